"""Synchronous replication in process: the gate's counting (a Clock), the store holding
writes back until they are confirmed, and an mqserver master and follower negotiating and
sending confirmations over the smss replication stream (StringTransports, real stores)."""

import pytest
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport, StringTransportWithDisconnection

from mqserver.errors import ReplicasUnavailable, ReplicationTimeout
from mqserver.replication.applier import Applier
from mqserver.replication.logreader import LogReader
from mqserver.replication.sync import SyncGate
from mqserver.store import format as fmt
from mqserver.store.store import Message
from protocols.smss import binlog
from protocols.smss import client_codec as cc
from protocols.smss import wire
from protocols.smss.factory import make_factory
from protocols.smss.follower import FollowerFactory
from protocols.smss.payload import encode_payload
from tests.support.inprocess import Node, failure_of, result_of

OK = bytes.fromhex("c8000000000000000000")
EMPTY_BLOCK = OK + bytes(4)


class Follower:
    """A stand-in follower for the gate: how far behind its feed is."""

    def __init__(self, behind=0):
        self.behind = behind

    def behind_bytes(self):
        return self.behind


def fired(d):
    """True once C{d} has its result (a Deferred waiting on another is not fired)."""
    box = []
    d.addBoth(lambda r: box.append(r) or r)
    return bool(box)


def gate(replicas=1, timeout_ms=1000, fallbehind=None):
    clock = Clock()
    return clock, SyncGate(clock, replicas, timeout_ms, fallbehind)


def test_a_write_waits_for_its_confirmation():
    clock, g = gate()
    commits = []
    g.on_commit = commits.append
    f = Follower()
    g.attach(f)
    d = g.wait(5)
    g.confirm(f, 4)
    assert not d.called and commits == [4]
    g.confirm(f, 5)
    assert d.called and result_of(d) is None
    assert g.committed_event_id == 5 and commits == [4, 5]
    assert g.wait(5).called  # committed already
    clock.advance(1)  # the gate's timer finds nothing to fail, and disarms
    assert clock.getDelayedCalls() == [] and g.timeouts == 0


def test_one_timer_serves_every_waiting_write():
    """The writes waiting share one timer, each failing at its own deadline; the
    confirmed ones are never failed."""
    clock, g = gate(timeout_ms=1000)
    f = Follower()
    g.attach(f)
    first = g.wait(1)
    clock.advance(0.4)
    second, third = g.wait(2), g.wait(3)
    assert len(clock.getDelayedCalls()) == 1
    g.confirm(f, 1)
    assert first.called and not second.called
    clock.advance(0.6)  # the first's deadline: nothing to fail
    assert not second.called and g.timeouts == 0
    g.confirm(f, 3)  # a confirmation after the deadline of the first, before theirs
    assert second.called and third.called
    later = g.wait(4)
    clock.advance(1)
    assert isinstance(failure_of(later).value, ReplicationTimeout) and g.timeouts == 1
    assert clock.getDelayedCalls() == []


def test_without_followers_a_write_fails_at_once():
    _, g = gate()
    assert failure_of(g.wait(1)).check(ReplicasUnavailable)
    assert g.unavailable == 1


def test_a_follower_too_far_behind_does_not_count():
    _, g = gate(fallbehind=100)
    f = Follower(behind=101)
    g.attach(f)
    assert failure_of(g.wait(1)).check(ReplicasUnavailable)
    f.behind = 100
    assert not g.wait(1).called


def test_a_write_not_confirmed_in_time_fails_and_a_late_confirmation_is_harmless():
    clock, g = gate(timeout_ms=800)
    f = Follower()
    g.attach(f)
    d = g.wait(3)
    clock.advance(0.79)
    assert not d.called
    clock.advance(0.01)
    f_ = failure_of(d)
    assert f_.check(ReplicationTimeout) and "within 800 ms" in f_.getErrorMessage()
    assert g.timeouts == 1
    g.confirm(f, 3)  # the write's Deferred has fired: nothing more happens to it
    assert g.committed_event_id == 3


def test_two_replicas_commit_at_the_second_highest_confirmation():
    _, g = gate(replicas=2)
    a, b, c = Follower(), Follower(), Follower()
    for f in (a, b, c):
        g.attach(f)
    d = g.wait(10)
    g.confirm(a, 12)
    assert not d.called
    g.confirm(b, 9)
    assert not d.called and g.committed_event_id == 9
    g.confirm(c, 10)
    assert d.called and g.committed_event_id == 10
    g.detach(a)
    g.detach(b)
    assert failure_of(g.wait(11)).check(ReplicasUnavailable)


@pytest.fixture
def node(tmp_path):
    n = Node(tmp_path / "master")
    yield n
    n.close()


