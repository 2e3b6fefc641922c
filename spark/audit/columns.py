"""Decode the records of one byte range in bulk into Arrow batches (executor side).

L{spark.audit.scan.walk} finds where the records start; everything else is done on whole
columns with numpy: the fixed header is gathered into an C{(n, HEADER_SIZE)} matrix and
read through a big-endian structured dtype (derived from the format's schema), the inner
lengths and physical offsets are checked at once, topics are gathered into one Arrow
string array. Per record, only C calls run in Python loops: C{zlib.crc32} over the body
slice (the body CRC) and C{zlib.crc32}/C{zlib.adler32} over the record with its physical
offset and store host zeroed (the digest the comparison with a slave matches on).
Properties are parsed only for the records that have any; admin records (a handful) go
through L{mqserver.store.format.RecordView}.

test-case-name: tests.spark.test_ranges
"""

import json
import zlib

import numpy as np
import pyarrow as pa

from mqserver.store import format as fmt
from spark.audit import records as rec

try:
    from mqserver.store.native import crc32s as _crc32s
except ImportError:  # the zip shipped to a cluster (spark.audit.package) holds no C code
    _crc32s = None

_TYPES = {"string": pa.string(), "bigint": pa.int64(), "int": pa.int32(), "boolean": pa.bool_()}
#: The items' Arrow schema (L{spark.audit.records.ITEM_DDL}).
ITEM_SCHEMA = pa.schema([(c.split()[0], _TYPES[c.split()[1]]) for c in rec.ITEM_DDL.split(", ")])
#: Consume-queue entries (L{spark.audit.records.CQ_DDL}).
CQ_SCHEMA = pa.schema([(c.split()[0], _TYPES[c.split()[1]]) for c in rec.CQ_DDL.split(", ")])

#: Record headers and consume-queue entries as numpy records, from the format's schemas
#: (named as the audit's columns and RecordView name them).


def _dtype(layout, rename):
    """A numpy structured dtype of C{layout}'s fields (C{rename}: schema name -> ours)."""
    def kind(f):
        if f.kind == "bytes":
            return f"V{f.size}"
        return layout.order + ("i" if f.kind[0] == "s" else "u") + str(f.size)

    return np.dtype([(rename.get(f.name, f.name), kind(f)) for f in layout.fields])


_HEADER = _dtype(fmt.HEADER_LAYOUT, {
    "total_size": "size", "body_crc": "crc", "physical_offset": "offset",
    "born_timestamp": "born_ts", "store_timestamp": "store_ts", "body_length": "body_len"})
_CQ = _dtype(fmt.CQ_LAYOUT, {"offset": "log_offset"})
#: Bytes left out of the digest: the physical offset and the store host (they may differ
#: between a master and a slave holding the same record).
_DIGEST_HOLES = np.r_[tuple(
    slice(at, at + size)
    for at, size in ((fmt.HEADER_LAYOUT.offset(n), fmt.HEADER_LAYOUT.field_size(n))
                     for n in ("physical_offset", "store_host")))]
#: The keys of a message's delay properties, as they stand in its properties string.
_DELAY_ID_KEY, _LEVEL_KEY = fmt.DELAY_PROPERTY + b"\x01", b"DELAY\x01"


class Layout:
    """Where the parts of C{n} records lie in a buffer: header fields and the positions
    of topic and properties, all numpy arrays (positions relative to the buffer)."""

    def __init__(self, arr, rel):
        self.rel = rel
        self.h = np.frombuffer(_headers(arr, rel), dtype=_HEADER)
        size = self.h["size"].astype(np.int64)
        bl = self.h["body_len"].astype(np.int64)
        ok = (bl >= 0) & (fmt.HEADER_SIZE + bl + 3 <= size)
        t = rel + fmt.HEADER_SIZE + np.where(ok, bl, 0)
        tlen = arr[t].astype(np.int64)
        ok &= fmt.HEADER_SIZE + bl + 3 + tlen <= size
        p = np.where(ok, t + 1 + tlen, rel)
        plen = arr[p].astype(np.int64) * 256 + arr[p + 1]
        self.inner_ok = ok & (fmt.HEADER_SIZE + bl + 3 + tlen + plen == size)
        self.size, self.body_len, self.topic_at, self.topic_len = size, bl, t + 1, tlen
        self.props_at, self.props_len = p + 2, plen


