"""Damaged records: bytes flipped at chosen places in the commit log, and a
damaged checkpoint. Every read path (cursors, the replication log reader, recovery and
rebuilds) leaves a damaged record out, reports it once and goes on with the records after
it."""

import os
import shutil

import pytest
from twisted.internet.task import Clock
from twisted.logger import globalLogPublisher

from mqserver.broker.cursor import TopicCursor
from mqserver.replication.logreader import LogReader
from mqserver.store import format as fmt
from mqserver.store.store import Message, MessageStore
from tests.support.inprocess import result_of as fired
from tests.unit.test_broker_recovery import open_broker

NOW = 1_700_000_000.0
SEGMENT = 4096


def open_store(path):
    s = MessageStore(str(path), Clock(), segment_size=SEGMENT, cq_entries_per_file=10,
                     clock=lambda: NOW)
    s.open()
    return s


@pytest.fixture
def logged():
    """Every log event's formatted text while the test runs."""
    from twisted.logger import formatEvent

    lines = []

    def observer(event):
        lines.append(formatEvent(event))

    globalLogPublisher.addObserver(observer)
    yield lines
    globalLogPublisher.removeObserver(observer)


def fill(path, topics=("t",), n=120):
    """Write n messages (each body names its index) round-robin over topics; return the
    store closed, and [(topic, body, offset, event id)] of every message."""
    s = open_store(path)
    out = []
    for i in range(n):
        topic = topics[i % len(topics)]
        body = b"m%03d-" % i + b"x" * 60
        r = fired(s.put_messages(topic, 0, [Message(body=body)]))
        out.append((topic, body, r.log_offsets[0], r.event_id))
    s.close()
    return out


def flip(path, offset, delta=0):
    """XOR one byte of the commit log at C{offset + delta}."""
    seg = offset - offset % SEGMENT
    name = os.path.join(path, "commitlog", fmt.segment_name(seg))
    with open(name, "r+b") as f:
        f.seek(offset - seg + delta)
        b = f.read(1)
        f.seek(offset - seg + delta)
        f.write(bytes([b[0] ^ 0x5A]))


def read_cursor(store, topic, batch=7):
    cur = TopicCursor.after_event(store, topic, [0], 0)
    bodies = []
    while True:
        buf, locs = cur.read_span(batch)
        if not locs:
            return bodies
        bodies += [bytes(fmt.RecordView(buf, p).body) for p, _ in locs]


def lose_checkpoint_and_queues(path):
    os.remove(os.path.join(path, "metadata.json"))
    shutil.rmtree(os.path.join(path, "consumequeue"))


def test_body_flip_in_an_older_segment_is_skipped_by_reads(tmp_path, logged):
    """A body byte flipped in an older segment (checkpoint intact, so recovery does not
    scan it): the cursor leaves that record out, logs it once with its segment, offset
    and eventId, counts it, and every other record is read."""
    msgs = fill(tmp_path)
    _, body, off, eid = msgs[10]
    flip(tmp_path, off, fmt.HEADER_SIZE + 2)
    s = open_store(tmp_path)
    assert s.damaged_records == 0
    want = [m[1] for m in msgs if m[1] != body]
    assert read_cursor(s, "t") == want
    assert read_cursor(s, "t", batch=1) == want  # a batch of only the damaged record
    assert s.damaged_records == 1
    lines = [x for x in logged if "damaged record skipped" in x]
    assert len(lines) == 1, lines
    assert fmt.segment_name(off - off % SEGMENT) in lines[0]
    assert f"offset {off} " in lines[0] and f"eventId {eid}" in lines[0]
    s.close()


def test_rebuild_with_a_damaged_body_keeps_every_later_record(tmp_path, logged):
    """The damage plus a lost checkpoint and lost consume queues: the rebuild reports the
    record at start-up, keeps the queue dense, and a reader gets every intact message,
    with no error on the way."""
    msgs = fill(tmp_path)
    _, body, off, eid = msgs[10]
    flip(tmp_path, off, fmt.HEADER_SIZE + 2)
    lose_checkpoint_and_queues(tmp_path)
    s = open_store(tmp_path)
    assert s.damaged_records == 1
    assert any("damaged record skipped" in x and f"eventId {eid}" in x for x in logged)
    assert any("recovery found 1 damaged records" in x for x in logged)
    q = s.queue("t", 0)
    assert q.max_offset == len(msgs)
    assert read_cursor(s, "t") == [m[1] for m in msgs if m[1] != body]
    assert s.damaged_records == 1  # reported once, not again by the read
    assert s.next_event_id == msgs[-1][3] + 1
    s.close()


