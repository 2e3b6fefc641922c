"""The nsqd TCP protocol (V2): commands in, OK/error/message frames out.

Replies go out in command order (a PUB answers when the store has the message, so
pipelined PUBs share a group commit). A subscribed connection is a consumer of a broker
L{Channel}: the channel hands it messages while RDY allows, and its frames are buffered
as nsqd does (flushed when the buffer fills, when the connection stops being ready,
or after output_buffer_timeout). Fatal errors are sent, then the socket closes.
"""

import re
import struct
from binascii import unhexlify
from collections import deque

from twisted.internet import defer
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from mqserver.answers import PendingAnswer
from mqserver.errors import BrokerError
from mqserver.interfaces import IChannelConsumer
from mqserver.sendnow import Cork
from mqserver.store.store import Message

from protocols.nsq import errors as E
from protocols.nsq.codec import CLOSE_WAIT, HEARTBEAT, OK, CommandDecoder, error, response
from protocols.nsq.compress import (CompressionError, DeflateCompressor, DeflateDecompressor,
                                    SnappyCompressor, SnappyDecompressor)
from protocols.nsq.errors import NsqError
from protocols.nsq.frames import delivery_frames
from protocols.nsq.gate import SecurityGate
from protocols.nsq.identify import ClientSettings, negotiate
from protocols.nsq.messages import (Auth, Cls, Dpub, Fin, Identify, Invalid, Mpub, Nop, Pub,
                                    Rdy, Req, Sub, Touch)

INIT, SUBSCRIBED, CLOSING = 0, 3, 4
#: Verbs allowed per state (anything else is the fatal "cannot <VERB> in current state").
_ALLOWED = {
    INIT: {"IDENTIFY", "AUTH", "SUB", "PUB", "MPUB", "DPUB", "NOP"},
    SUBSCRIBED: {"RDY", "FIN", "REQ", "TOUCH", "CLS", "PUB", "MPUB", "DPUB", "NOP"},
    CLOSING: {"RDY", "FIN", "REQ", "TOUCH", "PUB", "MPUB", "DPUB", "NOP"},
}
#: Replies waiting before the connection stops reading (bounds a pipelining producer).
MAX_PIPELINE = 512


def message_id(event_id):
    """The 16-byte NSQ message id of a stored record: its eventId in 16 hex digits."""
    return b"%016x" % event_id


#: A run of FIN lines with ids in our own spelling (16 lowercase hex digits).
_FIN_RUN = re.compile(rb"(?:FIN [0-9a-f]{16}\n)+")
_FIN_LINE = 21


def parse_message_id(msg_id):
    """The eventId of a 16-byte id, or None when it is not one of ours."""
    try:
        eid = int(msg_id, 16)
    except ValueError:
        return None
    # int() also takes "0x", "_" and spaces: only our exact spelling is an id
    return eid if b"%016x" % eid == msg_id else None


