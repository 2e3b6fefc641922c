"""Idle connections are closed after each door's idle timeout, driven by a
Clock: a connection that sends nothing goes, one that keeps sending stays, and smss
streams (SUB) are never closed for silence."""

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from mqserver.broker.broker import Broker
from mqserver.cluster.lookupd import LookupRegistry
from mqserver.cluster.namesrv import RouteTable
from mqserver.store.store import MessageStore
from protocols.nsq.lookupd import LookupdFactory
from protocols.remoting import codes
from protocols.remoting.codec import encode
from protocols.remoting.messages import RemotingCommand
from protocols.remoting.namesrv import NamesrvFactory
from protocols.smss import client_codec as cc
from protocols.smss.factory import SmssFactory

ADDR = IPv4Address("TCP", "127.0.0.1", 40000)


def connect(factory):
    proto = factory.buildProtocol(ADDR)
    transport = StringTransport(peerAddress=ADDR)
    proto.makeConnection(transport)
    return proto, transport


def closed_after(clock, transport, seconds, step=1.0):
    """Advance C{clock} by C{seconds} in C{step}s; return whether the transport closed."""
    t = 0.0
    while t < seconds:
        clock.advance(step)
        t += step
    return transport.disconnecting


# -- RocketMQ nameserver (the broker door shares RemotingProtocol) -------------------------


def namesrv(idle):
    clock = Clock()
    return NamesrvFactory(RouteTable(clock), idle, clock), clock


def test_remoting_silent_connection_is_closed_after_the_idle_time():
    factory, clock = namesrv(120)
    _, transport = connect(factory)
    assert not closed_after(clock, transport, 119)
    assert closed_after(clock, transport, 31)  # by 1.25 x the timeout


def test_remoting_connection_that_keeps_sending_stays():
    factory, clock = namesrv(120)
    proto, transport = connect(factory)
    request = encode(RemotingCommand(code=codes.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, opaque=1))
    for _ in range(10):
        assert not closed_after(clock, transport, 100)
        proto.dataReceived(request)
    assert closed_after(clock, transport, 151)


def test_remoting_idle_timeout_zero_never_closes():
    factory, clock = namesrv(0)
    _, transport = connect(factory)
    assert not closed_after(clock, transport, 10_000, step=100)


def test_remoting_timer_stops_with_the_connection():
    factory, clock = namesrv(120)
    proto, transport = connect(factory)
    proto.connectionLost(None)
    assert not clock.getDelayedCalls()


# -- smss -------------------------------------------------------------------------------


@pytest.fixture
def smss(tmp_path):
    clock = Clock()
    store = MessageStore(str(tmp_path), clock, clock=clock.seconds, segment_size=1 << 20)
    broker = Broker(store, clock)
    store.open()
    broker.start()
    broker.create_topic("t")
    clock.advance(0)
    yield SmssFactory(broker, clock, alive_interval=30.0, idle_timeout=1800.0), clock
    store.close()


def test_smss_silent_connection_is_closed_after_30_minutes(smss):
    factory, clock = smss
    _, transport = connect(factory)
    assert not closed_after(clock, transport, 1790, step=10)
    assert closed_after(clock, transport, 460, step=10)


def test_smss_connection_sending_alive_stays(smss):
    factory, clock = smss
    proto, transport = connect(factory)
    for _ in range(10):
        assert not closed_after(clock, transport, 1000, step=10)
        proto.dataReceived(cc.encode_alive())
    assert transport.value()  # ALIVE answered


def test_smss_subscriber_waiting_for_messages_is_not_idle(smss):
    """A SUB stream with nothing to deliver and no acks to read stays open: it has its
    own ALIVE keep-alive."""
    factory, clock = smss
    proto, transport = connect(factory)
    proto.dataReceived(cc.encode_sub("t"))
    clock.advance(0)
    assert proto.subscription is not None
    assert not closed_after(clock, transport, 4 * 3600, step=30)


# -- nsqlookupd TCP ----------------------------------------------------------------------


def lookupd(idle=60.0):
    clock = Clock()
    return LookupdFactory(LookupRegistry(clock=clock.seconds), clock, idle_timeout=idle), clock


def test_lookupd_silent_connection_is_closed():
    factory, clock = lookupd()
    _, transport = connect(factory)
    assert not closed_after(clock, transport, 59)
    assert closed_after(clock, transport, 16)


def test_lookupd_pinging_nsqd_stays():
    factory, clock = lookupd()
    proto, transport = connect(factory)
    proto.dataReceived(b"  V1")
    for _ in range(20):
        assert not closed_after(clock, transport, 15)
        proto.dataReceived(b"PING\n")


def test_lookupd_refuses_a_line_that_never_ends():
    factory, clock = lookupd()
    proto, transport = connect(factory)
    proto.dataReceived(b"  V1" + b"x" * 20000)
    assert transport.disconnecting and b"E_INVALID" in transport.value()
    assert proto._buf == b""


def test_lookupd_refuses_a_huge_identify_body():
    factory, clock = lookupd()
    proto, transport = connect(factory)
    proto.dataReceived(b"  V1IDENTIFY\n\x7f\xff\xff\xff")
    assert transport.disconnecting and b"E_BAD_BODY" in transport.value()


def test_lookupd_deeply_nested_identify_is_bad_body():
    factory, clock = lookupd()
    proto, transport = connect(factory)
    body = b"[" * 100_000
    proto.dataReceived(b"  V1IDENTIFY\n" + len(body).to_bytes(4, "big") + body)
    assert transport.disconnecting and b"E_BAD_BODY" in transport.value()


def test_lookupd_many_pings_in_one_read():
    factory, clock = lookupd()
    proto, transport = connect(factory)
    proto.dataReceived(b"  V1" + b"PING\n" * 20000)
    assert transport.value().count(b"OK") == 20000
