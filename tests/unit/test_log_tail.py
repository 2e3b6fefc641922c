"""What follows the last sound record of the commit log: zeros (a file a crash extended
but never wrote), garbage, or a record-shaped block whose body fails its CRC, at the
tail or in the middle, at every flush level, with a current, stale or missing
checkpoint. The log ends after its last sound record, damage in the middle is stepped
over and counted once, and no eventId is ever handed out twice."""

import os
import random
import shutil

import pytest
from twisted.internet.task import Clock

from mqserver.replication.logreader import LogReader
from mqserver.store import format as fmt
from mqserver.store.store import Message, MessageStore
from tests.support.inprocess import result_of as fired
from tests.unit import test_store_damage

NOW = test_store_damage.NOW
logged = test_store_damage.logged  # the fixture: every log line while a test runs

FIRST, LATER = 30, 10
JUNK = 4096
SEGMENT_NAME = fmt.segment_name(0)


def open_store(path, flush):
    s = MessageStore(str(path), Clock(), segment_size=1 << 20, cq_entries_per_file=16,
                     flush_level=flush, clock=lambda: NOW)
    s.open()
    return s


def segment(path):
    return os.path.join(path, "commitlog", SEGMENT_NAME)


def metadata(path):
    return os.path.join(path, "metadata.json")


def publish(store, n, start):
    """Publish n messages with bodies m<start>.. and return their PutResults."""
    return [fired(store.put_messages("t", 0, [Message(body=b"m%03d" % i)]))
            for i in range(start, start + n)]


def all_records(store):
    """Every record the replication feed's reader finds, in log order."""
    reader = LogReader(store, store.commitlog.min_offset)
    views = []
    while True:
        got = reader.read(max_bytes=4096)
        if not got:
            return views
        views += got


def junk_bytes(kind, last_record, at, event_id):
    """JUNK bytes of C{kind}, or a record-shaped block for C{"bad_crc"}: the bytes of
    C{last_record} renamed to offset C{at} and C{event_id}, one body byte flipped."""
    if kind == "zeros":
        return bytes(JUNK)
    if kind == "garbage":
        rnd = random.Random(7)
        return bytes([0x5A]) + bytes(rnd.randrange(256) for _ in range(JUNK - 1))
    block = bytearray(last_record)
    fmt.I64.pack_into(block, fmt.OFF_PHYSICAL_OFFSET, at)
    fmt.I64.pack_into(block, fmt.OFF_EVENT_ID, event_id)
    block[fmt.HEADER_SIZE] ^= 0x5A
    return bytes(block)


def write_log(path, flush):
    """FIRST messages, a checkpoint kept aside as the stale one, LATER more; closed
    (which writes the current checkpoint). Returns the PutResults."""
    s = open_store(path, flush)
    results = publish(s, FIRST, 0)
    fired(s.checkpoint())
    shutil.copy(metadata(path), metadata(path) + ".stale")
    results += publish(s, LATER, FIRST)
    s.close()
    return results


def use_checkpoint(path, which):
    if which == "missing":
        os.remove(metadata(path))
    elif which == "stale":
        os.replace(metadata(path) + ".stale", metadata(path))


def assert_ids_never_reused(path, flush, want_next):
    """Publish LATER more, then rebuild from the log alone: every eventId in the log is
    unique and increasing, and the new ones follow the highest one before them."""
    s = open_store(path, flush)
    assert s.next_event_id == want_next
    new = publish(s, LATER, 100)
    assert [r.event_id for r in new] == list(range(want_next, want_next + LATER))
    s.close()
    os.remove(metadata(path))
    s = open_store(path, flush)
    ids = [v.event_id for v in all_records(s)]
    assert ids == sorted(set(ids)), ids
    assert ids[-LATER:] == list(range(want_next, want_next + LATER))
    assert s.next_event_id == want_next + LATER
    s.close()


