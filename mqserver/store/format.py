"""The on-disk formats of the store: commit-log records, consume-queue entries, index
files, and the encoding of message lists inside admin records.

This module is the single written definition of those formats: the construct schemas
below (``DOC_SCHEMAS`` lists them). Everything else is derived from them once, at
import, by L{mqserver.layout.layout}: the ``struct`` objects the hot paths run
(``HEADER``, ``CQ_ENTRY``, ``DELIVERY_FIELDS``, ...), the field offsets and sizes
(``OFF_*``, also handed to the C speedups' ``configure()`` by
L{mqserver.store.native}), and the layout tables of ``docs/storage-format.md``
(``python -m mqserver.layoutdoc docs/storage-format.md mqserver.store.format``). The
schemas also parse and build records on cold paths and in tests.

It imports only the standard library, construct and L{mqserver.layout} (which imports
only those), so the Spark audit job can ship it to executors without Twisted. A BLANK record (end of segment) is only the first 8 bytes
of a record: TotalSize is the space left in the segment and the reader moves on to the
next segment.
"""

import operator
import struct
import zlib

from construct import (
    Bytes,
    Const,
    GreedyBytes,
    Int8ub,
    Int16ub,
    Int32sb,
    Int32ub,
    Int64sb,
    PascalString,
    Prefixed,
    Rebuild,
    Struct,
    len_,
    this,
)

from mqserver import speedups
from mqserver.layout import layout

MESSAGE_MAGIC = 0xDAA320A7
BLANK_MAGIC = 0xCBD43194
#: Our own magic for non-message records (topic create/delete, delay): they share the
#: message layout so one scanning loop reads every record, but never reach a consume queue.
ADMIN_MAGIC = 0x6D71AD01

#: Admin operations, stored in the Flag field of an admin record.
OP_CREATE = 1
OP_DELETE = 2
OP_DELAY = 3
OP_UPDATE = 4

#: RocketMQ MessageSysFlag bits we read or write.
SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
#: Our own bit: the body is a whole smss message record (S, H, headers, body) because
#: its headers could not be expressed as RocketMQ properties (binary keys or values).
SYSFLAG_SMSS_FRAMED = 0x10000
#: Our own bit: another message record of the same write (one PUB, MPUB or batch send)
#: follows this one. The replication feed sends a write as one smss binlog PUB record, as
#: smss writes it; the writer sets it, and clears it on what it is given.
SYSFLAG_BATCH_MORE = 0x20000

#: The body CRC is CRC32 masked to 31 bits, as RocketMQ's UtilAll.crc32.
CRC_MASK = 0x7FFFFFFF

# -- the schemas: the one definition ---------------------------------------------------

HOST_SCHEMA = Struct(
    "ipv4" / Bytes(4) * "the address",
    "port" / Int32sb * "the port",
)
"""A host in a record (BornHost, StoreHost), as RocketMQ stores an IPv4 socket address."""

RECORD = Struct(
    "total_size" / Int32sb * "`TotalSize`: the whole record, these 4 bytes included",
    "magic" / Int32ub * (
        f"`MagicCode`: `0x{MESSAGE_MAGIC:08X}` message, `0x{ADMIN_MAGIC:08X}` admin (ours), "
        f"`0x{BLANK_MAGIC:08X}` blank"),
    "body_crc" / Int32ub * f"`BodyCRC`: `crc32(body) & {CRC_MASK:#x}`, as RocketMQ's `UtilAll.crc32`",
    "queue_id" / Int32sb * "`QueueId`: -1 on admin records",
    "flag" / Int32sb * (
        f"`Flag`: the message flag; on admin records the operation ({OP_CREATE} create, "
        f"{OP_DELETE} delete, {OP_DELAY} delay, {OP_UPDATE} update)"),
    "queue_offset" / Int64sb * "`QueueOffset`: the entry index in the consume queue; -1 on admin records",
    "physical_offset" / Int64sb * "`PhysicalOffset`: the record's own commit-log offset",
    "sys_flag" / Int32sb * (
        f"`SysFlag`: RocketMQ bits; `{SYSFLAG_SMSS_FRAMED:#x}` (ours) = body is a whole smss "
        f"message record; `{SYSFLAG_BATCH_MORE:#x}` (ours) = another message record of the "
        "same write follows"),
    "born_timestamp" / Int64sb * "`BornTimestamp`: ms",
    "born_host" / Bytes(HOST_SCHEMA.sizeof()) * "`BornHost`: `HOST_SCHEMA`",
    "store_timestamp" / Int64sb * "`StoreTimestamp`: ms",
    "store_host" / Bytes(HOST_SCHEMA.sizeof()) * "`StoreHost`: the broker's, `HOST_SCHEMA`",
    "reconsume_times" / Int32sb * "`ReconsumeTimes`",
    "event_id" / Int64sb * "**EventId**: in RocketMQ's `PreparedTransactionOffset` slot",
    "body_length" / Rebuild(Int32sb, len_(this.body)) * "`BodyLength`",
    "body" / Bytes(this.body_length) * "`Body`",
    "topic" / PascalString(Int8ub, "utf8") * "`Topic`: UTF-8",
    "properties" / Prefixed(Int16ub, GreedyBytes) * "`Properties`: `key 0x01 value 0x02 ...`",
)
"""A whole record, message or admin (big-endian, the SmartGo/RocketMQ 4.x CommitLog
layout of seed 000 §1.3)."""

