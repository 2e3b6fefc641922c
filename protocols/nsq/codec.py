"""Sans-IO codec for the nsqd V2 TCP protocol.

* :class:`CommandDecoder` - incremental server-side decoder of client bytes into
  :mod:`protocols.nsq.messages` commands, validating exactly as nsqd v1.3.0 does.
* Frame encoders for the server side: :func:`response`, :func:`error`,
  :func:`message_frame`, :func:`message_frames` and the constant frames
  :data:`OK`, :data:`CLOSE_WAIT`, :data:`HEARTBEAT`, plus client side helpers for our
  tests and benchmarks: :class:`FrameReader`, :func:`decode_message`,
  :func:`encode_command`, :func:`encode_mpub`. They live in
  :mod:`protocols.nsq.frames` and are re-exported here.
"""
from __future__ import annotations

import re
import struct

from . import errors as E
from .errors import NsqError
from .frames import (CLOSE_WAIT, HEARTBEAT, OK, FrameReader, decode_message, encode_command,
                     encode_mpub, error, message_frame, message_frames, response)
from .messages import (Auth, Cls, Command, Dpub, Fin, Identify, Invalid, Mpub, Nop, Pub, Rdy,
                       Req, Sub, Touch)
from .wire import MAGIC_V2, MSG_ID_LENGTH, U32

__all__ = [
    "CommandDecoder", "is_valid_name", "is_valid_topic", "parse_base10",
    "response", "error", "message_frame", "message_frames", "OK", "CLOSE_WAIT", "HEARTBEAT",
    "FrameReader", "decode_message", "encode_command", "encode_mpub",
]

DEFAULT_MAX_LINE = 16384  # nsqd reads lines through a 16 KiB bufio.Reader

_NAME_RE = re.compile(rb"[.a-zA-Z0-9_-]+(?:#ephemeral)?")
_U64 = (1 << 64) - 1
#: Nanoseconds per millisecond: nsqd keeps durations in int64 ns (Go's time.Duration),
#: the protocol and the config give ms.
NS_PER_MS = 1_000_000


def is_valid_name(name: bytes | str) -> bool:
    """True if ``name`` is a valid topic/channel name (1..64 bytes, ``[.a-zA-Z0-9_-]+``
    with an optional ``#ephemeral`` suffix counted in the 64)."""
    if isinstance(name, str):
        name = name.encode("utf-8", "surrogateescape")
    return 0 < len(name) <= 64 and _NAME_RE.fullmatch(name) is not None


def is_valid_topic(name: bytes | str) -> bool:
    """L{is_valid_name} without a leading ``.``: our topic names are also directory
    names (nsqd's are not), so ``.``, ``..`` and hidden names are refused as invalid."""
    return is_valid_name(name) and name[:1] not in (b".", ".")


def parse_base10(raw: bytes) -> int | None:
    """nsqd's ByteToBase10: ASCII digits only, empty means 0, wraps modulo 2**64.

    Returns None when ``raw`` holds anything but digits.
    """
    if not raw:
        return 0
    if not raw.isdigit():
        return None
    if len(raw) <= 4000:  # CPython refuses int() of longer digit strings
        return int(raw) & _U64
    n = 0
    for i in range(0, len(raw), 4000):
        chunk = raw[i:i + 4000]
        n = (n * 10 ** len(chunk) + int(chunk)) & _U64
    return n


def _i64(n: int) -> int:
    n &= _U64
    return n - (1 << 64) if n >> 63 else n


_unpack_u32 = U32.unpack_from


def _i32(n: int) -> int:
    # nsqd reads every length prefix into an int32
    return n - (1 << 32) if n & 0x80000000 else n


_MAGIC, _LINE, _SIZE, _BODY, _MPUB_COUNT, _MPUB_SIZE, _MPUB_BODY, _DEAD = range(8)
#: The verbs whose line is followed by a 4-byte size and a body.
_BODY_VERBS = (b"PUB", b"MPUB", b"DPUB", b"IDENTIFY", b"AUTH")
_NOP = Nop()
_CLS = Cls()


