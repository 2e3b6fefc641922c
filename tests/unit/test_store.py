"""Unit tests of the message store on real files: SyncRunner and a fixed clock, no
reactor (but for the thread runner, run on the real reactor through pytest-twisted)."""

import os

import pytest
import pytest_twisted
from twisted.internet.task import Clock

from mqserver.errors import StoreError
from mqserver.store import format as fmt
from mqserver.store.store import Message, MessageStore
from tests.support.inprocess import failure_of, result_of


def open_store(path, **kw):
    kw.setdefault("segment_size", 4096)
    kw.setdefault("cq_entries_per_file", 10)
    s = MessageStore(str(path), Clock(), clock=lambda: 1_700_000_000.0, **kw)
    s.open()
    return s


def read_all(store, topic, qid=0):
    views, start = [], 0
    while True:
        entries = store.read_entries(topic, qid, start, 10_000)
        if not entries:
            return views
        buf, locs = store.read_records(entries)
        views += [fmt.RecordView(buf, pos) for pos, _ in locs]
        start += len(locs)


def test_put_and_read_back_across_segments(tmp_path):
    """Messages written across many small segments come back in order with dense eventIds."""
    s = open_store(tmp_path)
    bodies = [b"m%04d" % i * 20 for i in range(200)]
    for b in bodies:
        result_of(s.put_messages("t", 0, [Message(body=b)]))
    assert len(s.commitlog.segments) > 5
    views = []
    q = s.queue("t", 0)
    start = 0
    while start < q.max_offset:
        buf, locs = s.read_records(s.read_entries("t", 0, start, 7))
        views += [fmt.RecordView(buf, p) for p, _ in locs]
        start += len(locs)
    assert [bytes(v.body) for v in views] == bodies
    assert [v.event_id for v in views] == list(range(1, 201))
    assert all(v.crc_ok() for v in views)


def test_recovery_rebuilds_queues_and_event_ids(tmp_path):
    """After a restart without a checkpoint the queues and the next eventId are rebuilt."""
    s = open_store(tmp_path)
    result_of(s.put_messages("a", 0, [Message(body=b"x" * 50) for _ in range(30)]))
    result_of(s.put_messages("b", 1, [Message(body=b"y" * 50, properties=b"TAGS\x01T1\x02")]))
    s.commitlog.close()
    s.queue_table.close()
    s._lock.release()  # the kernel drops a dead process's lock
    import shutil
    shutil.rmtree(tmp_path / "consumequeue")
    s2 = open_store(tmp_path)
    assert s2.next_event_id == 32
    assert [v.event_id for v in read_all(s2, "a")] == list(range(1, 31))
    entries = s2.read_entries("b", 1, 0, 5)
    assert fmt.CQ_ENTRY.unpack(entries)[2] == fmt.java_string_hash("T1")


def test_torn_tail_is_truncated(tmp_path):
    """A half-written last record is cut off at start-up and its eventId reused."""
    s = open_store(tmp_path, segment_size=1 << 20)
    for i in range(5):
        result_of(s.put_messages("t", 0, [Message(body=b"b%d" % i)]))
    s.close()
    seg = os.path.join(tmp_path, "commitlog", fmt.segment_name(0))
    size = os.path.getsize(seg)
    with open(seg, "r+b") as f:
        f.truncate(size - 3)
    s2 = open_store(tmp_path, segment_size=1 << 20)
    assert [bytes(v.body) for v in read_all(s2, "t")] == [b"b0", b"b1", b"b2", b"b3"]
    assert s2.next_event_id == 5
    result_of(s2.put_messages("t", 0, [Message(body=b"again")]))
    assert [v.event_id for v in read_all(s2, "t")] == [1, 2, 3, 4, 5]


def test_fsync_failure_fails_the_put_and_hides_the_message(tmp_path):
    """At flush level 2 a failed fsync fails the publish and no reader sees the message."""
    def bad_fsync(fds):
        for fd in fds:
            os.close(fd)
        raise OSError(5, "Input/output error")

    s = open_store(tmp_path, flush_level=2, fsync=bad_fsync)
    failure_of(s.put_messages("t", 0, [Message(body=b"lost")]), StoreError)
    assert s.read_entries("t", 0, 0, 10) == b""
    failure_of(s.put_messages("t", 0, [Message(body=b"later")]), StoreError)


