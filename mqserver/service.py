"""The service tree: storage first, then each front door's services and listener, so
listeners close before the store flushes on shutdown (MultiService stops its children
in reverse order)."""

import gc
import json
import os
import signal
import socket

from twisted.application import service
from twisted.application.internet import TimerService
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqserver import speedups
from mqserver.broker.broker import Broker
from mqserver.config import etcd_endpoints
from mqserver.errors import StartupError
from mqserver.runtime.fastpath import service_reactor
from mqserver.runtime.output import together
from mqserver.listen import server_endpoint
from mqserver.security import AllowList, AllowListEndpoint
from mqserver.store import format as fmt
from mqserver.store.flush import ThreadRunner
from mqserver.store.lock import UnusableDirectory
from mqserver.store.store import MessageStore
from mqserver.version import version


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


def timer(step, f, clock, name=None, now=True):
    """Return a L{TimerService} calling C{f} every C{step} seconds on C{clock} (the first
    call when it starts, or C{step} seconds later if not C{now}), named C{name}: a
    background loop as a child of the service tree, so it starts after and stops before
    the services added ahead of it."""
    if not now:
        f = _after_first_step(f)
    t = TimerService(step, f)
    t.clock = clock
    if name is not None:
        t.setName(name)
    return t


def _after_first_step(f):
    # TimerService calls at once when it starts; this skips that call, as
    # LoopingCall.start(now=False) would.
    started = []

    def call():
        if not started:
            started.append(True)
            return None
        return f()

    return call


def freeze_start_up_heap():
    """Move the objects start-up made (modules, configuration, the store's tables) out of
    the cyclic garbage collector's generations (C{gc.freeze}), after collecting what is
    garbage already. The collections a busy broker triggers (a group's leader: some 200
    a second, a tenth of them of the older generations, as writes wait for their
    followers) then walk only what it made since, not the 45,000 objects of start-up:
    0.5 µs of the leader's CPU per write instead of 1.4."""
    gc.collect()
    gc.freeze()


def release_free_heap():
    """Give the C heap's free pages back to the system (glibc's C{malloc_trim}): start-up
    (imports, recovery) leaves about 1.5 MB freed but resident. Nothing elsewhere."""
    try:
        import ctypes

        trim = ctypes.CDLL(None).malloc_trim
    except (ImportError, OSError, AttributeError):
        return False
    trim(0)
    return True


class HookService(service.Service):
    """A service that calls C{start()} when it starts and C{stop()} when it stops (a
    front door's life cycle as a node of the tree; C{stop} may return a Deferred)."""

    def __init__(self, start, stop, name=None):
        self._start = start
        self._stop = stop
        if name is not None:
            self.setName(name)

    def startService(self):
        super().startService()
        self._start()

    def stopService(self):
        super().stopService()
        return self._stop()