BLANK_SCHEMA = Struct(
    "total_size" / Int32sb * "`TotalSize`: the space left in the segment",
    "magic" / Const(BLANK_MAGIC, Int32ub) * f"`MagicCode`: `0x{BLANK_MAGIC:08X}`",
)
"""The end-of-segment marker: the first two fields of a record."""

CQ_ENTRY_SCHEMA = Struct(
    "offset" / Int64sb * "commit-log offset of the record",
    "size" / Int32sb * "record size; 0 for a record whose body failed its CRC at recovery",
    "tag_hash" / Int64sb * "Java `String.hashCode` of the `TAGS` property, 0 when there is none",
)
"""One consume-queue entry."""

DELAYED_MESSAGE = Struct(
    "flag" / Int32sb * "the message flag",
    "sys_flag" / Int32sb * "RocketMQ `SysFlag` bits",
    "reconsume_times" / Int32sb * "`ReconsumeTimes`",
    "body_length" / Rebuild(Int32sb, len_(this.body)),
    "body" / Bytes(this.body_length),
    "properties" / Prefixed(Int16ub, GreedyBytes) * "as in a record",
)
"""One message of the list in the body of a DELAY admin record."""

DELAY_BODY = Struct(
    "trigger_ms" / Int64sb * "when the messages are published, ms",
    "count" / Rebuild(Int32sb, len_(this.messages)) * "how many messages follow",
    "messages" / DELAYED_MESSAGE[this.count] * "the messages, in the order they are published",
)
"""The body of a DELAY admin record."""

INDEX_HEADER_SCHEMA = Struct(
    "begin_timestamp" / Int64sb * "`BeginTimestamp`: store time of the first entry, ms",
    "end_timestamp" / Int64sb * "`EndTimestamp`: store time of the newest entry, ms",
    "begin_phy_offset" / Int64sb * "`BeginPhyOffset`: commit-log offset of the first entry",
    "end_phy_offset" / Int64sb * "`EndPhyOffset`: commit-log offset of the newest entry",
    "hash_slot_count" / Int32sb * "`HashSlotCount`",
    "index_count" / Int32sb * "`IndexCount`: entries written",
)
"""The header of an index file (seed 000 §1.5: RocketMQ's IndexFile)."""

INDEX_SLOT_SCHEMA = Struct(
    "newest" / Int32sb * "number of the newest entry whose key hashes to this slot, 0 = empty",
)
"""One hash slot of an index file; the slot table follows the header."""

INDEX_ENTRY_SCHEMA = Struct(
    "key_hash" / Int32sb * "`KeyHash`: abs(Java `String.hashCode` of `topic#key`), 0 for `Integer.MIN_VALUE`",
    "phy_offset" / Int64sb * "`PhyOffset`: commit-log offset of the record",
    "time_diff" / Int32sb * "`TimeDiff`: seconds since `BeginTimestamp`",
    "next_index_offset" / Int32sb * "`NextIndexOffset`: the previous entry of the same slot, 0 = end",
)
"""One index-file entry; entry numbers start at 1, after the slot table."""

