"""The slave side of smss replication.

The follower connects to the master, copies topics with VALID LIST when it starts in the
middle of the master's log, sends REPLICA with its resume point, and applies every binlog
block through the L{Applier}. It reconnects with backoff (Twisted's ClientService) when
the master goes away or stays silent for twice the ALIVE interval, and when it is
stalled (L{StallWatch}): the master is ahead and nothing is applied for as long.
"""

import json

from twisted.application.internet import ClientService, backoffPolicy
from twisted.internet import defer
from twisted.internet.endpoints import clientFromString, connectProtocol, wrapClientTLS
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from mqserver import exitstatus
from mqserver.broker.topics import Topic
from mqserver.config import MASTER_ENDPOINT_PREFIXES
from mqserver.replication.applier import Applier
from mqserver.replication.epochs import EpochError, truncation_point
from mqserver.runtime.output import Output, no_delay
from mqserver.runtime.soon import call_soon
from mqserver import message as fmt
from mqserver.message import Message

from protocols.smss import binlog, wire
from protocols.smss.client_codec import (
    Expect,
    ResponseDecoder,
    encode_replica,
    encode_topic_info,
    encode_valid_list,
)
from protocols.smss.errors import SmssProtocolError
from protocols.smss.messages import AliveResponse, ErrResponse, OkResponse, ReplicaBlock
from protocols.smss.protocol import EPOCHS_INFO, REPLICATION_INFO

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


_FRAME = wire.REPLICA_FRAME_HEADER_STRUCT
_frame_head = _FRAME.unpack_from


def _frame_end(data, pos):
    """Where the REPLICA frame (status OK) at C{pos} ends, or None when the frame
    there is another (the decoder reads it) or its header is not all here."""
    if len(data) - pos < _FRAME.size:
        return None
    status, length = _frame_head(data, pos)
    return pos + _FRAME.size + length if status == wire.STATUS_OK else None


def apply_block(applier, raw):
    """Parse one binlog block and apply it. Returns the store's Deferred or None."""
    return apply_record(applier, binlog.parse_block(raw))


def apply_record(applier, rec):
    """Apply one parsed binlog block. Returns the store's Deferred or None."""
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
    if rec.cmd == binlog.CMD_EPOCH:
        (epoch,) = fmt.I64.unpack_from(rec.payload, 0)
        if epoch < applier.broker.epoch:
            raise ValueError(f"a record of term {epoch}, older than ours ({applier.broker.epoch})")
        return applier.admin(rec.event_id, fmt.OP_EPOCH, rec.topic, rec.payload, rec.write_time)
    if rec.cmd == binlog.CMD_DELAY:
        trigger, _ = _DELAY_PREFIX.unpack_from(rec.payload, 0)
        msgs = [m for _, m in binlog.messages_of(rec.payload[16:], rec.timestamp)]
        body = fmt.DELAY_PREFIX.pack(trigger) + fmt.encode_message_list(msgs)
        return applier.admin(rec.event_id, fmt.OP_DELAY, rec.topic, body, rec.write_time)
    raise ValueError(f"unknown binlog command {rec.cmd}")


class _PubRun:
    """PUB records (writes) the master made one after another into one topic in the
    same millisecond (so with the same store time), with consecutive eventIds: applied
    at once, one put per queue as for a batch publish, each write keeping its end
    (L{Writer.put}'s C{ends}) and each message its eventId, queue, times and fields, so
    the records equal the master's byte for byte. Under load a follower reads about
    twenty records a read, most of them in such runs."""

    __slots__ = ("first", "topic", "write_time", "items", "ends")

    def __init__(self, rec):
        self.first, self.topic, self.write_time = rec.event_id, rec.topic, rec.write_time
        self.items = binlog.messages_of(rec.payload, rec.timestamp)
        self.ends = bytearray(len(self.items))
        if self.items:
            self.ends[-1] = 1

    @classmethod
    def parsed(cls, first, topic, write_time, items, ends):
        """The run L{binlog.plain_run} parsed: its first eventId, topic, store time,
        C{[(queue id, Message)]} and the end mark of each message."""
        run = cls.__new__(cls)
        run.first, run.topic, run.write_time, run.items, run.ends = (
            first, topic, write_time, items, ends)
        return run

    def take(self, rec):
        """Add C{rec} (a PUB record) if it continues the run; return whether it did."""
        if (rec.event_id != self.first + len(self.items) or rec.write_time != self.write_time
                or rec.topic != self.topic):
            return False
        items = binlog.messages_of(rec.payload, rec.timestamp)
        if items:
            self.items += items
            self.ends += bytes(len(items) - 1) + b"\x01"
        return True

    def apply(self, applier):
        """Apply the run; returns the store's Deferred or None (as L{apply_record})."""
        return applier.messages(self.first, self.topic, self.items, self.write_time,
                                ends=bytes(self.ends))


