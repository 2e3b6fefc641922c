"""The nsqd TCP protocol (V2): commands in, OK/error/message frames out.

L{NsqdProtocol} is one client connection, put together from a part per responsibility:

  - this module: the connection's life (made, lost), reading (the cork, inflating a
    compressed stream, the FIN fast path), command dispatch by state (L{_run} and the
    C{_handlers} table) and IDENTIFY, which upgrades the stream (TLS, compression);
  - L{protocols.nsq.replies.Replies}: writing, the delivery frame buffer, replies in
    command order and errors;
  - L{protocols.nsq.subscriber.Subscriber}: SUB, RDY, FIN, REQ, TOUCH, CLS and
    deliveries (the connection as a channel's consumer);
  - L{protocols.nsq.publisher.Publisher}: PUB, MPUB, DPUB;
  - L{protocols.nsq.heartbeats.Heartbeats}: heartbeats and the read deadline;
  - L{protocols.nsq.gate.SecurityGate}: the TLS policy and AUTH.

The states and the verbs each allows are in L{protocols.nsq.states}.
"""

from collections import deque

from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from zope.interface import implementer

from mqserver.interfaces import IChannelConsumer
from mqserver.runtime.output import Output, no_delay

from protocols.nsq import errors as E
from protocols.nsq.codec import OK, CommandDecoder, response
from protocols.nsq.compress import (CompressionError, DeflateCompressor, DeflateDecompressor,
                                    SnappyCompressor, SnappyDecompressor)
from protocols.nsq.errors import NsqError
from protocols.nsq.faults import DOOR, apply_fault, check_fault
from protocols.nsq.gate import SecurityGate
from protocols.nsq.heartbeats import Heartbeats
from protocols.nsq.identify import ClientSettings, negotiate
from protocols.nsq.messages import (Auth, Cls, Dpub, Fin, Identify, Invalid, Mpub, Nop, Pub,
                                    Rdy, Req, Sub, Touch)
from protocols.nsq.publisher import Publisher
from protocols.nsq.trace import command_fields
from protocols.nsq.replies import Replies
from protocols.nsq.states import ALLOWED, CLOSING, INIT
from protocols.nsq.subscriber import Subscriber, parse_message_id



def _by_state(handlers):
    """Return state -> the C{handlers} (command type -> handler) of the commands the
    state allows; an invalid command is handled in every state (do_invalid says what is
    wrong with it)."""
    return {state: {kind: handler for kind, handler in handlers.items()
                    if kind is Invalid or kind.verb in verbs}
            for state, verbs in ALLOWED.items()}


