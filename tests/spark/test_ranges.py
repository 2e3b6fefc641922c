"""Segments decoded as byte ranges (L{spark.audit.ranges}) against today's
record-by-record decoder (L{spark.audit.records.decode_segment}), the reference: the
same items, damage included, however the segments are split. Plain Python, no Spark."""

import glob
import os

import pytest

from spark.audit import ranges as R
from spark.audit import records as rec
from tests.spark import datadirs as dd

#: Columns the two decoders compute differently by design: the digest (another hash,
#: compared only for equality between directories) and the range bookkeeping.
IGNORED = {"digest", "range_start", "range_end", "range_first"}
NAMES = [c.split()[0] for c in rec.ITEM_DDL.split(", ")]
SPLITS = [1 << 20, 4096, 997, 301]


def _row(get):
    return tuple(get(n) for n in NAMES if n not in IGNORED)


def reference_items(data):
    """Today's decoder over every segment file."""
    out = []
    for path in sorted(glob.glob(os.path.join(data, "commitlog", "*"))):
        with open(path, "rb") as f:
            out += [_row(dict(zip(NAMES, t)).get) for t in rec.decode_segment(path, f.read())]
    return sorted(out, key=repr)


def range_items(data, split):
    """The range decoder, with the driver's consolidation and rewalks, run in-process."""
    files = [(os.path.basename(p), "file://" + p, os.path.getsize(p))
             for p in sorted(glob.glob(os.path.join(data, "commitlog", "*")))]  # fmt: skip
    good, bad = R.segment_files(files)
    tasks = {(t[1], t[3]): t for t in R.plan(good, split)}

    def run(task):
        reader = R.Reader(task[0])
        try:
            return [r for b in R.decode_range(reader.read_at, *task[1:]) for r in b.to_pylist()]
        finally:
            reader.close()

    out = {k: run(t) for k, t in tasks.items()}
    range_items.rewalks = 0
    for _ in range(64):
        segments, keep, rewalk = R.consolidate([r for rows in out.values() for r in rows if r["kind"] == "range"])
        if not rewalk:
            break
        range_items.rewalks += len(rewalk)
        for seg, a, start in rewalk:
            out[(seg, a)] = run(tasks[(seg, a)][:5] + (start, True))
    items = [r for k in keep for r in out[k] if r["kind"] not in ("range", "run")] + segments
    items += [R.bad_name_item(name, n) for name, _, n in bad]
    return sorted((_row(r.get) for r in items), key=repr)


def _same(data):
    ref = reference_items(data)
    assert ref
    for split in SPLITS:
        assert range_items(data, split) == ref, split


@pytest.fixture(params=["c", "python"])
def walk_step(request, monkeypatch):
    """The record walk's step in C (mqserver.store.native.walk) and in Python."""
    from spark.audit import scan

    if request.param == "python":
        monkeypatch.setattr(scan, "_walk", None)
    elif scan._walk is None:
        pytest.skip("the store's C speedups are not built")
    return request.param


def test_clean_broker_directory(broker_dir, walk_step):
    """The broker's own directory decodes to the same items at every split."""
    _same(broker_dir[0])


@pytest.mark.parametrize(
    "damage",
    ["crc", "relabel", "torn", "bad_magic", "bad_size", "physical_offset", "zero_tail", "not_a_segment", "cut",
     "header"],
)
def test_damaged_copies(broker_dir, tmp_path, damage, walk_step):
    """Each kind of damage, anywhere in a segment, gives the reference's items: the
    damaged bytes as one problem, and the records from the next sound one on, whichever
    range holds them."""
    data = dd.copy_dir(broker_dir[0], str(tmp_path / "data"))
    dd.damage(data, damage)
    _same(data)


