"""Sans-IO smss codec, server side: the incremental request decoder and the
response encoders.

``RequestDecoder.feed(data)`` takes whatever bytes arrived and returns the
events (``protocols.smss.messages``) for every request completed so far.  The
response encoders are plain functions returning bytes.  The payload helpers of
section 5 live in ``payload.py`` and the client half (request encoders, response
decoder) in ``client_codec.py``; the most used names are re-exported here.

No I/O and no Twisted imports: the Twisted protocol owns the transport.
"""

import enum

from mqserver import speedups

from . import wire
from .errors import InvalidPayload, SmssProtocolError
from .messages import (
    Ack,
    Alive,
    Confirm,
    Create,
    Delay,
    Delete,
    List,
    PayloadTooSmall,
    Pub,
    Replica,
    Sub,
    TooLarge,
    TopicInfo,
    Unsupported,
    ValidList,
)
from .payload import (  # noqa: F401  (re-exported API)
    count_messages,
    encode_message,
    encode_payload,
    parse_record,
    record_spans,
    split_payload,
)

__all__ = [
    "DEFAULT_MAX_PAYLOAD",
    "DEFAULT_MAX_TOPIC",
    "DEFAULT_MAX_WHO",
    "InvalidPayload",
    "Mode",
    "RequestDecoder",
    "SmssProtocolError",
    "alive",
    "batch_header",
    "count_messages",
    "encode_batch",
    "encode_message",
    "encode_payload",
    "err",
    "parse_record",
    "ok",
    "ok_json",
    "pushed_prefix",
    "record_spans",
    "replica_frame",
    "split_payload",
    "subend",
]

#: The reference server has no limit beyond the u32; we need one.
DEFAULT_MAX_PAYLOAD = 64 * 1024 * 1024
#: CREATE refuses names over 128 bytes with a business ERR; longer ones up to this
#: limit still reach the handler so it can send that ERR.
DEFAULT_MAX_TOPIC = 1024
DEFAULT_MAX_WHO = 1024

_HDR = wire.REQUEST_HEADER_SIZE
_CONFIRM_SIZE = _HDR + 8  # a REPLICA request without topic or traceId
_OFF_BATCH = wire.SUB_HEADER_OFFSETS["args.batch"]
_OFF_ACK_FLAG = wire.SUB_HEADER_OFFSETS["args.ack_flag"]
_unpack_header = wire.REQUEST_HEADER_STRUCT.unpack_from
_unpack_u16 = wire.U16.unpack_from
_unpack_u32 = wire.U32.unpack_from
_unpack_i64 = wire.I64.unpack_from
#: A PUB's payload must be longer than this (its first record's S and H).
_PUB_MIN = wire.MESSAGE_PREFIX_STRUCT.size
_unpack_prefix = wire.MESSAGE_PREFIX_STRUCT.unpack_from  # S, H

# Commands with no body after topic + trace, mapped to their event builders.
_NO_BODY = {
    wire.CMD_DELETE: lambda topic, trace: Delete(topic, trace),
    wire.CMD_ALIVE: lambda topic, trace: Alive(trace),
    wire.CMD_TOPIC_INFO: lambda topic, trace: TopicInfo(topic, trace),
    wire.CMD_LIST: lambda topic, trace: List(trace),
}


class Mode(enum.Enum):
    """What the request decoder expects next on the connection."""

    HEADERS = "headers"  # ordinary requests
    ACKS = "acks"  # 2-byte acks of a live subscription (section 7.4)
    SINK = "sink"  # a replication stream: the slave's bytes are read and dropped (8.1)
    CONFIRMS = "confirms"  # a replication stream whose follower confirms (REPLICA frames)


# Module-level names for the modes feed and _parse test on every call (an enum member
# read from its class costs several dictionary lookups).
_HEADERS, _ACKS, _CONFIRMS = Mode.HEADERS, Mode.ACKS, Mode.CONFIRMS


