"""Byte layouts of the RocketMQ remoting protocol.

Two equivalent descriptions live here: declarative ``construct`` schemas (the
readable reference, used by tests and tooling) and precompiled ``struct.Struct``
objects that the codec uses on the hot path.  A unit test checks that both produce
the same bytes.  See specs/rocketmq-remoting.md sections 1.2, 1.5 and 6.7.
"""

import struct

from construct import (
    Bytes,
    GreedyBytes,
    GreedyRange,
    Int8ub,
    Int16sb,
    Int24ub,
    Int32sb,
    Int32ub,
    PascalString,
    Prefixed,
    Rebuild,
    Struct,
    len_,
    this,
)

# Java's LengthFieldBasedFrameDecoder limit (com.rocketmq.remoting.frameMaxLength).
DEFAULT_MAX_FRAME = 16 * 1024 * 1024
MAX_HEADER_LENGTH = 0xFFFFFF  # the header length shares a 32-bit word with the type byte

# -- construct schemas ---------------------------------------------------------

FRAME = Struct(
    # number of bytes after this field: the type/length word, the header and the body
    "length" / Rebuild(Int32ub, 4 + len_(this.header) + len_(this.body)),
    "serialize_type" / Int8ub,
    "header_length" / Rebuild(Int24ub, len_(this.header)),
    "header" / Bytes(this.header_length),
    "body" / Bytes(this.length - 4 - this.header_length),
)
"""A whole remoting frame, length prefix included."""

FRAME_PREFIX = Struct(
    "length" / Int32ub,
    "serialize_type" / Int8ub,
    "header_length" / Int24ub,
)
"""The first 8 bytes of a frame: enough to size it and to reject it."""

EXT_FIELD = Struct(
    "key" / PascalString(Int16sb, "utf8"),
    "value" / PascalString(Int32sb, "utf8"),
)

ROCKETMQ_HEADER = Struct(
    "code" / Int16sb,
    "language" / Int8ub,
    "version" / Int16sb,
    "opaque" / Int32sb,
    "flag" / Int32sb,
    "remark" / PascalString(Int32sb, "utf8"),  # length 0 means null
    "ext_fields" / Prefixed(Int32sb, GreedyRange(EXT_FIELD)),
)
"""The ROCKETMQ (serializeType 1) binary header."""

BATCH_MESSAGE = Struct(
    "total_size" / Rebuild(Int32sb, 4 + 4 + 4 + 4 + 4 + len_(this.body) + 2 + len_(this.properties)),
    "magic_code" / Int32sb,  # 0 on the wire
    "body_crc" / Int32sb,  # 0 on the wire
    "flag" / Int32sb,
    "body" / Prefixed(Int32sb, GreedyBytes),
    "properties" / Prefixed(Int16sb, GreedyBytes),  # property string, UTF-8
)
"""One message inside a batch body (SEND_BATCH_MESSAGE, or C++ SEND_MESSAGE with batch)."""

# -- precompiled structs for the hot path ---------------------------------------

FRAME_PREFIX_STRUCT = struct.Struct(">II")  # length, (serialize_type << 24) | header_length
LENGTH_STRUCT = struct.Struct(">I")
BINARY_HEADER_FIXED = struct.Struct(">hBhiii")  # code, language, version, opaque, flag, remark length
INT32_STRUCT = struct.Struct(">i")
INT16_STRUCT = struct.Struct(">h")
BATCH_MESSAGE_HEAD = struct.Struct(">iiiii")  # total size, magic, body crc, flag, body length
BATCH_MESSAGE_HEAD_SIZE = BATCH_MESSAGE_HEAD.size + 2  # plus the properties length


def pack_frame_prefix(serialize_type: int, header_length: int, body_length: int) -> bytes:
    """Return the 8-byte frame prefix for a header and body of the given sizes."""
    return FRAME_PREFIX_STRUCT.pack(4 + header_length + body_length, (serialize_type << 24) | header_length)
