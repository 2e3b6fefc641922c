"""Byte layouts of the smss protocol, as the smss server reads and writes them.

The ``construct`` schemas below are the single written definition of every smss
format we handle: the 20-byte request header (section 3), the 10-byte response
header and its variants (section 4), the message record (section 5), the pushed
batch record (section 7.3) and the binlog record (section 11.4).  They are
used by tests, tools and anything that is not performance critical.

Hot paths (the request decoder, the publish validation walk, the batch encoder)
use the precompiled ``struct.Struct`` objects at the end of this module instead;
they, the header sizes and the offsets ``_push.c`` is configured with are derived
from the schemas at import (``mqserver.layout``), so no layout is written twice.

All integers are little-endian.  This module has no Twisted imports.
"""

import struct

from construct import (
    Adapter,
    Array,
    Bytes,
    Check,
    Const,
    FixedSized,
    GreedyBytes,
    Int8ul,
    Int16ul,
    Int32ul,
    Int64sl,
    Padding,
    Prefixed,
    Rebuild,
    Struct,
    Switch,
    Tell,
    len_,
    this,
)

from mqserver.layout import layout

# -- command codes (section 2) ------------------------------------------------

CMD_SUB = 0
CMD_PUB = 1
CMD_CREATE = 2
CMD_DELETE = 3
CMD_DELAY = 16
CMD_ALIVE = 17
CMD_REPLICA = 64
#: The traceId of a REPLICA from an mqserver follower that confirms what it holds: an
#: mqserver master answers it with an empty block and reads REPLICA frames as
#: confirmations; the reference server only logs a traceId and drops what a slave sends.
CONFIRM_TRACE = b"mqserver-confirm/1"
CMD_TOPIC_INFO = 65
CMD_VALID_LIST = 99
CMD_LIST = 100
CMD_DELAY_APPLY = 101  # binlog record type only; refused from the network
#: ours: the binlog block of an epoch record, sent only to mqserver followers (those that
#: confirm what they hold); a reference smss slave is not sent it and sees its eventId
#: missing from the stream
CMD_EPOCH = 102
#: ours: the master's commit point (the block's eventId: every write up to it is
#: acknowledged), sent only to mqserver followers of a master with synchronous
#: replication, which show their consumers only what it covers; no record of the log
CMD_COMMIT = 103

# -- response status codes (section 4) -----------------------------------------

STATUS_OK = 200
STATUS_ALIVE = 201
STATUS_SUBEND = 255
STATUS_ERR = 400

# -- ack values (section 7.4) ----------------------------------------------------

ACK_NEXT = 0
ACK_END = 1

# -- request header (section 3) ---------------------------------------------------

#: Bytes 3..18 of a PUB or DELAY header: the payload length, then reserved zeros.
PUB_ARGS = Struct("payload_len" / Int32ul * "P: payload bytes after topic and trace", Padding(12))

#: Bytes 3..18 of a SUB header: batch size, ack-timeout flag, reserved zeros.
SUB_ARGS = Struct(
    "batch" / Int8ul * "messages per pushed batch (0 = 1)",
    "ack_flag" / Int8ul * "1: an ack timeout follows the eventId",
    Padding(14),
)


def _request_header(args):
    """The 20-byte request header with C{args} as its bytes 3..18."""
    return Struct(
        "code" / Int8ul * "command code (section 2)",
        "topic_len" / Int16ul * "N: topic bytes after the header",
        "args" / args,
        "trace_len" / Int8ul * "T: traceId bytes after the topic",
    )


#: The request header of PUB and DELAY (and the shape the decoder reads every
#: command's header in: the u32 at offset 3 is its argument).
PUB_REQUEST_HEADER = _request_header(PUB_ARGS)
#: The request header of SUB.
SUB_REQUEST_HEADER = _request_header(SUB_ARGS)

#: The 20-byte request header; ``args`` depends on the command code.
REQUEST_HEADER = Struct(
    "code" / Int8ul,
    "topic_len" / Int16ul,
    "args"
    / Switch(
        this.code,
        {CMD_PUB: PUB_ARGS, CMD_DELAY: PUB_ARGS, CMD_SUB: SUB_ARGS},
        default=Bytes(16),
    ),
    "trace_len" / Int8ul,
)