def _headers(arr, rel):
    """The C{HEADER_SIZE} bytes at each of C{rel}, concatenated: one gather over a
    window view of the buffer (no copy until the gather), for records of any sizes. (A
    join of one slice per record cost about 1.2 us a record on interleaved records.)"""
    if not len(rel):
        return b""
    windows = np.lib.stride_tricks.sliding_window_view(arr, fmt.HEADER_SIZE)
    return windows[rel].tobytes()


def first_invalid(layout, positions, seg_start, arr=None):
    """Return the index of the first record whose inner lengths or physical offset are
    wrong, with its L{fmt.scan_buffer} detail, or C{(None, None)}. With C{arr} (the
    buffer the layout's positions are in), also of the first message whose header names
    what the broker never writes (L{spark.audit.records.header_damage}, here on whole columns)."""
    phys_ok = layout.h["offset"] == seg_start + positions
    bad = ~(layout.inner_ok & phys_ok)
    named = np.zeros(len(bad), dtype=bool) if arr is None else header_damage(layout, arr, ~bad)
    bad |= named
    if not bad.any():
        return None, None
    i = int(np.argmax(bad))
    if not layout.inner_ok[i]:
        return i, "inner lengths disagree with size"
    if named[i]:
        return i, rec.header_damage(arr, int(layout.rel[i]))
    return i, f"physical offset {int(layout.h['offset'][i])}"


_TOPIC_FORBIDDEN = np.zeros(256, dtype=bool)
_TOPIC_FORBIDDEN[list(rec.TOPIC_FORBIDDEN)] = True


def header_damage(layout, arr, check):
    """True for each message of C{layout} (among those C{check}ed, whose inner lengths
    are sound) whose header L{spark.audit.records.header_damage} finds damaged, on whole columns: only
    topics with bytes beyond ASCII (rare) are checked one by one."""
    is_msg = check & (layout.h["magic"] == fmt.MESSAGE_MAGIC)
    qid = layout.h["queue_id"].astype(np.int64)
    out = is_msg & ((qid < 0) | (qid >= rec.MAX_QUEUES) | (layout.topic_len == 0))
    m = np.nonzero(is_msg & ~out)[0]
    if not len(m):
        return out
    at, lengths = layout.topic_at[m], layout.topic_len[m]
    starts = np.r_[0, np.cumsum(lengths)[:-1]]
    idx = np.repeat(at - starts, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)
    raw = arr[idx]
    bad = np.logical_or.reduceat(_TOPIC_FORBIDDEN[raw], starts) | (raw[starts] == ord("."))
    high = np.logical_or.reduceat(raw >= 0x80, starts) & ~bad
    for j in np.nonzero(high)[0]:
        bad[j] = rec.header_damage(arr, int(layout.rel[m[j]])) is not None
    out[m] = bad
    return out


def _gather_strings(arr, at, lengths):
    """An Arrow string array of C{arr[at[i]:at[i]+lengths[i]]} for each i."""
    n = len(at)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    idx = np.repeat(at - offsets[:-1], lengths) + np.arange(total, dtype=np.int64)
    data = arr[idx] if total else np.zeros(0, dtype=np.uint8)
    binary = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data.tobytes())])
    try:
        return binary.cast(pa.string())
    except pa.ArrowInvalid:  # not UTF-8: the broker never writes such a topic name
        return pa.array([bytes(x).decode("utf-8", "replace") for x in binary.to_pylist()], pa.string())


def _body_crcs(buf, start, length):
    """The CRC-32 of each span C{buf[start[i]:start[i] + length[i]]}, as int64s: in C
    where the store's speedups are built (C{mqserver.store.native.crc32s})."""
    if _crc32s is not None:
        spans = (np.ascontiguousarray(start, dtype=np.int64), np.ascontiguousarray(length, dtype=np.int64))
        return np.frombuffer(_crc32s(buf, *spans), dtype=np.uint32).astype(np.int64)
    mv = memoryview(buf)
    try:
        return np.fromiter(
            map(zlib.crc32, map(mv.__getitem__, map(slice, start.tolist(), (start + length).tolist()))),
            dtype=np.int64, count=len(start),
        )  # fmt: skip
    finally:
        mv.release()