class FollowerProtocol(Protocol):
    """One connection to the master."""

    log = Logger()

    def __init__(self, factory):
        self.factory = factory
        self.applier = factory.applier
        self.decoder = None
        self._idle_call = None
        self._failed = False
        # confirming what it holds (an mqserver master asked for it with an empty block)
        self._confirming = False
        # whether the master sends its commit point (known at the stream's first frame)
        self._commits_known = False
        self._to_confirm = 0
        self._confirm_call = None
        self.output = Output(self)

    def connectionMade(self):
        f = self.factory
        no_delay(self.transport)  # confirmations are small writes
        self.applier.connected = True
        f.watch.connected(self)
        # first where our log and the master's part (an mqserver master answers its
        # terms; a reference smss master, "topic not exist")
        self._phase = "epochs"
        self.decoder = ResponseDecoder(Expect.JSON)
        self.transport.write(encode_topic_info(EPOCHS_INFO))
        self._touch()

    def _epochs(self, answer):
        # The master's terms against ours: a log that goes on past the last term we
        # share holds records no master confirmed, cut before we follow.
        broker = self.applier.broker
        if answer is not None:
            try:
                after = truncation_point(broker.epochs, self.applier.applied_event_id,
                                         answer.get("epochs", []), answer.get("lastEventId", 0))
            except EpochError as e:
                self.log.error("not following {master}: {why}", master=self._peer(), why=e)
                self._fail()
                return
            if after is not None:
                self._diverged(after)
                return
        start = self.applier.resume_point(self.factory.start_event)
        self._start = start
        fresh = not broker.registry.topics and self.applier.applied_event_id == 0
        if start > 0 and fresh:
            self._phase = "topics"
            self.decoder = ResponseDecoder(Expect.JSON)
            self.transport.write(encode_valid_list(start))
        else:
            self._replica()

    def _diverged(self, after):
        log = self.applier.broker.replication_log
        log.request_truncation(after)
        self.log.error(
            "our log goes on for {n} records after eventId {eid}, where the master's term"
            " ended: no master confirmed them; they are cut at the next start. Stopping.",
            n=log.next_event_id - 1 - after, eid=after)
        self._fail()
        self.factory.diverged()

    def _peer(self):
        peer = self.transport.getPeer()
        return f"{getattr(peer, 'host', '?')}:{getattr(peer, 'port', '?')}"

    def _replica(self):
        self.log.info("following the master from eventId {start}", start=self._start)
        self._phase = "replica"
        self.decoder = ResponseDecoder(Expect.REPLICA)
        # the trace offers confirmations; a reference smss master only logs it
        self.transport.write(encode_replica(self._start, wire.CONFIRM_TRACE))

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
        if binlog.plain_run is not None and self._phase == "replica" and self._commits_known:
            self._received_plain(data)
        else:
            self._received(data)

    def _received(self, data):
        # Decode what came and handle its events; False when the stream ended.
        try:
            events = self.decoder.feed(data)
        except SmssProtocolError as e:
            self.log.error("bad replication stream: {error}", error=e)
            self.transport.abortConnection()
            return False
        self._touch()
        self._events(events)
        return not self._failed

    def _events(self, events):
        run = None  # PUB records read but not yet applied (see _PubRun)
        for ev in events:
            if self._failed:
                return
            if isinstance(ev, ReplicaBlock):
                if not ev.raw:  # an mqserver master asks for confirmations
                    if run is not None and not self._apply_run(run):
                        return
                    run = None
                    self._confirming = True
                    self._confirm_when_durable(None)
                    continue
                try:
                    rec = binlog.parse_block(ev.raw)
                    if rec.cmd == binlog.CMD_PUB and self._commits_known:
                        if run is not None and run.take(rec):
                            continue
                        if run is not None and not self._apply_run(run):
                            return
                        run = _PubRun(rec)
                        continue
                    if run is not None:
                        if not self._apply_run(run):
                            return
                        run = None
                    if self._commit_point(rec):
                        continue
                    d = apply_record(self.applier, rec)
                except Exception:
                    self.log.failure("cannot apply a replicated record")
                    self._fail()
                    return
                self._applied(d)
                continue
            if run is not None:
                if not self._apply_run(run):
                    return
                run = None
            if isinstance(ev, OkResponse) and self._phase == "epochs":
                self._epochs(json.loads(ev.body) if ev.body else {})
            elif isinstance(ev, ErrResponse) and self._phase == "epochs":
                self._epochs(None)  # a reference smss master: no terms
            elif isinstance(ev, OkResponse):
                topics = json.loads(ev.body) if ev.body else []
                self.applier.copy_topics([topic_from_json(t) for t in topics])
                self._replica()
            elif isinstance(ev, ErrResponse):
                self.log.error("master refused replication: {text}", text=ev.text)
                self._fail()
            elif isinstance(ev, AliveResponse) and self._phase == "replica":
                self._commit_point(None)
        if run is not None and not self._failed:
            self._apply_run(run)

    def _received_plain(self, data):
        # The runs of plain writes (one message without headers each: nearly every
        # write of a busy master) are parsed in C (binlog.plain_run) and applied as a
        # _PubRun of them would be; any other frame goes the Python way on its own
        # (the commit point in front of a turn's records, a batch), and what is not all
        # here waits in the decoder.
        pending = self.decoder.take_pending()
        if pending:
            data = pending + data
        run, pos, end, limit = binlog.plain_run, 0, len(data), self.decoder.max_response
        while pos < end:
            got = run(data, pos, limit)
            if got is not None:
                pos, topic, write_time, first, writes, ends = got
                items = [(0, Message(body=body, born_ts=ts)) for ts, body in writes]
                if not self._apply_run(_PubRun.parsed(first, topic, write_time, items, ends)):
                    return
                continue
            stop = _frame_end(data, pos)
            if stop is None or stop > end:
                break
            if not self._received(memoryview(data)[pos:stop]):
                return
            pos = stop
        if pos < end:
            self._received(memoryview(data)[pos:])
        else:
            self._touch()

    def _apply_run(self, run):
        """Apply the PUB records of C{run}; False when the stream failed (nothing after
        a write that failed may be applied: the slave would skip its eventIds)."""
        try:
            d = run.apply(self.applier)
        except Exception:
            self.log.failure("cannot apply a replicated record")
            self._fail()
            return False
        self._applied(d)  # a write that failed at once fails the stream here
        return not self._failed

    def _applied(self, d):
        # d: the store's Deferred (durability) of what was just applied, or None
        if self._confirming:
            self._confirm_when_durable(d)
        elif d is not None:
            d.addErrback(self._store_failed)

    def _commit_point(self, rec):
        # A master with synchronous replication sends its commit point first, before
        # any record, and again as it moves: consumers here see only what it covers. A
        # stream that starts otherwise comes from a master that holds nothing back.
        if rec is not None and rec.cmd == binlog.CMD_COMMIT:
            self._commits_known = True
            self.applier.committed(rec.event_id)
            return True
        if not self._commits_known:
            self._commits_known = True
            self.applier.committed(None)
        return False

    def _confirm_when_durable(self, d):
        # Confirm what the store holds once it is as durable as our flush level asks:
        # a record already held (d None) may still wait for the group commit.
        event_id = self.applier.applied_event_id
        if d is None:
            d = self.applier.broker.replication_log.durable_now()
        d.addCallbacks(lambda _: self._confirm(event_id), self._store_failed)

    def _confirm(self, event_id):
        # Confirmations of one turn of the reactor go out as one frame, at the end of
        # that turn and straight to the socket: the master's writers wait for it.
        if self._failed or self.transport is None or event_id <= self._to_confirm:
            return
        self._to_confirm = event_id
        if self._confirm_call is None:
            self._confirm_call = call_soon(self.factory.reactor, self._send_confirm)

    def _send_confirm(self):
        self._confirm_call = None
        if not self._failed and self.transport is not None:
            self.output.write(encode_replica(self._to_confirm))

    def _store_failed(self, f):
        self.log.failure("storing a replicated record failed", f)
        self._fail()

    def _fail(self):
        self._failed = True
        if self.transport is not None:
            self.transport.abortConnection()

    def connectionLost(self, reason):
        self._failed = True  # nothing more is applied or confirmed on this connection
        self.applier.connected = False
        self.factory.watch.disconnected(self)
        # Says why, e.g. a TLS master whose certificate the CA does not vouch for.
        self.log.info("connection to the master lost: {why}", why=reason.getErrorMessage())
        if self._idle_call is not None and self._idle_call.active():
            self._idle_call.cancel()
        self._idle_call = None
        if self._confirm_call is not None and self._confirm_call.active():
            self._confirm_call.cancel()
        self._confirm_call = None


