"""The slave side of smss replication (spec §8.1, §8.3).

The follower connects to the master, copies topics with VALID LIST when it starts in the
middle of the master's log, sends REPLICA with its resume point, and applies every binlog
block through the L{Applier}. It reconnects with backoff (Twisted's ClientService) when
the master goes away or stays silent for twice the ALIVE interval.
"""

import json

from twisted.application.internet import ClientService, backoffPolicy
from twisted.internet.endpoints import clientFromString, wrapClientTLS
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger

from mqserver.broker.topics import Topic
from mqserver.config import MASTER_ENDPOINT_PREFIXES
from mqserver.replication.applier import Applier
from mqserver.store import format as fmt

from protocols.smss import binlog, wire
from protocols.smss.client_codec import Expect, ResponseDecoder, encode_replica, encode_valid_list
from protocols.smss.errors import SmssProtocolError
from protocols.smss.messages import AliveResponse, ErrResponse, OkResponse, ReplicaBlock

_DELAY_PREFIX = wire.BINLOG_DELAY_STRUCT


def topic_from_json(d):
    """Return a L{Topic} from one object of a VALID LIST reply."""
    return Topic(
        name=d["name"],
        create_ts=d.get("createTimeStamp", 0),
        expire_at=d.get("expireAt", 0),
        create_event_id=d.get("createEventId", 0),
        state_change_ts=d.get("stateChangeTime", 0),
        state_change_event_id=d.get("stateChangeEventId", 0),
        state=d.get("state", 0),
    )


def apply_block(applier, raw):
    """Parse one binlog block and apply it. Returns the store's Deferred or None."""
    rec = binlog.parse_block(raw)
    if rec.cmd == binlog.CMD_PUB:
        items = binlog.messages_of(rec.payload, rec.timestamp)
        return applier.messages(rec.event_id, rec.topic, items, rec.write_time)
    if rec.cmd == binlog.CMD_DELAY_APPLY:
        trigger, delay_eid = _DELAY_PREFIX.unpack_from(rec.payload, 0)
        marker = fmt.encode_properties([(fmt.DELAY_PROPERTY, fmt.delay_marker(delay_eid, trigger))])
        items = binlog.messages_of(rec.payload[16:], rec.timestamp, marker)
        return applier.messages(rec.event_id, rec.topic, items, rec.write_time, delay_eid)
    if rec.cmd == binlog.CMD_CREATE:
        op, body = binlog.create_record_body(rec.payload)
        return applier.admin(rec.event_id, op, rec.topic, body, rec.write_time)
    if rec.cmd == binlog.CMD_DELETE:
        return applier.admin(rec.event_id, fmt.OP_DELETE, rec.topic, b"", rec.write_time)
    if rec.cmd == binlog.CMD_DELAY:
        trigger, _ = _DELAY_PREFIX.unpack_from(rec.payload, 0)
        msgs = [m for _, m in binlog.messages_of(rec.payload[16:], rec.timestamp)]
        body = fmt.DELAY_PREFIX.pack(trigger) + fmt.encode_message_list(msgs)
        return applier.admin(rec.event_id, fmt.OP_DELAY, rec.topic, body, rec.write_time)
    raise ValueError(f"unknown binlog command {rec.cmd}")