def _digests(arr, buf, rel, size):
    """Signed 64-bit digests of the records at C{rel} (physical offset and store host
    left out): CRC-32 in the high half, Adler-32 in the low half."""
    arr[(rel[:, None] + _DIGEST_HOLES).ravel()] = 0
    mv = memoryview(buf)
    try:
        slices = list(map(mv.__getitem__, map(slice, rel.tolist(), (rel + size).tolist())))
        hi = np.fromiter(map(zlib.crc32, slices), dtype=np.uint64, count=len(rel))
        lo = np.fromiter(map(zlib.adler32, slices), dtype=np.uint64, count=len(rel))
        del slices
    finally:
        mv.release()
    return ((hi << np.uint64(32)) | lo).view(np.int64)


def _message_props(buf, layout, idx):
    """tag_hash, delay_id, delay_level of the messages C{idx} that have properties."""
    tag = np.zeros(len(idx), dtype=np.int64)
    delay_id = [None] * len(idx)
    level = [None] * len(idx)
    at, ln = layout.props_at[idx].tolist(), layout.props_len[idx].tolist()
    tag_hash_of, delay_key, level_key = fmt.tag_hash_of, _DELAY_ID_KEY, _LEVEL_KEY
    for j, (s, n) in enumerate(zip(at, ln)):
        props = buf[s : s + n]
        # tag_hash_of is 0 without a TAGS item (the C speedup finds that at once)
        t = tag_hash_of(props)
        if t:
            tag[j] = t
        if delay_key in props or level_key in props:
            delay_id[j], level[j] = rec._property_fields(bytes(props))
    return tag, delay_id, level


def _admin_fields(buf, rel):
    """trigger_ms, delay_count, expire_at of an admin record (as in records.record_item)."""
    view = fmt.RecordView(buf, rel)
    body_len = len(view.body)
    if view.flag == fmt.OP_DELAY and body_len >= fmt.DELAY_PREFIX.size + 4:
        (trigger,) = fmt.DELAY_PREFIX.unpack_from(view.body, 0)
        (count,) = fmt.I32.unpack_from(view.body, fmt.DELAY_PREFIX.size)
        return trigger, count, None
    if view.flag in (fmt.OP_CREATE, fmt.OP_UPDATE):
        try:
            return None, None, int(json.loads(bytes(view.body)).get("expireAt", 0))
        except (ValueError, AttributeError, TypeError):
            return None, None, None
    return None, None, None


def record_batch(buf, layout, seg_start, range_start, digest=True):
    """Return the Arrow batch of C{"record"} items for the records of C{layout}.

    C{buf} is left unchanged; the digest zeroes two fields in a copy of each record."""
    h, n = layout.h, len(layout.rel)
    arr = np.frombuffer(buf, dtype=np.uint8)
    is_msg = h["magic"] == fmt.MESSAGE_MAGIC
    crc = _body_crcs(buf, layout.rel + fmt.HEADER_SIZE, layout.body_len)
    crc_ok = (crc & fmt.CRC_MASK) == h["crc"].astype(np.int64)
    if digest:  # only a comparison with another directory needs it
        lo = int(layout.rel.min()) if n else 0
        copy = arr[lo : int((layout.rel + layout.size).max()) if n else 0].copy()
        digest = pa.array(_digests(copy, copy, layout.rel - lo, layout.size))
    else:
        digest = None
    tag = np.zeros(n, dtype=np.int64)
    delay_id = pa.nulls(n, pa.int64())
    level = pa.nulls(n, pa.int32())
    with_props = np.nonzero(is_msg & (layout.props_len > 0))[0]
    if len(with_props):
        t, d, lv = _message_props(buf, layout, with_props)
        tag[with_props] = t
        if any(x is not None for x in d) or any(x is not None for x in lv):
            dl, ll = [None] * n, [None] * n
            for j, i in enumerate(with_props.tolist()):
                dl[i], ll[i] = d[j], lv[j]
            delay_id, level = pa.array(dl, pa.int64()), pa.array(ll, pa.int32())
    trigger = count = expire = None
    admins = np.nonzero(~is_msg)[0]
    if len(admins):
        tl, cl, el = [None] * n, [None] * n, [None] * n
        for i in admins.tolist():
            tl[i], cl[i], el[i] = _admin_fields(buf, int(layout.rel[i]))
        trigger, count, expire = pa.array(tl, pa.int64()), pa.array(cl, pa.int32()), pa.array(el, pa.int64())
    cols = {
        "kind": pa.array(np.full(n, "record", dtype=object), pa.string()),
        "segment": pa.array(np.full(n, seg_start, dtype=np.int64)),
        "offset": pa.array(h["offset"].astype(np.int64)),
        "size": pa.array(layout.size.astype(np.int32)),
        "magic": pa.array(np.where(is_msg, "message", "admin").astype(object), pa.string()),
        "event_id": pa.array(h["event_id"].astype(np.int64)),
        "topic": _gather_strings(arr, layout.topic_at, layout.topic_len),
        "queue_id": pa.array(h["queue_id"].astype(np.int32)),
        "queue_offset": pa.array(h["queue_offset"].astype(np.int64)),
        "flag": pa.array(h["flag"].astype(np.int32)),
        "sys_flag": pa.array(h["sys_flag"].astype(np.int32)),
        "born_ts": pa.array(h["born_ts"].astype(np.int64)),
        "store_ts": pa.array(h["store_ts"].astype(np.int64)),
        "body_len": pa.array(layout.body_len.astype(np.int32)),
        "crc_ok": pa.array(crc_ok),
        "tag_hash": pa.array(tag),
        "reconsume_times": pa.array(h["reconsume_times"].astype(np.int32)),
        "delay_id": delay_id,
        "delay_level": level,
        "trigger_ms": trigger,
        "delay_count": count,
        "expire_at": expire,
        "digest": digest,
        "range_start": pa.array(np.full(n, range_start, dtype=np.int64)),
    }
    return _batch(cols, n)