@implementer(IPushProducer, IChannelConsumer)
class NsqdProtocol(SecurityGate, Protocol):
    """One V2 client connection (producer, consumer or both).

    Consumer attributes read by the channel: C{rdy}, C{in_flight}, C{msg_timeout},
    C{sample_rate}, C{can_receive}.
    """

    log = Logger()
    _ALLOWED = _ALLOWED

    def __init__(self, factory):
        node = factory.node
        self.node = node
        self.broker = node.broker
        self.reactor = node.reactor
        self.decoder = CommandDecoder(node.max_msg_size, node.max_body_size,
                                      max_rdy_count=node.server.max_rdy_count,
                                      max_req_timeout_ms=node.max_req_timeout_ms)
        self.state = INIT
        self.settings = ClientSettings.defaults(node.server)
        self.identified = False
        self.rdy = 0
        self.in_flight = 0
        self.msg_timeout = self.settings.msg_timeout_ms / 1000.0
        self.sample_rate = 0
        self.can_receive = False
        self.channel = None
        self.topic = None
        self.channel_name = None
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts = {}
        self.connect_ts = int(self.reactor.seconds())
        self.snappy = self.deflate = False
        self._answers = deque()
        self._out = []
        self._out_size = 0
        self._flush_call = None
        self._hb_call = None
        self._last_recv = self.reactor.seconds()
        self._compressor = None
        self._decompressor = None
        self._inflate_call = None  # a later turn picks up inflated input left over
        self._write_paused = False
        self._read_paused = False
        self._dead = False
        self._dead_input = False
        self._cork = Cork()  # one send for everything a read produces

    # -- connection ----------------------------------------------------------------------

    def connectionMade(self):
        self.node.clients.add(self)
        peer = self.transport.getPeer()
        self.remote_address = f"{getattr(peer, 'host', '')}:{getattr(peer, 'port', '')}"
        try:
            self.transport.setTcpNoDelay(True)
        except Exception:
            pass
        self.transport.registerProducer(self, True)
        self._arm_heartbeat()
        self._install_gate()

    def connectionLost(self, reason):
        self._dead = True
        self.node.clients.discard(self)
        for call in (self._hb_call, self._flush_call, self._inflate_call):
            if call is not None and call.active():
                call.cancel()
        self._hb_call = self._flush_call = self._inflate_call = None
        self._decompressor = None  # whatever it still holds is garbage now
        self.can_receive = False
        if self.channel is not None:
            self.channel.remove_consumer(self)
        self._answers.clear()

    # IPushProducer: the transport tells us when its write buffer is full

    def pauseProducing(self):
        self._write_paused = True
        self._update_ready()

    def resumeProducing(self):
        self._write_paused = False
        self._update_ready()

    def stopProducing(self):
        self._write_paused = True
        self.can_receive = False

    def _update_ready(self):
        ready = self.state == SUBSCRIBED and not self._write_paused and not self._dead
        was = self.can_receive
        self.can_receive = ready
        if ready and not was and self.channel is not None:
            self.channel.schedule_pump()

    # -- heartbeats ----------------------------------------------------------------------

    def _arm_heartbeat(self):
        if self._hb_call is not None and self._hb_call.active():
            self._hb_call.cancel()
        self._hb_call = None
        interval = self.settings.heartbeat_interval_ms
        if interval > 0 and not self._dead:
            self._hb_call = self.reactor.callLater(interval / 1000.0, self._heartbeat)

    def _heartbeat(self):
        self._hb_call = None
        interval = self.settings.heartbeat_interval_ms / 1000.0
        if self.reactor.seconds() - self._last_recv >= 2 * interval - 0.001:
            # nsqd's read deadline: nothing at all from the client for 2 intervals
            self.transport.loseConnection()
            return
        self._flush()
        self._write(HEARTBEAT)
        self._arm_heartbeat()

    # -- output --------------------------------------------------------------------------

    def _write(self, data):
        if self._compressor is not None:
            data = self._compressor.compress(data)
        self._cork.write(self.transport, data)

    def _flush(self):
        if self._flush_call is not None:
            if self._flush_call.active():
                self._flush_call.cancel()
            self._flush_call = None
        if self._out:
            data = b"".join(self._out)
            self._out = []
            self._out_size = 0
            if not self._dead:
                self._write(data)

    def deliver(self, items):
        """Channel callback: frame C{items} into the output buffer."""
        frames = delivery_frames(items)
        self._out.append(frames)
        self._out_size = size = self._out_size + len(frames)
        self.message_count += len(items)
        s = self.settings
        if self.in_flight >= self.rdy or size >= s.output_buffer_size:
            self._flush()
        elif self._flush_call is None and s.output_buffer_timeout_ms > 0:
            self._flush_call = self.reactor.callLater(s.output_buffer_timeout_ms / 1000.0,
                                                      self._flush)

    def channel_closed(self):
        """Channel callback: the channel was deleted; nsqd closes its consumers."""
        self.channel = None
        self.can_receive = False
        self._flush()
        self.transport.loseConnection()

    # -- replies in order ----------------------------------------------------------------

    def _answer(self, item, verb="PUB"):
        """Queue a reply: bytes, a Deferred firing with bytes (a failure is answered as
        C{verb}'s error), or a callable run in turn."""
        answers = self._answers
        if isinstance(item, defer.Deferred):
            slot = PendingAnswer(item)
            answers.append(slot)
            item.addBoth(self._settle, slot, verb)  # at once if it has fired
        elif not answers:
            self._emit(item)
            return
        else:
            answers.append(item)
        if len(answers) > MAX_PIPELINE and not self._read_paused:
            self._read_paused = True
            self.transport.pauseProducing()

    def _emit(self, item):
        if callable(item):
            item()
        elif item:
            self._flush()
            self._write(item)

    def _settle(self, value, slot, verb):
        # A Deferred's answer is ready (a failure becomes verb's error, so nothing is
        # left unhandled): write what the head of the queue now allows.
        if isinstance(value, Failure):
            value = self._fatal_later(self._publish_error(verb, value))
        slot.settle(value)
        self._drain()

    def _drain(self):
        answers = self._answers
        while answers:
            head = answers[0]
            if type(head) is PendingAnswer:
                if not head.ready:
                    return
                head = head.value
            answers.popleft()
            if not self._dead:
                self._emit(head)
        if self._read_paused and not self._dead:
            self._read_paused = False
            if not self._inflating():
                self.transport.resumeProducing()
            elif self._inflate_call is None:
                self._inflate_call = self.reactor.callLater(0, self._inflate_more)

    def _publish_error(self, verb, failure):
        reason = failure.getErrorMessage() if failure.check(BrokerError) else "internal error"
        if not failure.check(BrokerError):
            self.log.failure("NSQ {verb} failed", failure, verb=verb)
        make = {"PUB": E.pub_failed, "MPUB": E.mpub_failed, "DPUB": E.dpub_failed,
                "SUB": E.sub_failed}[verb]
        return make(reason)

    def _fatal_later(self, err):
        def send():
            self._send_error(err)
        return send

    def _send_error(self, err):
        if err.send_frame:
            self._flush()
            self._write(error(err))
        if err.fatal:
            self._dead = True
            self.can_receive = False
            self.transport.loseConnection()

    def _fail(self, err):
        """Answer an NsqError in order; a fatal one stops reading and closes."""
        if err.fatal:
            self._dead_input = True
        self._answer(self._fatal_later(err))

    # -- input ---------------------------------------------------------------------------

    def dataReceived(self, data):
        if self._decompressor is None and not (self._dead_input or self._dead):
            cmd = self.decoder.whole_pub(data)
            if cmd is not None:
                # One PUB in one read: what a publisher sending a message at a time
                # sends, handled without the decoder's state machine or the cork.
                self._last_recv = self.reactor.seconds()
                self._run(cmd)
                return
        self._cork.received(self.transport, self._received, data)

    def _received(self, data):
        self._last_recv = self.reactor.seconds()
        if self._dead_input or self._dead:
            return
        inflater = self._decompressor
        if inflater is not None:
            try:
                data = inflater.decompress(data)
            except CompressionError as e:
                self.log.info("bad compressed stream from {peer}: {e}", peer=self.remote_address, e=e)
                self._decompressor = None
                self.transport.loseConnection()
                return
            if inflater.pending and self._inflate_call is None:
                # More is inflated than one piece: stop reading and take the next piece
                # on a later turn, so what the decoder holds stays within its limits.
                self.transport.pauseProducing()
                self._inflate_call = self.reactor.callLater(0, self._inflate_more)
        if self.channel is not None and data.startswith(b"FIN ") and self.decoder.at_line_start:
            pos = self._fast_fins(data)
            if pos == len(data):
                return
            data = data[pos:]
        for cmd in self.decoder.feed(data):
            if type(cmd) is Fin and self.channel is not None:
                # hot path: a FIN that succeeds needs no state check and no reply
                eid = parse_message_id(cmd.msg_id)
                if eid is not None and self.channel.finish(eid, self) is None:
                    self.finish_count += 1
                    continue
            if self._dead_input:
                return
            self._run(cmd)

    def _inflating(self):
        """True while input already read still inflates to more commands."""
        return self._decompressor is not None and self._decompressor.pending

    def _inflate_more(self):
        self._inflate_call = None
        if self._dead or self._dead_input:
            return
        if self._read_paused:
            return  # too many replies pending: _drain resumes reading, then we go on
        self._cork.received(self.transport, self._received, b"")
        if self._inflate_call is None and not self._read_paused and not self._dead:
            self.transport.resumeProducing()

    def _run(self, cmd):
        """Check C{cmd} is allowed in this state and run its handler; an NsqError is
        answered in order."""
        kind = type(cmd)
        try:
            if kind is not Invalid and cmd.verb not in _ALLOWED[self.state]:
                raise E.cannot_in_state(cmd.verb)
            self._handlers[kind](self, cmd)
        except NsqError as err:
            self._fail(err)

    def _fast_fins(self, data):
        """Consume leading ``FIN <id>\\n`` lines that succeed; return where they stop
        (the decoder handles the rest, including any FIN that fails).

        A reader acknowledges in runs of FINs: the run is found by one regular-expression
        match, its ids decoded in one C call and finished in one channel call."""
        m = _FIN_RUN.match(data)
        if m is None:
            return 0
        count = m.end() // _FIN_LINE
        ids = data[:m.end()].replace(b"FIN ", b"").replace(b"\n", b"")
        eids = struct.unpack(">%dQ" % count, unhexlify(ids))
        n = self.channel.finish_many(eids, self)
        self.finish_count += n
        return n * _FIN_LINE

    def do_invalid(self, cmd):
        verb = cmd.verb
        known = any(verb in v for v in _ALLOWED.values()) or verb in ("IDENTIFY", "AUTH", "SUB")
        if known and verb not in _ALLOWED[self.state]:
            raise E.cannot_in_state(verb)
        if verb == "RDY" and self.state == CLOSING:
            return  # nsqd ignores RDY after CLS, even a malformed one
        raise cmd.error

    def do_nop(self, cmd):
        pass

    def do_identify(self, cmd):
        result = negotiate(cmd.body, self.identify_server(), self.settings)
        self.settings = s = result.client
        self.identified = True
        self.msg_timeout = s.msg_timeout_ms / 1000.0
        self.sample_rate = s.sample_rate
        self._arm_heartbeat()
        reply = response(result.reply())
        if not (result.tls_v1 or result.snappy or result.deflate):
            self._answer(reply)
            return

        def upgrade():
            self._flush()
            self._write(reply)
            if result.tls_v1:  # the reply in the clear, then OK through TLS
                self._start_tls()
                self._write(OK)
                if not (result.snappy or result.deflate):
                    return
            if result.snappy:
                self.snappy = True
                self._compressor, self._decompressor = SnappyCompressor(), SnappyDecompressor()
            else:
                self.deflate = True
                self._compressor = DeflateCompressor(result.deflate_level)
                self._decompressor = DeflateDecompressor()
            self._write(OK)
            leftover = bytes(self.decoder._buf) if self.decoder._buf else b""
            if leftover:  # bytes sent after IDENTIFY were already compressed
                self.decoder._buf.clear()
                self.reactor.callLater(0, self.dataReceived, leftover)

        self._answer(upgrade)

    def do_sub(self, cmd):
        if self.settings.heartbeat_interval_ms <= 0:
            raise E.sub_heartbeats_disabled()
        self.state = SUBSCRIBED
        self.topic, self.channel_name = cmd.topic, cmd.channel
        d = self.node.ensure_topic(cmd.topic)

        def attach(_):
            if self._dead:
                return OK
            ch = self.broker.channels.create_channel(cmd.topic, cmd.channel)
            self.channel = ch
            self._update_ready()
            ch.add_consumer(self)
            return OK

        d.addCallback(attach)
        self._answer(d, "SUB")

    def do_rdy(self, cmd):
        if self.state == CLOSING:
            return
        self.rdy = cmd.count
        if self.channel is not None and self.rdy > self.in_flight:
            self.channel.schedule_pump()
        elif self.in_flight >= self.rdy:
            self._flush()

    def _consumer_call(self, verb, cmd, fn, *args):
        ch = self.channel
        eid = parse_message_id(cmd.msg_id)
        why = "ID not in flight" if ch is None or eid is None else fn(ch, eid, self, *args)
        if why is not None:
            make = {"FIN": E.fin_failed, "REQ": E.req_failed, "TOUCH": E.touch_failed}[verb]
            self._fail(make(cmd.msg_id, why))
            return False
        return True

    def do_fin(self, cmd):
        if self._consumer_call("FIN", cmd, _finish):
            self.finish_count += 1

    def do_req(self, cmd):
        if self._consumer_call("REQ", cmd, _requeue, cmd.timeout_ms):
            self.requeue_count += 1

    def do_touch(self, cmd):
        self._consumer_call("TOUCH", cmd, _touch, self.node.server.max_msg_timeout_ms / 1000.0)

    def do_cls(self, cmd):
        self.state = CLOSING
        self.rdy = 0
        self._update_ready()
        self._answer(CLOSE_WAIT)

    def _publish(self, verb, topic, messages, defer_ms=0):
        broker = self.broker
        if defer_ms or broker.topic(topic) is None:
            stored = self._publish_later(topic, messages, defer_ms)
        else:
            try:
                stored = broker.publish_now(topic, messages)
            except Exception as e:  # answered in its turn, as a failed write's would be
                stored = defer.fail(e)
        self.pub_counts[topic] = self.pub_counts.get(topic, 0) + len(messages)
        if not isinstance(stored, defer.Deferred):
            # Stored already (flush levels 0 and 1): OK at once, without a Deferred,
            # or in turn behind the answers ahead of it.
            if self._answers:
                self._answer(OK)
            else:
                self._emit(OK)
            return
        stored.addCallback(_ok)
        self._answer(stored, verb)

    def _publish_later(self, topic, messages, defer_ms):
        # A DPUB, or a publish that creates its topic first: a Deferred.
        broker = self.broker
        if broker.topic(topic) is not None:
            return broker.delay(topic, defer_ms, messages)
        d = self.node.ensure_topic(topic)
        d.addCallback(lambda _: broker.publish(topic, messages) if not defer_ms
                      else broker.delay(topic, defer_ms, messages))
        return d

    # A body alone (bytes) is a message the store stamps with the time of its write.
    def do_pub(self, cmd):
        self._publish("PUB", cmd.topic, [bytes(cmd.body)])

    def do_mpub(self, cmd):
        self._publish("MPUB", cmd.topic, [bytes(b) for b in cmd.bodies])

    def do_dpub(self, cmd):
        self._publish("DPUB", cmd.topic, [Message(cmd.body, born_ts=self.broker.now_ms())],
                      cmd.defer_ms)

    _handlers = {
        Invalid: do_invalid, Nop: do_nop, Identify: do_identify, Auth: SecurityGate.do_auth, Sub: do_sub,
        Rdy: do_rdy, Fin: do_fin, Req: do_req, Touch: do_touch, Cls: do_cls, Pub: do_pub,
        Mpub: do_mpub, Dpub: do_dpub,
    }


def _ok(_):
    return OK


def _finish(ch, eid, owner):
    return ch.finish(eid, owner)


def _requeue(ch, eid, owner, delay_ms):
    return ch.requeue(eid, owner, delay_ms)


def _touch(ch, eid, owner, max_timeout):
    return ch.touch(eid, owner, max_timeout)


class NsqdFactory(Factory):
    """Builds L{NsqdProtocol}s for one broker's L{NsqNode}."""

    noisy = False

    def __init__(self, node):
        self.node = node

    def buildProtocol(self, addr):
        return NsqdProtocol(self)

    def listening(self, port):
        """The listener is bound (called by the broker's service tree)."""
        self.node.tcp_port = port.getHost().port
        self.node.tcp_started()