class CommandDecoder:
    """Incremental decoder of what a client sends to nsqd: magic, then command lines/bodies.

    :meth:`feed` returns complete commands in order. A command nsqd would reject is
    returned in place as :class:`~protocols.nsq.messages.Invalid` carrying the exact
    :class:`~protocols.nsq.errors.NsqError` (so earlier pipelined commands are never
    lost and the caller can do nsqd's state checks first). Body sizes are checked as
    soon as the 4-byte length arrives, before any body byte is buffered.
    """

    def __init__(self, max_msg_size: int = 1048576, max_body_size: int = 5242880,
                 max_line: int = DEFAULT_MAX_LINE, *, max_rdy_count: int = 2500,
                 max_req_timeout_ms: int = 3600000, expect_magic: bool = True) -> None:
        self.max_msg_size = max_msg_size
        self.max_body_size = max_body_size
        self.max_line = max_line
        self.max_rdy_count = max_rdy_count
        self.max_req_timeout_ms = max_req_timeout_ms
        self._buf = bytearray()
        self._state = _MAGIC if expect_magic else _LINE
        self._need = 4 if expect_magic else 0
        # context of the command whose body is being read
        self._verb = ""
        self._topic = ""
        self._defer_ms = 0
        self._count = 0
        self._bodies: list[bytes] = []
        self._pub_topics: dict[bytes, str] = {}  # _one_pub's valid topic names, decoded
        self._handlers = {
            b"FIN": self._fin, b"RDY": self._rdy, b"REQ": self._req, b"PUB": self._pub,
            b"MPUB": self._mpub, b"DPUB": self._dpub, b"NOP": self._nop,
            b"TOUCH": self._touch, b"SUB": self._sub, b"CLS": self._cls,
            b"AUTH": self._auth, b"IDENTIFY": self._identify,
        }

    @property
    def closed(self) -> bool:
        """True once a framing error made the rest of the stream undecodable."""
        return self._state == _DEAD

    @property
    def at_line_start(self) -> bool:
        """True when the next byte fed starts a command line (nothing is buffered), so a
        caller may consume simple lines itself before feeding the rest."""
        return self._state == _LINE and not self._buf

    @property
    def in_line(self) -> bool:
        """True when part of a command line is buffered: the next C{\\n} fed ends it."""
        return self._state == _LINE and bool(self._buf)

    def raw_commands(self, data) -> list[bytes] | None:
        """Return the bytes of each command that feeding ``data`` next will complete, as
        the client sent them (for the wire trace; nothing is consumed), or None while
        a command's body is being read (where the command began is gone)."""
        if self._state == _MAGIC:
            stream = (bytes(self._buf) + bytes(data))[len(MAGIC_V2):]
        elif self._state == _LINE:
            stream = bytes(self._buf) + bytes(data)
        else:
            return None
        out = []
        pos = 0
        while True:
            nl = stream.find(b"\n", pos)
            if nl < 0:
                break
            end = nl + 1
            if stream[pos:nl].split(b" ", 1)[0] in _BODY_VERBS:
                if len(stream) - end < 4:
                    break
                end += 4 + int.from_bytes(stream[end:end + 4], "big")
                if end > len(stream):
                    break
            out.append(stream[pos:end])
            pos = end
        return out

    def feed(self, data: bytes) -> list[Command]:
        """Consume ``data`` and return the commands it completes (possibly none)."""
        buf = self._buf
        if (not buf and self._state == _LINE and type(data) is bytes
                and data.startswith(b"PUB ")):
            # A read that is exactly one PUB, what a publisher sending a message at a
            # time sends: decoded in one step; anything else (None) the general way.
            pub = self._one_pub(data)
            if pub is not None:
                return [pub]
        if self._state == _DEAD:
            return []
        if type(data) is not bytes:
            data = bytes(data)
        if buf:
            # Waiting for more bytes: only append (O(len(data))) until progress is possible.
            if self._state == _LINE:
                if data.find(b"\n") < 0:
                    buf += data
                    if len(buf) >= self.max_line:
                        return [self._die("", (), E.line_too_long(self.max_line))]
                    return []
            elif len(buf) + len(data) < self._need:
                buf += data
                return []
            buf += data
            data = bytes(buf)
            buf.clear()
        out: list[Command] = []
        pos = self._parse(data, out)
        if pos < len(data) and self._state != _DEAD:
            buf += memoryview(data)[pos:]
        return out

    # -- internals ---------------------------------------------------------------

    def _die(self, verb: str, params: tuple, err: NsqError) -> Invalid:
        self._state = _DEAD
        self._buf.clear()
        self._bodies = []
        return Invalid(verb, params, err, False)

    def _parse(self, b: bytes, out: list) -> int:
        pos = 0
        end = len(b)
        max_line = self.max_line
        handlers = self._handlers
        while True:
            state = self._state
            if state == _LINE:
                nl = b.find(b"\n", pos, pos + max_line)
                if nl < 0:
                    if end - pos >= max_line:
                        out.append(self._die("", (), E.line_too_long(max_line)))
                        return end
                    return pos
                stop = nl - 1 if nl > pos and b[nl - 1] == 13 else nl  # drop one trailing \r
                params = b[pos:stop].split(b" ")
                pos = nl + 1
                handler = handlers.get(params[0])
                try:
                    if handler is None:
                        raise E.invalid_command(params[0])
                    cmd = handler(params)
                except NsqError as err:
                    verb = params[0].decode("latin-1")
                    if verb in ("PUB", "MPUB", "DPUB", "IDENTIFY", "AUTH"):
                        # its body was not consumed, so the framing is lost
                        out.append(self._die(verb, tuple(params), err))
                        return end
                    out.append(Invalid(verb, tuple(params), err, True))
                    continue
                if cmd is not None:
                    out.append(cmd)
                continue
            need = self._need
            if end - pos < need:
                return pos
            if state == _BODY:
                body = b[pos:pos + need]
                pos += need
                out.append(self._body_command(body))
                self._state = _LINE
                self._need = 0
            elif state == _SIZE:
                err = self._on_size(_i32(U32.unpack_from(b, pos)[0]))
                pos += 4
                if err is not None:
                    out.append(self._die(self._verb, (), err))
                    return end
            elif state == _MPUB_SIZE or state == _MPUB_BODY:
                pos = self._mpub_messages(b, pos, end, out)
            elif state == _MPUB_COUNT:
                count = _i32(U32.unpack_from(b, pos)[0])
                pos += 4
                if count <= 0 or count > (self.max_body_size - 4) // 5:
                    out.append(self._die("MPUB", (), E.mpub_invalid_count(count)))
                    return end
                self._count = count
                self._bodies = []
                self._state = _MPUB_SIZE
                self._need = 4
            elif state == _MAGIC:
                if b[pos:pos + 4] != MAGIC_V2:
                    out.append(self._die("", (), E.bad_protocol()))
                    return end
                pos += 4
                self._state = _LINE
                self._need = 0
            else:
                return end

    def _one_pub(self, data: bytes) -> Pub | None:
        """Return the L{Pub} of C{data} when it is exactly one complete ``PUB <topic>\n``
        command with its body that the general decoding accepts (the decoder at a line
        start with nothing buffered, checked by L{feed}); else None, declining anything
        its rules would turn into an error, a wait or another command."""
        nl = data.find(b"\n", 4, self.max_line)
        if nl < 0:
            return None
        try:
            # read unsigned: a size nsqd reads as negative (its int32) is over the limit
            size = _unpack_u32(data, nl + 1)[0]
        except struct.error:  # not all of the size is there
            return None
        if size == 0 or size > self.max_msg_size or nl + 5 + size != len(data):
            return None
        raw = data[4:nl]
        topic = self._pub_topics.get(raw)
        if topic is None:
            if not is_valid_topic(raw):
                return None  # also a \r or a second parameter: both are refused
            topic = raw.decode("ascii")
            if len(self._pub_topics) < 1024:
                self._pub_topics[raw] = topic
        return Pub(topic, data[nl + 5:])

    def _on_size(self, size: int) -> NsqError | None:
        verb = self._verb
        if verb == "PUB" or verb == "DPUB":
            if size <= 0:
                return E.body_size_invalid(verb, size)
            if size > self.max_msg_size:
                return E.body_too_big(verb, size, self.max_msg_size)
        elif verb == "MPUB":
            if size <= 0:
                return E.body_size_invalid(verb, size)
            if size > self.max_body_size:
                return E.body_too_big(verb, size, self.max_body_size)
            # nsqd ignores the MPUB body length and reads count + messages straight
            # from the stream; do the same so the stream stays in step with it.
            self._state = _MPUB_COUNT
            self._need = 4
            return None
        else:  # IDENTIFY, AUTH
            if size > self.max_body_size:
                return E.body_too_big(verb, size, self.max_body_size)
            if size <= 0:
                return E.body_size_invalid(verb, size)
        self._state = _BODY
        self._need = size
        return None

    def _mpub_messages(self, b: bytes, pos: int, end: int, out: list) -> int:
        # Tight loop over MPUB's inner messages; stops at the first incomplete piece.
        bodies = self._bodies
        count = self._count
        max_msg = self.max_msg_size
        unpack = U32.unpack_from
        state = self._state
        need = self._need
        while True:
            if state == _MPUB_SIZE:
                if end - pos < 4:
                    self._state, self._need = _MPUB_SIZE, 4
                    return pos
                size = _i32(unpack(b, pos)[0])
                pos += 4
                if size <= 0:
                    out.append(self._die("MPUB", (), E.mpub_message_size_invalid(len(bodies), size)))
                    return end
                if size > max_msg:
                    out.append(self._die("MPUB", (), E.mpub_message_too_big(size, max_msg)))
                    return end
                need = size
                state = _MPUB_BODY
            if end - pos < need:
                self._state, self._need = _MPUB_BODY, need
                return pos
            bodies.append(b[pos:pos + need])
            pos += need
            if len(bodies) == count:
                out.append(Mpub(self._topic, bodies))
                self._bodies = []
                self._state, self._need = _LINE, 0
                return pos
            state = _MPUB_SIZE

    def _body_command(self, body: bytes) -> Command:
        verb = self._verb
        if verb == "PUB":
            return Pub(self._topic, body)
        if verb == "DPUB":
            return Dpub(self._topic, self._defer_ms, body)
        if verb == "IDENTIFY":
            return Identify(body)
        return Auth(body)

    def _expect_body(self, verb: str) -> None:
        self._verb = verb
        self._state = _SIZE
        self._need = 4

    @staticmethod
    def _topic_name(verb: str, raw: bytes) -> str:
        if not is_valid_topic(raw):
            raise E.bad_topic(verb, raw)
        return raw.decode("ascii")

    # one handler per verb; each returns a command, or None when a body follows

    def _identify(self, params: list[bytes]) -> None:
        self._expect_body("IDENTIFY")  # nsqd ignores IDENTIFY's parameters

    def _auth(self, params: list[bytes]) -> None:
        if len(params) != 1:
            raise E.auth_invalid_params()
        self._expect_body("AUTH")

    def _pub(self, params: list[bytes]) -> None:
        if len(params) < 2:
            raise E.insufficient_params("PUB")
        self._topic = self._topic_name("PUB", params[1])
        self._expect_body("PUB")

    def _mpub(self, params: list[bytes]) -> None:
        if len(params) < 2:
            raise E.insufficient_params("MPUB")
        self._topic = self._topic_name("MPUB", params[1])
        self._expect_body("MPUB")

    def _dpub(self, params: list[bytes]) -> None:
        if len(params) < 3:
            raise E.insufficient_params("DPUB")
        topic = self._topic_name("DPUB", params[1])
        n = parse_base10(params[2])
        if n is None:
            raise E.dpub_parse(params[2])
        ns = _i64(_i64(n) * NS_PER_MS)  # time.Duration(ms) * time.Millisecond, int64 wrap included
        if ns < 0 or ns > self.max_req_timeout_ms * NS_PER_MS:
            raise E.dpub_range(n, self.max_req_timeout_ms)
        self._topic = topic
        self._defer_ms = ns // NS_PER_MS
        self._expect_body("DPUB")

    def _sub(self, params: list[bytes]) -> Sub:
        if len(params) < 3:
            raise E.insufficient_params("SUB")
        topic = self._topic_name("SUB", params[1])
        if not is_valid_name(params[2]):
            raise E.bad_channel("SUB", params[2])
        return Sub(topic, params[2].decode("ascii"))

    def _rdy(self, params: list[bytes]) -> Rdy:
        count = 1
        if len(params) > 1:
            n = parse_base10(params[1])
            if n is None:
                raise E.rdy_parse(params[1])
            count = _i64(n)
        if count < 0 or count > self.max_rdy_count:
            raise E.rdy_range(count, self.max_rdy_count)
        return Rdy(count)

    @staticmethod
    def _msg_id(verb: str, params: list[bytes], nparams: int) -> bytes:
        if len(params) < nparams:
            raise E.insufficient_params(verb)
        msg_id = params[1]
        if len(msg_id) != MSG_ID_LENGTH:
            raise E.invalid_message_id()
        return msg_id

    def _fin(self, params: list[bytes]) -> Fin:
        return Fin(self._msg_id("FIN", params, 2))

    def _touch(self, params: list[bytes]) -> Touch:
        return Touch(self._msg_id("TOUCH", params, 2))

    def _req(self, params: list[bytes]) -> Req:
        msg_id = self._msg_id("REQ", params, 3)
        n = parse_base10(params[2])
        if n is None:
            raise E.req_parse(params[2])
        ns = _i64(_i64(n) * NS_PER_MS)
        # REQ clamps silently where DPUB errors
        ns = min(max(ns, 0), self.max_req_timeout_ms * NS_PER_MS)
        return Req(msg_id, ns // NS_PER_MS)

    def _nop(self, params: list[bytes]) -> Nop:
        return _NOP

    def _cls(self, params: list[bytes]) -> Cls:
        return _CLS