class RequestDecoder:
    """Incremental decoder of client requests; feed it bytes, get events.

    Limits are checked as soon as a length is known, before its bytes arrive:

    * a PUB/DELAY payload over ``max_payload`` yields ``TooLarge`` once the
      header, topic and trace are in; the decoder then *discards* the announced
      body (8 + P bytes for DELAY) as it arrives, without buffering it, so the
      connection stays in sync;
    * a PUB with P <= 8 yields ``PayloadTooSmall`` and its P bytes are skipped;
    * a topic length over ``max_topic`` or a SUB who length over ``max_who``
      raises a fatal ``SmssProtocolError`` (write an ERR, then close).

    After a ``Sub`` or ``Replica`` event the decoder **pauses**: later bytes are
    buffered but not decoded, because their meaning depends on whether the
    server accepted the stream.  The protocol must then choose: ``ack_mode =
    True`` (SUB accepted), ``mode = Mode.SINK`` (REPLICA accepted) or
    ``ack_mode = False`` (refused with an ERR).  Setting a mode does not decode
    the held bytes by itself; call ``feed(b"")`` or use ``set_mode()``, which
    returns their events.

    In ack mode every 2 bytes become ``Ack(value)``.  ``Ack(1)`` (ack-and-end)
    switches back to header mode by itself, so a request pipelined right after
    it decodes correctly.  Any value other than 0 or 1 pauses the decoder: the
    server is going to close the connection (``invalid ack``).

    @ivar paused: True after Sub, Replica or an invalid ack, until a mode is chosen.
    """

    def __init__(
        self,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        max_topic: int = DEFAULT_MAX_TOPIC,
        max_who: int = DEFAULT_MAX_WHO,
    ):
        self.max_payload = max_payload
        self.max_topic = max_topic
        self.max_who = max_who
        self._buf = bytearray()
        self._need = 0  # buffered bytes required before parsing can progress
        self._skip = 0  # body bytes still to be discarded (TooLarge, PayloadTooSmall)
        self._mode = Mode.HEADERS
        self.paused = False
        self._error = None

    # -- mode control ---------------------------------------------------------

    @property
    def mode(self) -> Mode:
        """The current mode; assigning one also lifts a pause."""
        return self._mode

    @mode.setter
    def mode(self, mode: Mode) -> None:
        self._mode = Mode(mode)
        self.paused = False
        self._need = 0

    @property
    def ack_mode(self) -> bool:
        """True while 2-byte acks are expected; assigning lifts a pause."""
        return self._mode is Mode.ACKS

    @ack_mode.setter
    def ack_mode(self, on: bool) -> None:
        self.mode = Mode.ACKS if on else Mode.HEADERS

    @property
    def failed(self) -> bool:
        """True once a framing error was raised (every later call raises it again)."""
        return self._error is not None

    @property
    def buffered(self) -> int:
        """Number of bytes held in the buffer (discarded bodies are never held)."""
        return len(self._buf)

    def set_mode(self, mode: Mode) -> list:
        """Switch to ``mode``, lift a pause, and return events for held bytes."""
        self.mode = mode
        return self.feed(b"")

    # -- decoding -------------------------------------------------------------

    def feed(self, data) -> list:
        """Add ``data`` and return the events of every request it completes.

        Raises ``SmssProtocolError`` (``fatal`` True) when the stream cannot be
        kept in sync; the exception's ``events`` holds the events decoded from
        this call before the error.  Every later call raises it again.
        """
        if self._error is not None:
            raise self._error
        buf = self._buf
        if not buf and not self._skip and self._mode is _HEADERS and not self.paused:
            # A read that is exactly one PUB, what the SDKs send one message at a time:
            # decoded in one step (in C when built), without the buffer; anything else
            # returns None and takes the general way below, which applies every rule.
            pub = _one_pub(data, self.max_topic, self.max_payload)
            if pub is not None:
                return [pub]
        if self._skip and not buf and data:
            # Discarding straight from the input: the body is never copied.
            skipped = min(self._skip, len(data))
            self._skip -= skipped
            if self._skip:
                return []
            data = memoryview(data)[skipped:]
        buf += data
        if self.paused or len(buf) < self._need:
            return []
        events = []
        try:
            consumed = self._parse(buf, events)
        except SmssProtocolError as exc:
            exc.events = events
            self._error = exc
            raise
        if consumed:
            del buf[:consumed]  # bytearray drops a prefix without moving the rest
        return events

    def _parse(self, buf, events) -> int:
        """Decode complete frames from ``buf``; return how many bytes were used."""
        off = 0
        end = len(buf)
        self._need = 0
        while True:
            if self._skip:
                skipped = min(self._skip, end - off)
                off += skipped
                self._skip -= skipped
                if self._skip:
                    return off
            if self.paused:
                return off
            mode = self._mode
            if mode is _HEADERS:
                if end - off < _HDR:
                    # Checked here too so that the usual end of a read (nothing left)
                    # costs no call.
                    self._need = _HDR
                    return off
                result = self._request(buf, off, end)
                if result is None:
                    return off
                off, event = result
                events.append(event)
            elif mode is _ACKS:
                if end - off < 2:
                    self._need = 2
                    return off
                (value,) = _unpack_u16(buf, off)
                off += 2
                events.append(Ack(value))
                if value == wire.ACK_END:
                    self._mode = _HEADERS
                elif value != wire.ACK_NEXT:
                    self.paused = True
            elif mode is _CONFIRMS:
                if end - off < _CONFIRM_SIZE:
                    self._need = _CONFIRM_SIZE
                    return off
                code, topic_len, _, trace_len = _unpack_header(buf, off)
                if code != wire.CMD_REPLICA or topic_len or trace_len:
                    raise SmssProtocolError("a replication confirmation must be a REPLICA frame")
                events.append(Confirm(_unpack_i64(buf, off + _HDR)[0]))
                off += _CONFIRM_SIZE
            else:  # Mode.SINK
                return end

    def _request(self, buf, off, end):
        """Decode one request at ``off``: (new offset, event), or None if incomplete."""
        if end - off < _HDR:
            self._need = _HDR
            return None
        code, topic_len, arg, trace_len = _unpack_header(buf, off)
        if topic_len > self.max_topic:
            raise SmssProtocolError(
                f"topic length {topic_len} over limit {self.max_topic}"
            )
        topic_at = off + _HDR
        body = topic_at + topic_len + trace_len
        if end < body:
            self._need = body - off
            return None
        topic = bytes(buf[topic_at : topic_at + topic_len])
        trace = bytes(buf[topic_at + topic_len : body])

        if code == wire.CMD_PUB:
            if arg <= _PUB_MIN:
                self._skip = arg
                return body, PayloadTooSmall(code, topic, trace)
            if arg > self.max_payload:
                self._skip = arg
                return body, TooLarge(code, topic, trace, arg, self.max_payload)
            stop = body + arg
            if end < stop:
                self._need = stop - off
                return None
            return stop, Pub(topic, trace, bytes(buf[body:stop]))

        if code in _NO_BODY:
            return body, _NO_BODY[code](topic, trace)

        if code == wire.CMD_DELAY:
            if arg > self.max_payload:
                self._skip = 8 + arg
                return body, TooLarge(code, topic, trace, arg, self.max_payload)
            stop = body + 8 + arg
            if end < stop:
                self._need = stop - off
                return None
            (delay_ms,) = _unpack_i64(buf, body)
            return stop, Delay(topic, trace, delay_ms, bytes(buf[body + 8 : stop]))

        if code in (wire.CMD_CREATE, wire.CMD_VALID_LIST, wire.CMD_REPLICA):
            stop = body + 8
            if end < stop:
                self._need = stop - off
                return None
            (value,) = _unpack_i64(buf, body)
            if code == wire.CMD_CREATE:
                return stop, Create(topic, trace, value)
            if code == wire.CMD_VALID_LIST:
                return stop, ValidList(trace, value)
            self.paused = True
            return stop, Replica(value, trace)

        if code == wire.CMD_SUB:
            return self._sub(buf, off, end, body, topic, trace)

        # Unknown codes, codes above 100 and DelayApply (101): no body is read.
        return body, Unsupported(code, topic, trace)

    def _sub(self, buf, off, end, body, topic, trace):
        """Decode the SUB body (section 7.1) that starts at ``body``."""
        batch = buf[off + _OFF_BATCH] or 1
        has_timeout = buf[off + _OFF_ACK_FLAG] == 1
        who_len_at = body + (16 if has_timeout else 8)
        who_at = who_len_at + 4
        if end < who_at:
            self._need = who_at - off
            return None
        (who_len,) = _unpack_u32(buf, who_len_at)
        if who_len > self.max_who:
            raise SmssProtocolError(f"who length {who_len} over limit {self.max_who}")
        stop = who_at + who_len
        if end < stop:
            self._need = stop - off
            return None
        (event_id,) = _unpack_i64(buf, body)
        ack_timeout_ns = None
        if has_timeout:
            (ack_timeout_ns,) = _unpack_i64(buf, body + 8)
            if ack_timeout_ns <= 0:
                ack_timeout_ns = None
        self.paused = True
        who = bytes(buf[who_at:stop])
        return stop, Sub(topic, trace, event_id, batch, ack_timeout_ns, who)