# -- derived once, at import: what the hot paths run -----------------------------------


def _length_prefix(schema, name):
    """Return a C{struct.Struct} of the length field in front of the variable-size field
    C{name} (C{Prefixed}, C{PascalString}) of C{schema}."""
    (field,) = [sc for sc in schema.subcons if sc.name == name]
    return layout(field, prefix=True).struct


#: The fixed part of a record (every field up to BodyLength).
HEADER_LAYOUT = layout(RECORD, prefix=True)
HEADER = HEADER_LAYOUT.struct
HEADER_SIZE = HEADER_LAYOUT.size
BLANK_LAYOUT = layout(BLANK_SCHEMA)
BLANK = BLANK_LAYOUT.struct
BLANK_SIZE = BLANK_LAYOUT.size
#: Offsets of single fields, for reading one without unpacking the whole header.
OFF_TOTAL_SIZE = HEADER_LAYOUT.offset("total_size")
OFF_MAGIC = HEADER_LAYOUT.offset("magic")
OFF_BODY_CRC = HEADER_LAYOUT.offset("body_crc")
OFF_QUEUE_ID = HEADER_LAYOUT.offset("queue_id")
OFF_QUEUE_OFFSET = HEADER_LAYOUT.offset("queue_offset")
OFF_PHYSICAL_OFFSET = HEADER_LAYOUT.offset("physical_offset")
OFF_SYS_FLAG = HEADER_LAYOUT.offset("sys_flag")
OFF_STORE_TS = HEADER_LAYOUT.offset("store_timestamp")
OFF_STORE_HOST = HEADER_LAYOUT.offset("store_host")
OFF_EVENT_ID = HEADER_LAYOUT.offset("event_id")
OFF_BODY_LEN = HEADER_LAYOUT.offset("body_length")
#: Generic big-endian integers, for one field read at its OFF_* (the widths of the
#: fields read this way; tests check them against the schema).
I64 = struct.Struct(">q")
I32 = struct.Struct(">i")
#: The length fields in front of the topic and the properties, after the body.
TOPIC_LEN = _length_prefix(RECORD, "topic")
PROPS_LEN = _length_prefix(RECORD, "properties")
#: The smallest record: empty body, topic and properties.
MIN_RECORD_SIZE = HEADER_SIZE + TOPIC_LEN.size + PROPS_LEN.size

#: Only what a delivery needs: QueueId, QueueOffset, SysFlag, StoreTimestamp, EventId,
#: BodyLength (the other header fields are skipped with pad bytes).
DELIVERY_FIELDS = HEADER_LAYOUT.select(
    "queue_id", "queue_offset", "sys_flag", "store_timestamp", "event_id", "body_length")
#: What a channel delivery needs: TotalSize, QueueId, QueueOffset, PhysicalOffset,
#: StoreTimestamp, EventId, BodyLength (other header fields skipped with pad bytes).
CHANNEL_FIELDS = HEADER_LAYOUT.select(
    "total_size", "queue_id", "queue_offset", "physical_offset", "store_timestamp",
    "event_id", "body_length")
_SIZE_MAGIC_CRC = HEADER_LAYOUT.select("total_size", "magic", "body_crc")

CQ_LAYOUT = layout(CQ_ENTRY_SCHEMA)
CQ_ENTRY = CQ_LAYOUT.struct  # commit-log offset, size, tag hash
CQ_ENTRY_SIZE = CQ_LAYOUT.size

#: A host field: C{HOST.pack(socket.inet_aton(ip), port)}.
HOST = layout(HOST_SCHEMA).struct
NO_HOST = b"\x00" * HOST.size

#: The schemas docs/storage-format.md shows, by the names its tables carry
#: (C{python -m mqserver.layoutdoc docs/storage-format.md mqserver.store.format}).
DOC_SCHEMAS = {
    "RECORD": RECORD,
    "HOST_SCHEMA": HOST_SCHEMA,
    "BLANK_SCHEMA": BLANK_SCHEMA,
    "CQ_ENTRY_SCHEMA": CQ_ENTRY_SCHEMA,
    "DELAY_BODY": DELAY_BODY,
    "DELAYED_MESSAGE": DELAYED_MESSAGE,
    "INDEX_HEADER_SCHEMA": INDEX_HEADER_SCHEMA,
    "INDEX_SLOT_SCHEMA": INDEX_SLOT_SCHEMA,
    "INDEX_ENTRY_SCHEMA": INDEX_ENTRY_SCHEMA,
}

