"""A follower applies the writes its master made one after another into one topic in the
same millisecond as one put per queue, and its log still equals the master's record for
record: every write keeps its end (SYSFLAG_BATCH_MORE), every message its eventId, queue,
times and fields, so its own feed sends the same blocks. In process: an smss master door
and a follower over StringTransports, real stores, the stream of many writes read in one
chunk (as a loaded follower reads about twenty records a read)."""

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
