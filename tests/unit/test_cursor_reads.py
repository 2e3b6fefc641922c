"""What a cursor's batch read takes from the commit log: about the batch's own records,
whatever the number of queues of the topic and however far apart its records lie (the
smss door's RSS peak under fuzzing: a SUB to a 16-queue topic read 32 MB for a 90 KB
batch)."""

import pytest
from twisted.internet.task import Clock

from mqserver.broker.cursor import TopicCursor
from mqserver.store import format as fmt
from mqserver.store.store import Message, MessageStore
from tests.support.inprocess import result_of as fired

NOW = 1_700_000_000.0
#: Reads a test lets a cursor make before it must have reached the end of its records.
_MAX_READS = 10_000


@pytest.fixture
def store(tmp_path):
    s = MessageStore(str(tmp_path), Clock(), segment_size=8 << 20, cq_entries_per_file=1000,
                     clock=lambda: NOW)
    s.open()
    reads = []
    log_read = s.commitlog.read

    def counted(offset, size):
        data = log_read(offset, size)
        reads.append(len(data))
        return data

    s.commitlog.read = counted  # counts the bytes every read path takes from the log
    s.log_reads = reads
    yield s
    s.close()


def fill(store, topic, queues, count, filler):
    """Write C{count} messages of C{topic} round-robin over its queues, each followed by
    a C{filler}-byte message of another topic; return [(event id, body)]."""
    out = []
    for i in range(count):
        body = b"m%05d" % i
        r = fired(store.put_messages(topic, i % queues, [Message(body=body)]))
        out.append((r.event_id, body))
        fired(store.put_messages("filler", 0, [Message(body=bytes(filler))]))
    return out


def read_all(store, cursor, batch):
    """Every record the cursor gives as (event id, body), and the most bytes read from
    the log for one batch."""
    got, most = [], 0
    for _ in range(_MAX_READS):  # bounded: a cursor that stops moving fails, not hangs
        store.log_reads.clear()
        buf, locs = cursor.read_span(batch)
        most = max(most, sum(store.log_reads))
        if not locs:
            return got, most
        for p, _ in locs:
            view = fmt.RecordView(buf, p)
            got.append((view.event_id, bytes(view.body)))
    pytest.fail(f"the cursor gave records for {_MAX_READS} reads without reaching the end")


def test_merged_batch_reads_only_the_records_it_takes(store):
    """16 queues whose records lie 4 KiB apart: a batch of 100 is merged from the
    consume-queue entries and reads the ~420 KB holding those 100 records (reading 100
    records of every queue and keeping 100 read over 30 MB per batch)."""
    want = fill(store, "multi", queues=16, count=512, filler=4096)
    cursor = TopicCursor.after_event(store, "multi", range(16), 0)
    got, most = read_all(store, cursor, 100)
    assert got == want, "every message once, in eventId order"
    assert most <= 100 * (4096 + 2 * 300), most


@pytest.mark.parametrize("batch", [1, 7, 64])
def test_merged_batches_keep_event_id_order_and_positions(store, batch):
    want = fill(store, "multi", queues=3, count=90, filler=10)
    cursor = TopicCursor.after_event(store, "multi", range(3), 0)
    got, _ = read_all(store, cursor, batch)
    assert got == want
    assert cursor.positions == {0: 30, 1: 30, 2: 30}
    # a cursor resumed after an eventId goes on from there
    resumed = TopicCursor.after_event(store, "multi", range(3), want[40][0])
    assert read_all(store, resumed, batch)[0] == want[41:]


def test_records_far_apart_are_read_one_by_one(store):
    """Records 300 KB apart (in one segment, over 1 MiB in all): each is read alone,
    not with the 300 KB of other records between it and the next."""
    want = fill(store, "sparse", queues=1, count=10, filler=300_000)
    cursor = TopicCursor.after_event(store, "sparse", [0], 0)
    got, most = read_all(store, cursor, 10)
    assert got == want
    assert most <= 10 * 1024, most


def test_merged_read_reports_a_damaged_record_to_on_skip(tmp_path):
    """A damaged record of one queue is left out of a merged batch and reported once to
    C{on_skip} with its queue and queue offset (an NSQ channel counts it as done)."""
    from tests.unit.test_store_damage import flip, open_store

    s = open_store(tmp_path)
    want, damaged = [], None
    for i in range(30):
        r = fired(s.put_messages("multi", i % 3, [Message(body=b"m%02d" % i)]))
        if i == 7:
            damaged = r.log_offsets[0]
        else:
            want.append(b"m%02d" % i)
    s.close()
    flip(tmp_path, damaged, fmt.HEADER_SIZE)
    s = open_store(tmp_path)
    try:
        cursor = TopicCursor.after_event(s, "multi", range(3), 0)
        skipped = []
        cursor.on_skip = lambda qid, qoff: skipped.append((qid, qoff))
        got = []
        for _ in range(_MAX_READS):
            buf, locs = cursor.read_span(4)
            if not locs:
                break
            got += [bytes(fmt.RecordView(buf, p).body) for p, _ in locs]
        else:
            pytest.fail(f"the cursor gave records for {_MAX_READS} reads without reaching the end")
        assert got == want
        assert skipped == [(1, 2)], "message 7: queue 7 % 3, offset 7 // 3"
        assert cursor.positions == {0: 10, 1: 10, 2: 10}
    finally:
        s.close()