MAX_TOPIC_BYTES = (1 << 8 * TOPIC_LEN.size) - 1
MAX_PROPERTIES_BYTES = (1 << 8 * PROPS_LEN.size) - 1


def body_crc(body):
    """Return the stored CRC of C{body}: CRC32 masked to 31 bits, as RocketMQ computes it."""
    return zlib.crc32(body) & CRC_MASK


def record_size(body_len, topic_len, props_len):
    """Return the size of a record with bodies of the given lengths."""
    return MIN_RECORD_SIZE + body_len + topic_len + props_len


def pack_record(
    *,
    magic,
    queue_id,
    flag,
    queue_offset,
    physical_offset,
    sys_flag,
    born_ts,
    born_host,
    store_ts,
    store_host,
    reconsume_times,
    event_id,
    body,
    topic,
    properties,
):
    """Build one record. C{topic} and C{properties} are bytes; returns bytes."""
    total = MIN_RECORD_SIZE + len(body) + len(topic) + len(properties)
    return b"".join(
        (
            HEADER.pack(
                total,
                magic,
                zlib.crc32(body) & CRC_MASK,
                queue_id,
                flag,
                queue_offset,
                physical_offset,
                sys_flag,
                born_ts,
                born_host,
                store_ts,
                store_host,
                reconsume_times,
                event_id,
                len(body),
            ),
            body,
            TOPIC_LEN.pack(len(topic)),
            topic,
            PROPS_LEN.pack(len(properties)),
            properties,
        )
    )


_TOPIC_LEN_AT, _TOPIC_LEN_SIZE = TOPIC_LEN.unpack_from, TOPIC_LEN.size
_PROPS_LEN_AT, _PROPS_LEN_SIZE = PROPS_LEN.unpack_from, PROPS_LEN.size


class RecordView:
    """The fields of one record, decoded from a buffer without copying the body.

    @ivar offset: the record's commit-log offset.
    @ivar body: a memoryview (or bytes) of the body.
    @ivar topic: the topic as str.
    @ivar properties: the raw properties bytes.
    """

    __slots__ = (
        "size",
        "magic",
        "crc",
        "queue_id",
        "flag",
        "queue_offset",
        "offset",
        "sys_flag",
        "born_ts",
        "born_host",
        "store_ts",
        "store_host",
        "reconsume_times",
        "event_id",
        "body",
        "topic",
        "properties",
    )

    def __init__(self, buf, pos=0):
        (
            self.size,
            self.magic,
            self.crc,
            self.queue_id,
            self.flag,
            self.queue_offset,
            self.offset,
            self.sys_flag,
            self.born_ts,
            self.born_host,
            self.store_ts,
            self.store_host,
            self.reconsume_times,
            self.event_id,
            body_len,
        ) = HEADER.unpack_from(buf, pos)
        p = pos + HEADER_SIZE
        self.body = buf[p : p + body_len]
        p += body_len
        (tlen,) = _TOPIC_LEN_AT(buf, p)
        p += _TOPIC_LEN_SIZE
        self.topic = bytes(buf[p : p + tlen]).decode("utf-8")
        p += tlen
        (plen,) = _PROPS_LEN_AT(buf, p)
        p += _PROPS_LEN_SIZE
        self.properties = bytes(buf[p : p + plen])

    def crc_ok(self):
        """Return True when the stored body CRC matches the body."""
        return body_crc(self.body) == self.crc


class ScanError(Exception):
    """A record in a segment cannot be read.

    @ivar offset: commit-log offset of the bad record.
    @ivar kind: C{"torn"} (the segment ends inside the record) or C{"corrupt"} (bad magic,
        bad length, or a body CRC mismatch).
    """

    def __init__(self, offset, kind, detail):
        super().__init__(f"{kind} record at offset {offset}: {detail}")
        self.offset = offset
        self.kind = kind
        self.detail = detail