def _batch(cols, n):
    arrays = []
    for field in ITEM_SCHEMA:
        a = cols.get(field.name)
        arrays.append(pa.nulls(n, field.type) if a is None else a)
    return pa.RecordBatch.from_arrays(arrays, schema=ITEM_SCHEMA)


def run_batch(event_ids, seg_start, range_start):
    """The eventIds of a range as C{"run"} items: one per run of consecutive eventIds
    (C{event_id} the first, C{run_end} the last, C{seg_records} how many records hold
    them, more than the run's length when some are held twice). A healthy range is one
    run, so gaps and duplicates are found on a table of a few rows per range."""
    uniq, counts = np.unique(event_ids, return_counts=True)
    cut = np.nonzero(np.diff(uniq) != 1)[0] + 1
    first = np.r_[0, cut]
    last = np.r_[cut - 1, len(uniq) - 1]
    n = len(first)
    return _batch({
        "kind": pa.array(["run"] * n, pa.string()),
        "segment": pa.array(np.full(n, seg_start, dtype=np.int64)),
        "event_id": pa.array(uniq[first]),
        "run_end": pa.array(uniq[last]),
        "seg_records": pa.array(np.add.reduceat(counts, first).astype(np.int32)),
        "range_start": pa.array(np.full(n, range_start, dtype=np.int64)),
    }, n)  # fmt: skip


def single_item(**fields):
    """A one-row batch of any other item (problem, range summary)."""
    return _batch({k: pa.array([v], ITEM_SCHEMA.field(k).type) for k, v in fields.items()}, 1)


def cq_batch(path, content):
    """The consume-queue entries of one file as an Arrow batch (C{CQ_SCHEMA}): the same
    rows as L{spark.audit.records.decode_cq_file}, decoded in bulk."""
    loc = rec.cq_location(path)
    if loc is None:
        return pa.RecordBatch.from_pylist(
            [dict(zip(CQ_SCHEMA.names, (None, None, None, None, len(content), None, f"not a consume-queue file: {path}")))],
            schema=CQ_SCHEMA,
        )  # fmt: skip
    topic, qid, first = loc
    n = len(content) // fmt.CQ_ENTRY_SIZE
    e = np.frombuffer(content, dtype=_CQ, count=n)
    off, size, tag = e["log_offset"].astype(np.int64), e["size"].astype(np.int32), e["tag_hash"].astype(np.int64)
    keep = np.nonzero((off != 0) | (size != 0) | (tag != 0))[0]
    m = len(keep)
    extra = 1 if len(content) % fmt.CQ_ENTRY_SIZE else 0
    tail = np.zeros(extra, dtype=np.int64)
    mask = np.r_[np.zeros(m, dtype=bool), np.ones(extra, dtype=bool)]
    torn_size = np.full(extra, len(content) % fmt.CQ_ENTRY_SIZE, dtype=np.int32)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([topic] * (m + extra), pa.string()),
            pa.array(np.full(m + extra, qid, dtype=np.int32)),
            pa.array(np.concatenate([first + keep, tail + first + n]).astype(np.int64)),
            pa.array(np.concatenate([off[keep], tail]), mask=mask),
            pa.array(np.concatenate([size[keep], torn_size])),
            pa.array(np.concatenate([tag[keep], tail]), mask=mask),
            pa.array([None] * m + ["cq_torn"] * extra, pa.string()),
        ],
        schema=CQ_SCHEMA,
    )


