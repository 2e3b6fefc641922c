"""Decode commit-log segments and consume-queue files into plain tuples, on executors.

Everything here is plain Python over bytes: it imports L{mqserver.store.format} (which
needs only construct, struct and zlib) and the standard library, never Twisted and never
pyspark, so it runs in a Spark Python worker and in a unit test alike. The job turns the
tuples into DataFrames with the DDL schemas below.

A segment becomes a stream of I{items}, one tuple each, told apart by their first field:

- C{"record"}: one message or admin record. CRC failures stay here (with C{crc_ok}
  false) so their eventIds still count; the transforms list them as problems too.
- C{"problem"}: a record that cannot be read (C{"corrupt"}: bad magic, bad sizes, wrong
  physical offset; C{"torn"}: the file ends inside it). C{size} is the number of bytes
  that could not be read: the rest of the segment, which the broker skips as well.
- C{"segment"}: one per file: its start, length, record count, where the records end,
  and whether a BLANK record sealed it (and the segment size that BLANK implies).

test-case-name: tests.unit.test_audit_records
"""

import hashlib
import json
import zlib
from urllib.parse import unquote

from mqserver.store import format as fmt

#: The columns of an item (see the module docstring), as a Spark DDL schema.
ITEM_DDL = ", ".join(
    [
        "kind string",
        "segment bigint",
        "offset bigint",
        "size int",
        "magic string",
        "event_id bigint",
        "topic string",
        "queue_id int",
        "queue_offset bigint",
        "flag int",
        "sys_flag int",
        "born_ts bigint",
        "store_ts bigint",
        "body_len int",
        "crc_ok boolean",
        "tag_hash bigint",
        "reconsume_times int",
        "delay_id bigint",
        "delay_level int",
        "trigger_ms bigint",
        "delay_count int",
        "expire_at bigint",
        "digest bigint",
        "problem string",
        "detail string",
        "seg_records int",
        "seg_end bigint",
        "seg_sealed boolean",
        "seg_declared_size bigint",
        "range_start bigint",
        "range_end bigint",
        "range_first bigint",
        "run_end bigint",
        # Partial aggregates of a range (kinds "qstat", "minute", "sig", "fired"; see
        # spark.audit.columns.compact_batches): per queue, per minute, per block of
        # consume-queue entries, per delay.
        "key bigint",
        "n bigint",
        "sum_size bigint",
        "sum_body bigint",
        "min_ts bigint",
        "max_ts bigint",
        "min_eid bigint",
        "max_eid bigint",
        "min_qo bigint",
        "max_qo bigint",
        "n_level bigint",
        "n_delay bigint",
        "sig_lo bigint",
        "sig_hi bigint",
        # store lag (store_ts - born_ts) per minute: sum and largest (kind "minute")
        "lag_sum bigint",
        "lag_max bigint",
    ]
)

#: One consume-queue entry, or a problem with a consume-queue file (C{problem} set).
CQ_DDL = (
    "topic string, queue_id int, queue_offset bigint, log_offset bigint, size int,"
    " tag_hash bigint, problem string"
)
#: The compact form of the consume queues: C{CQ_DDL} rows for problems, and one row per
#: block of entries of a queue (C{n} set: entries, C{queue_offset} the block's largest,
#: C{sig_lo}/C{sig_hi} the signature; see L{spark.audit.columns.cq_compact_file}).
CQ_COMPACT_DDL = CQ_DDL + ", key bigint, n bigint, sig_lo bigint, sig_hi bigint"

_N_ITEM = ITEM_DDL.count(",") + 1
_DELAY_KEY = fmt.DELAY_PROPERTY
_LEVEL_KEY = b"DELAY"
MAGIC_NAMES = {fmt.MESSAGE_MAGIC: "message", fmt.ADMIN_MAGIC: "admin"}


def file_name(path):
    """Return the last component of a Spark C{path} column (a URI), percent-decoded."""
    return unquote(path.rstrip("/").rsplit("/", 1)[-1])