class StorageService(service.MultiService):
    """Owns the store and the broker: opens them (recovery, the data directory's lock) at
    start, closes them (flushed, lock released) at stop. Its timers (checkpoint, consumer
    offsets, retention) are its children, so they start after the store opens and stop
    before it closes.

    The store opens in C{startService}, not C{privilegedStartService}: under
    C{twistd --uid} files it creates belong to the service user.

    @ivar store: the L{MessageStore}.
    @ivar broker: the L{Broker}.
    """

    log = Logger()

    def __init__(self, config, reactor, store_port=0):
        super().__init__()
        self.config = config
        self._reactor = reactor
        host = fmt.HOST.pack(socket.inet_aton(local_ipv4()), store_port)
        self.store = MessageStore(
            os.path.abspath(config["store.path"]),
            reactor,
            segment_size=config["store.maxLogSize"],
            cq_entries_per_file=config["store.cqEntriesPerFile"],
            flush_level=config["store.flushLevel"],
            runner=ThreadRunner(reactor, around=together),
            housekeeping=ThreadRunner(reactor, name="mqserver-housekeeping"),
            store_host=host,
            max_message_size=config["store.maxMessageSize"],
            disk_max_used_ratio=config["store.diskMaxUsedRatio"],
        )
        self.broker = Broker(self.store, reactor)
        timer(1.0, self._tick, reactor, "checkpoint").setServiceParent(self)
        timer(5.0, self._save_offsets, reactor, "offsets").setServiceParent(self)
        if config["store.maxDays"] > 0:
            timer(config["store.clearInterval"], self._clean, reactor,
                  "retention").setServiceParent(self)

    def startService(self):
        try:
            self.store.open()
        except OSError as e:  # the directory cannot be made, or its files read or written
            raise UnusableDirectory(self.store.path, e) from None
        self.broker.start()
        self.log.info(
            "store open at {path}: log {start}..{end}, next eventId {eid}",
            path=self.store.path, start=self.store.commitlog.min_offset,
            end=self.store.commitlog.end, eid=self.store.next_event_id,
        )
        self.log.info("{speedups}", speedups=speedups.report())
        choice = service_reactor.choice
        if choice is not None:
            self.log.info("{paths}", paths=choice.describe())
        super().startService()

    def _tick(self):
        self.broker.stats.tick()
        self.store.check_disk()
        if self.store.flush_level == 1:
            self.store.sync()
        return self.store.checkpoint()

    def _save_offsets(self):
        d = self.broker.offsets.save(self.store.housekeeping)
        if d is not None:
            d.addErrback(self._offsets_unsaved)
        return d

    def _offsets_unsaved(self, failure):
        # a disk error like the others (counted, one line per trouble); the table stays
        # dirty and the next save tries again. Left to the timer, a failure would stop
        # the loop with a traceback.
        failure.trap(OSError)
        self.store.disk.error("writing consumer offsets", failure.value)

    def _clean(self):
        self.store.clean(self.config["store.maxDays"] * 86400, self.broker.min_reader_offset())

    def stopService(self):
        super().stopService()
        if not self.store.opened:
            return
        self.broker.stop()
        # Writes already queued on the disk threads (checkpoints, offset files) land
        # before the final synchronous ones below, never after them.
        self.store.stop_threads()
        try:
            self.broker.offsets.save()
        except OSError as e:
            self.log.error("saving consumer offsets failed: {e}", e=e)
        self.store.close()
        self.log.info("store closed at eventId {eid}", eid=self.store.next_event_id - 1)


def count_connections(factory, door, stats):
    """Make C{factory} tell the broker's statistics about every connection it serves (the
    connections of front door C{door} and their client addresses), adding nothing to a
    connection's own work.

    The factory's C{buildProtocol} is wrapped on the instance rather than the factory
    itself, because doors find their listening port by the factory's identity. The
    statistics learn the connection's transport when the protocol gets it
    (C{makeConnection}, wrapped on the protocol instance): the protocol a factory builds
    may be a wrapper without a transport of its own (twisted.web's HTTP channel)."""
    build = factory.buildProtocol

    def buildProtocol(addr):
        p = build(addr)
        if p is not None:
            connect = p.makeConnection

            def makeConnection(transport):
                stats.connection_made(door, transport, addr)
                return connect(transport)

            p.makeConnection = makeConnection
        return p

    factory.buildProtocol = buildProtocol
    return factory


def write_ready_file(path, info):
    """Write C{info} as JSON to C{path} atomically: a reader finds the whole file or
    none (a temporary file beside it, then renamed over it)."""
    path = os.path.abspath(path)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def remove_ready_file(path):
    """Remove the ready file C{path} an earlier run left: it must not say this one is
    ready. Raises L{StartupError} when it cannot be removed."""
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise StartupError(f"cannot replace the ready file {path}: {e.strerror}") from None


def ready_info(listeners):
    """What a ready file says once every L{ListenerService} of C{listeners} listens:
    the version, the process id, and each door's bound address and endpoint."""
    return {"version": version(), "pid": os.getpid(),
            "doors": {d.door: dict(d.bound(), endpoint=d.description) for d in listeners}}


class ListenError(StartupError):
    """A front door cannot listen on its endpoint."""

    def __init__(self, door, description, why):
        self.door = door
        self.description = description
        super().__init__(f"front door {door} cannot listen on {description}: {why}")


def _reason(failure):
    e = failure.value
    # CannotListenError's own text repeats the address; its socket error says why.
    return str(getattr(e, "socketError", None) or e)


