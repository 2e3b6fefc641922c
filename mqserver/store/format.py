"""The on-disk formats of the store: commit-log records, consume-queue entries, and the
encoding of message lists inside admin records.

This module is the single written definition of those formats. It imports only the
standard library and construct, so the Spark audit job can ship it to executors without
Twisted. ``RECORD`` (construct) documents and parses a record on cold paths;
``HEADER`` (``struct``) packs and unpacks the fixed part on hot paths, and
``tests/unit/test_store_format.py`` checks that both agree byte for byte.

Record layout (big-endian, the SmartGo/RocketMQ 4.x CommitLog layout of seed 000 §1.3)::

     0 TotalSize        i32   whole record, these 4 bytes included
     4 MagicCode        u32   MESSAGE_MAGIC, ADMIN_MAGIC, or BLANK_MAGIC (end of segment)
     8 BodyCRC          u32   crc32(body) & 0x7fffffff, as RocketMQ's UtilAll.crc32
    12 QueueId          i32   -1 on admin records
    16 Flag             i32   message flag; the admin operation on admin records
    20 QueueOffset      i64   index of the message in its consume queue; -1 on admin
    28 PhysicalOffset   i64   commit-log offset of this record
    36 SysFlag          i32   RocketMQ MessageSysFlag bits
    40 BornTimestamp    i64   ms
    48 BornHost         8     IPv4 (4) + port (i32)
    56 StoreTimestamp   i64   ms
    64 StoreHost        8     IPv4 (4) + port (i32)
    72 ReconsumeTimes   i32
    76 EventId          i64   RocketMQ's PreparedTransactionOffset slot: the global eventId
    84 BodyLength       i32
    88 Body             BodyLength bytes
       TopicLength      u8
       Topic            TopicLength bytes (UTF-8)
       PropertiesLength u16
       Properties       RocketMQ properties string: key 0x01 value 0x02 ...

A BLANK record is only its first 8 bytes: TotalSize is the space left in the segment and
the reader moves on to the next segment.
"""

import operator
import struct
import zlib

from construct import (
    Bytes,
    Const,
    Int8ub,
    Int16ub,
    Int32sb,
    Int32ub,
    Int64sb,
    PascalString,
    Prefixed,
    Struct,
    GreedyBytes,

)

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

HEADER = struct.Struct(">iIIiiqqiq8sq8siqi")
HEADER_SIZE = HEADER.size  # 88
BLANK = struct.Struct(">iI")
BLANK_SIZE = BLANK.size
#: Offsets of single fields, for reading one without unpacking the whole header.
OFF_TOTAL_SIZE = 0
OFF_QUEUE_ID = 12
OFF_QUEUE_OFFSET = 20
OFF_PHYSICAL_OFFSET = 28
OFF_SYS_FLAG = 36
OFF_STORE_TS = 56
OFF_EVENT_ID = 76
OFF_BODY_LEN = 84
I64 = struct.Struct(">q")
I32 = struct.Struct(">i")
EVENT_AND_BODYLEN = struct.Struct(">qi")  # at OFF_EVENT_ID

#: Only what a delivery needs: QueueId, QueueOffset, SysFlag, StoreTimestamp, EventId,
#: BodyLength (the other header fields are skipped with pad bytes).
DELIVERY_FIELDS = struct.Struct(">12xi4xq8xi16xq12xqi")
#: What a channel delivery needs: TotalSize, QueueId, QueueOffset, PhysicalOffset,
#: StoreTimestamp, EventId, BodyLength (other header fields skipped with pad bytes).
CHANNEL_FIELDS = struct.Struct(">i8xi4xqq4x8x8xq8x4xqi")
CQ_ENTRY = struct.Struct(">qiq")  # commit-log offset, size, tag hash
CQ_ENTRY_SIZE = CQ_ENTRY.size  # 20

NO_HOST = b"\x00" * 8

RECORD = Struct(
    "total_size" / Int32sb,
    "magic" / Int32ub,
    "body_crc" / Int32ub,
    "queue_id" / Int32sb,
    "flag" / Int32sb,
    "queue_offset" / Int64sb,
    "physical_offset" / Int64sb,
    "sys_flag" / Int32sb,
    "born_timestamp" / Int64sb,
    "born_host" / Bytes(8),
    "store_timestamp" / Int64sb,
    "store_host" / Bytes(8),
    "reconsume_times" / Int32sb,
    "event_id" / Int64sb,
    "body" / Prefixed(Int32sb, GreedyBytes),
    "topic" / PascalString(Int8ub, "utf8"),
    "properties" / Prefixed(Int16ub, GreedyBytes),
)
"""The whole record (message or admin); see the module docstring."""

CQ_ENTRY_SCHEMA = Struct(
    "offset" / Int64sb,
    "size" / Int32sb,
    "tag_hash" / Int64sb,
)
"""One 20-byte consume-queue entry."""

BLANK_SCHEMA = Struct("total_size" / Int32sb, "magic" / Const(BLANK_MAGIC, Int32ub))
"""The end-of-segment marker."""

MAX_TOPIC_BYTES = 255
MAX_PROPERTIES_BYTES = 0xFFFF


