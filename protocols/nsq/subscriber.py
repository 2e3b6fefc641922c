"""The consumer side of an nsqd V2 connection, mixed into L{NsqdProtocol}: SUB, RDY, FIN,
REQ, TOUCH and CLS, and deliveries.

A subscribed connection is a consumer of a broker L{Channel} (L{IChannelConsumer}): the
channel hands it messages while RDY allows (C{rdy} above C{in_flight}) and the transport
takes them (C{can_receive}, kept by the L{IPushProducer} methods); their frames are
buffered as nsqd does (flushed when the buffer fills, when the connection stops being
ready, or after output_buffer_timeout).
"""

import re
import struct
from binascii import unhexlify

from mqserver.errors import BrokerError

from protocols.nsq import errors as E
from protocols.nsq.codec import CLOSE_WAIT, OK
from protocols.nsq.frames import delivery_frames
from protocols.nsq.states import CLOSING, SUBSCRIBED


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


class Subscriber:
    """Subscription, ready count and in-flight handling of an nsqd connection.

    Consumer attributes read by the channel: C{rdy}, C{in_flight}, C{msg_timeout},
    C{sample_rate}, C{can_receive}, C{defer_room}.
    """

    #: Messages the output buffer could take before it flushes, while a flush is
    #: scheduled (0 otherwise): the channel may leave that many arrivals in the store
    #: until the flush, which takes them first (L{Replies._flush}).
    defer_room = 0

    # -- readiness -----------------------------------------------------------------------

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

    # -- deliveries ----------------------------------------------------------------------

    def deliver(self, items):
        """Channel callback: frame C{items} into the output buffer."""
        frames = delivery_frames(items)
        self._out.append(frames)
        self._out_size = size = self._out_size + len(frames)
        self.message_count += len(items)
        s = self.settings
        if self.in_flight >= self.rdy or size >= s.output_buffer_size:
            self._flush()
            return
        if self._flush_call is None:
            if s.output_buffer_timeout_ms <= 0:
                return
            self._flush_call = self.reactor.callLater(s.output_buffer_timeout_ms / 1000.0,
                                                      self._flush)
        # The messages this buffer could still take without flushing at once (the ready
        # window or the buffer filled, at the size of these frames, flushes): the channel
        # may leave that many arrivals in the store until the flush (Channel.arrived).
        self.defer_room = min(self.rdy - self.in_flight - 1,
                              (s.output_buffer_size - size - 1) * len(items) // len(frames))

    def channel_closed(self):
        """Channel callback: the channel was deleted; nsqd closes its consumers."""
        self.channel = None
        self.can_receive = False
        self._flush()
        self.transport.loseConnection()

    # -- commands ------------------------------------------------------------------------

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
            most = self.node.max_channel_consumers
            if most and len(ch.consumers) >= most:  # E_SUB_FAILED, fatal, as nsqd
                raise BrokerError(f"consumers for {cmd.topic}:{cmd.channel} exceeds limit"
                                  f" of {most}")
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
        # the room was counted in the old window; a pump below takes what waits
        self.defer_room = 0
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


def _finish(ch, eid, owner):
    return ch.finish(eid, owner)


def _requeue(ch, eid, owner, delay_ms):
    return ch.requeue(eid, owner, delay_ms)


def _touch(ch, eid, owner, max_timeout):
    return ch.touch(eid, owner, max_timeout)