def digest(buf, pos, size):
    """Return a signed 64-bit digest of the record at C{buf[pos:pos+size]}, leaving out
    the two fields that may differ between a master and a slave holding the same record:
    its physical offset (bytes 28..36) and the store host (bytes 64..72)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(buf[pos : pos + 28])
    h.update(buf[pos + 36 : pos + 64])
    h.update(buf[pos + 72 : pos + size])
    return int.from_bytes(h.digest(), "big", signed=True)


def _item(kind, segment, offset, size, **fields):
    row = [None] * _N_ITEM
    row[0], row[1], row[2], row[3] = kind, segment, offset, size
    for name, value in fields.items():
        row[_INDEX[name]] = value
    return tuple(row)


_INDEX = {c.split()[0]: i for i, c in enumerate(ITEM_DDL.split(", "))}


def _property_fields(props):
    """Return (delay_id, delay_level) from a properties string (None when absent)."""
    delay_id = level = None
    if _DELAY_KEY in props or _LEVEL_KEY in props:
        for k, v in fmt.decode_properties(props):
            try:
                if k == _DELAY_KEY:
                    delay_id = fmt.parse_delay_marker(v)[0]
                elif k == _LEVEL_KEY:
                    level = int(v)
            except ValueError:
                pass
    return delay_id, level


def record_item(buf, pos, view, segment):
    """Return the C{"record"} item of C{view}, which starts at C{buf[pos]}."""
    props = view.properties
    body_len = len(view.body)
    delay_id = level = trigger = count = expire = None
    tag_hash = 0
    if view.magic == fmt.MESSAGE_MAGIC:
        delay_id, level = _property_fields(props)
        tag_hash = fmt.tag_hash_of(props)
    elif view.flag == fmt.OP_DELAY and body_len >= fmt.DELAY_PREFIX.size + 4:
        (trigger,) = fmt.DELAY_PREFIX.unpack_from(view.body, 0)
        (count,) = fmt.I32.unpack_from(view.body, fmt.DELAY_PREFIX.size)
    elif view.flag in (fmt.OP_CREATE, fmt.OP_UPDATE):
        try:
            expire = int(json.loads(bytes(view.body)).get("expireAt", 0))
        except (ValueError, AttributeError, TypeError):
            expire = None
    return (
        "record", segment, view.offset, view.size,
        MAGIC_NAMES[view.magic], view.event_id, view.topic, view.queue_id,
        view.queue_offset, view.flag, view.sys_flag, view.born_ts, view.store_ts,
        body_len, view.crc_ok(), tag_hash, view.reconsume_times,
        delay_id, level, trigger, count, expire,
        digest(buf, pos, view.size),
        None, None, None, None, None, None, None, None, None, None,
    )  # fmt: skip


#: What a topic name never holds (L{mqserver.broker.topics.validate_topic_name}: it is
#: a directory name too), and the queue count a topic never reaches
#: (L{mqserver.broker.topics.MAX_QUEUES}). The executors do not import the broker, so
#: the two rules are restated here.
TOPIC_FORBIDDEN = b" \t\r\n/\\\x00"
MAX_QUEUES = 1024


def header_damage(buf, r):
    """Return why the header of the message record at C{buf[r:]} (its framing sound)
    cannot be what the broker wrote, or None: a queue id outside C{0..MAX_QUEUES-1}, or
    a topic that is empty, starts with a dot, holds a forbidden byte or is not UTF-8. No
    CRC covers the header, so such a record's topic and queue must not be believed."""
    (qid,) = fmt.I32.unpack_from(buf, r + fmt.OFF_QUEUE_ID)
    (body_len,) = fmt.I32.unpack_from(buf, r + fmt.OFF_BODY_LEN)
    t = r + fmt.HEADER_SIZE + body_len
    n = int(buf[t])
    topic = bytes(buf[t + 1 : t + 1 + n])
    ok = 0 <= qid < MAX_QUEUES and topic[:1] not in (b"", b".")
    ok = ok and not any(c in TOPIC_FORBIDDEN for c in topic)
    if ok:
        try:
            topic.decode("utf-8")
        except UnicodeDecodeError:
            ok = False
    if ok:
        return None
    return f"damaged header: queue {qid} of topic {topic.decode('utf-8', 'replace')!r}"