#: What L{scan_buffer} tells C{on_damage} of a run of zero bytes where a record should be.
ZEROED = "zero bytes where a record should be"

_RECORD_MAGICS = (MESSAGE_MAGIC, ADMIN_MAGIC)
_MAGIC_BYTES = tuple(HEADER_LAYOUT.field_struct("magic").pack(m) for m in _RECORD_MAGICS)


def header_plausible(buf, pos, base_offset):
    """Return True when C{buf[pos:]} starts with a record header that names its own
    position (C{base_offset + pos}), has a known magic and a size that fits C{buf}: how a
    reader finds the next record after a damaged one."""
    if pos < 0 or len(buf) - pos < HEADER_SIZE:
        return False
    size, magic = BLANK.unpack_from(buf, pos)
    if magic not in _RECORD_MAGICS or size < MIN_RECORD_SIZE or pos + size > len(buf):
        return False
    if I64.unpack_from(buf, pos + OFF_PHYSICAL_OFFSET)[0] != base_offset + pos:
        return False
    blen = I32.unpack_from(buf, pos + OFF_BODY_LEN)[0]
    return 0 <= blen <= size - MIN_RECORD_SIZE


def next_record(buf, pos, base_offset):
    """Return the position of the first plausible record header after C{pos} in C{buf}
    (see L{header_plausible}), or None. Used to step over a record whose framing is
    damaged: its own size cannot be trusted, but every record names its offset."""
    data = bytes(buf[pos:])
    base = base_offset + pos
    best = None
    for magic in _MAGIC_BYTES:
        p = data.find(magic, OFF_MAGIC + 1)  # a record starting after pos
        while p != -1:
            start = p - OFF_MAGIC
            if header_plausible(data, start, base):
                if best is None or start < best:
                    best = start
                break
            p = data.find(magic, p + 1)
    return None if best is None else pos + best


def record_damage(buf, pos, size, check_crc=True):
    """Return why the message record of C{size} bytes at C{buf[pos:]} cannot be served
    (framing, or body CRC when C{check_crc}), or None when it is sound. The check every
    read path makes."""
    if size < MIN_RECORD_SIZE or pos < 0 or pos + size > len(buf):
        return "no record at this entry"
    total, magic, crc = _SIZE_MAGIC_CRC.unpack_from(buf, pos)
    if total != size or magic != MESSAGE_MAGIC:
        return f"bad framing (size {total}, magic {magic:#x})"
    blen = I32.unpack_from(buf, pos + OFF_BODY_LEN)[0]
    if blen < 0 or blen > size - MIN_RECORD_SIZE:
        return f"bad body length {blen}"
    b0 = pos + HEADER_SIZE
    if check_crc and zlib.crc32(memoryview(buf)[b0 : b0 + blen]) & CRC_MASK != crc:
        return "body CRC mismatch"
    return None


def first_damaged(buf, locs, check_crc):
    """Return the index of the first record of C{locs} (C{[(pos, size), ...]} in C{buf})
    that L{record_damage} finds damaged, or -1 (the C speedup C{_check.c} does the same)."""
    for i, (pos, size) in enumerate(locs):
        if record_damage(buf, pos, size, check_crc) is not None:
            return i
    return -1


