"""The smss server protocol: decode requests, call the broker, answer in order.

Requests are handled as they arrive (so pipelined PUBs from one connection share a group
commit), but answers are written in request order. A SUB waits for every earlier answer,
then turns the connection into a subscription stream (see L{protocols.smss.subscription}).
"""

import json
from collections import deque

from twisted.internet import defer
from twisted.internet.protocol import Protocol
from twisted.logger import Logger

from mqserver.answers import PendingAnswer
from mqserver.broker.cursor import EventNotFound
from mqserver.errors import (
    BrokerError,
    InvalidTopicName,
    NotMaster,
    StoreError,
    TopicExists,
    TopicNotFound,
)
from mqserver.broker.topics import validate_topic_name
from mqserver.idle import IdleWatch
from mqserver.message import PutResult
from mqserver.runtime.output import Output, no_delay

from protocols.smss import codec, messages as m, wire
from protocols.smss.errors import InvalidPayload, SmssProtocolError
from protocols.smss.faults import DOOR, apply_fault
from protocols.smss.trace import out_frame, request_fields, request_names
from mqserver.replication.status import replication_status

from protocols.smss.payload import count_messages
from protocols.smss.replica import ReplicaFeed
from protocols.smss.subscription import Subscription
from protocols.smss.views import payload_to_messages, topic_json, topics_json

#: TOPIC INFO of this name answers the replication status instead of a topic.
REPLICATION_INFO = b"$replication"
#: TOPIC INFO of this name answers the master terms in the log (an mqserver follower
#: asks before it follows, to find where its log and the master's part).
EPOCHS_INFO = b"$epochs"
#: TOPIC INFO of this name (or C{$stats:TOPIC}) answers the broker's statistics.
STATS_INFO = b"$stats"
NAME_RULE = "topic name MUST be less than 128 char and NOT contains space/enter/tab"
#: The longest name in bytes: smss's own check is "> 128" whatever NAME_RULE says, and
#: its SDKs' tests create 128-byte names.
MAX_NAME = 128
#: Answers waiting to be written before the connection stops reading more requests.
MAX_PIPELINE = 256


_OK = codec.ok()
_Ack, _Sub = m.Ack, m.Sub  # tested on every request