class ListenerService(service.Service):
    """Front door C{door} listening on the endpoint C{description}.

    It binds in C{privilegedStartService} (privileged ports work under
    C{twistd --uid}), or in C{startService} if nothing called the former. A bind that
    fails raises L{ListenError}, which stops start-up (L{BrokerService}); Twisted's own
    L{StreamServerEndpointService} would log it and run on without the door.

    No connection is accepted before the store is open although the port is bound
    earlier: the reactor does not run between C{privilegedStartService} and
    C{startService}, and the storage service, an earlier sibling, opens the store in
    its C{startService}. The factory learns its port (C{factory.listening(port)}, if it
    has that method) in C{startService}, so after the store is open too.

    @ivar port: the L{IListeningPort} once bound, else None.
    """

    log = Logger()

    def __init__(self, door, description, endpoint, factory):
        self.door = door
        self.description = description
        self.endpoint = endpoint
        self.factory = factory
        self.port = None
        self._told = False

    def privilegedStartService(self):
        super().privilegedStartService()
        self._bind()

    def startService(self):
        super().startService()
        if self.port is None:
            self._bind()
        if not self._told:
            self._told = True
            notify = getattr(self.factory, "listening", None)
            if notify is not None:
                notify(self.port)

    def _bind(self):
        outcome = []
        self.endpoint.listen(self.factory).addBoth(outcome.append)
        if not outcome:
            # Every endpoint mqserver documents binds at once; one that does not would
            # leave the door's fate unknown at start-up, which we refuse as well.
            raise ListenError(self.door, self.description, "the endpoint did not bind at once")
        result = outcome[0]
        if isinstance(result, Failure):
            raise ListenError(self.door, self.description, _reason(result))
        self.port = result
        self.log.info("door {door} listening on {endpoint} ({address})", door=self.door,
                      endpoint=self.description, address=self.address())

    def bound(self):
        """Return where the door is bound: C{{"host": HOST, "port": PORT}}, or
        C{{"path": PATH}} for a UNIX socket; None when it is not listening."""
        if self.port is None:
            return None
        addr = self.port.getHost()
        if isinstance(addr, (IPv4Address, IPv6Address)):
            return {"host": addr.host, "port": addr.port}
        if isinstance(addr, UNIXAddress):
            name = addr.name
            return {"path": name.decode("utf-8", "replace") if isinstance(name, bytes) else name}
        return {"address": str(addr)}

    def address(self):
        """Return the bound address as text: C{tcp:HOST:PORT} or C{unix:PATH}."""
        where = self.bound()
        if "port" in where:
            host = where["host"]
            return f"tcp:[{host}]:{where['port']}" if ":" in host else f"tcp:{host}:{where['port']}"
        if "path" in where:
            return f"unix:{where['path']}"
        return where["address"]

    def stopService(self):
        super().stopService()
        port, self.port = self.port, None
        self._told = False
        if port is not None:
            return port.stopListening()


class StandaloneService(service.MultiService):
    """The listeners of a server without a store (C{twistd mqnamesrv}, C{twistd
    mqlookupd}): when given a C{ready_file}, it writes it as the broker does once every
    listener is bound (L{ready_info})."""

    def __init__(self, ready_file=None):
        super().__init__()
        self.ready_file = ready_file

    def privilegedStartService(self):
        if self.ready_file:
            remove_ready_file(self.ready_file)
        super().privilegedStartService()

    def startService(self):
        super().startService()
        if self.ready_file:
            write_ready_file(self.ready_file,
                             ready_info([c for c in self if isinstance(c, ListenerService)]))