def scan_buffer(buf, base_offset, pos=0, check_crc=True, on_damage=None):
    """Walk records in C{buf} (one segment's bytes, or a part of it starting at a record).

    Yields C{(offset, RecordView)} for message and admin records. Stops cleanly at the end
    of the buffer, at a BLANK record (end of segment), or at an all-zero tail (space that
    was never written). Raises L{ScanError} for a torn last record or a corrupt one; the
    caller decides whether to truncate (torn tail) or report (corruption).

    With C{on_damage}, a corrupt record does not end the walk: C{on_damage(offset, detail,
    view)} is called (C{view} is the decoded record when only its body CRC is wrong, else
    None) and the walk goes on after it (at the next plausible record header when its
    framing is damaged). A run of zero bytes (8 or more) is damage too (detail
    L{ZEROED}), not the end: the walk goes on at the next plausible record header after
    it, if any. A torn record with no plausible header after it still raises.

    @param base_offset: the commit-log offset of C{buf[0]}.
    """
    end = len(buf)
    if on_damage is not None:
        yield from _scan_skipping(buf, base_offset, pos, on_damage, check_crc)
        return
    while pos < end:
        if end - pos < BLANK_SIZE:
            if not any(buf[pos:end]):
                return
            raise ScanError(base_offset + pos, "torn", "fewer than 8 bytes left")
        size, magic = BLANK.unpack_from(buf, pos)
        if magic == BLANK_MAGIC:
            return
        if size == 0 and magic == 0 and not any(buf[pos : min(end, pos + 4096)]):
            return
        if magic not in (MESSAGE_MAGIC, ADMIN_MAGIC):
            raise ScanError(base_offset + pos, "corrupt", f"bad magic {magic:#x}")
        if size < MIN_RECORD_SIZE:
            raise ScanError(base_offset + pos, "corrupt", f"bad size {size}")
        if pos + size > end:
            raise ScanError(base_offset + pos, "torn", f"size {size} runs past the end")
        try:
            view = RecordView(buf, pos)
        except (UnicodeDecodeError, IndexError, struct.error):
            raise ScanError(base_offset + pos, "corrupt", "unreadable topic") from None
        if record_size(len(view.body), len(view.topic.encode()), len(view.properties)) != size:
            raise ScanError(base_offset + pos, "corrupt", "inner lengths disagree with size")
        if view.offset != base_offset + pos:
            raise ScanError(base_offset + pos, "corrupt", f"physical offset {view.offset}")
        if check_crc and not view.crc_ok():
            raise ScanError(base_offset + pos, "corrupt", "body CRC mismatch")
        yield base_offset + pos, view
        pos += size


def _scan_skipping(buf, base_offset, pos, on_damage, check_crc):
    end = len(buf)
    while pos < end:
        try:
            for off, view in scan_buffer(buf, base_offset, pos, check_crc):
                pos = off - base_offset + view.size
                yield off, view
        except ScanError as e:
            pos = e.offset - base_offset
            if e.kind == "torn":
                # A size field that runs past the end: the end of what was written, or
                # a damaged size with sound records after it.
                nxt = next_record(buf, pos, base_offset)
                if nxt is None:
                    raise
                on_damage(e.offset, f"bad size ({e.detail})", None)
                pos = nxt
                continue
            view = None
            if e.detail == "body CRC mismatch":
                view = RecordView(buf, pos)
                on_damage(e.offset, e.detail, view)
                pos += view.size
                continue
            on_damage(e.offset, e.detail, None)
            nxt = next_record(buf, pos, base_offset)
            if nxt is None:
                return
            pos = nxt
            continue
        # The walk stopped cleanly: at the end, at a BLANK, or at a run of zero bytes.
        if end - pos < BLANK_SIZE or BLANK.unpack_from(buf, pos)[1] == BLANK_MAGIC:
            return
        # Zeros where a record should be (a page the disk never wrote, a file extended
        # by a crash): never taken for the end of the log, so what follows stays
        # reachable and the caller learns of it (recovery cuts it from the last segment).
        on_damage(base_offset + pos, ZEROED, None)
        nxt = next_record(buf, pos, base_offset)
        if nxt is None:
            return
        pos = nxt


# -- properties ------------------------------------------------------------------------

PROP_SEP = b"\x01"
PROP_END = b"\x02"


def encode_properties(pairs):
    """Encode C{pairs} (an iterable of (str|bytes, str|bytes)) as a RocketMQ properties
    string. Returns bytes."""
    out = []
    for k, v in pairs:
        if isinstance(k, str):
            k = k.encode("utf-8")
        if isinstance(v, str):
            v = v.encode("utf-8")
        out.append(k + PROP_SEP + v + PROP_END)
    return b"".join(out)


def decode_properties(data):
    """Decode a RocketMQ properties string into a list of (bytes, bytes) pairs, in order."""
    pairs = []
    for item in bytes(data).split(PROP_END):
        if not item:
            continue
        k, _, v = item.partition(PROP_SEP)
        pairs.append((k, v))
    return pairs


