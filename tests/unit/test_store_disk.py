"""A full or failing disk through the store's file I/O seam (FaultyIO): a
failed write or fsync fails the publish and is never acknowledged, reads go on, writes
resume once the disk works again, nothing acknowledged is lost and the log recovers; and
the disk-usage watermark store.diskMaxUsedRatio."""

import errno
import os

import pytest
from twisted.internet.task import Clock
from twisted.logger import formatEvent, globalLogPublisher

from mqserver.errors import DiskFullError, StoreError
from mqserver.store import format as fmt
from mqserver.store.fileio import FaultyIO
from mqserver.store.store import Message, MessageStore


def open_store(path, io, flush_level=1, ratio=1.0, clock=None):
    s = MessageStore(str(path), clock or Clock(), segment_size=4096, cq_entries_per_file=10,
                     flush_level=flush_level, io=io, clock=lambda: 1_700_000_000.0,
                     disk_max_used_ratio=ratio)
    s.open()
    return s


def outcome(d):
    out = []
    d.addBoth(out.append)
    assert out, "deferred did not fire"
    return out[0]


def failed_with(d, cls):
    r = outcome(d)
    assert hasattr(r, "check") and r.check(cls), r
    return r.value


def bodies(store, topic="t"):
    out, pos = [], 0
    while True:
        entries = store.read_entries(topic, 0, pos, 100)
        if not entries:
            return out
        buf, locs = store.read_records(entries)
        out += [bytes(fmt.RecordView(buf, p).body) for p, _ in locs]
        pos += len(entries) // fmt.CQ_ENTRY_SIZE


@pytest.fixture
def logged():
    lines = []
    obs = lambda e: lines.append(formatEvent(e))  # noqa: E731
    globalLogPublisher.addObserver(obs)
    yield lines
    globalLogPublisher.removeObserver(obs)


@pytest.mark.parametrize("level", [0, 1, 2])
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_a_failed_write_fails_the_publish_and_writes_resume(tmp_path, logged, level, code):
    io = FaultyIO()
    s = open_store(tmp_path, io, level)
    for i in range(30):  # several segments
        assert not hasattr(outcome(s.put_messages("t", 0, [Message(b"ok%02d" % i + b"." * 200)])),
                           "check")
    io.write_error = code
    for i in range(5):
        err = failed_with(s.put_messages("t", 0, [Message(b"lost%d" % i), b"lost-too"]), StoreError)
        assert isinstance(err, DiskFullError) == (code == errno.ENOSPC)
    assert s.next_event_id == 31  # no eventId taken by a failed write
    assert len(bodies(s)) == 30  # reads go on
    assert s.disk_errors == 5 and s.disk_full_events == 1
    io.write_error = None
    assert not hasattr(outcome(s.put_messages("t", 0, [Message(b"after")])), "check")
    s.check_disk()
    assert s.disk_trouble is None
    trouble = [x for x in logged if "disk trouble" in x]
    over = [x for x in logged if "disk writes work again" in x]
    assert len(trouble) == 1 and len(over) == 1, logged
    s.close()
    s2 = open_store(tmp_path, FaultyIO(), level)
    got = bodies(s2)
    assert got[:30] == [b"ok%02d" % i + b"." * 200 for i in range(30)]
    assert got[30:] == [b"after"]
    assert s2.next_event_id == 32
    s2.close()


def test_fsync_failure_at_level_2_is_never_acknowledged_and_resumes(tmp_path):
    io = FaultyIO()
    s = open_store(tmp_path, io, 2)
    assert not hasattr(outcome(s.put_messages("t", 0, [Message(b"one")])), "check")
    io.fsync_error = errno.EIO
    failed_with(s.put_messages("t", 0, [Message(b"two")]), StoreError)
    assert bodies(s) == [b"one"]  # not durable: not visible
    io.fsync_error = None
    assert not hasattr(outcome(s.put_messages("t", 0, [Message(b"three")])), "check")
    assert bodies(s)[-1] == b"three"
    s.check_disk()
    assert s.disk_trouble is None and s.disk_errors == 1
    s.close()


