"""The store's one write path (Writer.put) with the C packing (_pack.c, chosen at import
when it is built) against the Python packing (Writer._pack_py, its reference), and with
an answer callback against without: the same commit log, consume queues, eventIds,
PutResults, listener calls and bookkeeping, for any mix of writes."""

import errno
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from mqserver import speedups
from mqserver.errors import StoreError
from mqserver.store import format as fmt
from mqserver.store import writer as writer_module
from mqserver.store.message import PutResult
from mqserver.store.store import Message, MessageStore
from tests.unit.test_speedups import _c_module
from tests.unit.test_store import ManualRunner

_HOST = b"\x7f\x00\x00\x01\x00\x00\x30\x39"


class ScriptedPwrite:
    """The commit log's pwrite, failing as told for the next write: C{"enospc"} or
    C{"eio"} (nothing written), C{"short"} (half written, the rest by the next call),
    C{"short-eio"} (half written, then EIO)."""

    def __init__(self, real):
        self.real = real
        self.plan = []

    def __call__(self, fd, data, pos):
        step = self.plan.pop(0) if self.plan else None
        if step in ("enospc", "eio"):
            code = errno.ENOSPC if step == "enospc" else errno.EIO
            raise OSError(code, os.strerror(code))
        if step in ("short", "short-eio"):
            if step == "short-eio":
                self.plan.insert(0, "eio")
            return self.real(fd, bytes(data)[: max(1, len(data) // 2)], pos)
        return self.real(fd, data, pos)


class Recorder:
    """Every listener call of a store, in order."""

    def __init__(self, store):
        self.calls = []
        store.add_arrival_listener(lambda t, q: self.calls.append(("arrived", t, q)))
        store.add_append_listener(lambda: self.calls.append(("appended",)))
        store.add_dispatch_listener(lambda *a: self.calls.append(("dispatch", *a)))
        store.add_dispatch_listener(lambda *a: self.calls.append(("dispatch-b", *a)),
                                    topics=["b"])


def _open(path, flush_level=1, runner=None):
    ms = [1_700_000_000.0]
    s = MessageStore(str(path), Clock(), clock=lambda: ms[0], segment_size=2048,
                     cq_entries_per_file=10, max_message_size=400, store_host=_HOST,
                     flush_level=flush_level, runner=runner)
    s.open()
    s.commitlog._pwrite = ScriptedPwrite(s.commitlog._pwrite)
    return s, Recorder(s), ms


def _outcome(call):
    try:
        r = call()
    except Exception as e:  # noqa: BLE001 - the error is the outcome compared
        return ("raised", type(e).__name__, str(e))
    if type(r) is PutResult:
        return ("now", _fields(r))
    got = []
    r.addBoth(got.append)
    if not got:
        return ("waiting",)
    v = got[0]
    return ("later", _fields(v)) if type(v) is PutResult else ("failed", str(v.value))


def _fields(r):
    return (r.event_id, r.queue_id, r.store_ts, r.log_offsets, r.queue_offsets, r.sizes)


def _state(s):
    w, log = s.writer, s.commitlog
    queues = {key: (q.max_offset, q.in_bytes, q.in_msgs, bytes(q._tail), q._tail_start)
              for key, q in sorted(s.queue_table.queues.items())}
    return (w.next_event_id, w.last_record, log.end, sorted(log._unsynced), log.open_end,
            s.visible_end, s.checkpoints.dirty, sum(s.write_latency.counts), s.disk_errors,
            s.disk_trouble, queues, sorted(os.path.relpath(q.directory, s.path) for q in s.queue_table._tails))


def _files(s):
    s.flush_queues()
    segments = [s.commitlog.read_segment(start) for start in s.commitlog.segments]
    entries = {key: s.read_entries(key[0], key[1], 0, 10_000)
               for key in sorted(s.queue_table.queues)}
    return segments, entries


def _answered(s, rec, topic, qid, messages, now_ms, event_id, ends=None):
    """put with an answer callback, given as the result it was called with
    when it was called (and None returned), else what the call returned; the callback
    must be called at most once, only when None is returned, and before any listener
    hears of the write."""
    answers = []
    r = s.put(topic, qid, messages, now_ms, event_id,
              lambda result: answers.append((result, rec.calls[:])), ends)
    if r is not None:
        assert answers == []
        return r
    [(result, heard)] = answers
    assert type(result) is PutResult and heard == []
    return result


def _run(path, ops, packer, flush_level=1, answer=False):
    """Apply C{ops} to a fresh store whose records C{packer} packs (C{"c"}: _pack.c, or
    C{"py"}: Writer._pack_py); return what each gave and what the store holds.
    C{answer}: every put gives an answer callback (see L{_answered})."""
    saved = writer_module._pack
    writer_module._pack = _c_module("mqserver.store._pack") if packer == "c" else None
    try:
        return _apply(path, ops, flush_level, answer)
    finally:
        writer_module._pack = saved


def _apply(path, ops, flush_level, answer):
    s, rec, ms = _open(path, flush_level)
    pwrite = s.commitlog._pwrite
    seen = []
    for op in ops:
        kind = op[0]
        s.checkpoints.dirty = False
        if kind == "put":
            _, topic, qid, messages, now_ms, event_id, fault, *ends = op
            ends = ends[0] if ends else None
            pwrite.plan = list(fault)
            if answer:
                got = _outcome(lambda: _answered(s, rec, topic, qid, messages, now_ms,
                                                 event_id, ends))
            else:
                got = _outcome(lambda: s.put(topic, qid, messages, now_ms, event_id,
                                             ends=ends))
            pwrite.plan = []
        elif kind == "open-queue":  # a reader opens a queue before anything is written
            s.queue(op[1], op[2])
            got = "opened"
        elif kind == "admin":
            got = _outcome(lambda: s.put_admin(fmt.OP_UPDATE, op[1], b"body"))
        elif kind == "tick":  # the clock moves: store times differ
            ms[0] += op[1]
            got = None
        elif kind == "refuse":
            s.disk.refusal = StoreError("refused for the test") if op[1] else None
            got = None
        elif kind == "flush":
            s.flush_queues()
            got = None
        elif kind == "sync":  # the once-a-second fsync: the log's segments are clean
            s.sync()
            got = None
        seen.append((got, rec.calls[:], _state(s)))
        rec.calls.clear()
    files = _files(s)
    s.close()
    return seen, files


_body = st.sampled_from([b"", b"m", b"x" * 200, b"y" * 401, b"z" * 900])
_props = st.sampled_from([b"", b"TAGS\x01tagA\x02", b"KEYS\x01k1 k2\x02TAGS\x01B\x02",
                          b"UNIQ_KEY\x01U\x02", b"K\x01" + b"v" * 70_000 + b"\x02"])
_message = st.one_of(
    _body,  # bytes: a body alone
    st.builds(Message, body=_body, properties=_props, flag=st.integers(0, 3),
              sys_flag=st.sampled_from([0, 4]), born_ts=st.sampled_from([0, 5]),
              born_host=st.sampled_from([b"\x0a\x00\x00\x02\x00\x00\x04\xd2", b"bad"])),
)
_messages = st.one_of(
    st.lists(_message, min_size=1, max_size=1),  # the usual case, mostly
    st.lists(_message, min_size=1, max_size=1),
    st.lists(_message, min_size=0, max_size=4),
    st.lists(_message, min_size=1, max_size=1).map(tuple),  # not a list
)
_fault = st.sampled_from([(), (), (), ("enospc",), ("eio",), ("short",), ("short-eio",)])
_put_op = st.tuples(st.just("put"), st.sampled_from(["a", "b", "c"]), st.integers(0, 2),
                    _messages, st.sampled_from([None, None, None, 1_600_000_000_123]),
                    st.sampled_from([None, None, None, None, "skip"]), _fault)
# several writes of a replication master applied in one put: where each ends
_ends_op = st.lists(_message, min_size=1, max_size=6).flatmap(lambda ms: st.tuples(
    st.just("put"), st.sampled_from(["a", "b"]), st.integers(0, 1), st.just(ms),
    st.sampled_from([None, 1_600_000_000_123]), st.sampled_from([None, "skip"]), _fault,
    st.lists(st.sampled_from([0, 1]), min_size=len(ms), max_size=len(ms)).map(bytes)))
_op = st.one_of(
    _put_op, _put_op, _put_op, _put_op, _put_op, _ends_op,
    st.tuples(st.just("open-queue"), st.sampled_from(["a", "c", "d"]), st.integers(0, 2)),
    st.tuples(st.just("admin"), st.sampled_from(["a", "z"])),
    st.tuples(st.just("tick"), st.integers(1, 5)),
    st.tuples(st.just("refuse"), st.booleans()),
    st.tuples(st.just("flush")),
    st.tuples(st.just("sync")),
)


def _compare(tmp_path_factory, ops, flush_level=1):
    """Run C{ops} with the Python packing (the reference), then with the packing chosen
    at import, without and with answer callbacks: all three give the same."""
    ops = [_event_ids(op) for op in ops]
    chosen = "py" if speedups.pure_python() else "c"
    reference = _run(tmp_path_factory.mktemp("py"), ops, "py", flush_level)
    runs = [_run(tmp_path_factory.mktemp("answered"), ops, chosen, flush_level, True)]
    if chosen == "c":
        runs.append(_run(tmp_path_factory.mktemp("c"), ops, "c", flush_level))
    for run in runs:
        assert run[0] == reference[0]
        assert run[1] == reference[1]


def _event_ids(op):
    # "skip" asks for an eventId ahead of the writer's next (a replication slave's);
    # the same number in both stores, since both hand out the same ones.
    if op[0] == "put" and op[5] == "skip":
        return op[:5] + (10_000 + len(str(op)),) + op[6:]
    return op


_settings = settings(max_examples=250, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])


@_settings
@given(st.lists(_op, min_size=1, max_size=30))
def test_c_packing_and_answers_write_as_the_reference(tmp_path_factory, ops):
    """Single and batch writes, bodies and Messages with and without properties, three
    topics and queues, segment rollover (2 KiB segments), bodies over the limit, queues
    opened before their first write, times and eventIds given, refused and failing
    writes (ENOSPC, EIO, short writes): each call gives the same result, listener calls
    and bookkeeping, and the files hold the same bytes."""
    _compare(tmp_path_factory, ops)


@_settings
@given(st.lists(_op, min_size=1, max_size=12))
def test_flush_level_2_writes_as_the_reference(tmp_path_factory, ops):
    _compare(tmp_path_factory, ops, flush_level=2)


def _put(topic, messages, qid=0, now_ms=None, event_id=None, fault=(), ends=None):
    return ("put", topic, qid, messages, now_ms, event_id, fault, ends)


_M = [b"m"]
_TAGGED = Message(b"t", b"TAGS\x01A\x02KEYS\x01k\x02")
#: Named write sequences, each a case of the packing (one message into the open segment,
#: a batch, a new segment, an error), after a first write to topic "a", queue 0.
CASES = {
    "a queue a reader opened, of a topic not written yet": [("open-queue", "c", 0), _put("c", _M)],
    "a new queue of a topic written before": [_put("a", _M, qid=1)],
    "a time given": [_put("a", _M, now_ms=1_600_000_000_123)],
    "an eventId given": [_put("a", _M, event_id=50), _put("a", _M)],
    "an eventId behind the log": [_put("a", _M, event_id=1)],
    "a batch": [_put("a", [b"m", _TAGGED])],
    "writes of a master applied at once": [_put("a", [b"m", _TAGGED, b"n"], ends=b"\1\0\1")],
    "writes of a master across a new segment": [
        _put("a", [b"x" * 300] * 8, ends=b"\0\1\0\0\1\0\0\1")],
    "no message": [_put("a", [])],
    "a tuple of one": [_put("a", (b"m",))],
    "a new segment": [_put("a", [b"x" * 300]) for _ in range(8)],
    "a body over the limit": [_put("a", [b"y" * 401])],
    "properties over 65535 bytes": [_put("a", [Message(b"p", b"K\x01" + b"v" * 70_000 + b"\x02")])],
    "a born host not of 8 bytes": [_put("a", [Message(b"h", born_host=b"bad")])],
    "properties: dispatched": [_put("a", [_TAGGED]), _put("a", [Message(b"no properties")])],
    "a topic a dispatch listener named": [_put("b", _M), _put("b", _M), _put("b", [_TAGGED])],
    "ENOSPC": [_put("a", _M, fault=("enospc",)), _put("a", _M)],
    "EIO": [_put("a", _M, fault=("eio",)), _put("a", _M)],
    "a short write": [_put("a", _M, fault=("short",)), _put("a", _M)],
    "a short write, then EIO": [_put("a", _M, fault=("short-eio",)), _put("a", _M)],
    "a failed first write of a segment": [_put("a", [b"x" * 300]) for _ in range(6)] + [
        _put("a", [b"x" * 300], fault=("enospc",)), _put("a", _M), _put("a", _M)],
    "refused": [("refuse", True), _put("a", _M), ("refuse", False), _put("a", _M)],
    "the clock moves": [("tick", 3), _put("a", _M)],
    "a sampled write latency": [_put("a", _M) for _ in range(70)],
    "entries flushed at TAIL_LIMIT": [_put("a", [b""]) for _ in range(300)],
    "entries flushed between": [_put("a", _M), ("flush",), _put("a", _M)],
    "the log synced between": [("sync",), _put("a", _M)],
    "an admin record between": [("admin", "a"), _put("a", _M)],
}


@pytest.mark.parametrize("flush_level", [1, 2])
@pytest.mark.parametrize("name", list(CASES))
def test_each_case_writes_as_the_reference(tmp_path_factory, name, flush_level):
    _compare(tmp_path_factory, [_put("a", _M)] + CASES[name], flush_level)


def _usual_store(tmp_path):
    s, rec, _ = _open(tmp_path)
    s.put("a", 0, [b"first"])  # the topic and queue are known now
    return s, rec


def test_a_write_error_leaves_nothing(tmp_path):
    """ENOSPC on the usual publish: DiskFullError, the disk told, nothing of it stays in
    the log, the queue or the eventIds, and the next write lands where it would have."""
    s, rec = _usual_store(tmp_path)
    end, errors = s.commitlog.end, s.disk_errors
    rec.calls.clear()
    s.commitlog._pwrite.plan = ["short-eio"]
    with pytest.raises(StoreError, match="write failed"):
        s.put("a", 0, [b"y" * 100])
    assert (s.commitlog.end, s.next_event_id, s.find_queue("a", 0).max_offset) == (end, 2, 1)
    assert s.disk_errors == errors + 1 and rec.calls == []
    assert os.path.getsize(os.path.join(str(tmp_path), "commitlog", fmt.segment_name(0))) == end
    s.commitlog._pwrite.plan = ["enospc"]
    with pytest.raises(StoreError, match="disk full"):
        s.put("a", 0, [b"y" * 100])
    r = s.put("a", 0, [b"z"])
    assert r.log_offsets == [end] and r.event_id == 2 and r.queue_offsets == [1]
    s.close()


def test_flush_level_2_answers_after_the_flusher(tmp_path):
    """At flush level 2 the usual publish is answered, and shown, only once the fsync
    that covers it is done; an answer callback is left uncalled."""
    runner = ManualRunner()
    s, rec, _ = _open(tmp_path, flush_level=2, runner=runner)
    for body in (b"one", b"two"):  # the second one is the usual publish
        got, shown, answers = [], s.visible_end, []
        rec.calls.clear()
        s.put("a", 0, [body], None, None, answers.append).addCallback(got.append)
        assert answers == []
        assert got == [] and s.visible_end == shown < s.commitlog.end
        assert not [c for c in rec.calls if c[0] == "arrived"]
        runner.finish_all()
        assert type(got[0]) is PutResult and s.visible_end == s.commitlog.end
    s.close()


def test_append_open_refuses_what_does_not_fit(tmp_path):
    """CommitLog.append_open writes only inside the open segment, and nothing else."""
    s, _, _ = _open(tmp_path)
    log = s.commitlog
    with pytest.raises(ValueError):  # no segment open yet
        log.append_open(b"x" * 10)
    s.put("a", 0, [b"first"])
    end = log.end
    assert log.open_end == log.segment_size
    with pytest.raises(ValueError):
        log.append_open(b"x" * (log.open_end - end + 1))
    assert log.end == end and os.path.getsize(log._path(0)) == end
    log.append_open(b"x" * (log.open_end - end))  # up to the end of the segment
    assert log.end == log.open_end
    log.truncate(0)  # the segment is gone: no segment is open
    assert log.open_end == 0
    s.close()


@pytest.fixture
def logged():
    """The failures logged through twisted.logger while the test runs."""
    from twisted.logger import globalLogPublisher

    events = []

    def observe(event):
        if event.get("log_failure") is not None:
            events.append(event)

    globalLogPublisher.addObserver(observe)
    yield events
    globalLogPublisher.removeObserver(observe)


def test_an_answer_that_raises_leaves_the_bookkeeping_done(tmp_path, logged):
    """The write is kept whole when the caller's answer callback fails: its queue entry,
    eventId and listeners are as without the callback, and the failure is logged."""
    s, rec = _usual_store(tmp_path)
    rec.calls.clear()

    def answer(result):
        raise RuntimeError("the answer failed")

    assert s.put("a", 0, [b"second"], None, None, answer) is None
    assert s.find_queue("a", 0).max_offset == 2 and s.next_event_id == 3
    assert ("arrived", "a", 0) in rec.calls and s.visible_end == s.commitlog.end
    assert [e["log_failure"].value.args for e in logged] == [("the answer failed",)]
    s.flush_queues()
    assert len(s.read_entries("a", 0, 0, 10)) == 2 * fmt.CQ_ENTRY_SIZE  # both entries
    s.close()


def test_a_listener_failing_after_the_answer_is_logged(tmp_path, logged):
    """A listener that fails after the client was answered cannot take the answer back:
    the failure is logged. Without an answer callback it is raised, as before."""
    s, rec = _usual_store(tmp_path)

    def broken(topic, queue_id):
        raise RuntimeError("listener")

    s.add_arrival_listener(broken)
    answers = []
    assert s.put("a", 0, [b"second"], None, None, answers.append) is None
    assert [r.queue_offsets for r in answers] == [[1]]
    assert [e["log_failure"].value.args for e in logged] == [("listener",)]
    with pytest.raises(RuntimeError, match="listener"):
        s.put("a", 0, [b"third"])
    assert s.find_queue("a", 0).max_offset == 3
    s.close()


@pytest.mark.parametrize("packer", ["py", "c"])
def test_the_answer_comes_before_the_bookkeeping_with_either_packing(tmp_path, packer):
    """With the Python packing as with the C one, a write complete at once calls its
    answer callback before any listener hears of it, and put returns None."""
    saved = writer_module._pack
    writer_module._pack = _c_module("mqserver.store._pack") if packer == "c" else None
    try:
        s, rec = _usual_store(tmp_path)
        rec.calls.clear()
        for messages in ([b"second"], [b"third", Message(b"x", b"TAGS\x01A\x02")]):
            answers = []
            assert s.put("a", 0, messages, None, None,
                         lambda r: answers.append((r, rec.calls[:]))) is None
            [(result, heard)] = answers
            assert heard == [] and ("arrived", "a", 0) in rec.calls
            rec.calls.clear()
        assert result.queue_offsets == [2, 3] and s.next_event_id == 5
        s.close()
    finally:
        writer_module._pack = saved


@pytest.mark.parametrize("packer", ["c", "py"])
@pytest.mark.parametrize("ends, more", [
    (None, [1, 1, 1, 1, 0]),
    (b"\0\1\0\0\1", [1, 0, 1, 1, 0]),
    (b"\1\1\1\1\1", [0, 0, 0, 0, 0]),
    (b"\0\1\0\0\0", [1, 0, 1, 1, 0]),  # the put's last record ends a write anyway
])
def test_each_write_of_a_put_keeps_its_end(tmp_path, packer, ends, more):
    """A put of several writes (C{ends}) marks SYSFLAG_BATCH_MORE on every record but
    the last of each write, as the writes made one by one would; the messages' own bit
    is cleared."""
    saved = writer_module._pack
    writer_module._pack = _c_module("mqserver.store._pack") if packer == "c" else None
    try:
        s, _, _ = _open(tmp_path)
        msgs = [Message(b"m%d" % i, sys_flag=fmt.SYSFLAG_BATCH_MORE) for i in range(5)]
        r = s.put("a", 0, msgs, ends=ends)
        views = [fmt.RecordView(s.commitlog.read(off, size))
                 for off, size in zip(r.log_offsets, r.sizes)]
        assert [int(bool(v.sys_flag & fmt.SYSFLAG_BATCH_MORE)) for v in views] == more
        s.close()
    finally:
        writer_module._pack = saved


@pytest.mark.parametrize("packer", ["c", "py"])
def test_a_failed_write_takes_no_event_id_even_one_given(tmp_path, packer):
    """A follower's write of its master's eventId 50 (ahead of the log) that fails (disk
    full, a body over the limit) leaves the next eventId where it was, for messages and
    admin records: the write taken again later is not skipped as already held."""
    saved = writer_module._pack
    writer_module._pack = _c_module("mqserver.store._pack") if packer == "c" else None
    try:
        s, _, _ = _open(tmp_path)
        s.put("a", 0, [b"first"])
        nxt = s.writer.next_event_id
        s.commitlog._pwrite.plan = ["enospc"]
        with pytest.raises(StoreError):
            s.put("a", 0, [b"m", b"n"], event_id=50)
        assert s.writer.next_event_id == nxt
        with pytest.raises(StoreError):
            s.put("a", 0, [b"y" * 401], event_id=60)
        assert s.writer.next_event_id == nxt
        s.disk.refusal = None
        s.commitlog._pwrite.plan = ["enospc"]
        failure = []
        s.put_admin(fmt.OP_UPDATE, "a", b"body", event_id=70).addErrback(failure.append)
        assert failure and s.writer.next_event_id == nxt
        s.disk.refusal = None
        assert s.put("a", 0, [b"again"]).event_id == nxt
        s.close()
    finally:
        writer_module._pack = saved