# -- the compact form: partial aggregates instead of one row per record -----------------

#: Consume-queue entries per signature block (the same in L{spark.audit.transforms}).
CQ_BLOCK = 4096
_MIX1, _MIX2, _GOLDEN = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


def _mix(z):
    z = z ^ (z >> np.uint64(30))
    z = z * _MIX1
    z = z ^ (z >> np.uint64(27))
    z = z * _MIX2
    return z ^ (z >> np.uint64(31))


def entry_hash(queue_offset, log_offset, size, tag_hash):
    """A 64-bit hash of consume-queue entries (arrays), split into its low and high 32
    bits (two int64 arrays, so sums of millions cannot overflow). Records and entries
    are hashed alike: equal sums per block mean equal entries (L{cq_compact_file})."""
    with np.errstate(over="ignore"):
        h = _mix(np.asarray(queue_offset, dtype=np.int64).view(np.uint64) + _GOLDEN)
        for v in (log_offset, size, tag_hash):
            h = _mix(h ^ np.asarray(v, dtype=np.int64).view(np.uint64))
    return (h & np.uint64(0xFFFFFFFF)).astype(np.int64), (h >> np.uint64(32)).astype(np.int64)


def _agg_batch(kind, table, seg_start, range_start, rename):
    n = table.num_rows
    cols = {"kind": pa.array([kind] * n, pa.string()), "segment": pa.array(np.full(n, seg_start, dtype=np.int64)),
            "range_start": pa.array(np.full(n, range_start, dtype=np.int64))}  # fmt: skip
    for src, dst in rename.items():
        cols[dst] = table.column(src).combine_chunks().cast(ITEM_SCHEMA.field(dst).type)
    return _batch(cols, n)


def _live_mask(topics, event_id, live):
    """True for the messages of a live topic written since its current incarnation."""
    import pyarrow.compute as pc

    names = list(live)
    if not names:
        return np.zeros(len(event_id), dtype=bool)
    idx = pc.index_in(topics, value_set=pa.array(names, pa.string())).to_numpy(zero_copy_only=False)
    known = ~np.isnan(idx) if idx.dtype.kind == "f" else idx >= 0
    idx = np.where(known, np.nan_to_num(idx), 0).astype(np.int64)
    floors = np.array([live[t] for t in names], dtype=np.int64)
    return known & (event_id >= floors[idx])