# -- response headers (section 4) --------------------------------------------------

#: A header with nothing but a status: OK for simple commands, ALIVE, SUBEND.
STATUS_HEADER = Struct("status" / Int16ul * "200 OK, 201 ALIVE, 255 SUBEND", Padding(8))

#: OK for TOPIC INFO / LIST / VALID LIST: JSON body length at offset 2.
OK_JSON_HEADER = Struct(
    "status" / Const(STATUS_OK, Int16ul),
    "body_len" / Int32ul * "JSON bytes after the header (0: none)",
    Padding(4),
)

#: OK header of one SUB push batch: count at byte 2, body length at offset 4.
BATCH_HEADER = Struct(
    "status" / Const(STATUS_OK, Int16ul),
    "count" / Int8ul * "records in the batch",
    Padding(1),
    "body_len" / Int32ul * "bytes of records after the header",
    Padding(2),
)

#: ERR header: u16 text length at offset 2, text follows.
ERR_HEADER = Struct(
    "status" / Const(STATUS_ERR, Int16ul),
    "text_len" / Int16ul * "error text bytes after the header",
    Padding(6),
)

#: OK header of one REPLICA frame plus the u32 block length that follows it.
REPLICA_FRAME_HEADER = Struct(
    "status" / Const(STATUS_OK, Int16ul),
    Padding(8),
    "block_len" / Int32ul * "B: binlog record bytes that follow",
)

#: Complete frames, header plus body, for tests and tools.
ERR_FRAME = Struct(
    "status" / Const(STATUS_ERR, Int16ul),
    "text_len" / Rebuild(Int16ul, len_(this.text)),
    Padding(6),
    "text" / Bytes(this.text_len),
)
OK_JSON_FRAME = Struct(
    "status" / Const(STATUS_OK, Int16ul),
    "body_len" / Rebuild(Int32ul, len_(this.body)),
    Padding(4),
    "body" / Bytes(this.body_len),
)

# -- message record (section 5) ------------------------------------------------------

#: One header of a message: ``keyLen u32 | key | valLen u32 | value``.
MESSAGE_HEADER = Struct(
    "key" / Prefixed(Int32ul, GreedyBytes), "value" / Prefixed(Int32ul, GreedyBytes)
)


def _record_size(ctx):
    """S of a message record being built: header bytes plus body bytes."""
    header_bytes = sum(8 + len(h["key"]) + len(h["value"]) for h in ctx.headers)
    return header_bytes + len(ctx.body)


#: One message record: S (bytes after the first 8), H, H headers, then the body.
#: A header list that runs past S fails the Check instead of eating the next record.
MESSAGE_RECORD = Struct(
    "size" / Rebuild(Int32ul, _record_size) * "S: bytes after these 8 (headers + body)",
    "header_count" / Rebuild(Int32ul, len_(this.headers)) * "H: number of headers",
    "_headers_start" / Tell,
    "headers" / Array(this.header_count, MESSAGE_HEADER),
    "_headers_end" / Tell,
    Check(this._headers_end - this._headers_start <= this.size),
    "body" / Bytes(this.size - (this._headers_end - this._headers_start))
    * "the rest of S",
)

# -- pushed batch (section 7.3) ---------------------------------------------------------

#: One record of a SUB push batch: 32-byte prefix then the stored message record.
PUSHED_RECORD = Struct(
    "ts" / Int64sl * "store time, ms",
    "event_id" / Int64sl,
    "next_file_id" / Int64sl * "mqserver: the queue id",
    "next_pos" / Int64sl * "mqserver: the queue offset after the record",
    "message" / MESSAGE_RECORD,
)

#: A whole push batch frame: BATCH_HEADER fields then ``count`` records filling body_len.
PUSHED_BATCH = Struct(
    "status" / Const(STATUS_OK, Int16ul),
    "count" / Rebuild(Int8ul, len_(this.records)),
    Padding(1),
    "body_len" / Int32ul,
    Padding(2),
    "records" / FixedSized(this.body_len, Array(this.count, PUSHED_RECORD)),
)