@pytest.mark.parametrize("flush", [0, 1, 2])
@pytest.mark.parametrize("kind", ["zeros", "garbage", "bad_crc"])
@pytest.mark.parametrize("checkpoint", ["current", "stale", "missing"])
def test_junk_after_the_last_record_is_cut(tmp_path, logged, flush, kind, checkpoint):
    """Bytes after the last sound record of the last segment are cut at start-up, with
    one log line naming the segment, the offset and the bytes cut; the next eventId is
    one past the last record's, and stays so after a rebuild without the checkpoint."""
    path = str(tmp_path / "data")
    results = write_log(path, flush)
    end = os.path.getsize(segment(path))
    last = results[-1]
    with open(segment(path), "rb") as f:
        f.seek(last.log_offsets[0])
        last_bytes = f.read(last.sizes[0])
    junk = junk_bytes(kind, last_bytes, end, last.event_id + 1)
    with open(segment(path), "ab") as f:
        f.write(junk)
    use_checkpoint(path, checkpoint)
    s = open_store(path, flush)
    assert s.commitlog.end == end
    assert os.path.getsize(segment(path)) == end
    cut = [x for x in logged if "truncating the commit log" in x]
    assert len(cut) == 1, cut
    assert f"at {end}: cut {len(junk)} bytes" in cut[0] and SEGMENT_NAME in cut[0], cut
    assert s.damaged_records == 0
    assert s.next_event_id == last.event_id + 1
    assert [bytes(v.body) for v in all_records(s)] == [b"m%03d" % i for i in range(FIRST + LATER)]
    s.close()
    assert_ids_never_reused(path, flush, last.event_id + 1)


def insert_junk(path, results, kind):
    """Put junk between message FIRST - 1 and message FIRST (the records after it moved
    up, renamed to their new offsets), as a broker that kept a junk tail and wrote
    after it leaves a log. For C{"bad_crc"}, message FIRST's body is damaged in place.
    Returns the offset of the junk."""
    at = results[FIRST].log_offsets[0]
    with open(segment(path), "rb") as f:
        data = bytearray(f.read())
    if kind == "bad_crc":
        data[at + fmt.HEADER_SIZE] ^= 0x5A
    else:
        junk = junk_bytes(kind, b"", at, 0)
        later = data[at:]
        for r in results[FIRST:]:
            pos = r.log_offsets[0] - at
            fmt.I64.pack_into(later, pos + fmt.OFF_PHYSICAL_OFFSET, r.log_offsets[0] + len(junk))
        data[at:] = junk + later
    with open(segment(path), "wb") as f:
        f.write(data)
    return at


@pytest.mark.parametrize("flush", [0, 1, 2])
@pytest.mark.parametrize("kind", ["zeros", "garbage", "bad_crc"])
@pytest.mark.parametrize("checkpoint", ["stale", "missing"])
def test_junk_between_records_is_stepped_over(tmp_path, logged, flush, kind, checkpoint):
    """Junk with sound records after it is damage in the middle, not the end: it is
    logged and counted once at its place, nothing is cut, every record after it is
    read, and the next eventId is one past the highest in the log."""
    path = str(tmp_path / "data")
    results = write_log(path, flush)
    at = insert_junk(path, results, kind)
    size = os.path.getsize(segment(path))
    use_checkpoint(path, checkpoint)
    s = open_store(path, flush)
    assert s.commitlog.end == size
    assert not any("truncating the commit log" in x for x in logged)
    assert s.damaged_records == 1
    lines = [x for x in logged if "damaged record skipped" in x]
    assert len(lines) == 1 and f"segment {SEGMENT_NAME} offset {at} " in lines[0], lines
    if kind == "zeros":
        assert fmt.ZEROED in lines[0]
    assert s.next_event_id == results[-1].event_id + 1
    lost = {FIRST} if kind == "bad_crc" else set()
    want = [b"m%03d" % i for i in range(FIRST + LATER) if i not in lost]
    assert [bytes(v.body) for v in all_records(s)] == want
    s.close()
    assert_ids_never_reused(path, flush, results[-1].event_id + 1)


