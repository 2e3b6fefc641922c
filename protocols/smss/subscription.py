"""An smss subscription stream: batches, acks, ALIVE when idle, SUBEND.

One batch is in flight at a time: the next is read only after the client acks. Acks
can arrive before the client has read a batch (2-byte acks pipelined in one read, or sent
by a client that never reads), so the subscription is also the connection's push
producer: while the transport's buffer is full it sends nothing, and the batch an ack
asked for goes out when the buffer drains. A subscriber so costs at most one batch
beyond the transport's buffer, whatever it sends. An idle stream gets ALIVE every
``timeout.server.alive`` ms; a missing ack closes the connection after the ack timeout.
"""

from operator import itemgetter

from twisted.internet.interfaces import IPushProducer
from twisted.logger import Logger
from zope.interface import implementer

from mqserver.broker.stats import SMSS, Consumer
from mqserver.interfaces import IWatcher
from mqserver.runtime.soon import call_soon

from protocols.smss import codec
from protocols.smss.keepalive import IdleAlive
from protocols.smss.views import encode_records

DEFAULT_ACK_TIMEOUT = 3.0
_size_of = itemgetter(1)


@implementer(IWatcher, IPushProducer)
class Subscription:
    """The live SUB of one connection.

    @ivar awaiting_ack: True while a batch waits for its 2-byte ack.
    @ivar paused: True while the transport's buffer is full (no batch is sent).
    """

    log = Logger()

    def __init__(self, proto, topic, cursor, batch, ack_timeout_ns, who):
        self._proto = proto
        self._tap = proto.tap
        self._broker = proto.broker
        self._reactor = proto.factory.reactor
        self.topic = topic
        self.cursor = cursor
        self.batch = max(1, min(batch, 255))
        self.ack_timeout = ack_timeout_ns / 1e9 if ack_timeout_ns else DEFAULT_ACK_TIMEOUT
        self.who = who
        self.awaiting_ack = False
        self.paused = False
        self._registered = False  # the transport's producer
        self._ack_call = None
        self._ack_deadline = 0.0
        self._alive = IdleAlive(self._reactor, proto.factory.alive_interval, self._send_alive)
        self._send_call = None
        self._active = False
        # the who as a core consumer: counted here, rewound by an operator
        self.stats = Consumer(SMSS, who.decode("utf-8", "replace"), topic,
                              positions=lambda: self.cursor.positions, on_rewind=self.rewind)

    def start(self):
        """Begin streaming: send what is there, then wait for arrivals."""
        self._active = True
        self._proto.transport.registerProducer(self, True)
        self._registered = True
        self._broker.stats.add_consumer(self.stats)
        self._broker.watch(self.topic, self)
        self._alive.start()
        self._send()

    def _write(self, data, buf=None, locs=None):
        # Through to the transport (not gathered until the read ends), so that a full
        # buffer pauses this producer before the next ack of the same read is handled.
        if self._tap.active:
            self._proto.trace_out(data, buf, locs)
        self._proto.write_through(data)
        self._alive.wrote()

    def _send(self):
        self._send_call = None
        if not self._active or self.awaiting_ack or self.paused:
            return
        buf, locs = self.cursor.read_span(self.batch)
        if not locs:
            return
        body = encode_records(buf, locs)
        self._write(codec.batch_header(len(locs), len(body)) + body, buf, locs)
        self.stats.delivered(len(locs), sum(map(_size_of, locs)))
        self.stats.in_flight = len(locs)
        self.awaiting_ack = True
        self._arm_deadline()

    def _arm_deadline(self):
        # One timer serves every batch: a new deadline is a float store, not a
        # callLater and a cancel per batch (the timer re-arms itself when it finds the
        # deadline moved on).
        self._ack_deadline = self._reactor.seconds() + self.ack_timeout
        if self._ack_call is None:
            self._ack_call = self._reactor.callLater(self.ack_timeout, self._ack_check)

    def _send_alive(self):
        if not self._active or self.awaiting_ack or self.paused:
            return False
        self._write(codec.alive())
        return True

    def ack(self, value):
        """Handle a 2-byte ack from the client."""
        if not self.awaiting_ack:
            # An extra ack is a client bug; ignore it rather than stall (the smss server stalls).
            return
        self.awaiting_ack = False
        self.stats.in_flight = 0
        if value == 0:
            self._send()
            if self.paused:
                # The batch asked for waits until the client reads what it was sent: it
                # gets as long as an ack would (smss's writes time out after 5 s).
                self._arm_deadline()
        elif value == 1:
            self._end(back_to_requests=True)
        else:
            self.log.warn("invalid ack {value} from {peer}", value=value, peer=self._proto._peer())
            self._end(back_to_requests=False)
            self._proto.transport.loseConnection()

    def _ack_check(self):
        self._ack_call = None
        if not self._active or not (self.awaiting_ack or self.paused):
            return  # acked (and read) in time; the next batch arms the timer again
        left = self._ack_deadline - self._reactor.seconds()
        if left > 0:
            self._ack_call = self._reactor.callLater(left, self._ack_check)
            return
        if self.awaiting_ack:
            self.log.info("ack timeout for {who} on {topic}", who=self.who, topic=self.topic)
        else:
            self.log.info("closing the subscription of {who} on {topic}: it acks without reading",
                          who=self.who, topic=self.topic)
        self._end(back_to_requests=False)
        self._proto.transport.loseConnection()

    def rewind(self, positions):
        """Go on from C{positions} (queue id -> offset): a batch waiting for its ack is
        not sent again, the next batch starts there."""
        self.cursor.positions = dict(positions)
        self.data_available(self.topic, None)

    # IPushProducer: the transport's buffer

    def pauseProducing(self):
        self.paused = True

    def resumeProducing(self):
        self.paused = False
        if self._send_call is None:  # else the arrivals' call sends it
            self._send()

    def stopProducing(self):
        # the connection is going (the transport dropped its producer); the protocol's
        # connectionLost stops the stream
        self.paused = True
        self._registered = False

    # IWatcher

    def data_available(self, topic, queue_id):
        # Coalesce many arrivals in one reactor turn into one read.
        if self._active and not self.awaiting_ack and self._send_call is None:
            self._send_call = call_soon(self._reactor, self._send)

    def topic_deleted(self, topic):
        if self._active:
            self._write(codec.subend())
            self._end(back_to_requests=True)

    def _end(self, back_to_requests):
        if not self._active:
            return
        self.stop()
        self._proto.subscription_ended(back_to_requests)

    def stop(self):
        """Stop streaming and give back the claim, the cursor and the timers."""
        self._active = False
        if self._registered:
            self._registered = False
            self._proto.transport.unregisterProducer()
        self._alive.stop()
        for call in (self._ack_call, self._send_call):
            if call is not None and call.active():
                call.cancel()
        self._ack_call = self._send_call = None
        self._broker.unwatch(self.topic, self)
        self._broker.release(self.topic, self.who, self)
        self._broker.close_cursor(self.cursor)
        self._broker.stats.remove_consumer(self.stats)