# -- the fast decode of one PUB ------------------------------------------------------

def py_one_pub(data, max_topic, max_payload):
    """Return the L{Pub} event of C{data} when it is bytes holding exactly one PUB that
    L{RequestDecoder.feed} accepts (topic within C{max_topic}, payload over 8 bytes and
    within C{max_payload}); else None. When the payload is one message record without
    headers, the event's C{messages} is C{[body]}, as C{views.payload_to_messages}
    gives it.

    The fast decode of L{RequestDecoder.feed} for a read holding one request, and the
    reference of its C speedup (C{_pub.c})."""
    if type(data) is not bytes or len(data) <= _HDR:
        return None
    code, topic_len, arg, trace_len = _unpack_header(data, 0)
    body = _HDR + topic_len + trace_len
    if (code != wire.CMD_PUB or topic_len > max_topic or arg <= _PUB_MIN
            or arg > max_payload or body + arg != len(data)):
        return None
    size, header_count = _unpack_prefix(data, body)
    return Pub(data[_HDR:_HDR + topic_len], data[_HDR + topic_len:body], data[body:],
               [data[body + _PUB_MIN:]] if header_count == 0 and size + _PUB_MIN == arg
               else None)


_pub = speedups.load("protocols.smss._pub")
if _pub is not None:
    _pub.configure(_HDR, wire.PUB_HEADER_SPANS, _PUB_MIN, wire.MESSAGE_PREFIX_SPANS,
                   wire.CMD_PUB, Pub)
    _one_pub = _pub.one_pub
