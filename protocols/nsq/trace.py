"""The nsqd TCP door's frames as the wire trace shows them (L{mqserver.trace}): a
command's verb and fields, and the frames the door writes (response, error, message)."""

from mqserver.trace import dataclass_fields

from protocols.nsq.frames import FrameReader, decode_message
from protocols.nsq.wire import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE

_FRAME_NAMES = {FRAME_TYPE_RESPONSE: "RESPONSE", FRAME_TYPE_ERROR: "ERROR",
                FRAME_TYPE_MESSAGE: "MESSAGE"}


def command_fields(cmd):
    """Return the trace's fields of command C{cmd} (bodies as their sizes)."""
    return dataclass_fields(cmd, text=("msg_id",))


def out_frames(data):
    """Return (names, fields, raw) of each frame in C{data} (whole frames the door
    writes)."""
    out = []
    pos = 0
    for kind, payload in FrameReader().feed(data):
        size = 8 + len(payload)
        raw = data[pos:pos + size]
        pos += size
        name = _FRAME_NAMES.get(kind, str(kind))
        if kind == FRAME_TYPE_MESSAGE:
            m = decode_message(payload)
            fields = {"id": m.msg_id.decode("latin-1"), "attempts": m.attempts,
                      "timestamp": m.timestamp, "body": len(m.body)}
        else:
            fields = {"data": payload.decode("utf-8", "replace")}
            if payload.startswith(b"E_"):
                name = payload.split(b" ", 1)[0].decode("ascii", "replace")
        out.append(((name, _FRAME_NAMES.get(kind, name)), fields, raw))
    return out
