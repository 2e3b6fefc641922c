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


def test_clean_broker_directory(broker_dir):
    """The broker's own directory decodes to the same items at every split."""
    _same(broker_dir[0])


@pytest.mark.parametrize(
    "damage",
    ["crc", "relabel", "torn", "bad_magic", "bad_size", "physical_offset", "zero_tail", "not_a_segment"],
)
def test_damaged_copies(broker_dir, tmp_path, damage):
    """Each kind of damage, anywhere in a segment, gives the reference's items: records
    after a corrupt one are not counted even where a later range could read them."""
    data = dd.copy_dir(broker_dir[0], str(tmp_path / "data"))
    dd.damage(data, damage)
    _same(data)


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