@pytest.mark.parametrize("where", [0, 4, fmt.OFF_BODY_LEN])
def test_rebuild_steps_over_damaged_framing(tmp_path, logged, where):
    """Damage in a record's size, magic or body length: recovery finds the next record by
    its header (every record names its own offset) and reindexes everything after it."""
    msgs = fill(tmp_path)
    _, body, off, _ = msgs[10]
    flip(tmp_path, off, where)
    lose_checkpoint_and_queues(tmp_path)
    s = open_store(tmp_path)
    assert s.damaged_records == 1
    assert read_cursor(s, "t") == [m[1] for m in msgs if m[1] != body]
    assert not any("Traceback" in x for x in logged)
    s.close()


def test_damage_in_the_last_segment_is_not_taken_for_a_torn_tail(tmp_path):
    """A damaged record in the middle of the last segment is skipped, not truncated with
    everything after it."""
    msgs = fill(tmp_path)
    last_seg = msgs[-1][2] - msgs[-1][2] % SEGMENT
    in_last = [m for m in msgs if m[2] >= last_seg]
    assert len(in_last) >= 3
    _, body, off, _ = in_last[1]
    flip(tmp_path, off, 0)  # the size field
    os.remove(os.path.join(tmp_path, "metadata.json"))
    s = open_store(tmp_path)
    assert s.commitlog.end > msgs[-1][2]
    assert read_cursor(s, "t") == [m[1] for m in msgs if m[1] != body]
    s.close()


def test_merged_cursor_skips_damaged_records(tmp_path):
    """A cursor over several queues (eventId merge) passes over a damaged record."""
    s = open_store(tmp_path)
    want = []
    damaged = None
    for i in range(40):
        body = b"q%d-%03d" % (i % 3, i) + b"y" * 50
        r = fired(s.put_messages("multi", i % 3, [Message(body=body)]))
        if i == 7:
            damaged = r.log_offsets[0]
        else:
            want.append(body)
    s.close()
    flip(tmp_path, damaged, fmt.HEADER_SIZE)
    s = open_store(tmp_path)
    for batch in (1, 5, 100):
        cur = TopicCursor.after_event(s, "multi", [0, 1, 2], 0)
        got = []
        while True:
            buf, locs = cur.read_span(batch)
            if not locs:
                break
            got += [bytes(fmt.RecordView(buf, p).body) for p, _ in locs]
        assert got == want, batch
    assert s.damaged_records == 1
    s.close()


def test_log_reader_never_returns_a_damaged_record_and_goes_on(tmp_path):
    """The replication feed's reader leaves out a record that fails its CRC (and one whose
    framing is damaged) and reads on to the end: no stall at the damage."""
    msgs = fill(tmp_path, n=60)
    flip(tmp_path, msgs[5][2], fmt.HEADER_SIZE + 1)
    flip(tmp_path, msgs[30][2], 4)
    s = open_store(tmp_path)
    reader = LogReader(s, s.commitlog.min_offset)
    got = []
    for _ in range(1000):
        views = reader.read(max_bytes=300)
        if not views:
            break
        assert all(v.crc_ok() for v in views)
        got += [v.event_id for v in views]
    want = [m[3] for i, m in enumerate(msgs) if i not in (5, 30)]
    assert got == want
    assert reader.offset == s.visible_end
    assert s.damaged_records == 2
    # Resuming after the record before a damaged one starts after the gap.
    r = LogReader.after_event(s, msgs[4][3])
    assert r.read()[0].event_id == msgs[6][3]
    # Resuming at the damaged record's own eventId (a slave that holds it) too.
    r = LogReader.after_event(s, msgs[5][3])
    assert r.read()[0].event_id == msgs[6][3]
    s.close()


@pytest.mark.parametrize("content", [
    b"{not json", b"\xff\xfe\x00garbage", b"", b"[1, 2, 3]",
    b'{"version": 1, "logOffset": "x", "nextEventId": 5, "queues": {}}',
    b'{"version": 1, "logOffset": 0, "nextEventId": 1, "queues": {"t": [1]}}',
    b'{"version": 1, "logOffset": 0, "nextEventId": 1, "queues": {}, "state": {"topics": 7}}',
])
def test_a_bad_checkpoint_is_rebuilt_from_the_log(tmp_path, logged, content):
    """A checkpoint that is not JSON, or not shaped like one, is rebuilt from the log with
    a warning: topics and pending delays are records in it."""
    store, broker = open_broker(tmp_path)
    fired(broker.create_topic("kept"))
    for i in range(30):
        fired(broker.publish("kept", [Message(body=b"k%02d" % i)]))
    fired(broker.delay("kept", 3_600_000, [Message(body=b"later")]))
    fired(store.checkpoint())
    store.close()
    with open(os.path.join(tmp_path, "metadata.json"), "wb") as f:
        f.write(content)
    store2, broker2 = open_broker(tmp_path)
    assert [t.name for t in broker2.topics()] == ["kept"]
    assert store2.queue("kept", 0).max_offset == 30
    assert len(broker2.delays.snapshot()) == 1
    assert store2.next_event_id == 33
    assert any("rebuilding from the commit log" in x for x in logged)
    store2.close()