def _delayed_log(tmp_path):
    """A segment of 300 messages to two topics, every third published by one of two
    delays (ids 7 and 9), and one of delay 9's bodies damaged (its CRC fails)."""
    fmt = rec.fmt
    out, pos, bad = bytearray(), 0, None
    for i in range(300):
        delay = (7, 9)[i % 2] if i % 3 == 0 else None
        props = fmt.encode_properties([(fmt.DELAY_PROPERTY, fmt.delay_marker(delay, 1000))]) if delay else b""
        r = bytearray(fmt.pack_record(
            magic=fmt.MESSAGE_MAGIC, queue_id=i % 2, flag=0, queue_offset=i // 2, physical_offset=pos, sys_flag=0,
            born_ts=1000 + i, born_host=fmt.NO_HOST, store_ts=1000 + i, store_host=fmt.NO_HOST, reconsume_times=0,
            event_id=20 + i, body=b"%03d" % i * 20, topic=(b"a", b"b")[i % 2], properties=props))  # fmt: skip
        if delay == 9 and bad is None:
            bad = 20 + i
            r[-len(props) - 3 - 2] ^= 0xFF  # a byte of the body
        out += r
        pos += len(r)
    os.makedirs(tmp_path / "commitlog")
    with open(tmp_path / "commitlog" / rec.fmt.segment_name(0), "wb") as f:
        f.write(out)
    return str(tmp_path), bad


def test_compact_form_counts_each_delays_messages(tmp_path):
    """The compact form leaves a delay's messages as C{"fired"} counts per topic and
    delay, not as rows: at every split they add up, with the one whose CRC fails (kept
    as a row), to the messages the reference decoder finds carrying each delay's id."""
    data, bad = _delayed_log(tmp_path)
    ref = {}
    for r in reference_items(data):
        item = dict(zip([n for n in NAMES if n not in IGNORED], r))
        if item["kind"] == "record" and item["delay_id"] is not None:
            ref[item["delay_id"]] = ref.get(item["delay_id"], 0) + 1
    assert ref == {7: 50, 9: 50}
    path = os.path.join(data, "commitlog", rec.fmt.segment_name(0))
    size = os.path.getsize(path)
    for split in SPLITS:
        got, rows = {}, []
        reader = R.Reader("file://" + path)
        try:
            for _, _, _, a, b, start, digest, live in R.plan([(rec.fmt.segment_name(0), "", size)], split, False, "{}"):
                for item in (r for batch in R.decode_range(reader.read_at, 0, size, a, b, start, digest, live)
                             for r in batch.to_pylist()):  # fmt: skip
                    if item["kind"] == "fired":
                        got[item["delay_id"]] = got.get(item["delay_id"], 0) + item["n"]
                    elif item["kind"] == "record":
                        rows.append(item)
        finally:
            reader.close()
        assert [(r["event_id"], r["crc_ok"]) for r in rows] == [(bad, False)], split
        got[9] += 1  # the damaged one, counted from its row
        assert got == ref, split


def test_boundary_scan_skips_a_fake_header_in_a_body(tmp_path):
    """A body holding two whole records (right magic, the physical offsets of where they
    lie) fools the boundary scan of a range that starts inside it, but not the result:
    the range before says where the next record really starts, and the driver walks the
    range again from there."""
    from mqserver.store import format as fmt

    data = tmp_path / "data"
    os.makedirs(data / "commitlog")
    buf = bytearray()
    for i in range(20):
        body = bytes(300)
        if i == 5:
            # Two fakes in a row, so the first one chains; the walk from it then runs
            # into the true record's tail (a false "corrupt" if it were believed).
            n = fmt.record_size(1, 1, 0)
            fake_at = len(buf) + fmt.HEADER_SIZE + 300 - 2 * n
            fakes = [
                fmt.pack_record(magic=fmt.MESSAGE_MAGIC, queue_id=0, flag=0, queue_offset=0,
                                physical_offset=at, sys_flag=0, born_ts=0, born_host=fmt.NO_HOST,
                                store_ts=0, store_host=fmt.NO_HOST, reconsume_times=0, event_id=999,
                                body=b"x", topic=b"t", properties=b"")
                for at in (fake_at, fake_at + n)
            ]  # fmt: skip
            body = bytes(300 - 2 * n) + b"".join(fakes)
        buf += fmt.pack_record(magic=fmt.MESSAGE_MAGIC, queue_id=0, flag=0, queue_offset=i,
                               physical_offset=len(buf), sys_flag=0, born_ts=i, born_host=fmt.NO_HOST,
                               store_ts=i, store_host=fmt.NO_HOST, reconsume_times=0, event_id=i + 1,
                               body=body, topic=b"t", properties=b"")  # fmt: skip
    (data / "commitlog" / fmt.segment_name(0)).write_bytes(bytes(buf))
    ref = reference_items(str(data))
    assert sorted(r[5] for r in ref if r[0] == "record") == list(range(1, 21))
    for split in [fake_at - 5, fake_at, 700, 301, 97]:
        assert range_items(str(data), split) == ref, split
    range_items(str(data), fake_at)
    assert range_items.rewalks == 1


