"""Every implementation of the core's contracts is checked against its interface
(zope.interface.verify.verifyObject: the attributes are there and the methods take the
declared arguments), on real objects built as the broker builds them."""

import pytest
from twisted.internet.testing import MemoryReactorClock
from zope.interface.verify import verifyClass, verifyObject

from mqserver.broker.broker import Broker
from mqserver.broker.channel_registry import ChannelRegistry
from mqserver.broker.queue_consumer import _Waiter
from mqserver.interfaces import (
    IBroker, IChannelConsumer, IDataFiles, IMessageLog, IReplicationLog, IStoreStats, IWatcher)
from mqserver.tap import Options, makeService
from protocols.console.protocol import _Follower
from protocols.nsq.factory import make_factory as nsqd_factory
from protocols.nsq.protocol import NsqdProtocol
from protocols.remoting.longpolls import LongPolls
from protocols.smss.factory import make_factory as smss_factory
from protocols.smss.subscription import Subscription


@pytest.fixture
def built(tmp_path):
    """(broker, config, reactor) as makeService builds them (nothing started)."""
    o = Options()
    o.parseOptions(["--data", str(tmp_path / "data")])
    reactor = MemoryReactorClock()
    root = makeService(o, reactor)
    return root.storage.broker, o["settings"], reactor


def test_the_broker_provides_ibroker(built):
    broker, _, _ = built
    assert verifyClass(IBroker, Broker)
    assert verifyObject(IBroker, broker)


def test_the_broker_gives_doors_the_store_only_through_interfaces(built):
    broker, _, _ = built
    assert "store" not in IBroker.names()
    broker.store.open()  # the figures of an open store
    try:
        assert verifyObject(IMessageLog, broker.messages)
        assert verifyObject(IReplicationLog, broker.replication_log)
        assert verifyObject(IStoreStats, broker.store_stats)
        assert verifyObject(IDataFiles, broker.files)
    finally:
        broker.store.close()


def test_watchers_provide_iwatcher(built):
    broker, config, reactor = built
    proto = smss_factory(broker, config, reactor).buildProtocol(None)
    waiter = _Waiter(broker, "t")
    for watcher in (Subscription(proto, "t", None, 10, 0, b"who"), LongPolls(broker, reactor),
                    broker.channels, waiter):
        assert verifyObject(IWatcher, watcher)
    assert isinstance(broker.channels, ChannelRegistry)
    assert verifyClass(IWatcher, _Follower)  # the console's TAIL (needs a live cursor)


def test_nsqd_connections_provide_ichannelconsumer(built):
    broker, config, reactor = built
    proto = nsqd_factory(broker, config, reactor).buildProtocol(None)
    assert isinstance(proto, NsqdProtocol)
    assert verifyObject(IChannelConsumer, proto)