# -- binlog record (section 11.4) ---------------------------------------------------------

_CMD_LINE_FIELDS = (
    "write_time",
    "cmd",
    "event_id",
    "timestamp",
    "topic",
    "payload_len",
)


class _BinlogCmdLine(Adapter):
    """The tab-separated ASCII command line of a binlog record, as named fields."""

    def _decode(self, obj, context, path):
        if not obj.endswith(b"\n"):
            raise ValueError("binlog command line must end in a newline")
        parts = obj[:-1].split(b"\t")
        if len(parts) != len(_CMD_LINE_FIELDS):
            raise ValueError("binlog command line needs 6 tab-separated fields")
        values = {
            name: int(part)
            for name, part in zip(_CMD_LINE_FIELDS, parts)
            if name != "topic"
        }
        values["topic"] = parts[4]
        return dict(values)

    def _encode(self, obj, context, path):
        return encode_binlog_cmd_line(**obj)


def encode_binlog_cmd_line(write_time, cmd, event_id, timestamp, topic, payload_len):
    """Return the ASCII command line of a binlog record, final newline included."""
    if isinstance(topic, str):
        topic = topic.encode()
    head = b"%d\t%d\t%d\t%d\t" % (write_time, cmd, event_id, timestamp)
    return head + topic + b"\t%d\n" % payload_len


#: One binlog record (= one REPLICA block). ``payload`` includes its trailing ``\n``
#: and is empty when payload_len is 0 (DELETE).
BINLOG_RECORD = Struct(
    "cmd_len"
    / Rebuild(Int32ul, lambda ctx: len(encode_binlog_cmd_line(**ctx.cmd_line))),
    "cmd_line" / _BinlogCmdLine(Bytes(this.cmd_len)),
    "payload" / Bytes(this.cmd_line["payload_len"]),
)

#: The raw payload of a CREATE (2) binlog record: expireAt; mqserver may add JSON after it.
BINLOG_CREATE = Struct("expire_at" / Int64sl * "ms, 0 = never", "more" / GreedyBytes)

#: The raw payload of a DELAY (16) or DelayApply (101) binlog record: the delay's trigger
#: time and eventId, then its messages (section 5 records).
BINLOG_DELAY = Struct(
    "trigger_time" / Int64sl * "ms",
    "delay_event_id" / Int64sl * "the DELAY record's eventId",
    "messages" / GreedyBytes,
)

#: The schemas the layout tables of docs/smss.md show (python -m mqserver.layoutdoc).
DOC_SCHEMAS = {
    "PUB_REQUEST_HEADER": PUB_REQUEST_HEADER,
    "SUB_REQUEST_HEADER": SUB_REQUEST_HEADER,
    "STATUS_HEADER": STATUS_HEADER,
    "OK_JSON_HEADER": OK_JSON_HEADER,
    "ERR_HEADER": ERR_HEADER,
    "BATCH_HEADER": BATCH_HEADER,
    "REPLICA_FRAME_HEADER": REPLICA_FRAME_HEADER,
    "MESSAGE_RECORD": MESSAGE_RECORD,
    "MESSAGE_HEADER": MESSAGE_HEADER,
    "PUSHED_RECORD": PUSHED_RECORD,
    "BINLOG_CREATE": BINLOG_CREATE,
    "BINLOG_DELAY": BINLOG_DELAY,
}

# -- precompiled struct fast paths ------------------------------------------------------
# Derived from the construct schemas above at import; tests also build and parse the
# same values with both and assert byte-for-byte equality.

_PUB_REQUEST = layout(PUB_REQUEST_HEADER)
_PUSHED_HEAD = layout(PUSHED_RECORD, prefix=True)