_MASK32 = 0xFFFFFFFF
_HASH_BLOCK = 256
_POW31 = [1]  # _POW31[i] = 31**i mod 2**32
for _ in range(_HASH_BLOCK):
    _POW31.append(_POW31[-1] * 31 & _MASK32)
_POW31_DESC = _POW31[_HASH_BLOCK - 1 :: -1]  # 31**(BLOCK-1) ... 31**0


def java_string_hash_py(s):
    """Return Java's String.hashCode of C{s} as a signed 32-bit int (the reference of
    the C speedup C{_hash.java_string_hash}, which L{java_string_hash} is when built).

    Java hashes UTF-16 code units, so a non-BMP character counts as two (its surrogate
    pair); lone surrogates are hashed as the single unit they are."""
    if not s:
        return 0
    if s.isascii():
        units = s.encode("ascii")  # one byte per UTF-16 unit; bytes iterate as ints
    else:
        data = s.encode("utf-16-be", "surrogatepass")
        units = struct.unpack(f">{len(data) // 2}H", data)
    h = 0
    # sum(unit_i * 31**(n-1-i)) mod 2**32, evaluated block-wise in C instead of per unit
    for start in range(0, len(units), _HASH_BLOCK):
        chunk = units[start : start + _HASH_BLOCK]
        size = len(chunk)
        h = (h * _POW31[size] + sum(map(operator.mul, chunk, _POW31_DESC[_HASH_BLOCK - size :]))) & _MASK32
    return h - 0x100000000 if h & 0x80000000 else h


_hash = speedups.load("mqserver.store._hash")
#: Java's String.hashCode of a str: the C speedup, or L{java_string_hash_py}.
java_string_hash = java_string_hash_py if _hash is None else _hash.java_string_hash


def tag_hash_of_py(properties):
    """Return the consume-queue tag hash of a message: Java hashCode of its TAGS property,
    or 0 when it has none (RocketMQ's rule for untagged messages).

    The property is the first item (as L{decode_properties} splits them) whose key is
    TAGS, found without decoding the others: a SEND pays this for every message. The
    reference of the C speedup C{_hash.tag_hash_of}, which L{tag_hash_of} is when built."""
    data = bytes(properties)
    if data.startswith(b"TAGS\x01"):  # the first item: how the clients write it
        stop = data.find(PROP_END, 5)
        value = data[5:] if stop < 0 else data[5:stop]
        return java_string_hash(value.decode("utf-8", "replace"))
    if b"TAGS\x01" not in data:
        return 0
    end, pos, size = -1, 0, len(data)
    while True:
        at = data.find(b"TAGS", pos)
        if at < 0:
            return 0
        end = at + 4
        # an item's key: at the start or after PROP_END, ended by PROP_SEP, PROP_END or
        # the end of the string
        if (at == 0 or data[at - 1] == 2) and (end == size or data[end] in (1, 2)):
            break
        pos = at + 1
    if end == size or data[end] == 2:
        return 0  # the key without a value: the hash of ""
    stop = data.find(PROP_END, end + 1)
    value = data[end + 1:] if stop < 0 else data[end + 1:stop]
    return java_string_hash(value.decode("utf-8", "replace"))


#: The consume-queue tag hash of a properties string: the C speedup, or L{tag_hash_of_py}.
tag_hash_of = tag_hash_of_py if _hash is None else _hash.tag_hash_of


def properties_safe(pairs):
    """Return True when every key and value can live in a properties string: no 0x01 or
    0x02 byte, non-empty keys, and valid UTF-8 (RocketMQ clients decode it as a String)."""
    for k, v in pairs:
        if not k or b"\x01" in k or b"\x02" in k or b"\x01" in v or b"\x02" in v:
            return False
        try:
            k.decode("utf-8")
            v.decode("utf-8")
        except UnicodeDecodeError:
            return False
    return True


# -- message lists inside admin records ------------------------------------------------

_DELAY_LAYOUT = layout(DELAY_BODY, prefix=True)
#: The start of a DELAY record's body: the trigger time (ms); the message list follows.
DELAY_PREFIX = _DELAY_LAYOUT.select("trigger_ms")
_MSG_COUNT = _DELAY_LAYOUT.field_struct("count")
_MSG_ITEM = layout(DELAYED_MESSAGE, prefix=True).struct  # flag, sys_flag, reconsume, body_len
_MSG_PROPS_LEN = _length_prefix(DELAYED_MESSAGE, "properties")


