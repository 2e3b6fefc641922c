"""RocketMQ message helpers: property strings, Java String.hashCode, message ids, batch bodies.

As RocketMQ 4.9.4's MessageDecoder (message ids, property strings, batch bodies) and
MessageExtBrokerInner.tagsString2tagsCode (tag hash).
"""

import ipaddress
import struct
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from mqserver import message as fmt

from protocols.remoting.codec import RemotingProtocolError
from protocols.remoting.wire import BATCH_MESSAGE_HEAD, BATCH_MESSAGE_HEAD_SIZE, INT16_STRUCT

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
MAX_PROPERTIES_LENGTH = 32767  # the stored/batch layouts carry a signed 16-bit length

# -- property string ------------------------------------------------------------------


def decode_properties(data: str | bytes) -> dict[str, str]:
    """Parse ``name\\x01value\\x02...`` into an ordered dict (the store's codec,
    L{mqserver.message.decode_properties}, with str keys and values).

    Accepts the C++ trailing separator and Java's missing one; pieces without a
    name or a value are skipped; the first ``\\x01`` splits name from value.
    """
    errors = "surrogatepass" if isinstance(data, str) else "strict"
    raw = data.encode("utf-8", errors) if isinstance(data, str) else bytes(data)
    props: dict[str, str] = {}
    try:
        for name, value in fmt.decode_properties(raw):
            if name and value:
                props[name.decode("utf-8", errors)] = value.decode("utf-8", errors)
    except UnicodeDecodeError as exc:
        raise RemotingProtocolError(f"properties are not UTF-8: {exc}") from None
    return props


def encode_properties(props: Mapping[str, str], trailing_separator: bool = False) -> str:
    """Build a property string with the store's codec; ``trailing_separator`` mimics the
    C++ client's final ``\\x02``."""
    for name, value in props.items():
        if NAME_VALUE_SEPARATOR in name or PROPERTY_SEPARATOR in name or PROPERTY_SEPARATOR in value:
            raise RemotingProtocolError(f"property {name!r} contains a separator character")
    pairs = ((name.encode("utf-8", "surrogatepass"), value.encode("utf-8", "surrogatepass"))
             for name, value in props.items())
    text = fmt.encode_properties(pairs).decode("utf-8", "surrogatepass")
    return text if trailing_separator else text[:-1]


# -- Java String.hashCode ----------------------------------------------------------------

# One definition of Java's String.hashCode, shared with the store's consume queues.
java_string_hash = fmt.java_string_hash


def tag_hash_code(tag: str | None) -> int:
    """Return the consume-queue tag hash of a ``TAGS`` value; 0 when there is no tag."""
    return java_string_hash(tag) if tag else 0


# -- message ids -------------------------------------------------------------------------

_PORT_OFFSET = struct.Struct(">iq")


def make_offset_msg_id(host: str, port: int, commit_log_offset: int) -> str:
    """Return the offset message id: uppercase hex of store IP, 4-byte port, 8-byte offset.

    32 hex characters for IPv4, 56 for IPv6.
    """
    try:
        packed = ipaddress.ip_address(host).packed
        return (packed + _PORT_OFFSET.pack(port, commit_log_offset)).hex().upper()
    except (ValueError, struct.error) as exc:
        raise RemotingProtocolError(f"cannot build an offset message id: {exc}") from None


def parse_offset_msg_id(msg_id: str) -> tuple[str, int, int]:
    """Split an offset message id into (store host, store port, commit log offset)."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise RemotingProtocolError(f"offset message id is not hex: {msg_id!r}") from None
    if len(raw) not in (16, 28):
        raise RemotingProtocolError(f"offset message id has {len(msg_id)} characters, not 32 or 56")
    ip_len = len(raw) - _PORT_OFFSET.size
    port, offset = _PORT_OFFSET.unpack_from(raw, ip_len)
    return str(ipaddress.ip_address(raw[:ip_len])), port, offset


def uniq_key_ip(uniq_key: str) -> str | None:
    """Return the client IP embedded at the start of a ``UNIQ_KEY``, or None if it has no known shape.

    Java and Go keys start with the IP bytes (32 hex characters for IPv4, 56 for
    IPv6); the C++ 1.2.3 client writes them byte-reversed, so its keys yield e.g.
    ``1.0.0.127``.  Everything after the IP is client-specific: keep the key opaque.
    """
    try:
        raw = bytes.fromhex(uniq_key)
    except ValueError:
        return None
    if len(raw) == 16:
        return str(ipaddress.IPv4Address(raw[:4]))
    if len(raw) == 28:
        return str(ipaddress.IPv6Address(raw[:16]))
    return None


# -- batch body --------------------------------------------------------------------------


class BatchMessage(NamedTuple):
    """One message of a batch body."""

    flag: int
    body: bytes
    properties: dict[str, str]


def decode_batch_body(body: bytes) -> list[BatchMessage]:
    """Split a batch body into messages; the TOTALSIZE fields must tile it exactly.

    The caller inflates the body first when the request's sysFlag has the
    compressed bit (C++ deflates a whole batch of 4 KiB or more).
    """
    view = memoryview(body)
    end = len(view)
    pos = 0
    messages = []
    while pos < end:
        if end - pos < BATCH_MESSAGE_HEAD_SIZE:
            raise RemotingProtocolError(f"truncated batch message at byte {pos}")
        total, _magic, _crc, flag, body_len = BATCH_MESSAGE_HEAD.unpack_from(view, pos)
        if body_len < 0 or total < BATCH_MESSAGE_HEAD_SIZE + body_len or total > end - pos:
            raise RemotingProtocolError(f"bad sizes in batch message at byte {pos}: total {total}, body {body_len}")
        cursor = pos + BATCH_MESSAGE_HEAD.size
        message_body = bytes(view[cursor:cursor + body_len])
        cursor += body_len
        (props_len,) = INT16_STRUCT.unpack_from(view, cursor)
        cursor += 2
        if props_len < 0 or cursor + props_len != pos + total:
            raise RemotingProtocolError(f"properties length {props_len} does not match batch message at byte {pos}")
        messages.append(BatchMessage(flag, message_body, decode_properties(view[cursor:cursor + props_len])))
        pos += total
    return messages


def encode_batch_body(messages: Iterable[tuple[int, bytes, Mapping[str, str]]], trailing_separator: bool = False) -> bytes:
    """Encode (flag, body, properties) triples as a batch body, MAGICCODE and BODYCRC zero."""
    parts = []
    for flag, message_body, props in messages:
        props_bytes = encode_properties(props, trailing_separator).encode("utf-8")
        if len(props_bytes) > MAX_PROPERTIES_LENGTH:
            raise RemotingProtocolError(f"properties of {len(props_bytes)} bytes exceed {MAX_PROPERTIES_LENGTH}")
        message_body = bytes(message_body)
        total = BATCH_MESSAGE_HEAD_SIZE + len(message_body) + len(props_bytes)
        try:
            head = BATCH_MESSAGE_HEAD.pack(total, 0, 0, flag, len(message_body))
        except struct.error as exc:
            raise RemotingProtocolError(f"batch message field out of range: {exc}") from None
        parts += (head, message_body, INT16_STRUCT.pack(len(props_bytes)), props_bytes)
    return b"".join(parts)