#: PUB_REQUEST_HEADER: (code, topic_len, payload_len, trace_len).
#: For SUB the u32 holds batch (low byte) and ack flag (next byte); see SUB_REQUEST_HEADER.
REQUEST_HEADER_STRUCT = _PUB_REQUEST.struct
_SUB_REQUEST = layout(SUB_REQUEST_HEADER)
#: SUB_REQUEST_HEADER: (code, topic_len, batch, ack_flag, trace_len).
SUB_REQUEST_HEADER_STRUCT = _SUB_REQUEST.struct
#: Offsets of the SUB header's fields (dotted names: "args.batch", "args.ack_flag").
SUB_HEADER_OFFSETS = {f.name: f.offset for f in _SUB_REQUEST.fields if f.name}
#: STATUS_HEADER: (status,).
STATUS_HEADER_STRUCT = layout(STATUS_HEADER).struct
#: OK_JSON_HEADER: (status, body_len).
OK_JSON_HEADER_STRUCT = layout(OK_JSON_HEADER).struct
#: BATCH_HEADER: (status, count, body_len).
BATCH_HEADER_STRUCT = layout(BATCH_HEADER).struct
#: ERR_HEADER: (status, text_len).
ERR_HEADER_STRUCT = layout(ERR_HEADER).struct
#: REPLICA_FRAME_HEADER: (status, block_len).
REPLICA_FRAME_HEADER_STRUCT = layout(REPLICA_FRAME_HEADER).struct
#: Where a REPLICA frame header's block length sits (for C{_feed.c}).
REPLICA_FRAME_LENGTH_AT = layout(REPLICA_FRAME_HEADER).offset("block_len")
_MESSAGE_PREFIX = layout(MESSAGE_RECORD, prefix=True)
#: First 8 bytes of MESSAGE_RECORD: (size, header_count).
MESSAGE_PREFIX_STRUCT = _MESSAGE_PREFIX.struct
#: First 32 bytes of PUSHED_RECORD: (ts, event_id, next_file_id, next_pos).
PUSHED_PREFIX_STRUCT = _PUSHED_HEAD.select("ts", "event_id", "next_file_id", "next_pos")
#: PUSHED_RECORD up to and including S and H: (ts, event_id, next_file_id, next_pos, S, H).
PUSHED_RECORD_HEAD_STRUCT = _PUSHED_HEAD.struct

#: BINLOG_CREATE's expireAt: (expire_at,).
BINLOG_CREATE_STRUCT = layout(BINLOG_CREATE, prefix=True).struct
#: BINLOG_DELAY up to its messages: (trigger_time, delay_event_id).
BINLOG_DELAY_STRUCT = layout(BINLOG_DELAY, prefix=True).struct

REQUEST_HEADER_SIZE = _PUB_REQUEST.size
RESPONSE_HEADER_SIZE = STATUS_HEADER_STRUCT.size
MESSAGE_PREFIX_SIZE = MESSAGE_PREFIX_STRUCT.size
PUSHED_PREFIX_SIZE = PUSHED_PREFIX_STRUCT.size

#: (offset, size) of code, topic_len, payload_len and trace_len in the PUB request
#: header, and of S and H in a message record's prefix: what C{_pub.c} reads.
PUB_HEADER_SPANS = tuple((_PUB_REQUEST.offset(n), _PUB_REQUEST.field_size(n))
                         for n in ("code", "topic_len", "args.payload_len", "trace_len"))
MESSAGE_PREFIX_SPANS = tuple((_MESSAGE_PREFIX.offset(n), _MESSAGE_PREFIX.field_size(n))
                             for n in ("size", "header_count"))
# _pub.c reads these fields little-endian, as the schemas write them.
assert _PUB_REQUEST.order == "<" and _MESSAGE_PREFIX.order == "<"

#: Where C{_push.c} writes each field of a pushed record's head (see views.py), in the
#: order of PUSHED_RECORD_HEAD_STRUCT: ts, event_id, next_file_id, next_pos, S, H.
PUSHED_HEAD_OFFSETS = tuple(_PUSHED_HEAD.offset(name) for name in _PUSHED_HEAD.names)
# _push.c writes every byte of the head through these fields: a pad byte would be left
# unwritten, so the schema must have none.
assert all(f.kind != "pad" for f in _PUSHED_HEAD.fields), "pushed record head has padding"

#: Single fields: status / ack value, lengths, and 8-byte ids, times and timeouts.
U16 = struct.Struct("<H")
U32 = struct.Struct("<I")
I64 = struct.Struct("<q")
