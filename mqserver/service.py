"""The service tree: storage first, listeners last, so listeners close before the store
flushes on shutdown (MultiService stops its children in reverse order)."""

import os
import socket

from twisted.application import service
from twisted.application.internet import StreamServerEndpointService
from twisted.internet import endpoints
from twisted.application.internet import TimerService
from twisted.logger import Logger

from mqserver import speedups
from mqserver.broker.broker import Broker
from mqserver.security import AllowList, AllowListEndpoint
from mqserver.store.flush import ThreadRunner
from mqserver.store.store import MessageStore


def local_ipv4():
    """Return a reachable IPv4 address of this host for the StoreHost field, falling back
    to 127.0.0.1 (RocketMQ clients connect to it for some calls)."""
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            # connect() on UDP sends nothing; it only picks the outgoing interface.
            s.connect(("10.255.255.255", 1))
            return s.getsockname()[0]
        finally:
            s.close()
    except OSError:
        return "127.0.0.1"


class StorageService(service.Service):
    """Owns the store and the broker: opens them at start, closes them (flushed) at stop.

    @ivar store: the L{MessageStore}.
    @ivar broker: the L{Broker}.
    """

    log = Logger()

    def __init__(self, config, reactor, store_port=0):
        self.config = config
        self._reactor = reactor
        host = socket.inet_aton(local_ipv4()) + store_port.to_bytes(4, "big")
        self.store = MessageStore(
            os.path.abspath(config["store.path"]),
            reactor,
            segment_size=config["store.maxLogSize"],
            cq_entries_per_file=config["store.cqEntriesPerFile"],
            flush_level=config["store.flushLevel"],
            runner=ThreadRunner(reactor),
            store_host=host,
            max_message_size=config["store.maxMessageSize"],
            disk_max_used_ratio=config["store.diskMaxUsedRatio"],
        )
        self.broker = Broker(self.store, reactor)
        self._timers = []

    def privilegedStartService(self):
        # Open (and recover) the store before any listener binds.
        self.store.open()
        super().privilegedStartService()

    def startService(self):
        self.broker.start()
        self.log.info(
            "store open at {path}: log {start}..{end}, next eventId {eid}",
            path=self.store.path, start=self.store.commitlog.min_offset,
            end=self.store.commitlog.end, eid=self.store.next_event_id,
        )
        self.log.info("{speedups}", speedups=speedups.report())
        timers = [TimerService(1.0, self._tick), TimerService(5.0, self._save_offsets)]
        if self.config["store.maxDays"] > 0:
            timers.append(TimerService(self.config["store.clearInterval"], self._clean))
        for t in timers:
            t.clock = self._reactor
            t.startService()
        self._timers = timers
        super().startService()

    def _tick(self):
        self.broker.stats.tick()
        self.store.check_disk()
        if self.store.flush_level == 1:
            self.store.sync()
        return self.store.checkpoint()

    def _save_offsets(self):
        return self.broker.offsets.save(self.store.runner)

    def _clean(self):
        self.store.clean(self.config["store.maxDays"] * 86400, self.broker.min_reader_offset())

    def stopService(self):
        super().stopService()
        for t in self._timers:
            t.stopService()
        self.broker.stop()
        # Writes already queued on the disk thread (checkpoints, offset files) land
        # before the final synchronous ones below, never after them.
        self.store.runner.stop()
        try:
            self.broker.offsets.save()
        except OSError as e:
            self.log.error("saving consumer offsets failed: {e}", e=e)
        self.store.close()
        self.log.info("store closed at eventId {eid}", eid=self.store.next_event_id - 1)


def count_connections(factory, door, stats):
    """Make C{factory} tell the broker's statistics about every connection it builds (the
    connections of front door C{door} and their client addresses), adding nothing to a
    connection's own work.

    The factory's C{buildProtocol} is wrapped on the instance rather than the factory
    itself, because doors find their listening port by the factory's identity."""
    build = factory.buildProtocol

    def buildProtocol(addr):
        p = build(addr)
        if p is not None:
            stats.connection_made(door, p, addr)
        return p

    factory.buildProtocol = buildProtocol
    return factory


class ListenerService(StreamServerEndpointService):
    """A listener whose factory, if it has a C{listening(port)} method, is told the
    listening port once it is bound (so it can advertise its real address, e.g. when
    the endpoint asks for port 0)."""

    def privilegedStartService(self):
        super().privilegedStartService()
        notify = getattr(self.factory, "listening", None)
        if notify is not None:

            def bound(port):
                if port is not None:  # None: the bind failed and was already logged
                    notify(port)
                return port

            self._waitingForPort.addCallback(bound)


class BrokerService(service.MultiService):
    """The root service: a named storage child, then one child per listener."""

    def __init__(self, config, reactor):
        super().__init__()
        self.config = config
        self._reactor = reactor
        self.storage = StorageService(config, reactor)
        self.storage.setName("storage")
        self.storage.setServiceParent(self)
        allow = config["security.allow"]
        self.allow = AllowList(allow, reactor.seconds) if allow else None

    def add_listener(self, name, factory):
        """Listen for C{factory} on the endpoint configured for front door C{name}."""
        desc = self.config.listen.get(name)
        if desc is None:
            return None
        count_connections(factory, name, self.storage.broker.stats)
        endpoint = endpoints.serverFromString(self._reactor, desc)
        if self.allow is not None:  # security.allow: refused at accept, on every door
            endpoint = AllowListEndpoint(endpoint, self.allow, name)
        svc = ListenerService(endpoint, factory)
        svc.setName(f"listen-{name}")
        svc.setServiceParent(self)
        return svc