class MasterProbe(Protocol):
    """One TOPIC INFO C{$replication} on a connection of its own: L{answer} fires with
    the master's last eventId (its C{appliedEventId}), or fails."""

    def __init__(self):
        self._decoder = ResponseDecoder(Expect.JSON, max_response=1 << 16)
        self.answer = defer.Deferred(self._cancel)

    def _cancel(self, d):
        if self.transport is not None:
            self.transport.abortConnection()

    def connectionMade(self):
        self.transport.write(encode_topic_info(REPLICATION_INFO))

    def dataReceived(self, data):
        try:
            for ev in self._decoder.feed(data):
                if isinstance(ev, ErrResponse):
                    raise SmssProtocolError(f"the master refused TOPIC INFO: {ev.text}")
                if isinstance(ev, OkResponse):
                    eid = json.loads(ev.body)["appliedEventId"]
                    if type(eid) is not int:
                        raise SmssProtocolError(f"appliedEventId {eid!r} is not a number")
                    self._done(eid)
                    return
        except (SmssProtocolError, ValueError, KeyError, TypeError) as e:
            self._done(failure=e)

    def _done(self, eid=None, failure=None):
        self.transport.loseConnection()
        if not self.answer.called:
            if failure is None:
                self.answer.callback(eid)
            else:
                self.answer.errback(failure)

    def connectionLost(self, reason):
        if not self.answer.called:
            self.answer.errback(reason)