@pytest.mark.parametrize("kind", ["zeros", "garbage"])
def test_log_reader_reports_junk_below_the_checkpoint_and_reads_on(tmp_path, logged, kind):
    """Junk below the checkpoint (recovery does not scan there): the replication feed's
    reader logs and counts it once, and reads every record after it, instead of
    stopping there as if the log ended."""
    path = str(tmp_path / "data")
    s = open_store(path, 1)
    results = publish(s, FIRST + LATER, 0)
    s.close()
    at = results[FIRST].log_offsets[0]
    span = results[FIRST + 2].log_offsets[0] - at  # two whole records
    with open(segment(path), "r+b") as f:
        f.seek(at)
        f.write(junk_bytes(kind, b"", at, 0)[:span])
    s = open_store(path, 1)
    assert s.damaged_records == 0  # below the checkpoint: not scanned at start-up
    for max_bytes in (4096, 100):
        reader = LogReader(s, 0)
        ids = []
        while True:
            views = reader.read(max_bytes=max_bytes)
            if not views:
                break
            ids += [v.event_id for v in views]
        assert ids == [r.event_id for i, r in enumerate(results) if i not in (FIRST, FIRST + 1)]
        assert reader.offset == s.visible_end
    assert s.damaged_records == 1
    lines = [x for x in logged if "damaged record skipped" in x]
    assert len(lines) == 1 and f"offset {at} " in lines[0], lines
    s.close()


def test_log_reader_reports_a_record_running_past_its_segment_and_reads_on(tmp_path, logged):
    """The last record of an older segment whose size now runs past the segment's end
    (below the checkpoint, so recovery does not scan it): the feed's reader reports it
    once and goes on with the next segment, instead of reading it again and again."""
    path = str(tmp_path / "data")
    s = test_store_damage.open_store(path)  # 4096-byte segments
    results = publish(s, 2 * (FIRST + LATER), 0)
    s.close()
    first_seg = [r for r in results if r.log_offsets[0] < test_store_damage.SEGMENT]
    assert len(first_seg) < len(results)
    victim = first_seg[-1]
    with open(segment(path), "r+b") as f:
        f.seek(victim.log_offsets[0])
        f.write(fmt.I32.pack(victim.sizes[0] + 64))
    s = test_store_damage.open_store(path)
    reader = LogReader(s, 0)
    ids = []
    for _ in range(100):
        views = reader.read()
        if not views:
            break
        ids += [v.event_id for v in views]
    assert ids == [r.event_id for r in results if r is not victim]
    assert reader.offset == s.visible_end
    assert s.damaged_records == 1
    lines = [x for x in logged if "damaged record skipped" in x]
    assert len(lines) == 1 and f"offset {victim.log_offsets[0]} " in lines[0], lines
    s.close()


@pytest.mark.parametrize("checkpoint", ["current", "missing"])
@pytest.mark.parametrize("after", [b"", bytes(64)])
def test_a_sealed_last_segment_stays_sealed(tmp_path, logged, checkpoint, after):
    """A last segment that ends in its BLANK marker (a crash after sealing it, before
    the first write of the next): the marker stays, bytes after it are cut, and the
    next record starts the next segment, where every reader (and a rebuild) finds it."""
    path = str(tmp_path / "data")
    s = test_store_damage.open_store(path)  # 4096-byte segments
    results = publish(s, FIRST, 0)
    s.close()
    size = os.path.getsize(segment(path))
    with open(segment(path), "ab") as f:
        f.write(fmt.BLANK.pack(test_store_damage.SEGMENT - size, fmt.BLANK_MAGIC) + after)
    use_checkpoint(path, checkpoint)
    s = test_store_damage.open_store(path)
    assert os.path.getsize(segment(path)) == size + fmt.BLANK_SIZE
    cut = [x for x in logged if "truncating the commit log" in x]
    if after:
        assert len(cut) == 1 and f"cut {len(after)} bytes" in cut[0], cut
    else:
        assert not cut
    new = publish(s, 1, 100)[0]
    assert new.log_offsets[0] == test_store_damage.SEGMENT
    assert new.event_id == results[-1].event_id + 1
    assert [v.event_id for v in all_records(s)] == [r.event_id for r in results + [new]]
    s.close()
    os.remove(metadata(path))
    s = test_store_damage.open_store(path)
    assert s.next_event_id == new.event_id + 1
    assert [v.event_id for v in all_records(s)] == [r.event_id for r in results + [new]]
    s.close()