def decode_segment(path, content):
    """Yield the items of one commit-log segment file (see the module docstring).

    @param path: the file's path or URI; its name is the segment's start offset.
    @param content: the file's bytes.
    """
    name = file_name(path)
    if len(name) != 20 or not name.isdigit():
        yield _item("problem", None, None, len(content), problem="corrupt",
                    detail=f"not a segment name: {name}")  # fmt: skip
        return
    start = int(name)
    buf = memoryview(content)
    end = len(buf)
    pos = 0
    count = 0
    sealed = False
    declared = None
    last_eid = None
    while True:
        try:
            for offset, view in fmt.scan_buffer(buf, start, pos, check_crc=False):
                at = offset - start
                damaged = header_damage(buf, at) if view.magic == fmt.MESSAGE_MAGIC else None
                if damaged:
                    raise fmt.ScanError(offset, "corrupt", damaged)
                yield record_item(buf, at, view, start)
                count += 1
                last_eid = view.event_id
                pos = at + view.size
        except fmt.ScanError as e:
            # Step over the damage to the next sound record, as recovery does.
            at = e.offset - start
            detail = e.detail
            if detail == "unreadable topic":  # the format's word for a topic not UTF-8
                detail = header_damage(buf, at) or detail
            nxt = _resync(buf, at, start)
            if nxt is None:
                pos = at
                yield _item("problem", start, e.offset, end - at, problem=e.kind, detail=detail, min_eid=last_eid)
                break
            (after,) = fmt.I64.unpack_from(buf, nxt + fmt.OFF_EVENT_ID)
            detail = detail if e.kind == "corrupt" else f"bad size ({detail})"
            yield _item("problem", start, e.offset, nxt - at, problem="corrupt", detail=detail,
                        min_eid=last_eid, max_eid=after)  # fmt: skip
            pos = nxt
            continue
        if end - pos >= fmt.BLANK_SIZE:
            size, magic = fmt.BLANK.unpack_from(buf, pos)
            if magic == fmt.BLANK_MAGIC:
                sealed = True
                declared = pos + size
        break
    yield _item(
        "segment", start, start, end, seg_records=count, seg_end=start + pos,
        seg_sealed=sealed, seg_declared_size=declared, sig_lo=zlib.crc32(buf[:pos]),
    )  # fmt: skip


def _resync(buf, at, start):
    """The position of the first sound record after the damage at C{buf[at]}
    (L{fmt.next_record}, then checked whole), or None."""
    search = at
    while True:
        nxt = fmt.next_record(buf, search, start)
        if nxt is None:
            return None
        try:
            for _, view in fmt.scan_buffer(buf, start, nxt, check_crc=False):
                if view.magic != fmt.MESSAGE_MAGIC or header_damage(buf, nxt) is None:
                    return nxt
                break
        except fmt.ScanError:
            pass
        search = nxt


def decode_segments(rows):
    """Decode an iterator of C{(path, content)} pairs (a Spark partition of the
    C{binaryFile} reader) into items."""
    for path, content in rows:
        yield from decode_segment(path, content)


def cq_location(path):
    """Return C{(topic, queue_id, first_entry)} of a consume-queue file from its path
    (``.../<topic>/<queueId>/<20-digit byte offset>``), or None when it is not one."""
    parts = [unquote(p) for p in path.rstrip("/").split("/")]
    if len(parts) < 3:
        return None
    topic, qid, name = parts[-3], parts[-2], parts[-1]
    if not (qid.lstrip("-").isdigit() and len(name) == 20 and name.isdigit()):
        return None
    return topic, int(qid), int(name) // fmt.CQ_ENTRY_SIZE


def decode_cq_file(path, content):
    """Yield the entries of one consume-queue file as C{CQ_DDL} tuples.

    All-zero entries are holes (never written) and are skipped; a trailing partial
    entry is yielded as a C{"cq_torn"} problem."""
    loc = cq_location(path)
    if loc is None:
        yield (None, None, None, None, len(content), None, f"not a consume-queue file: {path}")
        return
    topic, qid, first = loc
    n = len(content) // fmt.CQ_ENTRY_SIZE
    for i, (off, size, tag) in enumerate(fmt.CQ_ENTRY.iter_unpack(content[: n * 20])):
        if off == 0 and size == 0 and tag == 0:
            continue
        yield (topic, qid, first + i, off, size, tag, None)
    if len(content) % fmt.CQ_ENTRY_SIZE:
        yield (topic, qid, first + n, None, len(content) % 20, None, "cq_torn")


def decode_cq_files(rows):
    """Decode an iterator of C{(path, content)} pairs into consume-queue tuples."""
    for path, content in rows:
        yield from decode_cq_file(path, content)