class StallWatch:
    """Finds a stalled follower. Every half C{limit} seconds while connected it looks
    at the applied eventId; when it has not moved for C{limit} seconds (since it last
    moved or since the connection was made) it asks the master for its last eventId
    (L{MasterProbe}, at most once per C{limit}). A master ahead means the follower is
    stalled (L{Applier.check_stall} logs it once per stall): the replication
    connection is dropped, so the follower reconnects, and again after every C{limit}
    seconds without progress. The stall ends when the applied eventId moves.

    @ivar limit: seconds without progress before the master is asked.
    """

    log = Logger()

    def __init__(self, applier, reactor, endpoint, limit):
        self._applier = applier
        self._reactor = reactor
        self._endpoint = endpoint
        self.limit = limit
        self._proto = None
        self._loop = None
        self._probing = False
        self._asked_ms = None

    def _now_ms(self):
        return int(self._reactor.seconds() * 1000)

    def connected(self, proto):
        """Watch the replication connection C{proto}."""
        self.disconnected(self._proto)
        self._proto = proto
        self._applier.restart_progress(self._now_ms())
        if self._endpoint is None:
            return  # nowhere to ask the master
        self._loop = LoopingCall(self._tick)
        self._loop.clock = self._reactor
        d = self._loop.start(self.limit / 2.0, now=False)
        d.addErrback(lambda f: self.log.failure("the stall watch stopped", f))

    def disconnected(self, proto):
        """Stop watching C{proto} (its connection is gone)."""
        if proto is None or proto is not self._proto:
            return
        self._proto = None
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None

    def _tick(self):
        applier = self._applier
        applier.check_moving()
        now = self._now_ms()
        limit_ms = int(self.limit * 1000)
        if applier.since_progress_ms(now) < limit_ms or self._probing:
            return
        if self._asked_ms is not None and now - self._asked_ms < limit_ms:
            return
        self._asked_ms = now
        self._probing = True
        d = connectProtocol(self._endpoint, MasterProbe())
        d.addCallback(lambda probe: probe.answer)
        d.addTimeout(self.limit, self._reactor)
        d.addCallbacks(self._answered, self._unanswered)
        d.addBoth(self._probed)

    def _answered(self, master_event_id):
        if not self._applier.check_stall(master_event_id, self._now_ms(), int(self.limit * 1000)):
            return
        proto = self._proto
        if proto is not None and proto.transport is not None:
            proto.transport.abortConnection()

    def _unanswered(self, f):
        # The replication connection's own silence limit notices a master that is gone.
        self.log.info("could not ask the master how far it is: {why}", why=f.getErrorMessage())

    def _probed(self, _):
        self._probing = False


