"""Broker state (topics, delays) across restarts, through the real store on disk."""

import os
import shutil

from twisted.internet.task import Clock

from mqserver.broker.broker import Broker
from mqserver.store import format as fmt
from mqserver.store.store import Message, MessageStore
from tests.support.inprocess import failure_of, result_of

NOW = 1_700_000_000.0


def open_broker(path):
    clock = Clock()
    clock.advance(NOW)
    store = MessageStore(str(path), clock, segment_size=4096, cq_entries_per_file=10,
                         clock=lambda: NOW)
    broker = Broker(store, clock)
    store.open()
    return store, broker


def test_full_rebuild_keeps_topics_whose_create_retention_removed(tmp_path):
    """A full rebuild (a consume queue lost) after retention removed a topic's CREATE
    record keeps the topic and its retained messages, and still applies later deletes."""
    store, broker = open_broker(tmp_path)
    result_of(broker.create_topic("old"))
    result_of(broker.create_topic("gone"))
    for i in range(100):
        result_of(broker.publish("old", [Message(body=b"m%03d" % i + b"x" * 100)]))
    result_of(broker.delete_topic("gone"))
    result_of(store.checkpoint())
    segs = list(store.commitlog.segments)
    past = NOW - 30 * 86400
    for seg in segs:
        os.utime(os.path.join(tmp_path, "commitlog", fmt.segment_name(seg)), (past, past))
    assert store.clean(7 * 86400) >= 1
    assert store.commitlog.min_offset > 0, "the CREATE records are gone from the log"
    result_of(store.checkpoint())
    store.close()
    # Lose a consume queue: recovery must rebuild from the (partial) log.
    shutil.rmtree(tmp_path / "consumequeue" / "old")
    store2, broker2 = open_broker(tmp_path)
    assert [t.name for t in broker2.topics()] == ["old"]
    q = store2.queue("old", 0)
    entries = store2.read_entries("old", 0, q.min_offset, 100)
    assert entries, "retained messages are indexed again"
    buf, locs = store2.read_records(entries)
    assert bytes(fmt.RecordView(buf, locs[-1][0]).body).startswith(b"m099")


def test_a_queue_count_out_of_range_is_refused_and_never_applied(tmp_path):
    """Creating or updating a topic with a queue count outside 1..1024 fails and
    changes nothing (0 in an update keeps the count). A record holding such a count
    (written before the broker checked) gives a new topic one queue and leaves an old
    one's count as it was, live and when the log is replayed: every reader of a topic
    walks its queues, and 2**64 of them stopped the broker."""
    from mqserver.broker.topics import create_body
    from mqserver.errors import InvalidRequest

    store, broker = open_broker(tmp_path)
    result_of(broker.create_topic("t", queues=4))
    for bad in (2 ** 64, 1025, -1):
        f = broker.create_topic("new", queues=bad)
        assert failure_of(f, InvalidRequest)
        f = broker.update_topic("t", queues=bad)
        assert failure_of(f, InvalidRequest)
    assert broker.topic("new") is None and broker.topic("t").queues == 4
    assert result_of(broker.update_topic("t", queues=0)).queues == 4
    # records as a broker that did not check wrote them
    result_of(store.put_admin(fmt.OP_UPDATE, "t", create_body(2 ** 64)))
    result_of(store.put_admin(fmt.OP_CREATE, "huge", create_body(2 ** 64)))
    result_of(store.put_admin(fmt.OP_UPDATE, "big", create_body(5000)))
    counts = {n: broker.topic(n).queues for n in ("t", "huge", "big")}
    assert counts == {"t": 4, "huge": 1, "big": 1}
    store.close()
    store, broker = open_broker(tmp_path)
    assert {n: broker.topic(n).queues for n in ("t", "huge", "big")} == counts
    store.close()
