"""Byte layouts of the nsqd V2 protocol: construct schemas plus precompiled structs.

The construct schemas are the one definition (frames and messages as nsqd 1.3.0's
protocol_v2.go writes them). The ``struct.Struct`` objects the hot paths use, the header sizes
and the offsets ``_frames.c`` is configured with are derived from them at import
(``mqserver.layout``).
"""
from __future__ import annotations

import struct

from construct import (Bytes, Const, GreedyBytes, Int16ub, Int32ub, Int64sb, Prefixed,
                       PrefixedArray, Struct)

from mqserver.layout import layout

__all__ = [
    "MAGIC_V2", "MAGIC", "FRAME", "MESSAGE", "MPUB_BODY",
    "FRAME_TYPE_RESPONSE", "FRAME_TYPE_ERROR", "FRAME_TYPE_MESSAGE",
    "MESSAGE_FRAME", "MSG_ID_LENGTH", "MESSAGE_HEADER_LENGTH", "MESSAGE_FRAME_OFFSETS",
    "U32", "FRAME_HEADER", "MESSAGE_HEADER", "MESSAGE_FRAME_HEADER",
]

MAGIC_V2 = b"  V2"
FRAME_TYPE_RESPONSE = 0
FRAME_TYPE_ERROR = 1
FRAME_TYPE_MESSAGE = 2
#: nsqd's MsgIDLength: the id is 16 ASCII hex digits.
MSG_ID_LENGTH = 16

#: The 4 bytes a client sends right after connecting.
MAGIC = Const(MAGIC_V2)

#: Server -> client frame: u32 BE size (= 4 + len(data)), u32 BE frame type, data.
FRAME = Prefixed(Int32ub, Struct(
    "frame_type" / Int32ub * "0 response, 1 error, 2 message",
    "data" / GreedyBytes,
))

#: Payload of a type-2 frame (also nsqd's on-disk record after its length prefix).
MESSAGE = Struct(
    "timestamp" / Int64sb * "ns since the epoch",
    "attempts" / Int16ub * "deliveries so far, this one included",
    "id" / Bytes(MSG_ID_LENGTH) * "mqserver: the eventId in 16 lowercase hex digits",
    "body" / GreedyBytes,
)

#: A whole type-2 frame: the frame around one MESSAGE.
MESSAGE_FRAME = Prefixed(Int32ub, Struct(
    "frame_type" / Const(FRAME_TYPE_MESSAGE, Int32ub),
    "message" / MESSAGE,
))

#: MPUB body after its own u32 length: u32 count, then (u32 size, bytes) per message.
MPUB_BODY = PrefixedArray(Int32ub, Prefixed(Int32ub, GreedyBytes))

#: The schemas the layout tables of docs/nsq.md show (python -m mqserver.layoutdoc).
DOC_SCHEMAS = {"FRAME": FRAME, "MESSAGE": MESSAGE, "MESSAGE_FRAME": MESSAGE_FRAME}

# -- precompiled hot-path structs, derived from the schemas above --------------------
_FRAME_HEAD = layout(FRAME, prefix=True)
_MESSAGE_HEAD = layout(MESSAGE, prefix=True)
_MESSAGE_FRAME_HEAD = layout(MESSAGE_FRAME, prefix=True)

#: A u32 BE size prefix: a frame's, and also a command body's and MPUB's counts.
U32 = _FRAME_HEAD.field_struct("length")
#: size, frame type
FRAME_HEADER = _FRAME_HEAD.struct
#: timestamp, attempts, id (26 bytes)
MESSAGE_HEADER = _MESSAGE_HEAD.struct
MESSAGE_HEADER_LENGTH = MESSAGE_HEADER.size
#: size, frame type, timestamp, attempts, id: everything before a message body (34 bytes)
MESSAGE_FRAME_HEADER = _MESSAGE_FRAME_HEAD.struct
#: Where C{_frames.c} writes the fields of a message frame's head (see frames.py):
#: size, frame type, timestamp, attempts, id.
MESSAGE_FRAME_OFFSETS = tuple(_MESSAGE_FRAME_HEAD.offset(n) for n in _MESSAGE_FRAME_HEAD.names)

assert _MESSAGE_HEAD.field_size("id") == MSG_ID_LENGTH
# _frames.c writes every byte of the head through these fields: no padding allowed.
assert all(f.kind != "pad" for f in _MESSAGE_FRAME_HEAD.fields)