def compact_batches(buf, layout, seg_start, range_start, live):
    """The compact items of the records of C{layout}: the few records the checks need
    one by one (admin records, CRC failures) as C{"record"} items, and partial
    aggregates of the messages: C{"fired"} per topic and delay (the messages a delay
    published, C{delay_id} and their count C{n}), C{"qstat"} per topic and queue,
    C{"minute"} per topic and minute of store time (with the sum and largest store lag,
    C{store_ts - born_ts}), C{"sig"} per topic, queue and block of C{CQ_BLOCK} queue
    offsets (signatures of the entries the consume queues must hold, for the messages
    of the topics C{live}, C{{topic: create_event_id}})."""
    h, n = layout.h, len(layout.rel)
    if not n:
        return
    arr = np.frombuffer(buf, dtype=np.uint8)
    is_msg = h["magic"] == fmt.MESSAGE_MAGIC
    crc = _body_crcs(buf, layout.rel + fmt.HEADER_SIZE, layout.body_len)
    crc_ok = (crc & 0x7FFFFFFF) == h["crc"].astype(np.int64)
    tag = np.zeros(n, dtype=np.int64)
    has_delay = np.zeros(n, dtype=bool)
    has_level = np.zeros(n, dtype=bool)
    delay_id = np.zeros(n, dtype=np.int64)
    with_props = np.nonzero(is_msg & (layout.props_len > 0))[0]
    if len(with_props):
        t, d, lv = _message_props(buf, layout, with_props)
        tag[with_props] = t
        has_delay[with_props] = [x is not None for x in d]
        has_level[with_props] = [x is not None for x in lv]
        delay_id[with_props] = [x or 0 for x in d]
    notable = np.nonzero(~is_msg | ~crc_ok)[0]
    if len(notable):
        yield record_batch(buf, _sub_layout(layout, notable), seg_start, range_start, digest=False)
    m = np.nonzero(is_msg)[0]
    if not len(m):
        return
    topics = _gather_strings(arr, layout.topic_at[m], layout.topic_len[m])
    # A delay's messages are only counted (per delay, T.delays): one row per delay and
    # range instead of one per message. (A message whose CRC fails is a record above.)
    fired = np.nonzero((crc_ok & has_delay)[m])[0]
    if len(fired):
        f = pa.table({"topic": topics.take(pa.array(fired)), "delay_id": delay_id[m][fired]})
        f = f.group_by(["topic", "delay_id"]).aggregate([("delay_id", "count")])
        yield _agg_batch("fired", f, seg_start, range_start,
                         {"topic": "topic", "delay_id": "delay_id", "delay_id_count": "n"})  # fmt: skip
    ts = h["store_ts"][m].astype(np.int64)
    eid = h["event_id"][m].astype(np.int64)
    qo = h["queue_offset"][m].astype(np.int64)
    size = layout.size[m]
    t = pa.table({
        "topic": topics, "queue_id": h["queue_id"][m].astype(np.int32), "size": size,
        "body": layout.body_len[m], "ts": ts, "eid": eid, "qo": qo,
        "level": has_level[m].astype(np.int64), "delay": has_delay[m].astype(np.int64),
        "minute": ts - np.fmod(ts, 60000),  # Spark's % keeps the dividend's sign, as fmod
        "lag": ts - h["born_ts"][m].astype(np.int64),
    })  # fmt: skip
    q = t.group_by(["topic", "queue_id"]).aggregate([
        ("size", "count"), ("size", "sum"), ("body", "sum"), ("ts", "min"), ("ts", "max"), ("eid", "min"),
        ("eid", "max"), ("qo", "min"), ("qo", "max"), ("level", "sum"), ("delay", "sum"),
    ])  # fmt: skip
    yield _agg_batch("qstat", q, seg_start, range_start, {
        "topic": "topic", "queue_id": "queue_id", "size_count": "n", "size_sum": "sum_size", "body_sum": "sum_body",
        "ts_min": "min_ts", "ts_max": "max_ts", "eid_min": "min_eid", "eid_max": "max_eid", "qo_min": "min_qo",
        "qo_max": "max_qo", "level_sum": "n_level", "delay_sum": "n_delay",
    })  # fmt: skip
    per_min = t.group_by(["topic", "minute"]).aggregate([("size", "count"), ("size", "sum"), ("lag", "sum"),
                                                          ("lag", "max")])  # fmt: skip
    yield _agg_batch("minute", per_min, seg_start, range_start, {"topic": "topic", "minute": "key", "size_count": "n",
                     "size_sum": "sum_size", "lag_sum": "lag_sum", "lag_max": "lag_max"})  # fmt: skip
    keep = _live_mask(topics, eid, live)
    if keep.any():
        k = np.nonzero(keep)[0]
        lo, hi = entry_hash(qo[k], h["offset"][m][k], size[k], tag[m][k])
        s = pa.table({"topic": topics.take(pa.array(k)), "queue_id": t.column("queue_id").take(pa.array(k)),
                      "block": np.floor_divide(qo[k], CQ_BLOCK), "lo": lo, "hi": hi})  # fmt: skip
        s = s.group_by(["topic", "queue_id", "block"]).aggregate([("lo", "count"), ("lo", "sum"), ("hi", "sum")])
        yield _agg_batch("sig", s, seg_start, range_start, {"topic": "topic", "queue_id": "queue_id", "block": "key",
                                                             "lo_count": "n", "lo_sum": "sig_lo", "hi_sum": "sig_hi"})


def _sub_layout(layout, idx):
    """The L{Layout} of the records C{idx} of C{layout}, without decoding them again."""
    sub = Layout.__new__(Layout)
    sub.rel, sub.h = layout.rel[idx], layout.h[idx]
    for name in ("size", "body_len", "topic_at", "topic_len", "props_at", "props_len", "inner_ok"):
        setattr(sub, name, getattr(layout, name)[idx])
    return sub


