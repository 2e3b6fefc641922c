"""A synchronous write's round trip to its follower waits for no reactor turn more than
it must: the master's feed sends what a turn appended at the end of that turn, and the
follower sends its confirmation, straight to the socket, not when the reactor next finds
the socket writable (a whole turn later, with its poll).

Real loopback sockets on an epoll reactor of the test's own, which the test lets poll
only to set the connections up, never while it checks; the brokers' timers run on their
L{MemoryReactorClock}s (tests/support/inprocess.py), over real stores."""

import select
import socket
import time

import pytest
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.epollreactor import EPollReactor

from mqserver.replication.applier import Applier
from protocols.smss import client_codec as cc
from protocols.smss import wire
from protocols.smss.factory import make_factory
from protocols.smss.follower import FollowerFactory
from tests.support.inprocess import Node

OK = bytes.fromhex("c8000000000000000000")
EMPTY_BLOCK = OK + bytes(4)


def iterate_until(reactor, done, what, limit=10.0):
    """Let C{reactor} poll until C{done()} (set-up only)."""
    deadline = time.monotonic() + limit
    while not done():
        assert time.monotonic() < deadline, f"{what}: not within {limit}s"
        reactor.iterate(0.01)


def arrived(sock, size, reactor=None, limit=5.0):
    """Return C{size} bytes read from the raw socket C{sock}: with C{reactor}, letting it
    poll meanwhile; without, only what was sent already (nothing polls)."""
    got = b""
    deadline = time.monotonic() + limit
    while len(got) < size:
        if reactor is not None:
            reactor.iterate(0.01)
        if select.select([sock], [], [], 0 if reactor is not None else 0.05)[0]:
            chunk = sock.recv(size - len(got))
            assert chunk, "the connection closed"
            got += chunk
        elif time.monotonic() > deadline:
            raise AssertionError(f"{len(got)} of {size} bytes arrived")
    return got


def capture(factory):
    """Record the protocols C{factory} builds in C{factory.built}."""
    build = factory.buildProtocol
    factory.built = []

    def built(addr):
        p = build(addr)
        factory.built.append(p)
        return p

    factory.buildProtocol = built


@pytest.fixture
def loop():
    reactor = EPollReactor()
    yield reactor
    for selectable in reactor.removeAll():  # the connections' sockets; never run again
        sock = getattr(selectable, "socket", None)
        if sock is not None:
            sock.close()


def test_the_feed_sends_a_turns_records_at_its_end(tmp_path, loop):
    node = Node(tmp_path / "master")
    try:
        node.broker.require_replicas(1, 5000)
        f = node.door(make_factory)
        capture(f)
        port = loop.listenTCP(0, f, interface="127.0.0.1")
        follower = socket.create_connection(("127.0.0.1", port.getHost().port), timeout=10)
        try:
            follower.sendall(cc.encode_replica(0, wire.CONFIRM_TRACE))
            iterate_until(loop, lambda: f.built and f.built[0].replica_feed is not None,
                          "the feed")
            assert arrived(follower, len(EMPTY_BLOCK), loop) == EMPTY_BLOCK
            publisher = node.connect(f)
            publisher.send(cc.encode_create(b"t"))  # a write, waiting for its follower
            node.clock.advance(0)  # the end of the broker's turn; the epoll never polls
            head = arrived(follower, wire.REPLICA_FRAME_HEADER_STRUCT.size)
            status, size = wire.REPLICA_FRAME_HEADER_STRUCT.unpack(head)
            assert status == wire.STATUS_OK and size > 0
            assert publisher.take() == b""  # not confirmed yet
        finally:
            follower.close()
            port.stopListening()
    finally:
        node.close()


def test_the_follower_sends_its_confirmation_at_the_end_of_its_turn(tmp_path, loop):
    master = Node(tmp_path / "master")
    fnode = Node(tmp_path / "follower")
    try:
        master.broker.require_replicas(1, 5000)
        f = master.door(make_factory)
        fnode.broker.is_master = False
        factory = FollowerFactory(Applier(fnode.broker), fnode.clock, 0, alive_interval=30.0)
        capture(factory)
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        # as the follower's service connects: through a client endpoint
        TCP4ClientEndpoint(loop, "127.0.0.1", listener.getsockname()[1]).connect(factory)
        iterate_until(loop, lambda: factory.built, "the follower's connection")
        listener.settimeout(10)
        to_follower, _ = listener.accept()
        try:
            follower = factory.built[0]
            master_side = master.connect(f)
            # set-up: TOPIC INFO $epochs and REPLICA go through the reactor's polls
            epochs = cc.encode_topic_info(b"$epochs")
            master_side.send(arrived(to_follower, len(epochs), loop))
            follower.dataReceived(master_side.take())
            replica = cc.encode_replica(0, wire.CONFIRM_TRACE)
            master_side.send(arrived(to_follower, len(replica), loop))
            follower.dataReceived(master_side.take())  # the empty block, and what follows
            fnode.clock.advance(0)
            publisher = master.connect(f)
            publisher.send(cc.encode_create(b"t"))
            master.clock.advance(0)
            follower.dataReceived(master_side.take())  # the record: applied
            fnode.clock.advance(0)  # the end of the follower's turn; the epoll never polls
            confirmation = cc.encode_replica(fnode.store.next_event_id - 1)
            got = arrived(to_follower, len(confirmation))
            assert got == confirmation
            master_side.send(got)
            assert publisher.take() == OK
        finally:
            to_follower.close()
            listener.close()
    finally:
        fnode.close()
        master.close()
