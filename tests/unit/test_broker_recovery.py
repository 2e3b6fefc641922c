"""Broker state (topics, delays) across restarts, through the real store on disk."""

import os
import shutil

from twisted.internet.task import Clock

from mqserver.broker.broker import Broker
from mqserver.store import format as fmt
from mqserver.store.store import Message, MessageStore
from tests.support.inprocess import result_of

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