def test_fsync_failure_at_level_1_refuses_publishes_until_an_fsync_works(tmp_path):
    io = FaultyIO()
    s = open_store(tmp_path, io, 1)
    assert not hasattr(outcome(s.put_messages("t", 0, [Message(b"one")])), "check")
    io.fsync_error = errno.EIO
    outcome(s.sync())
    failed_with(s.put_messages("t", 0, [Message(b"two")]), StoreError)
    outcome(s.sync())  # still failing: still refused
    failed_with(s.put_messages("t", 0, [Message(b"two")]), StoreError)
    io.fsync_error = None
    outcome(s.sync())
    assert not hasattr(outcome(s.put_messages("t", 0, [Message(b"three")])), "check")
    assert bodies(s) == [b"one", b"three"]
    s.close()


def test_a_full_disk_during_a_checkpoint_loses_no_queue_entry(tmp_path):
    """Consume-queue entries whose write fails stay buffered; the next checkpoint writes
    them (and the checkpoint timer keeps running)."""
    io = FaultyIO()
    s = open_store(tmp_path, io, 1)
    for i in range(20):
        outcome(s.put_messages("t", 0, [Message(b"m%d" % i)]))
    io.write_error = errno.ENOSPC
    outcome(s.checkpoint())  # fails: logged, not raised
    assert s.disk_trouble is not None
    io.write_error = None
    assert not hasattr(outcome(s.checkpoint()), "check")
    s.close()
    s2 = open_store(tmp_path, FaultyIO(), 1)
    assert bodies(s2) == [b"m%d" % i for i in range(20)]
    s2.close()


def test_disk_usage_watermark_refuses_then_accepts(tmp_path, logged, monkeypatch):
    clock = Clock()
    s = open_store(tmp_path, FaultyIO(), 1, ratio=0.9, clock=clock)
    usage = [0.5]
    monkeypatch.setattr(s.disk, "used_ratio", lambda: usage[0])
    assert not hasattr(outcome(s.put_messages("t", 0, [Message(b"a")])), "check")
    usage[0] = 0.95
    s.check_disk()  # the service calls it once a second
    err = failed_with(s.put_messages("t", 0, [Message(b"b")]), DiskFullError)
    assert "95%" in str(err) and "diskMaxUsedRatio" in str(err)
    failed_with(s.put_admin(fmt.OP_CREATE, "x", b"{}"), DiskFullError)
    assert bodies(s) == [b"a"]
    s.check_disk()
    usage[0] = 0.85
    s.check_disk()
    assert not hasattr(outcome(s.put_messages("t", 0, [Message(b"c")])), "check")
    assert s.disk_full_events == 1
    assert len([x for x in logged if "publishes are refused" in x]) == 1
    assert len([x for x in logged if "publishes are accepted again" in x]) == 1
    s.close()


@pytest.mark.parametrize("code, cls, text", [(errno.ENOSPC, DiskFullError, "disk full: No space left on device"),
                                             (errno.EDQUOT, DiskFullError, "disk full: Disk quota exceeded"),
                                             (errno.EIO, StoreError, "writing x.json failed: Input/output error")])
def test_a_failed_write_of_a_state_file_is_a_disk_error(tmp_path, logged, code, cls, text):
    """DiskGuard.failed: counted, logged once per trouble (no traceback), and the error
    to answer the request with."""
    s = open_store(tmp_path / "s", FaultyIO())
    try:
        err = s.disk.failed("writing x.json", OSError(code, os.strerror(code)))
        assert type(err) is cls and str(err) == text
        s.disk.failed("writing x.json", OSError(code, "again"))
        assert s.disk_errors == 2 and s.disk_full_events == 1
        assert sum("disk trouble: writing x.json failed" in line for line in logged) == 1
        assert not any("Traceback" in line for line in logged)
    finally:
        s.close()
