"""Byte layouts of the RocketMQ remoting protocol.

The declarative ``construct`` schemas are the one definition (used as they are by
tests and tooling). The precompiled ``struct.Struct`` objects, sizes, offsets and bit
positions the codec uses on the hot path are derived from them at import
(``mqserver.layout``). Layouts as RocketMQ 4.9.4's RemotingCommand,
RocketMQSerializable and MessageDecoder write them.
"""


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

from mqserver.layout import layout

# Java's LengthFieldBasedFrameDecoder limit (com.rocketmq.remoting.frameMaxLength).
DEFAULT_MAX_FRAME = 16 * 1024 * 1024

# -- construct schemas ---------------------------------------------------------

FRAME = Struct(
    # number of bytes after this field: the type/length word, the header and the body
    "length" / Rebuild(Int32ub, 4 + len_(this.header) + len_(this.body)) * "bytes after it",
    "serialize_type" / Int8ub * "0 JSON, 1 ROCKETMQ (binary)",
    "header_length" / Rebuild(Int24ub, len_(this.header)) * "header bytes after this word",
    "header" / Bytes(this.header_length),
    "body" / Bytes(this.length - 4 - this.header_length),
)
"""A whole remoting frame, length prefix included."""

FRAME_PREFIX = Struct(
    "length" / Int32ub * "bytes after it",
    "serialize_type" / Int8ub * "0 JSON, 1 ROCKETMQ (binary)",
    "header_length" / Int24ub * "header bytes after this word",
)
"""The first 8 bytes of a frame: enough to size it and to reject it."""

EXT_FIELD = Struct(
    "key" / PascalString(Int16sb, "utf8"),
    "value" / PascalString(Int32sb, "utf8"),
)

ROCKETMQ_HEADER = Struct(
    "code" / Int16sb * "request or response code",
    "language" / Int8ub * "LanguageCode ordinal (JAVA 0, CPP 1, ...)",
    "version" / Int16sb,
    "opaque" / Int32sb * "request id, echoed in the response",
    "flag" / Int32sb * "bit 0 response, bit 1 one-way",
    "remark" / PascalString(Int32sb, "utf8"),  # length 0 means null
    "ext_fields" / Prefixed(Int32sb, GreedyRange(EXT_FIELD)),
)
"""The ROCKETMQ (serializeType 1) binary header."""

BATCH_MESSAGE = Struct(
    "total_size"
    / Rebuild(Int32sb, 4 + 4 + 4 + 4 + 4 + len_(this.body) + 2 + len_(this.properties))
    * "this message's bytes, these 4 included",
    "magic_code" / Int32sb * "0 on the wire",
    "body_crc" / Int32sb * "0 on the wire",
    "flag" / Int32sb,
    "body" / Prefixed(Int32sb, GreedyBytes),
    "properties" / Prefixed(Int16sb, GreedyBytes) * "property string, UTF-8",
)
"""One message inside a batch body (SEND_BATCH_MESSAGE, or C++ SEND_MESSAGE with batch)."""

#: The schemas the layout tables of docs/rocketmq-spec-notes.md show
#: (python -m mqserver.layoutdoc).
DOC_SCHEMAS = {
    "FRAME": FRAME,
    "ROCKETMQ_HEADER": ROCKETMQ_HEADER,
    "EXT_FIELD": EXT_FIELD,
    "BATCH_MESSAGE": BATCH_MESSAGE,
}

# -- precompiled structs for the hot path, derived from the schemas above -----------

_PREFIX = layout(FRAME_PREFIX)
_BINARY_HEAD = layout(ROCKETMQ_HEADER, prefix=True)
_BATCH_HEAD = layout(BATCH_MESSAGE, prefix=True)

#: length, (serialize_type << SERIALIZE_TYPE_SHIFT) | header_length
FRAME_PREFIX_STRUCT = _PREFIX.struct
#: The frame length prefix alone; also reads the type/length word that follows it.
LENGTH_STRUCT = _PREFIX.field_struct("length")
#: Bytes a frame's length prefix counts before the header: the type/length word.
WORD_SIZE = _PREFIX.size - LENGTH_STRUCT.size
#: Where the serialize type byte is, from the start of the frame.
SERIALIZE_TYPE_OFFSET = _PREFIX.offset("serialize_type")
SERIALIZE_TYPE_SHIFT = _PREFIX.bits["serialize_type"][0]
# the header length shares a 32-bit word with the type byte
MAX_HEADER_LENGTH = _PREFIX.bits["header_length"][1]
#: code, language, version, opaque, flag, remark length
BINARY_HEADER_FIXED = _BINARY_HEAD.struct
#: The extFields length and each value length (i32), and each key length (i16).
INT32_STRUCT = _BINARY_HEAD.field_struct("remark.length")
INT16_STRUCT = layout(EXT_FIELD, prefix=True).field_struct("key.length")
#: total size, magic, body crc, flag, body length
BATCH_MESSAGE_HEAD = _BATCH_HEAD.struct
#: The fixed bytes of one batch message: its head plus the properties length (the last
#: field of BATCH_MESSAGE, an i16 prefix).
BATCH_MESSAGE_HEAD_SIZE = (
    BATCH_MESSAGE_HEAD.size + layout(Struct(BATCH_MESSAGE.subcons[-1]), prefix=True).size
)


def pack_frame_prefix(serialize_type: int, header_length: int, body_length: int) -> bytes:
    """Return the 8-byte frame prefix for a header and body of the given sizes."""
    return FRAME_PREFIX_STRUCT.pack(
        WORD_SIZE + header_length + body_length,
        (serialize_type << SERIALIZE_TYPE_SHIFT) | header_length,
    )
