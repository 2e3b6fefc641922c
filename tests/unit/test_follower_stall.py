"""A follower whose applied eventId stops moving while its master's advances: the
follower asks the master how far it is (TOPIC INFO $replication on a connection of its
own), logs the stall once, shows it in its status and metrics, and reconnects; the
stall ends when records are applied again. In process: the follower's connections are
StringTransports on a MemoryReactorClock."""

import json

import pytest
from twisted.internet.endpoints import clientFromString
from twisted.internet.error import ConnectionLost
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure

from mqserver.broker.broker import Broker
from mqserver.replication.applier import Applier
from mqserver.store.store import Message, MessageStore
from protocols.metrics.collector import BrokerCollector
from protocols.smss import codec, wire
from protocols.smss.client_codec import encode_replica, encode_topic_info
from protocols.smss.follower import FollowerFactory
from tests.unit import test_store_damage

NOW = test_store_damage.NOW
logged = test_store_damage.logged  # the fixture: every log line while a test runs
ALIVE_S = 1.0  # the follower's silence and stall limit is twice this
LIMIT = 2 * ALIVE_S


@pytest.fixture
def follower(tmp_path):
    reactor = MemoryReactorClock()
    reactor.advance(NOW)
    store = MessageStore(str(tmp_path), reactor, segment_size=1 << 20, clock=reactor.seconds)
    broker = Broker(store, reactor, is_master=False)
    store.open()
    applier = Applier(broker)
    endpoint = clientFromString(reactor, "tcp:host=127.0.0.1:port=12301")
    factory = FollowerFactory(applier, reactor, 0, ALIVE_S, endpoint)
    yield reactor, factory, applier
    store.close()


def connect(factory):
    """A replication connection of the follower; returns (protocol, transport)."""
    proto = factory.buildProtocol(None)
    transport = StringTransport()
    proto.makeConnection(transport)
    assert transport.value() == encode_replica(0, wire.CONFIRM_TRACE)
    return proto, transport


def wait_with_alives(reactor, proto, seconds, step=0.5):
    """Let C{seconds} pass while the master sends ALIVE (idle, as far as it says)."""
    for _ in range(int(seconds / step)):
        proto.dataReceived(codec.alive())
        reactor.advance(step)


def answer_probe(reactor, master_event_id):
    """Take the follower's last connection attempt to the master as its probe and answer
    TOPIC INFO $replication with C{master_event_id}; return how many were made."""
    _, _, factory, _, _ = reactor.tcpClients[-1]
    probe = factory.buildProtocol(None)
    transport = StringTransport()
    probe.makeConnection(transport)
    assert transport.value() == encode_topic_info(b"$replication")
    body = json.dumps({"role": "master", "appliedEventId": master_event_id}).encode()
    probe.dataReceived(codec.ok_json(body))
    assert transport.disconnecting
    return len(reactor.tcpClients)


def stall_lines(logged):
    return [x for x in logged if "replication stalled" in x]


def metrics(applier):
    out = {}
    for family in BrokerCollector(applier.broker).collect():
        for sample in family.samples:
            out[sample.name] = sample.value
    return out


def test_a_stalled_follower_is_reported_once_and_reconnects(follower, logged):
    reactor, factory, applier = follower
    proto, transport = connect(factory)
    wait_with_alives(reactor, proto, LIMIT - 0.5)
    assert not reactor.tcpClients  # not yet LIMIT seconds without progress
    wait_with_alives(reactor, proto, 1.0)
    assert answer_probe(reactor, 500) == 1
    assert transport.disconnecting  # dropped: the ClientService reconnects
    status = applier.status()
    assert status["stalled"] and status["masterEventId"] == 500, status
    assert status["sinceProgressMs"] >= LIMIT * 1000
    m = metrics(applier)
    assert m["mqserver_replication_stalled"] == 1
    assert m["mqserver_replication_seconds_since_progress"] >= LIMIT
    lines = stall_lines(logged)
    assert len(lines) == 1 and "applied eventId 0 " in lines[0] and "master is at 500" in lines[0]
    proto.connectionLost(Failure(ConnectionLost()))

    # Reconnected, still nothing: asked again after LIMIT, dropped again, logged once.
    proto, transport = connect(factory)
    wait_with_alives(reactor, proto, LIMIT + 1.0)
    assert answer_probe(reactor, 510) == 2
    assert transport.disconnecting
    assert len(stall_lines(logged)) == 1
    proto.connectionLost(Failure(ConnectionLost()))

    # Records arrive: the stall ends.
    proto, transport = connect(factory)
    applier.messages(1, "t", [(0, Message(body=b"x"))], int(NOW * 1000))
    wait_with_alives(reactor, proto, ALIVE_S)
    assert not applier.status()["stalled"]
    assert metrics(applier)["mqserver_replication_stalled"] == 0
    assert any("replication moving again: applied eventId 1" in x for x in logged)
    assert not transport.disconnecting


def test_an_idle_master_is_no_stall(follower, logged):
    """The master is where the follower is: no stall, the connection stays, and the
    master is asked at most once per LIMIT seconds."""
    reactor, factory, applier = follower
    proto, transport = connect(factory)
    wait_with_alives(reactor, proto, LIMIT + 0.5)
    assert answer_probe(reactor, 0) == 1
    wait_with_alives(reactor, proto, LIMIT - 1.0)
    assert len(reactor.tcpClients) == 1
    wait_with_alives(reactor, proto, 1.0)
    assert answer_probe(reactor, 0) == 2
    assert not transport.disconnecting
    assert not applier.status()["stalled"]
    assert not stall_lines(logged)


def test_a_master_that_cannot_answer_is_no_stall(follower, logged):
    """A probe that gets no answer in LIMIT seconds is given up (its connection attempt
    cancelled), and the replication connection is left alone."""
    reactor, factory, applier = follower
    proto, transport = connect(factory)
    wait_with_alives(reactor, proto, LIMIT + 0.5)
    assert len(reactor.tcpClients) == 1
    wait_with_alives(reactor, proto, LIMIT + 0.5)
    assert not transport.disconnecting
    assert not applier.status()["stalled"]
    assert any("could not ask the master how far it is" in x for x in logged)
