"""Byte layouts of the nsqd V2 protocol: construct schemas plus precompiled structs.

The construct schemas are the readable reference (and what the tests check the
fast paths against); the ``struct.Struct`` objects are what the hot paths use.
"""
from __future__ import annotations

import struct

from construct import (Bytes, Const, GreedyBytes, Int16ub, Int32ub, Int64sb, Prefixed,
                       PrefixedArray, Struct)

__all__ = [
    "MAGIC_V2", "MAGIC", "FRAME", "MESSAGE", "MPUB_BODY",
    "FRAME_TYPE_RESPONSE", "FRAME_TYPE_ERROR", "FRAME_TYPE_MESSAGE",
    "MSG_ID_LENGTH", "MESSAGE_HEADER_LENGTH",
    "U32", "FRAME_HEADER", "MESSAGE_HEADER", "MESSAGE_FRAME_HEADER",
]

MAGIC_V2 = b"  V2"
FRAME_TYPE_RESPONSE = 0
FRAME_TYPE_ERROR = 1
FRAME_TYPE_MESSAGE = 2
MSG_ID_LENGTH = 16
MESSAGE_HEADER_LENGTH = 26  # timestamp 8 + attempts 2 + id 16

#: The 4 bytes a client sends right after connecting.
MAGIC = Const(MAGIC_V2)

#: Server -> client frame: u32 BE size (= 4 + len(data)), u32 BE frame type, data.
FRAME = Prefixed(Int32ub, Struct(
    "frame_type" / Int32ub,
    "data" / GreedyBytes,
))

#: Payload of a type-2 frame (also nsqd's on-disk record after its length prefix).
MESSAGE = Struct(
    "timestamp" / Int64sb,   # ns since the epoch
    "attempts" / Int16ub,
    "id" / Bytes(MSG_ID_LENGTH),
    "body" / GreedyBytes,
)

#: MPUB body after its own u32 length: u32 count, then (u32 size, bytes) per message.
MPUB_BODY = PrefixedArray(Int32ub, Prefixed(Int32ub, GreedyBytes))

# -- precompiled hot-path structs ------------------------------------------------
U32 = struct.Struct(">I")
#: size, frame type
FRAME_HEADER = struct.Struct(">II")
#: timestamp, attempts, id (26 bytes)
MESSAGE_HEADER = struct.Struct(">qH16s")
#: size, frame type, timestamp, attempts, id: everything before a message body (34 bytes)
MESSAGE_FRAME_HEADER = struct.Struct(">IIqH16s")

assert MESSAGE_HEADER.size == MESSAGE_HEADER_LENGTH
