"""What front doors read of the store, through the broker's interfaces
(mqserver/broker/storeviews.py), on a real store: records by commit-log offset (sound
ones only), store times, cursors from an eventId, the key index, a follower's
truncation request, the store's figures and a door's JSON files."""

import errno
import json
import os

import pytest
from twisted.internet.task import Clock

from mqserver.broker.broker import Broker
from mqserver.errors import DiskFullError
from mqserver.message import Message, RecordView
from mqserver.store import format as fmt
from mqserver.store.store import MessageStore
from tests.support.inprocess import result_of

NOW = 1_700_000_000.0


@pytest.fixture
def broker(tmp_path):
    clock = Clock()
    clock.advance(NOW)
    store = MessageStore(str(tmp_path / "data"), clock, segment_size=1 << 16,
                         cq_entries_per_file=64, clock=lambda: NOW)
    b = Broker(store, clock)
    store.open()
    result_of(b.create_topic("t", queues=2))
    yield b
    store.close()


def _publish(broker, bodies, queue_id=0, props=b""):
    return result_of(broker.publish("t", [Message(body=b, properties=props) for b in bodies],
                                    queue_id))


def test_message_at_returns_sound_message_records_only(broker):
    log = broker.messages
    r = _publish(broker, [b"one", b"two"])
    data = log.message_at(r.log_offsets[1])
    assert RecordView(data).body == b"two" and len(data) == r.sizes[1]
    assert log.message_at(0) is None, "the topic's CREATE record is not a message"
    assert log.message_at(r.log_offsets[1] + 1) is None, "not where a record starts"
    assert log.message_at(log.end) is None
    assert log.message_at(r.log_offsets[1], end=r.log_offsets[1] + 10) is None
    # a damaged body is never served, and counted once
    first = log.message_at(r.log_offsets[0])
    path = os.path.join(broker.files.path, "commitlog", fmt.segment_name(0))
    with open(path, "r+b") as f:
        f.seek(r.log_offsets[0] + first.index(b"one"))
        f.write(b"O")
    assert log.message_at(r.log_offsets[0]) is None
    assert broker.store_stats.damaged_records == 1


def test_store_ts_at_reads_the_records_store_time(broker):
    r = _publish(broker, [b"x"])
    log = broker.messages
    assert log.store_ts_at(r.log_offsets[0]) == r.store_ts == int(NOW * 1000)
    assert log.store_ts_at(log.end) == 0
    assert broker.store_stats.earliest_store_ts() == int(NOW * 1000)


def test_cursor_at_reads_from_an_event_id_over_every_queue(broker):
    first = _publish(broker, [b"a", b"b"], 0)
    _publish(broker, [b"c"], 1)
    cursor = broker.messages.cursor_at("t", range(2), first.event_id + 1)
    buf, locs = cursor.read_span(10)
    assert [bytes(RecordView(buf, pos).body) for pos, _ in locs] == [b"b", b"c"]


def test_the_key_index_finds_messages_by_key(broker):
    index = broker.messages.open_key_index()
    try:
        r = _publish(broker, [b"k"], props=fmt.encode_properties([(b"KEYS", b"order-7")]))
        _publish(broker, [b"other"], props=fmt.encode_properties([(b"KEYS", b"order-8")]))
        assert index.lookup("t", "order-7", 10, 0, 1 << 62) == [r.log_offsets[0]]
    finally:
        index.close()


def test_request_truncation_cuts_after_the_write_holding_the_event_id(broker):
    r = _publish(broker, [b"a", b"b"])
    _publish(broker, [b"c"])
    log = broker.replication_log
    log.request_truncation(r.event_id)  # the first record of a two-record write
    want = {"afterEventId": r.event_id, "offset": r.log_offsets[1] + r.sizes[1]}
    assert broker.store.pending_truncation() == want
    log.request_truncation(log.next_event_id + 5)  # past the log's end: nothing to cut
    assert broker.store.pending_truncation()["offset"] == broker.messages.end


def test_reader_after_reads_the_writes_after_an_event_id(broker):
    r = _publish(broker, [b"a", b"b"])
    c = _publish(broker, [b"c"])
    views = broker.replication_log.reader_after(r.event_id).read()
    assert [v.event_id for v in views] == [c.event_id]


def test_store_stats_show_the_stores_figures(broker):
    _publish(broker, [b"x" * 100])
    s, store = broker.store_stats, broker.store
    assert (s.next_event_id, s.min_offset, s.end, s.segments) == (
        store.next_event_id, 0, store.commitlog.end, 1)
    assert 0 < s.disk_used_ratio() <= 1
    assert s.disk_max_used_ratio == store.disk_max_used_ratio
    assert (s.disk_errors, s.disk_full_events, s.damaged_records) == (0, 0, 0)
    assert s.fsync_latency is store.flusher.fsync_latency


def test_data_files_write_read_and_count_failures(broker):
    files = broker.files
    assert files.read_json("door.json") is None
    files.write_json("door.json", {"a": 1})
    assert files.read_json("door.json") == {"a": 1}
    result_of(files.save_json("door.json", {"a": 2}))
    with open(os.path.join(files.path, "door.json")) as f:
        assert json.load(f) == {"a": 2}
    e = files.disk_failed("writing door.json", OSError(errno.ENOSPC, "No space left"))
    assert isinstance(e, DiskFullError)
    assert broker.store_stats.disk_errors == 1
