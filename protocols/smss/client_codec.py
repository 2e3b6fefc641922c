"""Sans-IO smss codec, client side: request encoders and the incremental
response decoder.

A 200 header means different things depending on the request it answers
(section 4), so ``ResponseDecoder`` must be told what it is waiting for with
``expect``: a simple OK, a JSON reply, a SUB stream or a REPLICA stream.
"""

import enum

from . import wire
from .errors import InvalidPayload, SmssProtocolError
from .messages import (
    AliveResponse,
    Batch,
    ErrResponse,
    OkResponse,
    PushedMessage,
    ReplicaBlock,
    SubEnd,
)
from .payload import parse_record

#: Responses bigger than this are treated as a broken stream.
DEFAULT_MAX_RESPONSE = 256 * 1024 * 1024

_pack_header = wire.REQUEST_HEADER_STRUCT.pack
_pack_sub_header = wire.SUB_REQUEST_HEADER_STRUCT.pack
_pack_i64 = wire.I64.pack
_pack_u32 = wire.U32.pack


def to_bytes(value) -> bytes:
    """Return ``value`` as bytes; str is encoded as UTF-8."""
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


# -- request encoders (section 3) ------------------------------------------------


def encode_request(
    code: int, topic=b"", trace=b"", payload_len: int = 0, body=b""
) -> bytes:
    """A request: 20-byte header with ``payload_len`` at offset 3, topic, trace, body."""
    topic = to_bytes(topic)
    trace = to_bytes(trace)
    if len(topic) > 0xFFFF:
        raise ValueError("topic is longer than 65535 bytes")
    if len(trace) > 0xFF:
        raise ValueError("trace id is longer than 255 bytes")
    return (
        _pack_header(code, len(topic), payload_len, len(trace)) + topic + trace + body
    )


def encode_pub(topic, payload: bytes, trace=b"") -> bytes:
    """PUB (1) of a raw payload (one or more section 5 message records)."""
    return encode_request(wire.CMD_PUB, topic, trace, len(payload), payload)


def encode_delay(topic, delay_ms: int, payload: bytes, trace=b"") -> bytes:
    """DELAY (16): P in the header counts the payload only, not the delay field."""
    return encode_request(
        wire.CMD_DELAY, topic, trace, len(payload), _pack_i64(delay_ms) + payload
    )


def encode_create(topic, expire_at: int = 0, trace=b"") -> bytes:
    """CREATE (2); ``expire_at`` is absolute Unix ms, 0 = permanent."""
    return encode_request(wire.CMD_CREATE, topic, trace, body=_pack_i64(expire_at))


def encode_delete(topic, trace=b"") -> bytes:
    """DELETE (3)."""
    return encode_request(wire.CMD_DELETE, topic, trace)


def encode_alive(trace=b"") -> bytes:
    """ALIVE (17)."""
    return encode_request(wire.CMD_ALIVE, trace=trace)


def encode_topic_info(topic, trace=b"") -> bytes:
    """TOPIC INFO (65)."""
    return encode_request(wire.CMD_TOPIC_INFO, topic, trace)


def encode_list(trace=b"") -> bytes:
    """LIST (100)."""
    return encode_request(wire.CMD_LIST, trace=trace)


def encode_valid_list(event_id: int = 0, trace=b"") -> bytes:
    """VALID LIST (99)."""
    return encode_request(wire.CMD_VALID_LIST, trace=trace, body=_pack_i64(event_id))


def encode_replica(event_id: int = 0, trace=b"") -> bytes:
    """REPLICA (64), as slaves send it: no topic and, but for an mqserver follower's
    first (C{trace} = C{wire.CONFIRM_TRACE}), no trace. An mqserver follower's
    confirmations are this frame too, without a trace."""
    return encode_request(wire.CMD_REPLICA, trace=trace, body=_pack_i64(event_id))


def encode_sub(
    topic, event_id: int = 0, batch: int = 1, ack_timeout_ns=None, who=b"", trace=b""
) -> bytes:
    """SUB (0); the ack-timeout field is sent only when ``ack_timeout_ns`` is given."""
    topic = to_bytes(topic)
    trace = to_bytes(trace)
    who = to_bytes(who)
    if not 0 <= batch <= 255:
        raise ValueError("batch must be 0..255")
    if len(trace) > 0xFF:
        raise ValueError("trace id is longer than 255 bytes")
    flag = 0 if ack_timeout_ns is None else 1
    parts = [
        _pack_sub_header(wire.CMD_SUB, len(topic), batch, flag, len(trace)),
        topic,
        trace,
        _pack_i64(event_id),
    ]
    if flag:
        parts.append(_pack_i64(ack_timeout_ns))
    parts += (_pack_u32(len(who)), who)
    return b"".join(parts)


def encode_ack(value: int = wire.ACK_NEXT) -> bytes:
    """A 2-byte ack: 0 = next batch, 1 = ack and end the subscription."""
    return wire.U16.pack(value)


# -- response decoder (section 4) -----------------------------------------------------