def readable(store, topic):
    """The bodies a consumer of (C{topic}, 0) can read now."""
    entries = store.read_entries(topic, 0, 0, 100)
    if not entries:
        return []
    buf, locs = store.read_records(entries)
    return [bytes(fmt.RecordView(buf, pos).body) for pos, _ in locs]


def test_the_store_holds_a_write_back_until_it_is_confirmed(node):
    """A gated write is not acknowledged nor readable until the gate confirms it; it is
    replicable at once; a failed one carries its result and shows once confirmed."""
    g = node.broker.require_replicas(1, 1000)
    store = node.store
    arrivals = []
    store.add_arrival_listener(lambda t, q: arrivals.append((t, q)))
    f = Follower()
    g.attach(f)
    visible = store.visible_end
    d = store.put_messages("t", 0, [Message(body=b"one")])
    assert not fired(d)
    assert store.visible_end == visible and readable(store, "t") == []
    assert store.replicable_end == store.commitlog.end
    g.confirm(f, store.next_event_id - 1)
    r = result_of(d)
    assert store.visible_end == store.commitlog.end
    assert arrivals == [("t", 0)] and readable(store, "t") == [b"one"]
    d = store.put_messages("t", 0, [Message(body=b"two")])
    node.clock.advance(1)
    e = failure_of(d).value
    assert isinstance(e, ReplicationTimeout) and e.put_result.event_id == r.event_id + 1
    assert readable(store, "t") == [b"one"]
    g.confirm(f, e.put_result.event_id)
    assert readable(store, "t") == [b"one", b"two"]


class Pipe(StringTransport):
    """A transport whose writes the test moves to the other side by hand."""


def follower_node(tmp_path, master_node):
    n = Node(tmp_path / "follower")
    n.broker.is_master = False
    applier = Applier(n.broker)
    factory = FollowerFactory(applier, n.clock, 0, alive_interval=30.0)
    proto = factory.buildProtocol(None)
    transport = Pipe()
    proto.makeConnection(transport)
    return n, proto, transport


def test_master_and_follower_negotiate_and_confirm(node, tmp_path):
    """The follower offers confirmations in its REPLICA's traceId; the master answers with
    an empty block, streams, and acknowledges a publish once the follower's REPLICA frame
    confirms it."""
    node.broker.require_replicas(1, 5000)
    f = node.door(make_factory)
    fnode, follower, to_master = follower_node(tmp_path, node)
    try:
        master_side = node.connect(f)
        master_side.send(to_master.value())  # TOPIC INFO $epochs: where the logs part
        to_master.clear()
        follower.dataReceived(master_side.take())
        replica_request = to_master.value()
        assert replica_request == cc.encode_replica(0, wire.CONFIRM_TRACE)
        to_master.clear()
        master_side.send(replica_request)
        out = master_side.take()
        assert out.startswith(EMPTY_BLOCK)
        follower.dataReceived(out)
        fnode.clock.advance(0)
        master_side.send(to_master.value())  # the follower's first confirmation
        to_master.clear()
        publisher = node.connect(f)
        publisher.send(cc.encode_create(b"t"))
        node.clock.advance(0)
        assert publisher.take() == b""  # not acknowledged yet
        follower.dataReceived(master_side.take())
        fnode.clock.advance(0)
        confirmation = to_master.value()
        assert confirmation == cc.encode_replica(fnode.store.next_event_id - 1)
        master_side.send(confirmation)
        assert publisher.take() == OK
        assert node.broker.sync_gate.committed_event_id == node.store.next_event_id - 1
    finally:
        fnode.close()


def test_a_reference_slave_never_counts(node):
    """A REPLICA without the traceId (what the reference smss slave sends) gets no empty
    block, and what it sends after is dropped: it confirms nothing."""
    node.broker.require_replicas(1, 5000)
    f = node.door(make_factory)
    slave = node.connect(f)
    slave.send(cc.encode_replica(0))
    assert not slave.take().startswith(EMPTY_BLOCK)
    slave.send(cc.encode_replica(10**6))
    assert node.broker.sync_gate.followers() == []
    publisher = node.connect(f)
    publisher.send(cc.encode_create(b"t"))
    assert b"0 of 1 replicas" in publisher.take()


def test_a_confirmation_counts_only_what_was_sent(node):
    """A follower cannot confirm more of this log than it was sent."""
    g = node.broker.require_replicas(1, 5000)
    f = node.door(make_factory)
    side = node.connect(f)
    side.send(cc.encode_replica(0, wire.CONFIRM_TRACE))
    side.take()
    side.send(cc.encode_replica(10**6))
    (feed,) = g.followers()
    assert g.confirmed(feed) == feed.last_event_id < 10**6