def test_find_event(tmp_path):
    """Binary search finds exact eventIds and the next one after a gap."""
    s = open_store(tmp_path)
    for i in range(20):
        result_of(s.put_messages("t", 0, [Message(body=b"a")]))
        result_of(s.put_messages("u", 0, [Message(body=b"b")]))
    # t holds odd eventIds 1, 3, ..., 39
    assert s.find_event("t", 0, 7) == (3, True)
    assert s.find_event("t", 0, 8) == (4, False)
    assert s.find_event("t", 0, 100) == (20, False)


class LazyRunner:
    """Like the broker's ThreadRunner during recovery: calls queue up until start()."""

    def __init__(self):
        from mqserver.store.flush import SyncRunner

        self._sync = SyncRunner()
        self._queued = []
        self._started = False

    def start(self):
        self._started = True
        for f, args in self._queued:
            f(*args)
        self._queued = []

    def stop(self):
        pass

    def run(self, f, *args):
        from twisted.internet import defer

        if self._started:
            return self._sync.run(f, *args)
        self._queued.append((f, args))
        return defer.Deferred()


def crash_after_checkpoint_then_delete(path):
    """Write x (2 messages) and y (3), checkpoint, DELETE x, and 'crash' (no final
    checkpoint). Returns the checkpoint's log offset."""
    s = open_store(path)
    result_of(s.put_messages("x", 0, [Message(body=b"x1"), Message(body=b"x2")]))
    result_of(s.put_messages("y", 0, [Message(body=b"y%d" % i) for i in range(3)]))
    result_of(s.checkpoint())
    offset = s.last_checkpoint_offset
    result_of(s.put_admin(fmt.OP_DELETE, "x", b""))
    s.commitlog.close()
    s.queue_table.close()
    s._lock.release()  # the kernel drops a dead process's lock
    return offset


def test_delete_after_checkpoint_does_not_force_a_full_rebuild(tmp_path):
    """A queue emptied by a DELETE replayed after the checkpoint is not 'behind': the
    store restarts from the checkpoint instead of rebuilding from the start of the log."""
    offset = crash_after_checkpoint_then_delete(tmp_path)
    assert offset > 0
    s2 = open_store(tmp_path, runner=LazyRunner())
    assert s2.last_checkpoint_offset == offset
    assert read_all(s2, "x") == []
    assert [bytes(v.body) for v in read_all(s2, "y")] == [b"y0", b"y1", b"y2"]
    assert s2.next_event_id == 7


def test_queue_really_behind_still_rebuilds_with_a_delete_replayed_twice(tmp_path):
    """A queue that lost entries is rebuilt from the whole log even when a DELETE after
    the checkpoint was already replayed once (its trash directory is reused)."""
    import shutil

    crash_after_checkpoint_then_delete(tmp_path)
    shutil.rmtree(tmp_path / "consumequeue" / "y")
    s2 = open_store(tmp_path, runner=LazyRunner())
    assert s2.last_checkpoint_offset == 0
    assert read_all(s2, "x") == []
    assert [bytes(v.body) for v in read_all(s2, "y")] == [b"y0", b"y1", b"y2"]
    assert s2.next_event_id == 7


class ManualRunner:
    """A disk runner whose calls wait until the test lets them run."""

    def __init__(self):
        self.calls = []

    def start(self):
        pass

    def stop(self):
        pass

    def run(self, f, *args):
        from twisted.internet import defer

        d = defer.Deferred()
        self.calls.append((f, args, d))
        return d

    def finish_all(self):
        while self.calls:
            f, args, d = self.calls.pop(0)
            d.callback(f(*args))