class FollowerProtocol(Protocol):
    """One connection to the master."""

    log = Logger()

    def __init__(self, factory):
        self.factory = factory
        self.applier = factory.applier
        self.decoder = None
        self._idle_call = None
        self._failed = False

    def connectionMade(self):
        f = self.factory
        self.applier.connected = True
        start = self.applier.resume_point(f.start_event)
        self._start = start
        fresh = not self.applier.broker.registry.topics and self.applier.applied_event_id == 0
        if start > 0 and fresh:
            self.decoder = ResponseDecoder(Expect.JSON)
            self.transport.write(encode_valid_list(start))
        else:
            self._replica()
        self._touch()

    def _replica(self):
        self.log.info("following the master from eventId {start}", start=self._start)
        self.decoder = ResponseDecoder(Expect.REPLICA)
        self.transport.write(encode_replica(self._start))

    def _touch(self):
        if self._idle_call is not None and self._idle_call.active():
            self._idle_call.reset(self.factory.silence_limit)
        else:
            self._idle_call = self.factory.reactor.callLater(self.factory.silence_limit, self._silent)

    def _silent(self):
        self._idle_call = None
        self.log.warn("master silent for {s}s: reconnecting", s=self.factory.silence_limit)
        self.transport.abortConnection()

    def dataReceived(self, data):
        try:
            events = self.decoder.feed(data)
        except SmssProtocolError as e:
            self.log.error("bad replication stream: {error}", error=e)
            self.transport.abortConnection()
            return
        self._touch()
        for ev in events:
            if self._failed:
                return
            if isinstance(ev, ReplicaBlock):
                try:
                    d = apply_block(self.applier, ev.raw)
                except Exception:
                    self.log.failure("cannot apply a replicated record")
                    self._fail()
                    return
                if d is not None:
                    d.addErrback(self._store_failed)
            elif isinstance(ev, OkResponse):
                topics = json.loads(ev.body) if ev.body else []
                self.applier.copy_topics([topic_from_json(t) for t in topics])
                self._replica()
            elif isinstance(ev, ErrResponse):
                self.log.error("master refused replication: {text}", text=ev.text)
                self._fail()
            elif isinstance(ev, AliveResponse):
                pass

    def _store_failed(self, f):
        self.log.failure("storing a replicated record failed", f)
        self._fail()

    def _fail(self):
        self._failed = True
        if self.transport is not None:
            self.transport.abortConnection()

    def connectionLost(self, reason):
        self.applier.connected = False
        # Says why, e.g. a TLS master whose certificate the CA does not vouch for.
        self.log.info("connection to the master lost: {why}", why=reason.getErrorMessage())
        if self._idle_call is not None and self._idle_call.active():
            self._idle_call.cancel()
        self._idle_call = None


class FollowerFactory(Factory):
    """Builds L{FollowerProtocol}s for the one master connection."""

    noisy = False

    def __init__(self, applier, reactor, start_event=0, alive_interval=30.0):
        self.applier = applier
        self.reactor = reactor
        self.start_event = start_event
        self.silence_limit = max(1.0, 2 * alive_interval)

    def buildProtocol(self, addr):
        return FollowerProtocol(self)


def master_endpoint(reactor, config):
    """Return the client endpoint of the master: C{master} as HOST:PORT over TCP, or over
    TLS when C{masterTls} is set (the certificate checked for HOST against the CA file
    C{masterCa}, else the system's trust roots); or C{master} as a Twisted client
    endpoint string (C{tls:HOST:PORT:trustRoots=DIR}, C{tcp:...}, C{unix:...})."""
    master = config["master"]
    if master.startswith(MASTER_ENDPOINT_PREFIXES):
        return clientFromString(reactor, master)
    host, _, port = master.rpartition(":")
    endpoint = clientFromString(reactor, f"tcp:host={host}:port={port}:timeout=5")
    if not config["masterTls"]:
        return endpoint
    from twisted.internet import ssl

    trust = ssl.platformTrust()
    if config["masterCa"]:
        with open(config["masterCa"], "rb") as f:
            trust = ssl.Certificate.loadPEM(f.read())
    return wrapClientTLS(ssl.optionsForClientTLS(host, trustRoot=trust), endpoint)


def make_follower(broker, config, reactor):
    """Return the service that follows the master named in C{config}."""
    applier = Applier(broker)
    factory = FollowerFactory(applier, reactor, config["event"], config["timeout.server.alive"] / 1000.0)
    endpoint = master_endpoint(reactor, config)
    service = ClientService(
        endpoint, factory, retryPolicy=backoffPolicy(initialDelay=1.0, maxDelay=5.0), clock=reactor
    )
    service.setName("replication")
    return service