def test_hadoop_s3_uris_open_with_pyarrow_s3():
    """The driver lists with Hadoop, whose S3 scheme is C{s3a:} (or the old C{s3n:});
    executors open the listed URIs with pyarrow, which knows that store as C{s3:} only
    (C{s3a:} is "Unrecognized filesystem type"). Other URIs pass unchanged."""
    from pyarrow import fs

    listed = "s3a://bucket/mq/commitlog/00000000000000000000?region=us-east-1"
    filesystem, path = fs.FileSystem.from_uri(R.arrow_uri(listed))
    assert isinstance(filesystem, fs.S3FileSystem) and path == "bucket/mq/commitlog/00000000000000000000"
    assert R.arrow_uri("S3N://b/k") == "s3://b/k"
    for uri in ("file:///data/commitlog/00000000000000000000", "hdfs://nn:8020/mq/x", "/plain/path"):
        assert R.arrow_uri(uri) == uri


def _reference_cq_compact(files, durable, limit):
    """The compact form of consume-queue C{files} (C{[(path, content)]}) from today's
    entry-by-entry decoder: problems, and per block entries, largest offset and
    signature sums."""
    from spark.audit import columns as C

    probs, blocks = [], {}
    for path, content in files:
        for t in rec.decode_cq_file(path, content):
            topic, qid, qo, off = t[:4]
            if durable is not None:
                if topic is None or qo >= durable.get((topic, qid), -1) or (off is not None and off >= limit):
                    continue
            if t[6] is not None:
                probs.append(t)
                continue
            lo, hi = C.entry_hash([qo], [off], [t[4]], [t[5]])
            b = blocks.setdefault((topic, qid, qo // C.CQ_BLOCK), [0, -1, 0, 0])
            b[0], b[1], b[2], b[3] = b[0] + 1, max(b[1], qo), b[2] + int(lo[0]), b[3] + int(hi[0])
    return sorted(probs, key=repr), blocks


def _file_cq_compact(files, durable, limit):
    """The same from L{spark.audit.columns.cq_compact_file}, file by file, with the rows
    of a block that spans files summed as the job's checks sum them."""
    from spark.audit import columns as C

    probs, blocks = [], {}
    for path, content in files:
        for r in C.cq_compact_file(path, content, durable, limit).to_pylist():
            if r["n"] is None:
                probs.append(tuple(r[c] for c in C.CQ_SCHEMA.names))
                continue
            b = blocks.setdefault((r["topic"], r["queue_id"], r["key"]), [0, -1, 0, 0])
            b[0], b[1] = b[0] + r["n"], max(b[1], r["queue_offset"])
            b[2], b[3] = b[2] + r["sig_lo"], b[3] + r["sig_hi"]
    return sorted(probs, key=repr), blocks


def test_compact_consume_queues_file_by_file(broker_dir, tmp_path):
    """The compact consume queues, decoded file by file with numpy, hold the entries of
    the entry-by-entry decoder: holes skipped, torn tails and foreign names as problems,
    blocks of entries that span two files, and with C{--live}'s durable lengths and log
    limit only what they allow."""
    import numpy as np

    from mqserver.store import format as fmt

    data = dd.copy_dir(broker_dir[0], str(tmp_path / "data"))
    dd.damage(data, "cq")
    dd.damage(data, "cq_torn")
    files = []
    for path in sorted(glob.glob(os.path.join(data, "consumequeue", "*", "*", "*"))):
        with open(path, "rb") as f:
            files.append((path, f.read()))
    rng = np.random.default_rng(20)
    entries = rng.integers(1, 1 << 40, size=(300, 3))
    entries[[3, 150, 151]] = 0  # holes
    big = b"".join(fmt.CQ_ENTRY.pack(int(o), int(s) & 0x7FFFFFFF, int(t)) for o, s, t in entries)
    first = 4000  # entries 4000..4299 cross the block boundary at 4096
    files.append((f"/x/consumequeue/big/3/{first * fmt.CQ_ENTRY_SIZE:020d}", big[:2000]))
    files.append((f"/x/consumequeue/big/3/{(first + 100) * fmt.CQ_ENTRY_SIZE:020d}", big[2000:] + b"\1\2"))
    files.append(("/x/consumequeue/big/3/junk", b"junk"))
    limit = int(np.median(entries[:, 0]))
    durable = {("orders", 0): 30, ("big", 3): 4250}
    found = []
    for d, lim in ((None, None), (durable, limit)):
        ref = _reference_cq_compact(files, d, lim)
        assert _file_cq_compact(files, d, lim) == ref
        found.append(ref)
    (probs, blocks), (live_probs, live_blocks) = found
    assert [p[6][:9] for p in probs] == ["cq_torn", "cq_torn", "not a con"] and live_probs == []
    assert blocks[("big", 3, 1)][0] == 300 - 96 - 2  # both files' entries past 4095, less the holes
    assert blocks[("big", 3, 1)][0] > live_blocks[("big", 3, 1)][0] > 0


def test_crc32_combine_chains_the_ranges_crcs():
    """The CRC-32 of two byte strings joined, from theirs and the second's length, is
    zlib's of the whole (how the driver chains the ranges' CRCs into a segment's)."""
    import zlib

    rng = __import__("random").Random(7)
    for n1, n2 in [(0, 1), (3, 0), (1000, 77777), (65536, 4096)]:
        a, b = rng.randbytes(n1), rng.randbytes(n2)
        assert R.crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


@pytest.mark.parametrize("run", [8, 9, 63, 64, 65, 600, 5000])
def test_same_size_run_counts_runs_of_any_length(run):
    """Runs of equal-sized records are counted exactly whatever their length, across
    the windows the probe grows through, and stop at the first record of another size."""
    from mqserver.store import format as fmt
    from spark.audit import scan

    size = 120
    magic = fmt.MESSAGE_MAGIC.to_bytes(4, "big")
    buf = bytearray((size.to_bytes(4, "big") + magic + bytes(size - 8)) * run + (200).to_bytes(4, "big") + magic
                    + bytes(192))  # fmt: skip
    assert scan.same_size_run(buf, 0, 0, size, len(buf), len(buf)) == run


@pytest.fixture
def zipped_package(tmp_path):
    """A package C{zpkg} (modules C{a} and C{b}) in a zip archive on C{sys.path},
    C{zpkg.a} imported from it; removed from the path and C{sys.modules} afterwards,
    and the collector's frozen objects given back to it."""
    import gc
    import sys
    import zipfile

    archive = str(tmp_path / "zpkg.zip")
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("zpkg/__init__.py", "")
        z.writestr("zpkg/a.py", "A = 1\n")
        z.writestr("zpkg/b.py", "B = 2\n")
    sys.path.insert(0, archive)
    try:
        import zpkg.a  # noqa: F401

        yield archive
    finally:
        gc.unfreeze()
        sys.path.remove(archive)
        for name in [m for m in sys.modules if m == "zpkg" or m.startswith("zpkg.")]:
            del sys.modules[name]
        for entry in [e for e in sys.path_importer_cache if e.startswith(archive)]:
            del sys.path_importer_cache[entry]


def _zip_finders(archive):
    import sys
    import zipimport

    return [e for e, f in sys.path_importer_cache.items()
            if e.startswith(archive) and isinstance(f, zipimport.zipimporter)]  # fmt: skip


def test_settle_worker_drops_zip_finders_and_freezes_what_is_alive(zipped_package):
    """A zip's finders (the archive's and its package's) are dropped where Python's
    importlib.invalidate_caches() re-reads every zip archive, and a module of the zip not
    imported yet still imports; the objects alive are out of the collector's reach,
    what comes after is not."""
    import gc
    import sys

    before = [["made before"]]  # a list is always tracked
    assert gc.is_tracked(before) and _zip_finders(zipped_package)
    assert gc.get_freeze_count() == 0
    R.settle_worker()
    if sys.version_info < (3, 12):
        assert _zip_finders(zipped_package) == []
    else:
        assert _zip_finders(zipped_package)  # invalidation is lazy there: kept
    from zpkg import b

    assert b.B == 2
    assert gc.get_freeze_count() > 0
    after = [["made after"]]
    generations = [id(o) for g in range(3) for o in gc.get_objects(generation=g)]
    assert id(after) in generations and id(before) not in generations
    # A later task: what it holds as it starts stays collectable. (The freeze count is
    # no measure of that: it drops as frozen objects are freed.)
    R.settle_worker()
    generations = [id(o) for g in range(3) for o in gc.get_objects(generation=g)]
    assert id(after) in generations


@pytest.mark.parametrize("task", ["decode_ranges", "decode_cq_groups", "decode_cq_compact", "digest_task"])
def test_every_task_function_settles_its_worker_first(zipped_package, tmp_path, task):
    """Each function the audit's workers run settles the worker before its work."""
    import gc
    import sys

    from spark.audit import state

    if task == "digest_task":
        path = tmp_path / "f"
        path.write_bytes(b"x" * 10)
        state.digest_task(("f", "file://" + str(path), 10))
    else:
        list(getattr(R, task)([], iter([])))
    assert gc.get_freeze_count() > 0
    if sys.version_info < (3, 12):
        assert _zip_finders(zipped_package) == []


def test_numbered_looks_tasks_up_by_the_numbers_it_is_given():
    """A worker's tasks are the ones the JVM's numbers name, as dicts of the fields."""
    import gc

    import pyarrow as pa

    tasks = [("a", 1), ("b", 2), ("c", 3)]
    batches = [pa.record_batch([pa.array([2, 0], pa.int64())], names=["id"])]
    try:
        assert list(R.numbered(tasks, ("name", "n"), iter(batches))) == [
            {"name": "c", "n": 3}, {"name": "a", "n": 1}]
    finally:
        gc.unfreeze()


def test_a_capped_task_keeps_its_summaries_and_says_it_overflowed():
    """L{ranges.capped}: batches pass while the task's rows stay within the cap; past it
    only those to keep pass, and when any was left out one mark ends the task with the
    rows it made."""
    import pyarrow as pa

    def batch(kind, n):
        return pa.RecordBatch.from_pylist([{"kind": kind}] * n)

    def run(cap):
        out = R.capped([batch("qstat", 3), batch("record", 4), batch("range", 1)], cap,
                            lambda b: b.column(0)[0].as_py() == "range", lambda n: batch(f"over {n}", 1))
        return [(b.column(0)[0].as_py(), b.num_rows) for b in out]

    assert run(None) == run(8) == run(7) == [("qstat", 3), ("record", 4), ("range", 1)]
    assert run(6) == run(3) == [("qstat", 3), ("range", 1), ("over 8", 1)]
    assert run(2) == [("range", 1), ("over 8", 1)]