def test_level2_readers_wait_for_fsync_and_writes_share_it(tmp_path):
    """At flush level 2 nothing is readable or acknowledged before the fsync finishes, and
    writes arriving meanwhile are covered by one further fsync (group commit)."""
    runner = ManualRunner()
    s = open_store(tmp_path, flush_level=2, runner=runner, segment_size=1 << 20)
    arrivals = []
    s.add_arrival_listener(lambda t, q: arrivals.append((t, q)))
    acks = []
    s.put_messages("t", 0, [Message(body=b"one")]).addCallback(acks.append)
    assert len(runner.calls) == 1
    for i in range(5):
        s.put_messages("t", 0, [Message(body=b"more%d" % i)]).addCallback(acks.append)
    assert len(runner.calls) == 1, "an fsync is running: later writes wait for the next"
    assert s.read_entries("t", 0, 0, 10) == b"" and acks == [] and arrivals == []
    f, args, d = runner.calls.pop(0)
    d.callback(f(*args))
    assert len(acks) == 1 and len(read_all(s, "t")) == 1
    assert len(runner.calls) == 1
    runner.finish_all()
    assert len(acks) == 6 and len(read_all(s, "t")) == 6
    assert arrivals and arrivals[-1] == ("t", 0)


def test_retention_deletes_old_segments_not_read_ones(tmp_path):
    """Old sealed segments go, with the consume-queue files below the new start; the
    current segment, and segments a reader still needs, stay."""
    s = open_store(tmp_path, segment_size=4096, cq_entries_per_file=10)
    for i in range(120):
        result_of(s.put_messages("t", 0, [Message(body=b"x" * 100)]))
    result_of(s.checkpoint())
    segs = list(s.commitlog.segments)
    assert len(segs) > 4
    old = 1_700_000_000.0 - 10 * 86400
    for seg in segs:
        os.utime(os.path.join(tmp_path, "commitlog", fmt.segment_name(seg)), (old, old))
    reader_at = segs[2] + 10  # an open cursor still reads the third segment
    assert s.clean(7 * 86400, min_reader_offset=reader_at) == 2
    assert s.commitlog.segments == segs[2:]
    q = s.queue("t", 0)
    assert q.files[0] > 0, "queue files below the new log start are gone"
    remaining = read_all(s, "t")
    assert remaining and all(v.offset >= segs[2] for v in remaining)
    assert s.clean(7 * 86400) == len(segs) - 3, "without readers all but the current go"
    assert s.commitlog.segments == segs[-1:]


def test_clean_close_leaves_complete_queue_files_after_checkpoints(tmp_path):
    """Entries buffered after a checkpoint reach the queue files at close, so a clean
    restart needs no rebuild and the files alone hold every entry."""
    s = open_store(tmp_path, segment_size=1 << 20, cq_entries_per_file=1000)
    for i in range(5):
        result_of(s.put_messages("t", 0, [Message(body=b"a")]))
    result_of(s.checkpoint())
    for i in range(3):
        result_of(s.put_messages("t", 0, [Message(body=b"b")]))
    s.close()
    path = os.path.join(tmp_path, "consumequeue", "t", "0", fmt.segment_name(0))
    assert os.path.getsize(path) == 8 * fmt.CQ_ENTRY_SIZE


class _NoReactor:
    """What deferToThreadPool needs from a reactor when nobody waits for the results."""

    def callFromThread(self, f, *args, **kw):
        pass


def test_close_waits_for_a_checkpoint_queued_on_the_disk_thread(tmp_path):
    """A checkpoint still queued on the disk thread at close() must not land after the
    final checkpoint (it would put an older state back) nor share its temp file."""
    import threading

    from mqserver.store.flush import ThreadRunner, read_json

    runner = ThreadRunner(_NoReactor())
    s = open_store(tmp_path, runner=runner)
    gate = threading.Event()
    try:
        result_of(s.put_messages("t", 0, [Message(body=b"a")]))
        runner.run(gate.wait)  # keep the disk thread busy...
        s.checkpoint()  # ...so this checkpoint waits behind it
        result_of(s.put_messages("t", 0, [Message(body=b"b" * 100)]))
        final_offset = s.commitlog.end
        threading.Timer(0.2, gate.set).start()
        s.close()
    finally:
        gate.set()
        runner.stop()
    snap = read_json(os.path.join(str(tmp_path), "metadata.json"))
    assert snap["logOffset"] == final_offset
    assert not [n for n in os.listdir(tmp_path) if ".tmp" in n]