class FollowerFactory(Factory):
    """Builds L{FollowerProtocol}s for the one master connection.

    @ivar watch: the L{StallWatch} of the follower's connections.
    """

    noisy = False

    def __init__(self, applier, reactor, start_event=0, alive_interval=30.0, endpoint=None,
                 on_diverged=None):
        """
        @param on_diverged: called when our log must be cut before we can follow (the
            cut is done at the next start): by default the reactor stops and the
            process exits with L{exitstatus.RESTART}.
        """
        self.applier = applier
        self.reactor = reactor
        self.start_event = start_event
        self.silence_limit = max(1.0, 2 * alive_interval)
        self.watch = StallWatch(applier, reactor, endpoint, self.silence_limit)
        self._on_diverged = on_diverged

    def diverged(self):
        """Our log was found to go on past where the master's parts from it."""
        if self._on_diverged is not None:
            self._on_diverged()
            return
        exitstatus.request(exitstatus.RESTART)  # a supervisor starts us again
        self.reactor.stop()

    def buildProtocol(self, addr):
        return FollowerProtocol(self)


def master_endpoint(reactor, config, master=None):
    """Return the client endpoint of the master: C{master} as HOST:PORT over TCP, or over
    TLS when C{masterTls} is set (the certificate checked for HOST against the CA file
    C{masterCa}, else the system's trust roots); or C{master} as a Twisted client
    endpoint string (C{tls:HOST:PORT:trustRoots=DIR}, C{tcp:...}, C{unix:...})."""
    master = master or config["master"]
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


def make_follower(broker, config, reactor, master=None):
    """Return the service that follows the master at C{master} (HOST:PORT or a client
    endpoint string), by default the one named in C{config}."""
    # one applier a process: its position is the broker's, whoever is followed
    applier = broker.state_of(Applier.state_name) or Applier(broker)
    endpoint = master_endpoint(reactor, config, master)
    factory = FollowerFactory(applier, reactor, config["event"],
                              config["timeout.server.alive"] / 1000.0, endpoint)
    service = ClientService(
        endpoint, factory, retryPolicy=backoffPolicy(initialDelay=1.0, maxDelay=5.0), clock=reactor
    )
    service.setName("replication")
    return service
