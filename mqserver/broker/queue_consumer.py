"""msgout consumers: what a consumer of a msgout queue is to its channel, and what it
hands on (L{Delivery}), plus the cursor reads and waits used without a channel.

A L{QueueConsumer} is a channel consumer (see L{mqserver.broker.channels}) that hands
L{Delivery} objects to a sink: a long connection, a short fetch, or a push to a URL.
"""

from twisted.internet import defer
from zope.interface import implementer

from mqserver.broker.channels import OWNER
from mqserver.interfaces import IWatcher
from mqserver.store import format as fmt


def _props_after(buf, b1):
    """The properties of a record whose body ends at C{b1} in C{buf}."""
    tlen = buf[b1]
    p = b1 + 1 + tlen
    plen = (buf[p] << 8) | buf[p + 1]
    return bytes(buf[p + 2:p + 2 + plen])


class Delivery:
    """One message handed to a consumer.

    @ivar receipt: the handle that acks or nacks it, or None when nothing is to be acked.
    @ivar props: its RocketMQ properties string (bytes; headers).
    """

    __slots__ = ("queue", "id", "receipt", "attempts", "body", "props", "ts_ms")

    def __init__(self, queue, eid, receipt, attempts, body, props, ts_ms):
        self.queue = queue
        self.id = eid
        self.receipt = receipt
        self.attempts = attempts
        self.body = body
        self.props = props
        self.ts_ms = ts_ms

    def headers(self):
        """The headers as a dict of str (from the properties, broker-internal ones left out)."""
        out = {}
        if self.props:
            for k, v in fmt.decode_properties(self.props):
                if k != fmt.DELAY_PROPERTY:
                    out[k.decode("utf-8", "replace")] = v.decode("utf-8", "replace")
        return out


class QueueConsumer:
    """A msgout consumer of one channel (the channel's consumer interface).

    C{sink(consumer, deliveries)} gets every batch; C{on_closed(consumer)}, if given,
    is called when the channel goes (the queue was deleted). C{window} is how many
    un-acked messages it may hold (0 stops delivery); an ordered queue gives one message
    at a time to the whole channel.
    """

    sample_rate = 0
    defer_room = 0  # every batch goes to the sink at once

    def __init__(self, service, channel, attrs, sink, window, on_closed=None):
        self.service = service
        self.on_closed = on_closed
        self.channel = channel
        self.queue = channel.topic
        self.sink = sink
        self.window = window
        self.in_flight = 0
        self.msg_timeout = attrs["ack_timeout_ms"] / 1000.0
        self.ordered = attrs["ordered"]
        self.ack = attrs["ack"]
        self.open = True
        self._tag = service.channel_tag(channel)

    @property
    def rdy(self):
        return 1 if self.ordered else self.window

    @property
    def can_receive(self):
        return self.open and self.window > 0 and not (self.ordered and self.channel.in_flight)

    def deliver(self, items):
        ch = self.channel
        tag = self._tag
        out = []
        append = out.append
        ack = self.ack
        for ts_ns, attempts, eid, buf, b0, b1 in items:
            if b1 < len(buf):
                props = _props_after(buf, b1)
            else:  # a redelivery: the item holds the body only
                e = ch.in_flight[eid]
                props = bytes(ch.store.read_record(e[3], e[4]).properties)
            receipt = f"{tag}.{eid}.{attempts}" if ack else None
            append(Delivery(self.queue, eid, receipt, attempts, bytes(buf[b0:b1]), props,
                            ts_ns // 1_000_000))
        if not ack:
            ch.finish_many([d.id for d in out], self)
        self.sink(self, out)

    def channel_closed(self):
        self.open = False
        if self.on_closed is not None:
            self.on_closed(self)

    def unacked(self):
        """The eventIds this consumer holds un-acked."""
        return [eid for eid, e in self.channel.in_flight.items() if e[OWNER] is self]

    def close(self, fail_back=True):
        """Detach; with C{fail_back}, everything it holds un-acked goes back at once."""
        self.open = False
        self.window = 0
        ch = self.channel
        ch.remove_consumer(self)
        if fail_back and not ch.deleted:
            for eid in self.unacked():
                ch.requeue(eid, self, 0)


def _finish_run(ch, owner, run, errors):
    """FIN a run of (eventId, receipt) of one channel and owner in one call; what stops
    it (a receipt twice in one request) is retried one by one."""
    if not run:
        return
    done = ch.finish_many([eid for eid, _ in run], owner)
    for eid, r in run[done:]:
        if not ch.finish_many((eid,), owner):
            errors[r] = f"receipt {r} is not in flight"


@implementer(IWatcher)
class _Waiter:
    """Fires its Deferred once, at the first arrival, deletion or the timer."""

    def __init__(self, broker, name):
        self.broker = broker
        self.name = name
        self.timer = None
        self.d = defer.Deferred(lambda d: self._stop())

    def _stop(self):
        if self.timer is not None and self.timer.active():
            self.timer.cancel()
        self.broker.unwatch(self.name, self)

    def fire(self, *_):
        if not self.d.called:
            self._stop()
            self.d.callback(None)

    data_available = topic_deleted = fire


def cursor_deliveries(name, cursor, n):
    """Read up to C{n} records from C{cursor} as L{Delivery} objects (no receipts)."""
    buf, locs = cursor.read_span(n)
    out = []
    for pos, size in locs:
        view = fmt.RecordView(buf, pos)
        out.append(Delivery(name, view.event_id, None, 1, bytes(view.body),
                            bytes(view.properties), view.store_ts))
    return out
