"""One broker in process for protocol unit tests: no sockets, no threads, no real time.

L{Node} builds what the service tree builds for a front door (a real L{MessageStore} on
disk, the L{Broker} over it, the config), on a L{MemoryReactorClock}, with a store runner the test
controls: L{SyncRunner} finishes every disk call at once, L{HeldRunner} holds them until
the test lets them go (a publish whose write is not finished yet). Protocols are driven
through L{StringTransportWithDisconnection}, so C{loseConnection} really ends the
connection and runs C{connectionLost}, as a socket would.
"""

from contextlib import contextmanager

import pytest
from twisted.internet import defer
from twisted.internet.testing import MemoryReactorClock, StringTransportWithDisconnection
from twisted.trial.unittest import SynchronousTestCase

from mqserver.broker.broker import Broker
from mqserver.config import build_config
from mqserver.store.flush import SyncRunner
from mqserver.store.store import MessageStore

#: The clock's start: a plausible "now", so timestamps are not near 0.
NOW = 1_700_000_000.0

# trial's Deferred assertions, for pytest tests: the result of a Deferred that has fired
# (fails the test when it has not, or failed), the Failure of one that failed with one of
# the given exception types, and "has not fired yet".
_trial = SynchronousTestCase()
result_of = _trial.successResultOf
failure_of = _trial.failureResultOf
no_result = _trial.assertNoResult


class HeldRunner(SyncRunner):
    """A store runner whose calls wait until L{release} (the disk thread, made manual)."""

    def __init__(self):
        self.held = []  # (Deferred, f, args)

    def run(self, f, *args):
        d = defer.Deferred()
        self.held.append((d, f, args))
        return d

    def release(self):
        """Run every held call (and any they queue) and fire its Deferred."""
        while self.held:
            d, f, args = self.held.pop(0)
            defer.maybeDeferred(f, *args).chainDeferred(d)

    def stop(self):
        # the store's close runs after the test: let queued fsyncs finish as the
        # real runner's thread would
        self.release()


class FillingTransport(StringTransportWithDisconnection):
    """A transport whose buffer, like a socket's (C{FileDescriptor.write}), pauses its
    streaming producer once more than C{bufferSize} bytes wait; L{drain} sends them and
    resumes it."""

    bufferSize = 4096
    full = False

    def write(self, data):
        super().write(data)
        if self.producer is not None and self.streaming and not self.full \
                and len(self.value()) > self.bufferSize:
            self.full = True
            self.producer.pauseProducing()

    def drain(self):
        out = self.value()
        self.clear()
        if self.full:
            self.full = False
            if self.producer is not None:
                self.producer.resumeProducing()
        return out


class Connection:
    """One client connection: the protocol, its transport, and the bytes it wrote."""

    def __init__(self, protocol, peer=None, transport=StringTransportWithDisconnection):
        self.protocol = protocol
        self.transport = transport(peerAddress=peer)
        self.transport.protocol = protocol
        protocol.makeConnection(self.transport)

    def send(self, data):
        """Deliver C{data} to the protocol in one read."""
        self.protocol.dataReceived(data)

    def send_bytewise(self, data):
        """Deliver C{data} one byte per read (every split point a frame can have)."""
        for i in range(len(data)):
            self.protocol.dataReceived(data[i:i + 1])

    def take(self):
        """Return what the protocol wrote since the last call, and forget it."""
        out = self.transport.value()
        self.transport.clear()
        return out

    @property
    def connected(self):
        """False once either side ended the connection."""
        return self.transport.connected

    def lose(self):
        """The client goes away (the socket reports the loss)."""
        self.transport.loseConnection()


class Node:
    """A broker on a L{MemoryReactorClock} over a real store in C{path}.

    @ivar clock: the reactor every part uses (callLater, seconds; no sockets).
    @ivar runner: the store's disk runner (L{HeldRunner} when C{hold_disk}).
    """

    def __init__(self, path, flush_level=1, hold_disk=False, config=None):
        self.clock = MemoryReactorClock()
        self.clock.advance(NOW)
        self.runner = HeldRunner() if hold_disk else SyncRunner()
        self.store = MessageStore(str(path), self.clock, clock=self.clock.seconds,
                                  segment_size=1 << 20, cq_entries_per_file=1000,
                                  flush_level=flush_level, runner=self.runner)
        self.broker = Broker(self.store, self.clock)
        self.config = build_config(config or {})
        self.store.open()
        self.broker.start()
        self.factories = []
        self.services = []
        self.connections = []

    def door(self, make_factory):
        """Build and start the factory a front door's C{make_factory} returns."""
        f = make_factory(self.broker, self.config, self.clock)
        self.add_factory(f)
        self.clock.advance(0)  # what a factory does on the reactor's first turn
        return f

    def add_factory(self, factory):
        """Start C{factory} and the services it contributes to the broker's service tree
        (C{factory.services()}, if it has that method); all are stopped at L{close}."""
        factory.doStart()
        self.factories.append(factory)
        for svc in getattr(factory, "services", lambda: ())():
            svc.startService()
            self.services.append(svc)
        return factory

    def connect(self, factory, peer=None, transport=StringTransportWithDisconnection):
        """Return a new L{Connection} to C{factory} (over a C{transport} made for it)."""
        c = Connection(factory.buildProtocol(peer), peer, transport)
        self.connections.append(c)
        return c

    def close(self):
        """Close what is still connected, stop the factories, the broker and the store."""
        for c in self.connections:
            if c.connected:
                c.lose()
        for f in reversed(self.factories):
            f.doStop()
        for svc in reversed(self.services):
            svc.stopService()
        self.broker.stop()
        self.store.close()

    def pending_calls(self):
        """The timers still armed on the clock, by function name (sorted)."""
        return sorted(getattr(c.func, "__qualname__", repr(c.func))
                      for c in self.clock.getDelayedCalls())


@contextmanager
def running(path, door=None, **kw):
    """A L{Node} in C{path} (keywords as L{Node} takes them) with C{door}'s factory, if
    given, started as C{node.factory}; closed at the end, which must leave no timer
    armed on the clock."""
    node = Node(path, **kw)
    if door is not None:
        node.factory = node.door(door)
    try:
        yield node
    finally:
        node.close()
    left = node.pending_calls()
    assert left == [], f"timers left behind: {left}"


def door_fixtures(door=None):
    """Return the pytest fixtures C{node} and C{held} of a test module, each a running
    L{Node} in the test's C{tmp_path} with C{door}'s factory as C{node.factory}:
    C{node} writes at flush level 1 (answers at once), C{held} at flush level 2 with
    every fsync held until C{held.runner.release()}.

    Use: C{node, held = door_fixtures(make_factory)} at module level."""

    @pytest.fixture
    def node(tmp_path):
        with running(tmp_path / "data", door) as n:
            yield n

    @pytest.fixture
    def held(tmp_path):
        with running(tmp_path / "data", door, flush_level=2, hold_disk=True) as n:
            n.runner.release()  # what the door wrote when it started (RocketMQ's TBW102)
            yield n

    return node, held