else:
    _one_pub = py_one_pub


# -- response encoders (section 4) -----------------------------------------------

_OK = wire.STATUS_HEADER_STRUCT.pack(wire.STATUS_OK)
_ALIVE = wire.STATUS_HEADER_STRUCT.pack(wire.STATUS_ALIVE)
_SUBEND = wire.STATUS_HEADER_STRUCT.pack(wire.STATUS_SUBEND)
_pack_json_header = wire.OK_JSON_HEADER_STRUCT.pack
_pack_err_header = wire.ERR_HEADER_STRUCT.pack
_pack_batch_header = wire.BATCH_HEADER_STRUCT.pack
_pack_pushed_prefix = wire.PUSHED_PREFIX_STRUCT.pack
_pack_replica_header = wire.REPLICA_FRAME_HEADER_STRUCT.pack


def ok() -> bytes:
    """OK for PUB, DELAY, CREATE and DELETE: a bare 200 header."""
    return _OK


def ok_json(body: bytes) -> bytes:
    """OK for TOPIC INFO / LIST / VALID LIST; an empty body sends only the header."""
    return _pack_json_header(wire.STATUS_OK, len(body)) + body


def err(text) -> bytes:
    """ERR (400) carrying ``text`` (str is sent as UTF-8; cut at 65535 bytes)."""
    if isinstance(text, str):
        text = text.encode("utf-8")
    text = bytes(text[:0xFFFF])
    return _pack_err_header(wire.STATUS_ERR, len(text)) + text


def alive() -> bytes:
    """ALIVE (201): reply to ALIVE, or keep-alive on an idle SUB/REPLICA stream."""
    return _ALIVE


def subend() -> bytes:
    """SUBEND (255): the subscribed topic was deleted or expired."""
    return _SUBEND


def batch_header(count: int, body_len: int) -> bytes:
    """Header of a SUB push batch: ``count`` (1..255) records in ``body_len`` bytes."""
    return _pack_batch_header(wire.STATUS_OK, count, body_len)


def pushed_prefix(ts: int, event_id: int, next_file_id: int, next_pos: int) -> bytes:
    """The 32-byte prefix of one pushed record; the stored message record follows."""
    return _pack_pushed_prefix(ts, event_id, next_file_id, next_pos)


def encode_batch(records) -> bytes:
    """A whole push batch frame from ``(ts, event_id, next_file_id, next_pos,
    message_record)`` tuples, where message_record is the section 5 record bytes."""
    parts = [b""]
    for ts, event_id, next_file_id, next_pos, record in records:
        parts.append(_pack_pushed_prefix(ts, event_id, next_file_id, next_pos))
        parts.append(record)
    body_len = sum(map(len, parts))
    parts[0] = _pack_batch_header(wire.STATUS_OK, (len(parts) - 1) // 2, body_len)
    return b"".join(parts)


def replica_frame(block: bytes) -> bytes:
    """One REPLICA frame: OK header, u32 block length, then the binlog record."""
    return _pack_replica_header(wire.STATUS_OK, len(block)) + block
