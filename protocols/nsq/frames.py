"""NSQ frame encoders (server side) and frame reader / command encoders (client side).

Server hot paths are struct-based: :func:`response`, :func:`error`,
:func:`message_frame`, :func:`message_frames`, :func:`delivery_frames` (channel
deliveries; a C speedup) and the constant frames :data:`OK`,
:data:`CLOSE_WAIT`, :data:`HEARTBEAT`. :class:`FrameReader`, :func:`decode_message`,
:func:`encode_command` and :func:`encode_mpub` are for our own tests and benchmarks.
All of these are re-exported by :mod:`protocols.nsq.codec`.
"""
from __future__ import annotations

from typing import Iterable

from mqserver import speedups

from .errors import NsqError
from .messages import Message
from .wire import (FRAME_HEADER, FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE,
                   MESSAGE_FRAME_HEADER, MESSAGE_FRAME_OFFSETS, MESSAGE_HEADER,
                   MESSAGE_HEADER_LENGTH, MSG_ID_LENGTH, U32)

__all__ = ["response", "error", "message_frame", "message_frames", "delivery_frames", "OK",
           "CLOSE_WAIT", "HEARTBEAT", "FrameReader", "decode_message", "encode_command",
           "encode_mpub"]


# -- server -> client frame encoders ---------------------------------------------

_pack_frame_header = FRAME_HEADER.pack
_pack_message_frame_header = MESSAGE_FRAME_HEADER.pack
# What a message frame's size counts besides the body: frame type + message header.
_MSG_FRAME_OVERHEAD = MESSAGE_FRAME_HEADER.size - U32.size


def response(data: bytes) -> bytes:
    """A type-0 (response) frame around ``data``."""
    return _pack_frame_header(len(data) + 4, FRAME_TYPE_RESPONSE) + data


def error(data: bytes | NsqError) -> bytes:
    """A type-1 (error) frame; ``data`` is raw bytes or an :class:`NsqError`."""
    if isinstance(data, NsqError):
        data = data.data
    return _pack_frame_header(len(data) + 4, FRAME_TYPE_ERROR) + data


#: ``OK`` response frame.
OK = response(b"OK")
#: ``CLOSE_WAIT`` response frame (reply to CLS).
CLOSE_WAIT = response(b"CLOSE_WAIT")
#: Heartbeat, sent as a plain response frame like nsqd does.
HEARTBEAT = response(b"_heartbeat_")


def message_frame(timestamp_ns: int, attempts: int, msg_id: bytes, body: bytes) -> bytes:
    """A type-2 (message) frame; ``msg_id`` must be exactly 16 bytes."""
    if len(msg_id) != MSG_ID_LENGTH:
        raise ValueError("message id must be 16 bytes")
    return _pack_message_frame_header(len(body) + _MSG_FRAME_OVERHEAD, FRAME_TYPE_MESSAGE,
                                      timestamp_ns, attempts, msg_id) + body


def message_frames(messages: Iterable[tuple[int, int, bytes, bytes]]) -> bytes:
    """Many message frames in one buffer, from ``(timestamp_ns, attempts, msg_id16, body)``.

    Hot path: ids are not length-checked here (struct would pad/truncate them).
    """
    pack = _pack_message_frame_header
    parts: list[bytes] = []
    append = parts.append
    for timestamp, attempts, msg_id, body in messages:
        append(pack(len(body) + _MSG_FRAME_OVERHEAD, FRAME_TYPE_MESSAGE,
                    timestamp, attempts, msg_id))
        append(body)
    return b"".join(parts)


def py_delivery_frames(items: list) -> bytes:
    """Message frames for channel deliveries ``(ts_ns, attempts, event_id, buf, b0, b1)``
    (the body is ``buf[b0:b1]``; the id is the eventId in 16 lowercase hex digits).

    The reader hot path; the C speedup (``_frames.c``) does the same byte for byte."""
    pack = _pack_message_frame_header
    parts: list[bytes] = []
    append = parts.append
    for ts, attempts, eid, buf, b0, b1 in items:
        append(pack(b1 - b0 + _MSG_FRAME_OVERHEAD, FRAME_TYPE_MESSAGE, ts, attempts,
                    b"%016x" % eid))
        append(buf[b0:b1])
    return b"".join(parts)


_frames = speedups.load("protocols.nsq._frames")
if _frames is not None:
    _frames.configure(MESSAGE_FRAME_OFFSETS, MESSAGE_FRAME_HEADER.size)
    _c_frames = _frames.message_frames

    def delivery_frames(items: list) -> bytes:
        """Message frames for channel deliveries (the C speedup of
        :func:`py_delivery_frames`)."""
        return _c_frames(items, FRAME_TYPE_MESSAGE)

else:
    delivery_frames = py_delivery_frames


# -- client side -------------------------------------------------------------------

class FrameReader:
    """Incremental client-side reader of nsqd frames: ``feed(data) -> [(frame_type, data)]``."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._need = 8

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Consume ``data``; return the complete frames it finishes."""
        buf = self._buf
        if buf:
            buf += data
            if len(buf) < self._need:
                return []
            data = bytes(buf)
            buf.clear()
        elif type(data) is not bytes:
            data = bytes(data)
        out = []
        pos, end = 0, len(data)
        unpack = FRAME_HEADER.unpack_from
        while end - pos >= 8:
            size, frame_type = unpack(data, pos)
            if size < 4:
                raise ValueError(f"invalid frame size {size}")
            if end - pos - 4 < size:
                self._need = size + 4
                break
            out.append((frame_type, data[pos + 8:pos + 4 + size]))
            pos += 4 + size
        else:
            self._need = 8
        if pos < end:
            buf += memoryview(data)[pos:]
        return out


def decode_message(payload: bytes) -> Message:
    """Split a type-2 frame's payload into timestamp, attempts, id and body."""
    if len(payload) < MESSAGE_HEADER_LENGTH:
        raise ValueError(
            f"message payload too short ({len(payload)} < {MESSAGE_HEADER_LENGTH} bytes)")
    timestamp, attempts, msg_id = MESSAGE_HEADER.unpack_from(payload)
    return Message(timestamp, attempts, msg_id, payload[MESSAGE_HEADER_LENGTH:])


def _param(p: bytes | str | int) -> bytes:
    return p if isinstance(p, bytes) else str(p).encode()


def encode_command(verb: str, *params: bytes | str | int, body: bytes | None = None) -> bytes:
    """Client-side bytes of one command line, plus ``<u32 size><body>`` when body is given."""
    line = b" ".join([verb.encode(), *map(_param, params)]) + b"\n"
    if body is None:
        return line
    return line + U32.pack(len(body)) + body


def encode_mpub(topic: str, bodies: list[bytes]) -> bytes:
    """Client-side bytes of ``MPUB topic`` with a correct body length and message count."""
    parts = [U32.pack(len(bodies))]
    for body in bodies:
        parts.append(U32.pack(len(body)))
        parts.append(body)
    inner = b"".join(parts)
    return b"MPUB " + topic.encode() + b"\n" + U32.pack(len(inner)) + inner