class SmssServerProtocol(IdleWatch, Protocol):
    """One smss client connection.

    A connection that sends nothing for C{timeout.net.idle} ms outside a SUB or REPLICA
    stream is closed (smss closes one after 360 header reads time out, 30 minutes).

    @ivar subscription: the live L{Subscription}, or None in request mode.
    """

    log = Logger()
    _handlers = {}  # event type -> unbound do_* method, filled on first use

    def __init__(self, factory):
        self.factory = factory
        self.broker = factory.broker
        self.decoder = codec.RequestDecoder(max_payload=factory.max_payload)
        self.subscription = None
        self._answers = deque()  # PendingAnswers or bytes, in request order
        self._paused = False
        self._held_sub = None  # a SUB waiting for the answers before it
        self.replica_feed = None
        self.output = Output(self)
        self.tap = factory.broker.wiretap
        self.looked = None  # the request a fault rule delayed (smss.faults)
        self._last_event = None  # the last request of the read being handled
        self._framing_error = None  # the decoder's, once answered

    def connectionMade(self):
        no_delay(self.transport)
        self.watch_idle(self.factory.idle_timeout, self.factory.reactor)

    def idle_exempt(self):
        # a stream has its own keep-alive (ALIVE) and ack deadlines
        return self.subscription is not None or self.replica_feed is not None

    def idle_expired(self):
        self.log.info("closing idle smss connection {peer}: no request for {timeout} s",
                      peer=self._peer(), timeout=self.factory.idle_timeout)
        self.transport.loseConnection()

    # -- output --------------------------------------------------------------------------

    def write(self, data):
        """Send C{data}: gathered while a read is being handled (one send for all the
        answers to a pipelined read), else at once."""
        if self.tap.active:
            self.trace_out(data)
        self.output.write(data)

    def trace_out(self, data, buf=None, locs=None):
        """Report C{data}, which the door writes, to the wire trace while someone traces:
        a pushed batch of the stored records at C{locs} in C{buf}, else an answer
        (L{out_frame})."""
        if self.tap.trace.active and self.transport is not None:
            names, fields = out_frame(data, buf, locs)
            self.tap.frame(DOOR, self, "out", names, fields, len(data), data)

    def write_through(self, data):
        """Send C{data} now, after what this read gathered so far: for a stream whose
        next write depends on the transport's buffer (a subscription, the transport's
        producer, pauses when it fills)."""
        self.output.send(data)

    # -- input ---------------------------------------------------------------------------

    def dataReceived(self, data):
        self.active = True
        try:
            events = self.decoder.feed(data)
        except SmssProtocolError as e:
            self.output.received(self._framing_failed, e)
            return
        if len(events) == 1 and not self.tap.active:
            # One request in the read (a client waiting for each answer): nothing to
            # gather its answer with, so it goes out as it is made.
            self._last_event = ev = events[0]
            self._event(ev)
        elif events:
            # the answers to the requests of one read leave in one send
            self.output.received(self._events, events)

    def _set_mode(self, mode):
        """Switch the decoder to C{mode} and handle the requests it held back."""
        try:
            events = self.decoder.set_mode(mode)
        except SmssProtocolError as e:
            self._framing_failed(e)
            return
        self._events(events)

    def _events(self, events):
        if events:
            self._last_event = events[-1]
            for ev in events:
                self._event(ev)

    def _framing_failed(self, e):
        """Handle the requests decoded before the framing error C{e}, answer it and
        close; once (a failed decoder raises its error again on every later call)."""
        if e is self._framing_error:
            return  # answered and closing already
        self._framing_error = e
        self._events(e.events)
        self.log.warn("closing smss connection {peer}: {error}", peer=self._peer(), error=e)
        self._answer(codec.err(str(e)))
        self._close_after_answers()

    def _event(self, ev):
        kind = type(ev)
        if kind is _Ack:
            if self.subscription is not None:
                self.subscription.ack(ev.value)
            return
        if self.tap.active and ev is not self.looked and self._tapped(ev):
            pass  # a fault rule took it
        elif kind is _Sub and self._answers:
            # The decoder pauses after a SUB, so nothing can queue up behind it.
            self._held_sub = ev
            return
        else:
            handler = self._handlers.get(kind)
            if handler is None:
                handler = self._handlers[kind] = getattr(type(self), "do_" + kind.__name__)
            try:
                result = handler(self, ev)
            except BrokerError as e:
                result = codec.err(self._error_text(e))
            if result is not None:
                self._answer(result)
        if self.decoder.paused and self.subscription is None and self.transport is not None:
            # A refused SUB: go back to requests and decode what the client sent after it.
            self._set_mode(codec.Mode.HEADERS)

    def _tapped(self, ev):
        """Report request C{ev} to the trace; apply a fault rule to it: True when the
        rule took it (L{apply_fault})."""
        if getattr(self.transport, "disconnecting", False):
            return True  # a close rule acted on a request before it in this read
        if self.tap.trace.active:
            self.tap.frame(DOOR, self, "in", request_names(ev), request_fields(ev))
        return apply_fault(self, ev)

    # -- answers in order ----------------------------------------------------------------

    def _answer(self, result):
        if not self._answers and type(result) is bytes:
            # Nothing ahead of it: write at once (the common case).
            self.write(result)
            return
        if isinstance(result, defer.Deferred):
            slot = PendingAnswer(result)
            self._answers.append(slot)
            # Exactly one flush per answer, when it is ready (at once if it already is).
            result.addCallbacks(self._settle, self._settle_failure, (slot,), None, (slot,))
        else:
            self._answers.append(result)
        self._flush_answers()
        if len(self._answers) > MAX_PIPELINE and not self._paused:
            self._paused = True
            self.transport.pauseProducing()

    def _failure_to_err(self, f):
        if f.check(BrokerError):
            return codec.err(self._error_text(f.value))
        self.log.failure("smss request failed", f)
        return codec.err("internal error")

    def _settle_failure(self, f, slot):
        return self._settle(self._failure_to_err(f), slot)

    def _settle(self, answer, slot):
        # a write's PutResult (a publish acknowledged later) is answered OK
        slot.settle(_OK if type(answer) is PutResult else answer)
        self._flush_answers()
        return answer

    def _flush_answers(self):
        while self._answers:
            head = self._answers[0]
            if type(head) is PendingAnswer:
                if not head.ready:
                    # Its own callback (added in _answer) flushes again when it fires.
                    # Adding one here on every call piled up a callback per later
                    # answer on each pending head: quadratic work for pipelined PUBs.
                    return
                head = head.value
            self._answers.popleft()
            if head:
                self.write(head)
        if self._paused:
            self._paused = False
            self.transport.resumeProducing()
        if self._held_sub is not None and not self._answers:
            ev, self._held_sub = self._held_sub, None
            self._event(ev)

    def _close_after_answers(self):
        d = defer.gatherResults(
            [a.deferred for a in self._answers if type(a) is PendingAnswer], consumeErrors=True
        )
        d.addBoth(lambda _: self.transport.loseConnection())

    def _peer(self):
        return self.transport.getPeer() if self.transport else None

    @staticmethod
    def _error_text(e):
        if isinstance(e, TopicNotFound):
            return "topic not exist"
        if isinstance(e, TopicExists):
            return "topic exist"
        if isinstance(e, NotMaster):
            return "just master can " + str(e)
        if isinstance(e, StoreError):
            return f"store error: {e}"
        return str(e) or type(e).__name__

    # -- names ---------------------------------------------------------------------------

    @staticmethod
    def _name(raw, for_create=False):
        """Decode a topic name; raise with smss's error texts."""
        if not raw:
            raise InvalidTopicName("topic name is required")
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidTopicName(NAME_RULE if for_create else "topic not exist") from None
        if len(raw) > MAX_NAME:
            raise InvalidTopicName(NAME_RULE if for_create else "topic not exist")
        try:
            validate_topic_name(name)
        except InvalidTopicName:
            raise InvalidTopicName(NAME_RULE if for_create else "topic not exist") from None
        return name

    # -- commands ------------------------------------------------------------------------

    def _topic_name(self, raw):
        # Validated names are cached per factory: PUB is the hot path.
        names = self.factory.names
        name = names.get(raw)
        if name is None:
            name = self._name(raw)
            if len(names) < 10_000:
                names[raw] = name
        return name

    def do_Pub(self, ev):
        broker = self.broker
        if not broker.is_master:
            raise NotMaster("pub message", broker.master_address)
        msgs = ev.messages  # the decoder read them already (one record without headers)
        if msgs is None:
            try:
                msgs = payload_to_messages(ev.payload)
            except InvalidPayload:
                return codec.err("invalid pub payload")
        topic = ev.topic
        name = self.factory.names.get(topic)  # the names cache, looked up inline
        if name is None:
            name = self._topic_name(topic)
        # The last request of a read with no answer ahead of it (the usual PUB): OK
        # goes out as soon as the message is written (_send_ok), before the store's
        # bookkeeping, so the round trip waits for less. None: answered.
        stored = broker.publish_now(
            name, msgs, None,
            self._send_ok if ev is self._last_event and not self._answers else None)
        if stored is None:
            return None
        # type() first: isinstance of Deferred (an ABC's subclass) runs abc's check
        if type(stored) is PutResult:
            return _OK  # stored already (flush levels 0 and 1)
        return stored  # its PutResult answers OK (_settle)

    def _send_ok(self, result):
        """Answer a publish the broker has written with OK, before the broker's
        bookkeeping: at once when the PUB is alone in its read (the usual case), else
        with the answers of the read."""
        self.write(_OK)

    def do_Delay(self, ev):
        if not self.broker.is_master:
            raise NotMaster("pub message", self.broker.master_address)
        if len(ev.payload) <= 8:
            return codec.err("invalid delay request")
        if ev.delay_ms < 1000:
            return codec.err("delay time must be more than 1 second")
        try:
            count_messages(ev.payload)
            msgs = payload_to_messages(ev.payload, self.broker.now_ms())
        except InvalidPayload:
            return codec.err("invalid delay request")
        d = self.broker.delay(self._name(ev.topic), ev.delay_ms, msgs)
        return d.addCallback(lambda _: codec.ok())

    def do_Create(self, ev):
        name = self._name(ev.topic, for_create=True)
        if not self.broker.is_master:
            raise NotMaster("manage topic", self.broker.master_address)
        now = self.broker.now_ms()
        if ev.expire_at < 0 or (ev.expire_at > 0 and ev.expire_at - now < 10_000):
            return codec.err("expire MUST more than 10s")
        d = self.broker.create_topic(name, expire_at=ev.expire_at)
        return d.addCallback(lambda _: codec.ok())

    def do_Delete(self, ev):
        if not ev.topic:
            return codec.err("topic name is required")
        if not self.broker.is_master:
            raise NotMaster("manage topic", self.broker.master_address)
        d = self.broker.delete_topic(self._name(ev.topic))
        return d.addCallback(lambda _: codec.ok())

    def do_Alive(self, ev):
        return codec.alive()

    def do_TopicInfo(self, ev):
        if ev.topic == REPLICATION_INFO:
            return codec.ok_json(json.dumps(self._replication_status()).encode())
        if ev.topic == EPOCHS_INFO:
            return codec.ok_json(json.dumps({
                "epochs": self.broker.epochs,
                "lastEventId": self.broker.replication_log.next_event_id - 1,
                "master": self.broker.is_master}).encode())
        if ev.topic == STATS_INFO or ev.topic.startswith(STATS_INFO + b":"):
            return self._stats_info(ev.topic[len(STATS_INFO) + 1:])
        name = self._name(ev.topic)
        t = self.broker.registry.get(name)
        if t is None:
            raise TopicNotFound(name)
        return codec.ok_json(topic_json(t, self.factory.folder_count))

    def _stats_info(self, rest):
        # "$stats": the broker's statistics; "$stats:T": those of topic T
        topic = None
        if rest:
            topic = self._name(rest)
            if self.broker.registry.get(topic) is None:
                raise TopicNotFound(topic)
        return codec.ok_json(json.dumps(self.broker.stats.snapshot(topic)).encode())

    def _replication_status(self):
        return replication_status(self.broker, slaves=self.factory.replica_feeds)

    def do_List(self, ev):
        return codec.ok_json(topics_json(self.broker.topics(), self.factory.folder_count))

    def do_ValidList(self, ev):
        e = ev.event_id
        topics = [
            t for t in self.broker.topics()
            if t.state == 0 and (e == 0 or t.create_event_id <= e)
        ]
        return codec.ok_json(topics_json(topics, self.factory.folder_count))

    def do_Sub(self, ev):
        if self.decoder.failed or self.replica_feed is not None or self.subscription is not None:
            return None  # the stream went bad after this SUB, or the connection is a stream
        try:
            name = self._name(ev.topic)
            if self.broker.topic(name) is None:
                raise TopicNotFound(name)
            cursor = self.broker.open_cursor(name, ev.event_id)
        except EventNotFound as e:
            return codec.err(str(e))
        except BrokerError as e:
            return codec.err(self._error_text(e))
        sub = Subscription(self, name, cursor, ev.batch, ev.ack_timeout_ns, ev.who)
        if not self.broker.claim(name, ev.who, sub):
            self.broker.close_cursor(cursor)
            return codec.err(ev.who.decode("utf-8", "replace") + " regiester exist")
        self.subscription = sub
        sub.start()
        self._set_mode(codec.Mode.ACKS)
        return None

    def subscription_ended(self, back_to_requests):
        """Called by the subscription when it ends; C{back_to_requests} is False when the
        connection is closing."""
        self.subscription = None
        if back_to_requests and self.decoder.ack_mode:
            self._set_mode(codec.Mode.HEADERS)
        self._flush_answers()

    def do_Replica(self, ev):
        if self.decoder.failed or self.replica_feed is not None or self.subscription is not None:
            return None  # the stream went bad after this REPLICA, or the connection is a stream
        if not self.broker.is_master:
            return codec.err("don't support action")
        if ev.event_id < 0:
            return codec.err("invalid replica eventId")
        try:
            reader = self.broker.replication_log.reader_after(ev.event_id)
        except EventNotFound as e:
            return codec.err(str(e))
        confirms = ev.trace == wire.CONFIRM_TRACE
        self.replica_feed = ReplicaFeed(self, reader, ev.event_id, confirms,
                                        self.factory.shared_frames)
        self.factory.replica_feeds += 1
        self.log.info("slave {peer} follows from eventId {eid}{how}", peer=self._peer(),
                      eid=ev.event_id, how=", confirming what it holds" if confirms else "")
        self.replica_feed.start()
        # a reference smss slave's bytes are dropped unread (it never sends any that
        # mean something); an mqserver follower's are its confirmations
        self._set_mode(codec.Mode.CONFIRMS if confirms else codec.Mode.SINK)
        return None

    def do_Confirm(self, ev):
        if self.replica_feed is not None:
            self.replica_feed.confirmed(ev.event_id)
        return None

    def do_Unsupported(self, ev):
        return codec.err("don't support action")

    def do_TooLarge(self, ev):
        return codec.err(f"payload too large: {ev.size} > {ev.limit}")

    def do_PayloadTooSmall(self, ev):
        return codec.err("invalid request, payload size must be more than 8")

    # -- end -----------------------------------------------------------------------------

    def connectionLost(self, reason):
        self.stop_idle_watch()
        if self.replica_feed is not None:
            self.replica_feed.stop()
            self.replica_feed = None
            self.factory.replica_feeds -= 1
        if self.subscription is not None:
            self.subscription.stop()
            self.subscription = None
        for a in self._answers:
            if type(a) is PendingAnswer:
                a.deferred.addErrback(lambda f: None)
        self._answers.clear()
        self._held_sub = None