def test_a_bad_frame_on_a_confirming_stream_closes_it(node):
    node.broker.require_replicas(1, 5000)
    f = node.door(make_factory)
    side = node.connect(f)
    side.send(cc.encode_replica(0, wire.CONFIRM_TRACE))
    side.take()
    side.send(cc.encode_alive() + bytes(8))  # the size of a confirmation
    assert b"confirmation must be a REPLICA frame" in side.take()
    assert not side.connected
    assert node.broker.sync_gate.followers() == []


def test_a_follower_store_shows_only_what_its_master_committed(tmp_path):
    """A follower's writes (the master's eventIds) wait for the master's commit point;
    one committed before it is durable here waits for its fsync too (flush level 2)."""
    n = Node(tmp_path / "follower", flush_level=2, hold_disk=True)
    try:
        store = n.store
        arrivals = []
        store.add_arrival_listener(lambda t, q: arrivals.append((t, q)))
        store.follow_commits(0)
        d1 = store.put_messages("t", 0, [Message(body=b"one")], event_id=1)
        d2 = store.put_messages("t", 0, [Message(body=b"two")], event_id=2)
        n.runner.release()
        assert fired(d1) and fired(d2)  # durable: the follower may confirm them
        assert readable(store, "t") == [] and arrivals == []
        store.follow_commits(1)
        assert readable(store, "t") == [b"one"] and arrivals == [("t", 0)]
        store.follow_commits(3)  # ahead of what this follower holds
        assert readable(store, "t") == [b"one", b"two"]
        store.put_messages("t", 0, [Message(body=b"three")], event_id=3)
        assert readable(store, "t") == [b"one", b"two"]  # committed, not durable here
        n.runner.release()
        assert readable(store, "t") == [b"one", b"two", b"three"]
        store.follow_commits(2)  # never goes back
        assert store.commit_point == 3
        store.put_messages("t", 0, [Message(body=b"four")], event_id=4)
        n.runner.release()
        assert readable(store, "t") == [b"one", b"two", b"three"]
        store.stop_following_commits()  # a master that holds nothing back
        assert readable(store, "t") == [b"one", b"two", b"three", b"four"]
        assert store.commit_point is None
    finally:
        n.close()


def test_a_follower_shows_a_write_once_the_master_commits_it(node, tmp_path):
    """The master sends its commit point after the empty block and whenever it moves;
    a follower's consumers see a replicated write only once it is committed (two
    replicas wanted: this follower's confirmation alone does not commit)."""
    g = node.broker.require_replicas(2, 5000)
    f = node.door(make_factory)
    fnode, follower, to_master = follower_node(tmp_path, node)
    try:
        master_side = node.connect(f)
        master_side.send(to_master.value())  # TOPIC INFO $epochs
        to_master.clear()
        follower.dataReceived(master_side.take())
        master_side.send(to_master.value())  # REPLICA, offering confirmations
        to_master.clear()
        out = master_side.take()
        commit = binlog.commit_block(0, node.broker.now_ms())
        assert out.startswith(EMPTY_BLOCK + OK + len(commit).to_bytes(4, "little") + commit)
        follower.dataReceived(out)
        assert fnode.store.commit_point == 0
        other = Follower()  # a second follower, confirming by hand
        g.attach(other)
        publisher = node.connect(f)
        publisher.send(cc.encode_create(b"t"))
        publisher.send(cc.encode_pub(b"t", encode_payload([b"hello"])))
        node.clock.advance(0)
        follower.dataReceived(master_side.take())
        fnode.clock.advance(0)
        master_side.send(to_master.value())  # the follower holds and confirms them
        to_master.clear()
        last = node.store.next_event_id - 1
        assert fnode.store.next_event_id - 1 == last
        assert publisher.take() == b""  # one replica of two: nothing committed
        node.clock.advance(0)
        follower.dataReceived(master_side.take())
        assert readable(fnode.store, "t") == []
        g.confirm(other, last)
        assert publisher.take() == OK + OK
        node.clock.advance(0)  # the commit points of one turn: one block
        out = master_side.take()
        commit = binlog.commit_block(last, node.broker.now_ms())
        assert out == OK + len(commit).to_bytes(4, "little") + commit
        follower.dataReceived(out)
        assert readable(fnode.store, "t") == [b"hello"]
        assert fnode.broker.state_of("replica").status()["committedEventId"] == last
    finally:
        fnode.close()


def test_a_follower_of_a_master_without_synchronous_replication_shows_all(node, tmp_path):
    """A master that holds nothing back sends no commit point: the follower shows every
    write it holds (and what it held back before, from a master that did)."""
    f = node.door(make_factory)
    fnode, follower, to_master = follower_node(tmp_path, node)
    try:
        fnode.store.follow_commits(0)  # as a restart after following a master that did
        master_side = node.connect(f)
        master_side.send(to_master.value())
        to_master.clear()
        follower.dataReceived(master_side.take())
        master_side.send(to_master.value())
        to_master.clear()
        publisher = node.connect(f)
        publisher.send(cc.encode_create(b"t"))
        publisher.send(cc.encode_pub(b"t", encode_payload([b"hello"])))
        node.clock.advance(0)
        follower.dataReceived(master_side.take())
        assert readable(fnode.store, "t") == [b"hello"]
        assert fnode.store.commit_point is None
    finally:
        fnode.close()