def encode_message_list(messages):
    """Encode C{messages} (objects with flag, sys_flag, reconsume_times, body, properties)
    for the body of a DELAY admin record."""
    out = [_MSG_COUNT.pack(len(messages))]
    for m in messages:
        out.append(
            _MSG_ITEM.pack(m.flag, m.sys_flag, m.reconsume_times, len(m.body))
        )
        out.append(bytes(m.body))
        out.append(_MSG_PROPS_LEN.pack(len(m.properties)))
        out.append(m.properties)
    return b"".join(out)


def decode_message_list(buf, pos=0):
    """Decode what L{encode_message_list} wrote: a list of tuples
    C{(flag, sys_flag, reconsume_times, body, properties)}."""
    (count,) = _MSG_COUNT.unpack_from(buf, pos)
    pos += _MSG_COUNT.size
    out = []
    for _ in range(count):
        flag, sys_flag, reconsume, blen = _MSG_ITEM.unpack_from(buf, pos)
        pos += _MSG_ITEM.size
        body = bytes(buf[pos : pos + blen])
        pos += blen
        (plen,) = _MSG_PROPS_LEN.unpack_from(buf, pos)
        pos += _MSG_PROPS_LEN.size
        props = bytes(buf[pos : pos + plen])
        pos += plen
        out.append((flag, sys_flag, reconsume, body, props))
    return out


#: Property of a message a delay published when it fired: ``"<delay eventId>:<trigger ms>"``.
#: Recovery uses it to tell a fired delay from a pending one; replication needs the trigger.
DELAY_PROPERTY = b"MQ_DELAY_ID"


def delay_marker(delay_event_id, trigger_ms):
    """Return the value of the DELAY_PROPERTY of a message published by a delay."""
    return b"%d:%d" % (delay_event_id, trigger_ms)


def parse_delay_marker(value):
    """Return (delay eventId, trigger ms) from a DELAY_PROPERTY value (trigger 0 if absent)."""
    eid, _, trigger = bytes(value).partition(b":")
    return int(eid), int(trigger or 0)


def segment_name(start_offset):
    """Return the file name of the segment (or consume-queue file) starting at C{start_offset}."""
    return f"{start_offset:020d}"


# -- index files (seed 000 §1.5: RocketMQ's IndexFile) ---------------------------------
#
# A header (INDEX_HEADER_SCHEMA), the slot table (INDEX_SLOT_SCHEMA per slot), then the
# entries (INDEX_ENTRY_SCHEMA). The indexed key is ``topic#key``.

INDEX_HEADER_LAYOUT = layout(INDEX_HEADER_SCHEMA)
INDEX_SLOT_LAYOUT = layout(INDEX_SLOT_SCHEMA)
INDEX_ENTRY_LAYOUT = layout(INDEX_ENTRY_SCHEMA)
INDEX_HEADER = INDEX_HEADER_LAYOUT.struct
INDEX_HEADER_SIZE = INDEX_HEADER.size
INDEX_SLOT = INDEX_SLOT_LAYOUT.struct
INDEX_ENTRY = INDEX_ENTRY_LAYOUT.struct
INDEX_ENTRY_SIZE = INDEX_ENTRY.size


def index_key_hash_py(topic, key):
    """Return the IndexFile KeyHash of C{key} in C{topic} (str both): the reference of
    the C speedup C{_hash.index_key_hash}, which L{index_key_hash} is when built."""
    h = java_string_hash(f"{topic}#{key}")
    return 0 if h == -(1 << 31) else abs(h)


#: The IndexFile KeyHash of a key in a topic: the C speedup, or L{index_key_hash_py}.
index_key_hash = index_key_hash_py if _hash is None else _hash.index_key_hash


def index_file_size(slots, entries):
    """Return the size of an index file with C{slots} slots and room for C{entries}."""
    return INDEX_HEADER_SIZE + slots * INDEX_SLOT.size + entries * INDEX_ENTRY_SIZE