class Expect(enum.Enum):
    """What a 200 header will mean in the next response."""

    SIMPLE = "simple"  # PUB, DELAY, CREATE, DELETE (and ALIVE)
    JSON = "json"  # TOPIC INFO, LIST, VALID LIST
    SUB = "sub"  # push batches of a subscription
    REPLICA = "replica"  # binlog blocks of a replication stream


_unpack_u16 = wire.U16.unpack_from
_unpack_u32 = wire.U32.unpack_from
_unpack_batch_header = wire.BATCH_HEADER_STRUCT.unpack_from
_unpack_record_head = wire.PUSHED_RECORD_HEAD_STRUCT.unpack_from
_RESPONSE = wire.RESPONSE_HEADER_SIZE


class ResponseDecoder:
    """Incremental decoder of server frames; set ``expect`` before each request.

    ``feed(data)`` returns OkResponse, ErrResponse, AliveResponse, SubEnd, Batch
    or ReplicaBlock events.  A frame that cannot be understood (unknown status,
    a batch whose records do not fill its body, a length over ``max_response``)
    raises a fatal ``SmssProtocolError``.
    """

    def __init__(
        self, expect: Expect = Expect.SIMPLE, max_response: int = DEFAULT_MAX_RESPONSE
    ):
        self.expect = Expect(expect)
        self.max_response = max_response
        self._buf = bytearray()
        self._need = 0

    def feed(self, data) -> list:
        """Add ``data`` and return the events of every frame it completes."""
        buf = self._buf
        buf += data
        if len(buf) < self._need:
            return []
        events = []
        off = 0
        self._need = 0
        while True:
            result = self._frame(buf, off, len(buf))
            if result is None:
                break
            off, event = result
            events.append(event)
        if off:
            del buf[:off]
        return events

    def take_pending(self) -> bytes:
        """Return the bytes fed but not decoded yet (the start of a frame), and forget
        them: for a caller that decodes some frames itself and feeds back the rest."""
        pending = bytes(self._buf)
        self._buf.clear()
        self._need = 0
        return pending

    def _check(self, length: int) -> None:
        """Refuse a length over the limit before waiting for its bytes."""
        if length > self.max_response:
            raise SmssProtocolError(f"response length {length} over limit")

    def _frame(self, buf, off, end):
        """Decode one frame at ``off``: (new offset, event), or None if incomplete."""
        if end - off < _RESPONSE:
            self._need = _RESPONSE
            return None
        (status,) = _unpack_u16(buf, off)
        body = off + _RESPONSE
        if status == wire.STATUS_ERR:
            (text_len,) = _unpack_u16(buf, off + 2)
            stop = body + text_len
            if end < stop:
                self._need = stop - off
                return None
            return stop, ErrResponse(bytes(buf[body:stop]).decode("utf-8", "replace"))
        if status == wire.STATUS_ALIVE:
            return body, AliveResponse()
        if status == wire.STATUS_SUBEND:
            return body, SubEnd()
        if status != wire.STATUS_OK:
            raise SmssProtocolError(f"unknown response status {status}")

        expect = self.expect
        if expect is Expect.SIMPLE:
            return body, OkResponse(None)
        if expect is Expect.JSON:
            (length,) = _unpack_u32(buf, off + 2)
            self._check(length)
            stop = body + length
            if end < stop:
                self._need = stop - off
                return None
            return stop, OkResponse(bytes(buf[body:stop]))
        if expect is Expect.REPLICA:
            if end - off < _RESPONSE + 4:
                self._need = _RESPONSE + 4
                return None
            (length,) = _unpack_u32(buf, body)
            self._check(length)
            stop = body + 4 + length
            if end < stop:
                self._need = stop - off
                return None
            return stop, ReplicaBlock(bytes(buf[body + 4 : stop]))
        _, count, length = _unpack_batch_header(buf, off)
        self._check(length)
        stop = body + length
        if end < stop:
            self._need = stop - off
            return None
        return stop, Batch(parse_batch_body(buf, body, stop, count))


def parse_batch_body(buf, start: int, stop: int, count: int) -> list:
    """Parse ``count`` pushed records filling ``buf[start:stop]`` (section 7.3)."""
    messages = []
    pos = start
    try:
        for _ in range(count):
            if stop - pos < wire.PUSHED_PREFIX_SIZE + wire.MESSAGE_PREFIX_SIZE:
                raise SmssProtocolError("batch record runs past the batch body")
            ts, event_id, next_file_id, next_pos, size, _ = _unpack_record_head(
                buf, pos
            )
            record_at = pos + wire.PUSHED_PREFIX_SIZE
            record_end = record_at + wire.MESSAGE_PREFIX_SIZE + size
            if record_end > stop:
                raise SmssProtocolError("batch record runs past the batch body")
            headers, body = parse_record(buf, record_at, record_end)
            messages.append(
                PushedMessage(ts, event_id, next_file_id, next_pos, headers, body)
            )
            pos = record_end
    except InvalidPayload as exc:
        raise SmssProtocolError(f"bad message in batch: {exc}") from None
    if pos != stop:
        raise SmssProtocolError("batch body longer than its records")
    return messages