def test_channel_passes_over_a_damaged_record_and_its_floor_moves(tmp_path):
    """An NSQ-style channel never delivers a damaged record; once the rest is finished
    its floor is past it (the position it keeps across restarts does not stick there)."""
    from tests.unit.test_channels import Consumer

    clock = Clock()
    store, broker = open_broker(tmp_path)
    fired(broker.create_topic("c"))
    offs = []
    for i in range(20):
        r = fired(broker.publish("c", [Message(body=b"c%02d" % i)]))
        offs.append(r.log_offsets[0])
    store.close()
    flip(tmp_path, offs[3], fmt.HEADER_SIZE)
    store, broker = open_broker(tmp_path)
    broker.start()
    ch = broker.channels.create_channel("c", "ch")
    ch.cursor.positions = {0: 0}
    ch.floor = {0: 0}
    consumer = Consumer(rdy=100)
    ch.add_consumer(consumer)
    broker._reactor.advance(0)
    got = consumer.take()
    assert [body for _, _, body in got] == [b"c%02d" % i for i in range(20) if i != 3]
    assert ch.finish_many([eid for eid, _, _ in got], consumer) == 19
    assert ch.floor == {0: 20}
    assert store.damaged_records == 1
    store.close()


def test_a_write_cut_by_a_crash_ends_at_its_last_record(tmp_path):
    """A multi-message write whose tail a crash tore off: recovery cuts the torn record
    and clears the 'more of this write follows' bit of the last one kept, so the
    replication feed sends what is left as one record instead of waiting for more."""
    s = open_store(tmp_path)
    fired(s.put_messages("w", 0, [Message(body=b"solo")]))
    r = fired(s.put_messages("w", 0, [Message(body=b"part%d" % i) for i in range(3)]))
    s.close()
    last = r.log_offsets[-1]
    seg = last - last % SEGMENT
    with open(os.path.join(tmp_path, "commitlog", fmt.segment_name(seg)), "r+b") as f:
        f.truncate(last - seg + 20)  # the third record torn
    os.remove(os.path.join(tmp_path, "metadata.json"))
    s = open_store(tmp_path)
    views = []
    reader = LogReader(s, 0)
    while True:
        got = reader.read()
        if not got:
            break
        views += got
    assert [bytes(v.body) for v in views] == [b"solo", b"part0", b"part1"]
    assert views[1].sys_flag & fmt.SYSFLAG_BATCH_MORE
    assert not views[2].sys_flag & fmt.SYSFLAG_BATCH_MORE
    s.close()


@pytest.mark.parametrize("where", [0, 4, fmt.OFF_BODY_LEN])
def test_rebuild_counts_each_damaged_header_once_at_its_place(tmp_path, logged, where):
    """Four records with a damaged header (size, magic or body length), in two
    segments, then a rebuild: each is logged once, naming its own segment and offset,
    and counted once; reading every queue afterwards adds no report (the queue slots
    those records had are no records, not more damage at offset 0)."""
    msgs = fill(tmp_path, topics=("t", "u"))
    hit = [msgs[i] for i in (10, 21, 40, 75)]
    for _, _, off, _ in hit:
        flip(tmp_path, off, where)
    lose_checkpoint_and_queues(tmp_path)
    s = open_store(tmp_path)
    bodies = {m[1] for m in hit}
    for topic in ("t", "u"):
        for batch in (1, 7, 100):
            want = [m[1] for m in msgs if m[0] == topic and m[1] not in bodies]
            assert read_cursor(s, topic, batch) == want
    assert s.damaged_records == 4
    lines = [x for x in logged if "damaged record skipped" in x]
    assert len(lines) == 4, lines
    for line, (_, _, off, _) in zip(lines, hit):
        assert f"segment {fmt.segment_name(off - off % SEGMENT)} offset {off} " in line, line
    s.close()