CQ_COMPACT_SCHEMA = pa.schema([(c.split()[0], _TYPES[c.split()[1]]) for c in rec.CQ_COMPACT_DDL.split(", ")])


def cq_compact_file(path, content, durable=None, limit=None):
    """The compact form (C{CQ_COMPACT_SCHEMA}) of one consume-queue file: its problems
    (a torn tail, a name that is not a consume queue's) as C{CQ_SCHEMA} rows, and per
    block of C{CQ_BLOCK} offsets one row: entries, largest offset, signature
    (L{entry_hash}). A block that spans two files gives a row in each; the checks sum
    them (L{spark.audit.compact.differing_blocks}).

    With C{durable} (C{{(topic, queue_id): length}}) and C{limit} (a log offset), only
    the entries a checkpoint made durable are kept, as the job's C{--live} does (and
    the problems of files no durable queue names are left out).

    One file is one queue, so the entries stay numpy columns throughout: no string per
    entry and no group-by (it cost 3.8 CPU s for the 7.2M entries of a 2 GiB log,
    against about 1 s like this; bench/audit_bench.py)."""
    loc = rec.cq_location(path)
    if loc is None:
        if durable is not None:
            return _compact_rows([])
        return _compact_rows([(None, None, None, None, len(content), None, f"not a consume-queue file: {path}")])
    topic, qid, first = loc
    n = len(content) // fmt.CQ_ENTRY_SIZE
    e = np.frombuffer(content, dtype=_CQ, count=n)
    off, size, tag = e["log_offset"].astype(np.int64), e["size"].astype(np.int64), e["tag_hash"].astype(np.int64)
    qo = np.arange(first, first + n, dtype=np.int64)
    keep = (off != 0) | (size != 0) | (tag != 0)
    cap = None
    if durable is not None:
        cap = durable.get((topic, qid), -1)
        keep &= (qo < cap) & (off < limit)
    rows = []
    torn = len(content) % fmt.CQ_ENTRY_SIZE
    if torn and (cap is None or first + n < cap):
        rows.append((topic, qid, first + n, None, torn, None, "cq_torn"))
    out = _compact_rows(rows)
    idx = np.flatnonzero(keep)
    if not len(idx):
        return out
    qo, off, size, tag = qo[idx], off[idx], size[idx], tag[idx]
    lo, hi = entry_hash(qo, off, size, tag)
    key = qo // CQ_BLOCK
    starts = np.r_[0, np.flatnonzero(np.diff(key)) + 1]
    ends = np.r_[starts[1:], len(key)] - 1
    k = len(starts)
    nulls = pa.nulls(k, pa.int64())
    sig = pa.RecordBatch.from_arrays([
        pa.array([topic] * k, pa.string()), pa.array(np.full(k, qid, dtype=np.int32)), pa.array(qo[ends]),
        nulls, pa.nulls(k, pa.int32()), nulls, pa.nulls(k, pa.string()), pa.array(key[starts]),
        pa.array(ends - starts + 1), pa.array(np.add.reduceat(lo, starts)), pa.array(np.add.reduceat(hi, starts)),
    ], schema=CQ_COMPACT_SCHEMA)  # fmt: skip
    return pa.concat_tables([out, pa.Table.from_batches([sig])]) if rows else pa.Table.from_batches([sig])


#: What a capped task (L{spark.audit.ranges.capped}) sends last when it left rows out:
#: an item of this kind, or a consume-queue row with this problem.
OVERFLOW = "overflow"


def cq_overflow(n):
    """The one row a capped consume-queue task ends with when it left rows out
    (L{spark.audit.ranges.capped}): C{n} the rows it made, its problem L{OVERFLOW}."""
    return pa.RecordBatch.from_pylist([{"problem": OVERFLOW, "n": n}], schema=CQ_COMPACT_SCHEMA)


def _compact_rows(rows):
    """C{CQ_SCHEMA} tuples as a C{CQ_COMPACT_SCHEMA} table (no block columns)."""
    cols = list(zip(*rows)) if rows else [()] * len(CQ_SCHEMA)
    arrays = [pa.array(list(c), f.type) for c, f in zip(cols, CQ_SCHEMA)]
    arrays += [pa.nulls(len(rows), pa.int64())] * 4
    return pa.Table.from_arrays(arrays, schema=CQ_COMPACT_SCHEMA)
