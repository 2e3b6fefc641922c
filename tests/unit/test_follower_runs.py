"""A follower applies the writes its master made one after another into one topic in the
same millisecond as one put per queue, and its log still equals the master's record for
record: every write keeps its end (SYSFLAG_BATCH_MORE), every message its eventId, queue,
times and fields, so its own feed sends the same blocks. In process: an smss master door
and a follower over StringTransports, real stores, the stream of many writes read in one
chunk (as a loaded follower reads about twenty records a read)."""

import errno
import os

import pytest
from twisted.internet.testing import StringTransport

from mqserver.replication.applier import Applier
from mqserver.replication.logreader import LogReader
from protocols.smss import binlog
from protocols.smss import client_codec as cc
from protocols.smss.factory import make_factory
from protocols.smss.follower import FollowerFactory
from protocols.smss.payload import encode_payload
from tests.integration.test_replication_fields import records
from tests.support.inprocess import Node


def blocks(store):
    """The binlog blocks a feed of C{store} sends (one per write)."""
    reader = LogReader(store, store.commitlog.min_offset)
    out = []
    while views := reader.read():
        out += [binlog.record_to_block(v) for v in views]
    return out


def follower(tmp_path):
    n = Node(tmp_path / "follower")
    n.broker.is_master = False
    applier = Applier(n.broker)
    proto = FollowerFactory(applier, n.clock, 0, alive_interval=30.0).buildProtocol(None)
    transport = StringTransport()
    proto.makeConnection(transport)
    puts = []
    put = n.store.put_messages
    n.store.put_messages = lambda *a, **k: puts.append(a[:3]) or put(*a, **k)
    return n, proto, transport, puts


@pytest.mark.parametrize("sync", [False, True], ids=["plain", "synchronous"])
def test_writes_of_one_millisecond_are_applied_together_and_kept_apart(tmp_path, sync):
    master = Node(tmp_path / "master")
    fnode, proto, to_master, puts = follower(tmp_path)
    try:
        if sync:
            master.broker.require_replicas(1, 60_000)
        door = master.door(make_factory)
        stream = master.connect(door)
        stream.send(to_master.value())  # where the logs part
        to_master.clear()
        proto.dataReceived(stream.take())
        stream.send(to_master.value())  # REPLICA
        to_master.clear()
        proto.dataReceived(stream.take())
        fnode.clock.advance(0)
        stream.send(to_master.value())
        to_master.clear()
        publishers = [master.connect(door) for _ in range(3)]
        publishers[0].send(cc.encode_create(b"t") + cc.encode_create(b"u"))
        master.clock.advance(0)
        proto.dataReceived(stream.take())
        fnode.clock.advance(0)
        stream.send(to_master.value())
        to_master.clear()
        # writes of one millisecond: single messages from three publishers, a batch, a
        # write to another topic between them, then the next millisecond's
        writes = [(0, b"t", [b"a1"]), (1, b"t", [b"b1"]), (2, b"t", [b"c1", b"c2", b"c3"]),
                  (0, b"t", [b"a2"]), (1, b"u", [b"u1"]), (2, b"t", [b"c4"]),
                  (0, b"t", [b"a3", b"a4"])]
        for who, topic, bodies in writes:
            publishers[who].send(cc.encode_pub(topic, encode_payload(bodies)))
        master.clock.advance(0.001)
        publishers[1].send(cc.encode_pub(b"t", encode_payload([b"b2"])))
        publishers[2].send(cc.encode_pub(b"t", encode_payload([b"c5"])))
        master.clock.advance(0)
        chunk = stream.take()
        puts.clear()
        proto.dataReceived(chunk)  # every write in one read
        fnode.clock.advance(0)
        assert records(fnode.store.path) == records(master.store.path)
        assert blocks(fnode.store) == blocks(master.store)
        # the first millisecond's writes to t until the one to u, the rest of t's, u's,
        # the next millisecond's: 4 puts for 9 writes
        assert [(t, len(m)) for t, _, m in puts] == [("t", 6), ("u", 1), ("t", 3), ("t", 2)]
        assert to_master.value() == cc.encode_replica(master.store.next_event_id - 1)
        if sync:  # the confirmation releases every write
            stream.send(to_master.value())
            for p in publishers:
                assert p.take()
            assert master.broker.sync_gate.committed_event_id == master.store.next_event_id - 1
    finally:
        fnode.close()
        master.close()


class FailingPwrite:
    """The follower's commit-log pwrite, failing with ENOSPC while C{full} is set."""

    def __init__(self, real):
        self.real = real
        self.full = False

    def __call__(self, fd, data, pos):
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.real(fd, data, pos)


def connect_follower(master, door, fnode):
    """A follower connection of C{fnode} to C{master}'s door, past its handshake:
    (protocol, its transport, the master's side)."""
    proto = FollowerFactory(Applier(fnode.broker), fnode.clock, 0,
                            alive_interval=30.0).buildProtocol(None)
    to_master = StringTransport()
    proto.makeConnection(to_master)
    stream = master.connect(door)
    for _ in range(3):  # where the logs part, REPLICA, the first confirmation
        stream.send(to_master.value())
        to_master.clear()
        proto.dataReceived(stream.take())
        fnode.clock.advance(0)
    return proto, to_master, stream


def test_nothing_after_a_failed_write_is_applied(tmp_path):
    """A follower whose store fails a run's write (disk full) applies nothing that came
    after it in the same read and takes none of its eventIds; once the disk works, it
    resumes after what it holds and its log equals the master's, no eventId skipped."""
    master = Node(tmp_path / "master")
    fnode = Node(tmp_path / "follower")
    fnode.broker.is_master = False
    pwrite = fnode.store.commitlog._pwrite = FailingPwrite(fnode.store.commitlog._pwrite)
    try:
        door = master.door(make_factory)
        proto, to_master, stream = connect_follower(master, door, fnode)
        publisher = master.connect(door)
        publisher.send(cc.encode_create(b"t"))
        master.clock.advance(0)
        proto.dataReceived(stream.take())
        held = fnode.store.next_event_id
        # three runs in one read, the last of one write: the read ends with it
        for millisecond, bodies in enumerate(([b"a0", b"b0"], [b"a1", b"b1"], [b"a2"])):
            for body in bodies:
                publisher.send(cc.encode_pub(b"t", encode_payload([body])))
            master.clock.advance(0.0015)  # the next millisecond, whatever the rounding
        chunk = stream.take()
        applied = []
        put = fnode.store.put_messages

        def counted(*a, **k):
            d = put(*a, **k)
            applied.append(k["event_id"])
            pwrite.full = True  # the disk fills after the first run's write
            return d

        fnode.store.put_messages = counted
        proto.dataReceived(chunk)
        assert applied == [held, held + 2]  # the second run failed: not the third
        assert fnode.store.next_event_id == held + 2
        assert proto.transport.disconnecting or to_master.disconnecting
        fnode.store.put_messages = put
        pwrite.full = False
        fnode.store.disk.refusal = None
        fnode.clock.advance(10)  # the store finds its disk writable again
        proto, to_master, stream = connect_follower(master, door, fnode)
        assert records(fnode.store.path) == records(master.store.path)
    finally:
        fnode.close()
        master.close()