class BrokerService(service.MultiService):
    """The root service: a named storage child, then each front door's services and
    its listener.

    Start-up is all or nothing: when a child cannot start (L{StartupError}: the data
    directory is locked, a door cannot listen), the children already started are
    stopped (the store closes cleanly), one line saying why is logged, and the process
    exits with status 1.
    """

    log = Logger()

    def __init__(self, config, reactor, ready_file=None):
        super().__init__()
        self.config = config
        self._reactor = reactor
        self.ready_file = ready_file
        self.storage = StorageService(config, reactor)
        self.storage.setName("storage")
        self.storage.setServiceParent(self)
        allow = config["security.allow"]
        self.allow = AllowList(allow, reactor.seconds) if allow else None

    def add_door_services(self, factory):
        """Add the services a front door's factory runs beside its listener (its
        C{services()}, if it has that method): they start after the store and stop
        after the door's listener."""
        for svc in getattr(factory, "services", lambda: ())():
            svc.setServiceParent(self)

    def add_listener(self, name, factory):
        """Listen for C{factory} on the endpoint configured for front door C{name}."""
        desc = self.config.listen.get(name)
        if desc is None:
            return None
        count_connections(factory, name, self.storage.broker.stats)
        self.storage.broker.stats.door_listening(name)
        # the listening port's log lines name the door, not the factory's class
        factory.logPrefix = lambda: f"door {name}"
        endpoint = server_endpoint(self._reactor, desc)
        if self.allow is not None:  # security.allow: refused at accept, on every door
            endpoint = AllowListEndpoint(endpoint, self.allow, name)
        svc = ListenerService(name, desc, endpoint, factory)
        svc.setName(f"listen-{name}")
        svc.setServiceParent(self)
        return svc

    def privilegedStartService(self):
        role = self.config["role"]
        if etcd_endpoints(self.config["cluster.etcd"]):  # etcd decides the role
            role = (f"member {self.config['cluster.name']} of replica group "
                    f"{self.config['cluster.group']}")
        self.log.info("mqserver {version} starting: {role}, data {path}, pid {pid}",
                      version=version(), role=role,
                      path=os.path.abspath(self.config["store.path"]), pid=os.getpid())
        if self.ready_file:
            try:
                remove_ready_file(self.ready_file)
            except StartupError as e:
                self._refuse(e)
        try:
            super().privilegedStartService()
        except StartupError as e:
            self._refuse(e)

    def startService(self):
        try:
            super().startService()
        except StartupError as e:
            self._refuse(e)
        self._ready()
        # the signal handlers first: a SIGTERM that arrives while start-up's garbage is
        # collected (tens of ms) must already stop the broker cleanly
        self._reactor.callWhenRunning(self._stop_cleanly_on_signals)
        self._reactor.callWhenRunning(freeze_start_up_heap)
        self._reactor.callWhenRunning(release_free_heap)

    def listeners(self):
        """Return the L{ListenerService} of every door that listens, in start order."""
        return [child for child in self if isinstance(child, ListenerService)]

    def _ready(self):
        """Every door listens and the store is open: say so in one line, and write the
        ready file when asked for one."""
        doors = self.listeners()
        self.log.info("mqserver {version} ready: {doors}", version=version(),
                      doors=", ".join(f"{d.door} {d.address()}" for d in doors) or "no doors")
        if self.ready_file:
            try:
                write_ready_file(self.ready_file, ready_info(doors))
            except OSError as e:
                self._refuse(StartupError(f"cannot write the ready file {self.ready_file}: "
                                          f"{e.strerror}"))

    def _stop_cleanly_on_signals(self):
        """Make SIGTERM and SIGINT stop the reactor as the reactor's own handlers do, but
        without twistd then killing the process with that signal again: a broker stopped
        that way has shut down cleanly, so it exits with status 0 (what service managers
        and ``make run`` take as success). Only handlers the reactor installed are
        replaced (none in a process that runs it without signal handling)."""
        for number in (signal.SIGTERM, signal.SIGINT):
            installed = signal.getsignal(number)
            if getattr(installed, "__self__", None) is self._reactor:
                signal.signal(number, self._stop_on_signal)

    def _stop_on_signal(self, number, frame):
        self.log.info("received {name}, shutting down", name=signal.Signals(number).name)
        self._reactor.callFromThread(self._reactor.stop)

    def _refuse(self, error):
        self.log.critical("mqserver cannot start: {why}", why=str(error))
        for child in reversed(list(self)):
            if child.running or isinstance(child, ListenerService):
                child.stopService()
        self.running = 0
        # twistd has no public way to end start-up with a status; SystemExit carries one
        # without a traceback (the line above says why).
        raise SystemExit(1)
