"""Master terms (epochs) and truncation: where a follower's log parts from its master's,
the cut made at the next open (real files), a crash in the middle of it, and a follower
refusing an older term."""

import json
import os

import pytest

from mqserver.replication.applier import Applier
from mqserver.replication.epochs import EpochError, truncation_point
from mqserver.replication.logreader import LogReader
from mqserver.store import format as fmt
from mqserver.store.store import TRUNCATION_FILE, Message
from protocols.smss import binlog
from protocols.smss import client_codec as cc
from protocols.smss.factory import make_factory
from protocols.smss.follower import apply_block
from protocols.smss.messages import OkResponse
from tests.support.inprocess import Node, result_of


@pytest.mark.parametrize("ours, our_last, theirs, their_last, want", [
    ([], 50, [(1, 1)], 80, None),  # a log that never saw a term: nothing to compare
    ([(1, 1)], 50, [(1, 1)], 80, None),  # behind in the same term
    ([(1, 1)], 80, [(1, 1)], 80, None),  # level
    ([(1, 1)], 90, [(1, 1), (2, 81)], 120, 80),  # went on in term 1 after the master's end
    ([(1, 1)], 70, [(1, 1), (2, 81)], 120, None),  # stopped before term 1 ended
    ([(1, 1), (2, 50)], 60, [(1, 1), (3, 40)], 70, 39),  # our own term 2 no one kept
    ([(1, 1), (3, 40)], 100, [(1, 1), (3, 40), (4, 90)], 95, 89),
])
def test_truncation_point(ours, our_last, theirs, their_last, want):
    assert truncation_point(ours, our_last, theirs, their_last) == want


@pytest.mark.parametrize("ours, theirs, words", [
    ([(1, 1), (2, 50)], [(1, 1)], "before ours"),  # a master that was replaced
    ([(2, 10)], [(3, 5)], "share no term"),
    ([(1, 1)], [], "before ours"),
])
def test_a_master_we_cannot_follow(ours, theirs, words):
    with pytest.raises(EpochError) as e:
        truncation_point(ours, 100, theirs, 100)
    assert words in str(e.value)


def publish(node, topic, *bodies):
    return result_of(node.broker.publish(topic, list(bodies)))


def bodies(node, topic):
    """The bodies a consumer of (C{topic}, 0) reads from the start."""
    store, out = node.store, []
    while True:
        entries = store.read_entries(topic, 0, len(out), 1000)
        if not entries:
            return out
        buf, locs = store.read_records(entries)
        out += [bytes(fmt.RecordView(buf, pos).body) for pos, _ in locs]


def test_a_truncation_is_made_at_the_next_open(tmp_path):
    """Records after the cut are gone from the log, the consume queues and the state (a
    topic, a delay and a term they made), the next eventId follows the cut, and new
    writes go on from there."""
    path = tmp_path / "data"
    n = Node(path)
    result_of(n.broker.create_topic("t"))
    result_of(n.broker.begin_epoch())
    publish(n, "t", b"kept-1", b"kept-2")
    keep = n.store.next_event_id - 1
    offset = LogReader.after_event(n.store, keep).offset
    publish(n, "t", b"cut-1")
    result_of(n.broker.create_topic("later"))
    result_of(n.broker.delay("t", 60_000, [Message(body=b"delayed")]))
    result_of(n.broker.begin_epoch())
    publish(n, "t", b"cut-2")
    assert [e[0] for e in n.broker.epochs] == [1, 2]
    n.store.request_truncation(keep, offset)
    n.close()
    n = Node(path)
    try:
        assert not os.path.exists(path / TRUNCATION_FILE)
        assert n.store.next_event_id == keep + 1
        assert n.store.commitlog.end == offset
        assert bodies(n, "t") == [b"kept-1", b"kept-2"]
        assert n.broker.topic("later") is None and n.broker.delays.pending == {}
        assert [e[0] for e in n.broker.epochs] == [1]
        r = publish(n, "t", b"new")
        assert r.event_id == keep + 1 and bodies(n, "t") == [b"kept-1", b"kept-2", b"new"]
    finally:
        n.close()


@pytest.mark.parametrize("crash", ["before the cut", "after the cut"])
def test_a_crash_in_the_middle_of_a_truncation(tmp_path, crash):
    """The request stays on disk until the cut and a checkpoint after it are durable: a
    crash before or after the cut ends in the same log and state."""
    path = tmp_path / "data"
    n = Node(path)
    result_of(n.broker.create_topic("t"))
    publish(n, "t", b"kept")
    keep = n.store.next_event_id - 1
    offset = n.store.commitlog.end
    publish(n, "t", b"cut")
    result_of(n.broker.create_topic("later"))
    n.store.checkpoint()  # the checkpoint is ahead of the cut
    n.store.request_truncation(keep, offset)
    if crash == "after the cut":
        n.store.commitlog.truncate(offset)  # cut, then the process died
    n.store.queue_table.flush()
    n.store.commitlog.close()
    n.store._lock.release()  # the process is gone: no final checkpoint
    n = Node(path)
    try:
        assert n.store.next_event_id == keep + 1
        assert bodies(n, "t") == [b"kept"] and n.broker.topic("later") is None
        assert not os.path.exists(path / TRUNCATION_FILE)
    finally:
        n.close()


def test_the_master_answers_its_terms(tmp_path):
    n = Node(tmp_path / "data")
    try:
        result_of(n.broker.begin_epoch())
        publish_to = n.door(make_factory)
        c = n.connect(publish_to)
        c.send(cc.encode_topic_info(b"$epochs"))
        (ok,) = cc.ResponseDecoder(cc.Expect.JSON).feed(c.take())
        assert isinstance(ok, OkResponse)
        assert json.loads(ok.body) == {"epochs": [[1, 1]], "lastEventId": 1, "master": True}
    finally:
        n.close()


def test_a_follower_refuses_a_record_of_an_older_term(tmp_path):
    master, follower = Node(tmp_path / "m"), Node(tmp_path / "f")
    try:
        follower.broker.is_master = False
        applier = Applier(follower.broker)
        result_of(master.broker.begin_epoch())
        first = master.store.next_event_id - 1
        result_of(master.broker.begin_epoch())
        views = LogReader(master.store, master.store.commitlog.min_offset).read()
        one, two = (binlog.record_to_block(v) for v in views)
        result_of(apply_block(applier, two))
        assert follower.broker.epoch == 2
        with pytest.raises(ValueError, match="older than ours"):
            apply_block(applier, one)
        assert first == 1
    finally:
        master.close()
        follower.close()