def body_crc(body):
    """Return the stored CRC of C{body}: CRC32 masked to 31 bits, as RocketMQ computes it."""
    return zlib.crc32(body) & 0x7FFFFFFF


def record_size(body_len, topic_len, props_len):
    """Return the size of a record with bodies of the given lengths."""
    return HEADER_SIZE + body_len + 1 + topic_len + 2 + props_len


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
    total = HEADER_SIZE + len(body) + 3 + len(topic) + len(properties)
    return b"".join(
        (
            HEADER.pack(
                total,
                magic,
                zlib.crc32(body) & 0x7FFFFFFF,
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
            bytes((len(topic),)),
            topic,
            len(properties).to_bytes(2, "big"),
            properties,
        )
    )


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
        tlen = buf[p]
        self.topic = bytes(buf[p + 1 : p + 1 + tlen]).decode("utf-8")
        p += 1 + tlen
        plen = int.from_bytes(buf[p : p + 2], "big")
        self.properties = bytes(buf[p + 2 : p + 2 + plen])

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


MIN_RECORD_SIZE = HEADER_SIZE + 3
_RECORD_MAGICS = (MESSAGE_MAGIC, ADMIN_MAGIC)
_MAGIC_BYTES = (MESSAGE_MAGIC.to_bytes(4, "big"), ADMIN_MAGIC.to_bytes(4, "big"))


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
        p = data.find(magic, 5)
        while p != -1:
            if header_plausible(data, p - 4, base):
                if best is None or p - 4 < best:
                    best = p - 4
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
    if check_crc and zlib.crc32(memoryview(buf)[b0 : b0 + blen]) & 0x7FFFFFFF != crc:
        return "body CRC mismatch"
    return None


_SIZE_MAGIC_CRC = struct.Struct(">iII")


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
    framing is damaged). A torn record still raises.

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
        if size < HEADER_SIZE + 3:
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
            return
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


def java_string_hash(s):
    """Return Java's String.hashCode of C{s} as a signed 32-bit int.

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


def tag_hash_of(properties):
    """Return the consume-queue tag hash of a message: Java hashCode of its TAGS property,
    or 0 when it has none (RocketMQ's rule for untagged messages)."""
    if b"TAGS\x01" not in properties:
        return 0
    for k, v in decode_properties(properties):
        if k == b"TAGS":
            return java_string_hash(v.decode("utf-8", "replace"))
    return 0


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

_MSG_ITEM = struct.Struct(">iiii")  # flag, sys_flag, reconsume, body_len


def encode_message_list(messages):
    """Encode C{messages} (objects with flag, sys_flag, reconsume_times, body, properties)
    for the body of a DELAY admin record."""
    out = [I32.pack(len(messages))]
    for m in messages:
        out.append(
            _MSG_ITEM.pack(m.flag, m.sys_flag, m.reconsume_times, len(m.body))
        )
        out.append(bytes(m.body))
        out.append(len(m.properties).to_bytes(2, "big"))
        out.append(m.properties)
    return b"".join(out)


def decode_message_list(buf, pos=0):
    """Decode what L{encode_message_list} wrote: a list of tuples
    C{(flag, sys_flag, reconsume_times, body, properties)}."""
    (count,) = I32.unpack_from(buf, pos)
    pos += 4
    out = []
    for _ in range(count):
        flag, sys_flag, reconsume, blen = _MSG_ITEM.unpack_from(buf, pos)
        pos += _MSG_ITEM.size
        body = bytes(buf[pos : pos + blen])
        pos += blen
        plen = int.from_bytes(buf[pos : pos + 2], "big")
        props = bytes(buf[pos + 2 : pos + 2 + plen])
        pos += 2 + plen
        out.append((flag, sys_flag, reconsume, body, props))
    return out


DELAY_PREFIX = struct.Struct(">q")  # trigger time, ms; the message list follows

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
# Header (40 bytes): BeginTimestamp i64, EndTimestamp i64, BeginPhyOffset i64,
# EndPhyOffset i64, HashSlotCount i32, IndexCount i32. Then the slot table (i32 per slot:
# the number of the newest entry whose key hashes there, 0 = empty), then the entries
# (20 bytes each): KeyHash i32, PhyOffset i64, TimeDiff i32 (seconds since
# BeginTimestamp), NextIndexOffset i32 (the previous entry of the same slot, 0 = end).
# Entry numbers start at 1. The indexed key is ``topic#key``; KeyHash is the absolute
# value of its Java String.hashCode (0 for Integer.MIN_VALUE).

INDEX_HEADER = struct.Struct(">qqqqii")
INDEX_HEADER_SIZE = INDEX_HEADER.size  # 40
INDEX_SLOT = struct.Struct(">i")
INDEX_ENTRY = struct.Struct(">iqii")
INDEX_ENTRY_SIZE = INDEX_ENTRY.size  # 20


def index_key_hash(topic, key):
    """Return the IndexFile KeyHash of C{key} in C{topic}."""
    h = java_string_hash(f"{topic}#{key}")
    return 0 if h == -(1 << 31) else abs(h)


def index_file_size(slots, entries):
    """Return the size of an index file with C{slots} slots and room for C{entries}."""
    return INDEX_HEADER_SIZE + slots * INDEX_SLOT.size + entries * INDEX_ENTRY_SIZE
