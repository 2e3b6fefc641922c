"""A consumer keeping up with a publisher takes the record just written from the store's
memory (L{MessageStore.newest_record}) instead of reading it back from the log, and gets
exactly what reading it back gives, in every case the cursor meets."""

import pytest
from hypothesis import given, settings, strategies as st
from twisted.internet.task import Clock

from mqserver.broker.cursor import TopicCursor
from mqserver.store import format as fmt
from mqserver.store.store import Message, MessageStore
from tests.support.inprocess import result_of as fired
from tests.unit.test_store import ManualRunner

NOW = 1_700_000_000.0


def _open(path, **kw):
    s = MessageStore(str(path), Clock(), segment_size=1 << 20, cq_entries_per_file=100,
                     clock=lambda: NOW, **kw)
    s.open()
    reads = []
    log_read = s.commitlog.read

    def counted(offset, size):
        reads.append(offset)
        return log_read(offset, size)

    s.commitlog.read = counted  # counts the reads every read path makes of the log
    s.log_reads = reads
    return s


@pytest.fixture
def store(tmp_path):
    s = _open(tmp_path)
    yield s
    s.close()


class _ReadBack:
    """The store as a cursor sees it, without the newest record's hand-off: every record
    is read back from the log (the reference the hand-off must equal)."""

    def __init__(self, store):
        self._store = store

    def newest_record(self, topic, queue_id, qoffset):
        return None

    def __getattr__(self, name):
        return getattr(self._store, name)


def _records(buf, locs):
    return [bytes(buf[p:p + size]) for p, size in locs]


def test_a_consumer_at_the_tail_takes_the_record_just_written(store):
    cursor = TopicCursor.at_end(store, "t", [0])
    for i in range(5):
        fired(store.put_messages("t", 0, [Message(body=b"m%d" % i)]))
        store.log_reads.clear()
        buf, locs = cursor.read_span(10)
        assert store.log_reads == [], "the record just written is not read back"
        (record,) = _records(buf, locs)
        view = fmt.RecordView(record)
        assert bytes(view.body) == b"m%d" % i and view.queue_offset == i
        # the very bytes the log holds
        assert _records(*store.read_records(store.read_entries("t", 0, i, 1))) == [record]
    assert cursor.positions == {0: 5}
    entry_reads = []
    read_entries = store.read_entries
    store.read_entries = lambda *a: entry_reads.append(a) or read_entries(*a)
    assert cursor.read_span(10) == (None, [])
    assert entry_reads == [], "just past the newest record: nothing more to look for"
    assert store.newest_record("t", 0, 5) == b""


def test_not_for_a_batch_another_queue_or_a_reader_behind(store):
    behind = TopicCursor.at_end(store, "t", [0])
    fired(store.put_messages("t", 0, [Message(body=b"a")]))
    fired(store.put_messages("t", 0, [Message(body=b"b"), Message(body=b"c")]))
    assert store.newest_record("t", 0, 2) is None, "the last append wrote two"
    fired(store.put_messages("t", 0, [Message(body=b"d")]))
    assert store.newest_record("t", 0, 3) is not None
    assert store.newest_record("t", 1, 3) is None
    assert store.newest_record("u", 0, 3) is None
    assert store.newest_record("t", 0, 2) is None
    assert store.newest_record("t", 0, 5) is None, "two past it: not this queue's end"
    buf, locs = behind.read_span(10)
    assert [bytes(fmt.RecordView(r).body) for r in _records(buf, locs)] == [
        b"a", b"b", b"c", b"d"]


def test_not_before_readers_may_see_it_at_flush_level_2(tmp_path):
    runner = ManualRunner()
    s = _open(tmp_path, flush_level=2, runner=runner)
    try:
        cursor = TopicCursor.at_end(s, "t", [0])
        s.put_messages("t", 0, [Message(body=b"durable first")])
        assert s.newest_record("t", 0, 0) is None
        assert cursor.read_span(10) == (None, [])
        assert cursor.positions == {0: 0}
        runner.finish_all()
        buf, locs = cursor.read_span(10)
        assert [bytes(fmt.RecordView(r).body) for r in _records(buf, locs)] == [b"durable first"]
    finally:
        s.close()


def test_not_after_the_topic_was_dropped(store):
    fired(store.put_messages("t", 0, [Message(body=b"gone")]))
    assert store.newest_record("t", 0, 0) is not None
    fired(store.drop_topic("t"))
    assert store.newest_record("t", 0, 0) is None


def test_not_after_a_delete_record_or_a_reopen(tmp_path):
    """A topic deleted through the log (the admin record every delete writes, which the
    state machine applies) and a store opened again hand off nothing old."""
    s = _open(tmp_path)
    fired(s.put_messages("t", 0, [Message(body=b"gone")]))
    fired(s.put_admin(fmt.OP_DELETE, "t", b""))
    assert s.newest_record("t", 0, 0) is None
    fired(s.put_messages("t", 0, [Message(body=b"kept")]))
    assert s.newest_record("t", 0, 0) is not None
    s.close()
    s.open()
    try:
        assert s.newest_record("t", 0, 0) is None
    finally:
        s.close()


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from(["t", "u"]), st.integers(0, 1),
                  st.integers(1, 3)),
        st.tuples(st.just("read"), st.integers(0, 1), st.integers(1, 4)),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(ops=_OPS)
def test_the_hand_off_gives_what_reading_back_gives(tmp_path_factory, ops):
    """Publishes of one or several messages to two topics and two queues, and reads of
    two cursors (one topic of one queue, one of two queues) in any order: each cursor
    gives the same records and ends at the same positions as its twin that reads
    everything back from the log."""
    s = _open(tmp_path_factory.mktemp("handoff"))
    try:
        back = _ReadBack(s)
        cursors = [(TopicCursor.at_end(s, "t", [0]), TopicCursor.at_end(back, "t", [0])),
                   (TopicCursor.at_end(s, "u", [0, 1]), TopicCursor.at_end(back, "u", [0, 1]))]
        n = 0
        for op in ops:
            if op[0] == "put":
                _, topic, qid, count = op
                msgs = [Message(body=b"%s%d" % (topic.encode(), n + i)) for i in range(count)]
                n += count
                fired(s.put_messages(topic, qid, msgs))
            else:
                _, which, batch = op
                fast, slow = cursors[which]
                assert _records(*fast.read_span(batch)) == _records(*slow.read_span(batch))
                assert fast.positions == slow.positions
        for fast, slow in cursors:
            assert _records(*fast.read_span(1000)) == _records(*slow.read_span(1000))
            assert fast.positions == slow.positions
    finally:
        s.close()