def test_a_follower_promoted_without_synchronous_replication_shows_what_it_held(tmp_path):
    """Promoted with no synchronous replicas, a follower shows the writes its old master
    had not committed (nothing would ever commit them) and its own new ones."""
    n = Node(tmp_path / "follower")
    try:
        n.broker.is_master = False
        n.store.follow_commits(0)
        n.store.put_messages("t", 0, [Message(body=b"held")], event_id=1)
        assert readable(n.store, "t") == []
        assert n.broker.become_master() is None
        assert readable(n.store, "t") == [b"held"]
        n.store.put_messages("t", 0, [Message(body=b"new")])
        assert readable(n.store, "t") == [b"held", b"new"]
    finally:
        n.close()


def test_a_follower_promoted_with_synchronous_replication_shows_them_once_confirmed(
        tmp_path):
    """Promoted with synchronous replicas, a follower shows what its old master had not
    committed once its own followers confirm it, as it does its new writes."""
    n = Node(tmp_path / "follower")
    try:
        n.broker.is_master = False
        n.store.follow_commits(0)
        n.store.put_messages("t", 0, [Message(body=b"held")], event_id=1)
        n.broker.become_master(1, 5000)
        assert readable(n.store, "t") == []
        f = Follower()
        n.broker.sync_gate.attach(f)
        n.broker.sync_gate.confirm(f, n.store.next_event_id - 1)  # the term's epoch record
        assert readable(n.store, "t") == [b"held"]
    finally:
        n.close()


def test_a_follower_reads_its_whole_log_whatever_its_consumers_see(tmp_path):
    """The writes a follower holds back from its consumers are in its log for everything
    else: finding where to cut it (its terms against a new master's), feeding it on."""
    n = Node(tmp_path / "follower")
    try:
        n.broker.is_master = False
        n.store.follow_commits(0)
        for eid in (1, 2, 3):
            n.store.put_messages("t", 0, [Message(body=b"m%d" % eid)], event_id=eid)
        assert readable(n.store, "t") == []
        third = LogReader.after_event(n.store, 2)
        assert [v.event_id for v in third.read()] == [3]
        assert [v.event_id for v in LogReader(n.store, 0).read()] == [1, 2, 3]
    finally:
        n.close()


class CountingTransport(StringTransportWithDisconnection):
    """A transport that keeps each write apart (each is one send on a socket)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.writes = []

    def write(self, data):
        self.writes.append(bytes(data))
        super().write(data)


def frames_of(data):
    """The (block or None) of each REPLICA frame in data."""
    out, pos, head = [], 0, wire.REPLICA_FRAME_HEADER_STRUCT
    while pos < len(data):
        _, n = head.unpack_from(data, pos)
        pos += head.size
        out.append(binlog.parse_block(data[pos:pos + n]) if n else None)
        pos += n
    return out


def test_the_commit_point_goes_in_front_of_the_records_of_its_turn(node):
    """A turn that moves the commit point (a confirmation) and appends records (a
    publish) sends the follower one write: the commit block, then the records. A turn
    that moves it alone sends the commit block alone."""
    g = node.broker.require_replicas(1, 5000)
    f = node.door(make_factory)
    side = node.connect(f, transport=CountingTransport)
    side.send(cc.encode_replica(0, wire.CONFIRM_TRACE))
    node.clock.advance(0)
    publisher = node.connect(f)
    publisher.send(cc.encode_create(b"t"))
    node.clock.advance(0)
    created = node.store.next_event_id - 1
    side.transport.writes.clear()
    # one turn: the confirmation of the create, and a publish
    side.send(cc.encode_replica(created))
    publisher.send(cc.encode_pub(b"t", encode_payload([b"m"])))
    node.clock.advance(0)
    assert g.committed_event_id == created
    (write,) = side.transport.writes
    commit, record = frames_of(write)
    assert (commit.cmd, commit.event_id) == (binlog.CMD_COMMIT, created)
    assert (record.cmd, record.event_id) == (binlog.CMD_PUB, created + 1)
    # a turn with the confirmation alone
    side.transport.writes.clear()
    side.send(cc.encode_replica(created + 1))
    node.clock.advance(0)
    (write,) = side.transport.writes
    (commit,) = frames_of(write)
    assert (commit.cmd, commit.event_id) == (binlog.CMD_COMMIT, created + 1)
    assert publisher.take() == OK + OK
