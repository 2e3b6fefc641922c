"""Message records inside PUB/DELAY payloads.

A payload is one or more records back to back: ``S u32 | H u32 | headers | body``
where S counts the bytes after the first 8.  The walk rules are the server's:
every S > 0, every record fits, and what is left after a record is either 0 or
more than 8 bytes.

``count_messages`` and ``record_spans`` are the server-side validation (they do
not look at headers, which are opaque to the server).  ``split_payload`` also
parses headers, and so is stricter: clients and tests use it.
"""

from .errors import InvalidPayload
from .wire import MESSAGE_PREFIX_STRUCT, U32

_prefix_from = MESSAGE_PREFIX_STRUCT.unpack_from
_u32_from = U32.unpack_from
_u32_pack = U32.pack


def record_spans(payload) -> list[tuple[int, int]]:
    """Validate ``payload`` and return the (start, end) offset of each record.

    Raises InvalidPayload when the walk rules are broken (or the payload is
    8 bytes or less, which leaves no room for a record).
    """
    total = len(payload)
    if total <= 8:
        raise InvalidPayload("invalid pub payload")
    spans = []
    pos = 0
    while pos < total:
        # Rule: what is left here is > 8 (checked for the first record above and
        # after each record below), so the 8-byte prefix is always readable.
        (size,) = _u32_from(payload, pos)
        end = pos + 8 + size
        if size == 0 or end > total or 0 < total - end <= 8:
            raise InvalidPayload("invalid pub payload")
        spans.append((pos, end))
        pos = end
    return spans


def count_messages(payload) -> int:
    """Validate ``payload`` with the server's walk and return its message count.

    Raises InvalidPayload on a malformed payload.  Headers are not parsed.
    """
    total = len(payload)
    if total <= 8:
        raise InvalidPayload("invalid pub payload")
    count = 0
    pos = 0
    while pos < total:
        (size,) = _u32_from(payload, pos)
        pos += 8 + size
        if size == 0 or pos > total or 0 < total - pos <= 8:
            raise InvalidPayload("invalid pub payload")
        count += 1
    return count


def parse_record(buf, start: int, end: int) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """Parse the headers and body of the record occupying ``buf[start:end]``.

    ``start`` points at S; the caller has checked that ``end == start + 8 + S``.
    Raises InvalidPayload when H or a header length runs past the record.
    """
    _, count = _prefix_from(buf, start)
    pos = start + 8
    # Each header takes at least 8 bytes; reject absurd H before looping over it.
    if count > (end - pos) // 8:
        raise InvalidPayload("message headers run past the record")
    headers = []
    for _ in range(count):
        if pos + 4 > end:
            raise InvalidPayload("message headers run past the record")
        (key_len,) = _u32_from(buf, pos)
        key_end = pos + 4 + key_len
        if key_end + 4 > end:
            raise InvalidPayload("message headers run past the record")
        (val_len,) = _u32_from(buf, key_end)
        val_end = key_end + 4 + val_len
        if val_end > end:
            raise InvalidPayload("message headers run past the record")
        headers.append(
            (bytes(buf[pos + 4 : key_end]), bytes(buf[key_end + 4 : val_end]))
        )
        pos = val_end
    return headers, bytes(buf[pos:end])


def split_payload(payload) -> list[tuple[list[tuple[bytes, bytes]], bytes]]:
    """Validate ``payload`` and return its messages as ``(headers, body)`` pairs.

    Raises InvalidPayload when the walk rules of section 5 fail or a header
    runs past its record.
    """
    return [parse_record(payload, start, end) for start, end in record_spans(payload)]


def _as_bytes(value) -> bytes:
    """Encode str as UTF-8 and pass bytes-like values through as bytes."""
    return value.encode() if isinstance(value, str) else bytes(value)


def encode_message(headers, body) -> bytes:
    """Return one message record for ``headers`` and ``body``.

    ``headers`` is an iterable of (key, value) pairs or a dict; keys, values
    and body may be str (sent as UTF-8) or bytes.  Header order is kept.
    """
    if isinstance(headers, dict):
        headers = headers.items()
    parts = []
    count = 0
    for key, value in headers:
        key = _as_bytes(key)
        value = _as_bytes(value)
        parts += (_u32_pack(len(key)), key, _u32_pack(len(value)), value)
        count += 1
    parts.append(_as_bytes(body))
    content = b"".join(parts)
    return MESSAGE_PREFIX_STRUCT.pack(len(content), count) + content


def encode_payload(messages) -> bytes:
    """Return a PUB payload for ``messages``: ``(headers, body)`` pairs or bare bodies."""
    out = []
    for message in messages:
        if isinstance(message, (bytes, bytearray, memoryview, str)):
            out.append(encode_message((), message))
        else:
            headers, body = message
            out.append(encode_message(headers, body))
    return b"".join(out)