def test_read_records_of_a_queue_interleaved_with_others(tmp_path):
    """A queue's records read in one span skip the other topics' records between them,
    across a segment roll too."""
    s = open_store(tmp_path)  # 4096-byte segments: the 60 writes below roll several
    for i in range(30):
        result_of(s.put_messages("a", 0, [Message(body=b"a%03d" % i)]))
        result_of(s.put_messages("b", 0, [Message(body=b"b%03d" % i + b"." * 50)]))
    views = read_all(s, "a")
    assert [v.body for v in views] == [b"a%03d" % i for i in range(30)]
    entries = s.read_entries("b", 0, 3, 4)
    buf, locs = s.read_records(entries)
    assert [fmt.RecordView(buf, p).body[:4] for p, _ in locs] == [b"b003", b"b004", b"b005", b"b006"]


@pytest_twisted.inlineCallbacks
def test_thread_runner_runs_off_the_reactor_thread_and_answers_on_it():
    """The disk runner calls on its own thread; its Deferreds fire on the reactor's
    (pytest-twisted runs the real reactor while the test waits)."""
    import threading

    from twisted.internet import reactor

    from mqserver.store.flush import ThreadRunner

    runner = ThreadRunner(reactor)
    runner.start()
    try:
        ran_on = yield runner.run(threading.current_thread)
        assert ran_on is not threading.current_thread()
        assert threading.current_thread() is threading.main_thread()
        with pytest.raises(ZeroDivisionError):
            yield runner.run(lambda: 1 / 0)
    finally:
        runner.stop()


@pytest.mark.parametrize("flushed,start", [(1, 0), (9, 8), (10, 9), (13, 12), (13, 5)])
def test_a_read_goes_on_from_the_files_into_the_buffered_entries(tmp_path, flushed, start):
    """Entries written to the queue's files and entries buffered since the last flush
    come back in one read: a batch is not cut short where a flush fell (a subscriber
    asking for 10 got 1 when only the first of 3 had been flushed). A read still stops
    at the end of a file that the buffer does not follow."""
    s = open_store(tmp_path)  # 10 entries per consume-queue file
    for i in range(flushed):
        result_of(s.put_messages("t", 0, [Message(body=b"f%d" % i)]))
    s.queue("t", 0).flush()
    for i in range(3):
        result_of(s.put_messages("t", 0, [Message(body=b"b%d" % i)]))
    q = s.queue("t", 0)
    assert q.max_offset == flushed + 3
    got = len(s.read_entries("t", 0, start, 100)) // fmt.CQ_ENTRY_SIZE
    # from start: to the end of its file, or on through the buffer when it follows
    file_end = (start // 10 + 1) * 10
    expected = flushed + 3 - start if flushed <= file_end else file_end - start
    assert got == expected
    bodies = [bytes(v.body) for v in read_all(s, "t")]
    assert bodies == [b"f%d" % i for i in range(flushed)] + [b"b0", b"b1", b"b2"]


@pytest_twisted.inlineCallbacks
def test_thread_runner_answers_through_around():
    """With C{around}, the disk runner's results reach their callbacks through it, on
    the reactor's thread: the broker gives output.together, so that everything a
    group commit's answers write to one connection leaves in one write."""
    from twisted.internet import defer, reactor

    from mqserver.runtime import output
    from mqserver.store.flush import ThreadRunner
    from tests.unit.test_output import _counting_conn

    conn = _counting_conn()
    runner = ThreadRunner(reactor, around=output.together)
    runner.start()
    try:
        d = runner.run(lambda: b"ok")
        for reply in (b"1", b"2", b"3"):
            d.addCallback(lambda r, reply=reply: (conn.output.write(reply), r)[1])
        done = defer.Deferred()
        d.addCallback(lambda r: reactor.callLater(0, done.callback, r))
        assert (yield done) == b"ok"
        assert conn.writes == [b"123"]
        with pytest.raises(ZeroDivisionError):
            yield runner.run(lambda: 1 / 0)
    finally:
        runner.stop()