@implementer(IPushProducer, IChannelConsumer)
class NsqdProtocol(Replies, Subscriber, Publisher, Heartbeats, SecurityGate, Protocol):
    """One V2 client connection (producer, consumer or both).

    Consumer attributes read by the channel: C{rdy}, C{in_flight}, C{msg_timeout},
    C{sample_rate}, C{can_receive}.
    """

    log = Logger()
    _ALLOWED = ALLOWED

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
        self.output = Output(self)  # one send for everything a read produces
        self.last_command = None  # the last command of the read being handled
        self.tap = self.broker.wiretap

    # -- connection ----------------------------------------------------------------------

    def connectionMade(self):
        self.node.clients.add(self)
        peer = self.transport.getPeer()
        self.remote_address = f"{getattr(peer, 'host', '')}:{getattr(peer, 'port', '')}"
        no_delay(self.transport)
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

    # -- input ---------------------------------------------------------------------------

    def dataReceived(self, data):
        if self.tap.active:
            # every command is reported and may be changed by a fault rule: the replies
            # of the read leave in one send, whatever they are
            self.output.received(self._received, data)
        else:
            self._received(data)

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
        if self.channel is not None and not self.tap.active:
            if self.decoder.in_line:
                # A read that ended inside a line (a reader's FINs cut anywhere): the
                # decoder ends that line, so the FINs after it take the fast path too.
                nl = data.find(b"\n")
                if nl >= 0 and data.startswith(b"FIN ", nl + 1):
                    if not self._feed(data[:nl + 1]):
                        return
                    data = data[nl + 1:]
            if data.startswith(b"FIN ") and self.decoder.at_line_start:
                pos = self._fast_fins(data)
                if pos == len(data):
                    return
                data = data[pos:]
        self._feed(data)

    def _feed(self, data):
        """Run the commands C{data} completes; False once input is dead."""
        if self.tap.active:
            raw = self.decoder.raw_commands(data) if self.tap.trace.active else None
            return self._feed_tapped(self.decoder.feed(data), raw)
        commands = self.decoder.feed(data)
        if len(commands) > 1:
            # the replies of several commands in one read leave in one send
            self.output.received(self._commands, commands)
        elif commands:
            # one command (a client waiting for each reply): nothing to gather its
            # reply with, so it goes out as it is made
            self._commands(commands)
        return not (self._dead_input or self._dead)

    def _commands(self, commands):
        """Run the commands of one read (FINs that succeed without a reply, the others
        through L{_run}), until input is dead."""
        self.last_command = commands[-1]
        for cmd in commands:
            if type(cmd) is Fin and self.channel is not None:
                # hot path: a FIN that succeeds needs no state check and no reply
                eid = parse_message_id(cmd.msg_id)
                if eid is not None and self.channel.finish(eid, self) is None:
                    self.finish_count += 1
                    continue
            if self._dead_input:
                return
            self._run(cmd)

    def _feed_tapped(self, commands, raw):
        """L{_feed} while the broker's tap is on: each command reported to the trace
        (with its bytes, C{raw}'s in order, when known) and run as a fault rule says."""
        for i, cmd in enumerate(commands):
            if self._dead_input:
                return False
            if self.tap.trace.active:
                data = raw[i] if raw is not None and i < len(raw) else None
                self.tap.frame(DOOR, self, "in", (cmd.verb,), command_fields(cmd),
                               None if data is None else len(data), data)
            rule = self.tap.fault(DOOR, self, (cmd.verb,))
            if rule is None:
                self._run(cmd)
            else:
                apply_fault(self, rule, cmd)
        return not (self._dead_input or self._dead)

    def _inflating(self):
        """True while input already read still inflates to more commands."""
        return self._decompressor is not None and self._decompressor.pending

    def _inflate_more(self):
        self._inflate_call = None
        if self._dead or self._dead_input:
            return
        if self._read_paused:
            return  # too many replies pending: _drain resumes reading, then we go on
        self.dataReceived(b"")
        if self._inflate_call is None and not self._read_paused and not self._dead:
            self.transport.resumeProducing()

    def _run(self, cmd):
        """Check C{cmd} is allowed in this state and run its handler; an NsqError is
        answered in order."""
        handler = self._allowed_handlers[self.state].get(type(cmd))
        try:
            if handler is None:
                raise E.cannot_in_state(cmd.verb)
            handler(self, cmd)
        except NsqError as err:
            self._fail(err)

    # -- commands ------------------------------------------------------------------------

    def do_invalid(self, cmd):
        verb = cmd.verb
        known = any(verb in v for v in ALLOWED.values()) or verb in ("IDENTIFY", "AUTH", "SUB")
        if known and verb not in ALLOWED[self.state]:
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

    _handlers = {
        Invalid: do_invalid, Nop: do_nop, Identify: do_identify, Auth: SecurityGate.do_auth,
        Sub: Subscriber.do_sub, Rdy: Subscriber.do_rdy, Fin: Subscriber.do_fin,
        Req: Subscriber.do_req, Touch: Subscriber.do_touch, Cls: Subscriber.do_cls,
        Pub: Publisher.do_pub, Mpub: Publisher.do_mpub, Dpub: Publisher.do_dpub,
    }
    _allowed_handlers = _by_state(_handlers)


class NsqdFactory(Factory):
    """Builds L{NsqdProtocol}s for one broker's L{NsqNode}."""

    noisy = False

    def __init__(self, node):
        self.node = node
        node.broker.wiretap.faults.door(DOOR, check_fault)

    def buildProtocol(self, addr):
        return NsqdProtocol(self)

    def listening(self, port):
        """The listener is bound (called by the broker's service tree)."""
        self.node.tcp_port = port.getHost().port
        self.node.tcp_started()
