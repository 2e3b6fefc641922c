"""msgout queues: attributes, consumer sessions, receipts and push-subscription state.

A msgout queue is a topic of the one log; its attributes (C{mode}, C{ack}, C{ordered},
C{persistent}, C{ack_timeout_ms}) live in the topic's C{attrs} under C{"msgout"}, so
they are written to the log and survive restarts and replication. Any topic, whoever
made it, is a queue with the default attributes until they are set.

Consumption reuses the channel model (L{mqserver.broker.channels}):
  - queue mode: one shared channel per queue (C{QUEUE_CHANNEL}); each message goes to
    one consumer;
  - topic mode with a C{sub_id}: one channel per sub_id (C{sub_channel(sub_id)});
  - topic mode without a C{sub_id}: no broker-kept position, the client reads from an id
    (L{QueueService.read_from}).

A L{QueueConsumer} (L{mqserver.broker.queue_consumer}) is a channel consumer that hands
L{Delivery} objects to a sink (a long connection, a short fetch, or a push to a URL). A
receipt names the channel, the eventId and the attempt, so any connection can ack or
nack it, and an old attempt's receipt cannot touch a redelivered message.
"""

from twisted.internet import defer
from twisted.logger import Logger

from mqserver.broker.channels import ATTEMPTS, OWNER
from mqserver.broker.cursor import TopicCursor
from mqserver.broker.queue_consumer import QueueConsumer, _Waiter, _finish_run, cursor_deliveries
from mqserver.errors import BrokerError, InvalidRequest, TopicNotFound

ATTR_KEY = "msgout"
QUEUE_CHANNEL = "msgout:queue"
_SUB_PREFIX = "msgout:sub:"
MAX_SUB_ID = 200

DEFAULTS = {"mode": "queue", "ack": True, "ordered": False, "persistent": False,
            "ack_timeout_ms": 30000}
_CHECKS = {
    "mode": (lambda v: v in ("queue", "topic"), '"queue" or "topic"'),
    "ack": (lambda v: isinstance(v, bool), "true or false"),
    "ordered": (lambda v: isinstance(v, bool), "true or false"),
    "persistent": (lambda v: isinstance(v, bool), "true or false"),
    "ack_timeout_ms": (lambda v: type(v) is int and 100 <= v <= 3_600_000, "100..3600000"),
}


class UnknownReceipt(BrokerError):
    """A receipt that names no message in flight (acked, timed out or redelivered)."""


def check_attrs(spec, base=None):
    """Return the full attributes: C{base} (or the defaults) updated with C{spec}.

    Raises L{InvalidRequest} naming the first unknown or invalid attribute."""
    if not isinstance(spec, dict):
        raise InvalidRequest("queue attributes must be a JSON object")
    out = dict(base or DEFAULTS)
    for k, v in spec.items():
        check = _CHECKS.get(k)
        if check is None:
            raise InvalidRequest(f"unknown attribute {k!r}")
        if not check[0](v):
            raise InvalidRequest(f"attribute {k!r} must be {check[1]}")
        out[k] = v
    return out


def sub_channel(sub_id):
    """Return the channel name of topic-mode subscription C{sub_id}."""
    return _SUB_PREFIX + sub_id


def check_sub_id(sub_id):
    """Raise L{InvalidRequest} unless C{sub_id} is a usable subscription id."""
    if not isinstance(sub_id, str) or not sub_id or len(sub_id) > MAX_SUB_ID:
        raise InvalidRequest(f"sub_id must be a string of 1..{MAX_SUB_ID} characters")
    if any(c.isspace() or c in "\x00/" for c in sub_id):
        raise InvalidRequest("sub_id holds a space, slash or NUL")


class PushSubscription:
    """A push-to-URL subscription's durable settings and what it has done.

    @ivar delivered: messages acknowledged by the endpoint since start.
    @ivar failures: failed POSTs since start.
    @ivar last_error: the last failure's text, or None.
    """

    def __init__(self, queue, sub_id, url, batch, created_ms):
        self.queue = queue
        self.sub_id = sub_id
        self.url = url
        self.batch = batch
        self.created_ms = created_ms
        self.delivered = 0
        self.failures = 0
        self.last_error = None
        self.last_error_ms = None
        self.runner = None

    def durable(self):
        return {"queue": self.queue, "sub_id": self.sub_id, "url": self.url,
                "batch": self.batch, "created_ms": self.created_ms}


class QueueService:
    """msgout queues over a broker: attributes, channels, receipts, push subscriptions.

    Reached as C{broker.queues}; its checkpoint state (the push subscriptions) is kept
    by the broker under C{"msgout"}.

    @ivar subscriptions: (queue, sub_id) -> L{PushSubscription}.
    @ivar push_runner: callable(subscription) that starts pushing (set by the msgout
        front door), or None.
    """

    log = Logger()

    def __init__(self, broker):
        self.broker = broker
        self.store = broker.store
        self.subscriptions = {}
        self.push_runner = None
        self._tags = {}  # id(channel) -> tag
        self._by_tag = {}  # tag -> channel
        self._next_tag = 1

    # -- checkpoint ----------------------------------------------------------------------

    def snapshot_state(self):
        return {"subscriptions": [s.durable() for s in self.subscriptions.values()]}

    def restore_state(self, state):
        self.subscriptions = {}
        for d in (state or {}).get("subscriptions", []):
            s = PushSubscription(d["queue"], d["sub_id"], d["url"], d["batch"],
                                 d.get("created_ms", 0))
            self.subscriptions[(s.queue, s.sub_id)] = s

    # -- attributes ----------------------------------------------------------------------

    def attrs(self, name):
        """Return the attributes of queue C{name}; raises L{TopicNotFound}."""
        t = self.broker.topic(name)
        if t is None:
            raise TopicNotFound(name)
        own = t.attrs.get(ATTR_KEY) if isinstance(t.attrs, dict) else None
        return dict(DEFAULTS, **own) if own else dict(DEFAULTS)

    def declare(self, name, spec):
        """Create queue C{name} or change its attributes (other attrs of the topic are
        kept). Returns a Deferred firing with the full attributes."""
        def write():
            t = self.broker.topic(name)
            base = self.attrs(name) if t is not None else None
            attrs = check_attrs(spec, base)
            # a topic another protocol made gets its mode once; after that it stays
            if t is not None and (t.attrs or {}).get(ATTR_KEY) and base["mode"] != attrs["mode"]:
                raise InvalidRequest("a queue's mode cannot change")
            if t is None:
                d = self.broker.create_topic(name, attrs={ATTR_KEY: attrs})
            else:
                d = self.broker.update_topic(name, attrs=dict(t.attrs or {}, **{ATTR_KEY: attrs}))
            # the queue's channel is made by its first consumer, from the oldest retained
            # message: until then the topic's first channel may still be another protocol's
            return d.addCallback(lambda _: attrs)

        return defer.maybeDeferred(write)

    def info(self, name):
        """Attributes, stored messages, and per channel depth, in flight and consumers,
        with the push subscriptions (as the admin views show a queue)."""
        attrs = self.attrs(name)
        t = self.broker.topic(name)
        store = self.store
        stored = sum(store.queue(name, q).max_offset - store.queue(name, q).min_offset
                     for q in range(t.queues))
        info = dict(attrs, name=name, messages=stored)
        chans = self.broker.channels.of(name)

        def stats(ch):
            return {"depth": ch.depth(), "in_flight": len(ch.in_flight),
                    "consumers": len(ch.consumers)}

        if attrs["mode"] == "queue":
            ch = chans.get(QUEUE_CHANNEL)
            info.update(stats(ch) if ch else {"depth": stored, "in_flight": 0, "consumers": 0})
        else:
            info["subs"] = {n[len(_SUB_PREFIX):]: stats(ch) for n, ch in chans.items()
                            if n.startswith(_SUB_PREFIX)}
        info["subscriptions"] = [self.subscription_info(s)
                                 for (q, _), s in self.subscriptions.items() if q == name]
        return info

    def publish(self, name, messages):
        """Publish C{messages} to queue C{name}; a C{persistent} queue answers once they
        are fsynced. Returns a Deferred firing with their ids."""
        def write():
            persistent = self.attrs(name)["persistent"]
            d = self.broker.publish(name, messages)
            store = self.store
            if persistent and store.flush_level < 2:
                d.addCallback(lambda r: store.sync().addCallback(lambda _: r))
            return d

        n = len(messages)
        return defer.maybeDeferred(write).addCallback(lambda r: list(range(r.event_id, r.event_id + n)))

    # -- channels ------------------------------------------------------------------------

    def _positions(self, name, start):
        """Queue offsets to start at: "earliest" (oldest retained), "latest", or an id
        (that message and later)."""
        t = self.broker.topic(name)
        out = {}
        for qid in range(t.queues):
            q = self.store.queue(name, qid)
            if start == "latest":
                out[qid] = q.max_offset
            elif start == "earliest":
                out[qid] = q.min_offset
            else:
                out[qid] = self.store.find_event(name, qid, start)[0]
        return out

    def queue_channel(self, name):
        """The shared channel of queue-mode queue C{name} (made with the whole retained
        backlog the first time)."""
        chans = self.broker.channels
        ch = chans.get(name, QUEUE_CHANNEL)
        if ch is None:
            if self.broker.topic(name) is None:
                raise TopicNotFound(name)
            ch = chans.create_channel(name, QUEUE_CHANNEL, self._positions(name, "earliest"))
        return ch

    def channel_for(self, name, sub_id=None, start="earliest"):
        """The channel a consumer of queue C{name} reads: the shared one in queue mode,
        the sub_id's own in topic mode (made at C{start} the first time). Raises
        L{TopicNotFound} or L{InvalidRequest}."""
        attrs = self.attrs(name)
        if attrs["mode"] == "queue":
            return self.queue_channel(name), attrs
        if sub_id is None:
            raise InvalidRequest("a topic-mode queue needs a sub_id (or from_id)")
        check_sub_id(sub_id)
        chans = self.broker.channels
        ch = chans.get(name, sub_channel(sub_id))
        if ch is None:
            ch = chans.create_channel(name, sub_channel(sub_id), self._positions(name, start))
        return ch, attrs

    def channel_tag(self, ch):
        """A short tag naming C{ch} in receipts (for this process's life)."""
        tag = self._tags.get(id(ch))
        if tag is None or self._by_tag.get(tag) is not ch:
            tag = str(self._next_tag)
            self._next_tag += 1
            self._tags[id(ch)] = tag
            self._by_tag[tag] = ch
        return tag

    def consumer(self, name, sink, window, sub_id=None, start="earliest", on_closed=None):
        """Attach a L{QueueConsumer} of queue C{name}; returns it."""
        ch, attrs = self.channel_for(name, sub_id, start)
        c = QueueConsumer(self, ch, attrs, sink, window, on_closed)
        ch.add_consumer(c)
        return c

    def take(self, name, n, sub_id=None, start="earliest"):
        """Take up to C{n} messages now; they stay in flight until acked or timed out."""
        got = []
        c = self.consumer(name, lambda c, ds: got.extend(ds), n, sub_id, start)
        c.channel.pump()
        c.close(fail_back=False)
        return got

    def fetch(self, name, n, wait_s=0.0, sub_id=None, start="earliest"):
        """Take up to C{n} messages; when none are there, wait up to C{wait_s} seconds
        for the first to arrive. Returns a Deferred firing with the deliveries (cancel
        it to stop waiting)."""
        def wait():
            got = self.take(name, n, sub_id, start)
            if got or wait_s <= 0:
                return got

            def cancel(d):
                timer.cancel()
                c.close(fail_back=True)

            d = defer.Deferred(cancel)

            def sink(c, ds):
                timer.cancel()
                c.close(fail_back=False)
                d.callback(ds)

            def expired():
                c.close(fail_back=True)
                d.callback([])

            c = self.consumer(name, sink, n, sub_id, start)
            timer = self.broker._reactor.callLater(wait_s, expired)
            return d

        return defer.maybeDeferred(wait)

    # -- receipts ------------------------------------------------------------------------

    def _entry(self, receipt):
        try:
            tag, eid, attempts = receipt.split(".")
            eid, attempts = int(eid), int(attempts)
        except (AttributeError, ValueError):
            raise UnknownReceipt(f"bad receipt {receipt!r}") from None
        ch = self._by_tag.get(tag)
        if ch is not None and ch.deleted:  # its queue or sub_id went: forget the tag
            del self._by_tag[tag]
            self._tags.pop(id(ch), None)
            ch = None
        e = ch.in_flight.get(eid) if ch is not None else None
        if e is None or e[ATTEMPTS] != attempts:
            raise UnknownReceipt(f"receipt {receipt} is not in flight")
        return ch, eid, e[OWNER]

    def _entries(self, receipts, errors):
        """(receipt, channel, eventId, owner) of each receipt in flight; the others go
        to C{errors}."""
        for r in receipts:
            try:
                yield (r, *self._entry(r))
            except UnknownReceipt as e:
                errors[r] = str(e)

    def ack(self, receipts):
        """Acknowledge C{receipts}; returns {receipt: error text} for those that failed."""
        errors = {}
        run, run_ch, run_owner = [], None, None
        for r, ch, eid, owner in self._entries(receipts, errors):
            if ch is not run_ch or owner is not run_owner:
                _finish_run(run_ch, run_owner, run, errors)
                run, run_ch, run_owner = [], ch, owner
            run.append((eid, r))
        _finish_run(run_ch, run_owner, run, errors)
        return errors

    def nack(self, receipts):
        """Give C{receipts} back for redelivery now; returns {receipt: error} as L{ack}."""
        errors = {}
        for r, ch, eid, owner in self._entries(receipts, errors):
            if ch.requeue(eid, owner, 0) is not None:  # twice in one request
                errors[r] = f"receipt {r} is not in flight"
        return errors

    # -- push subscriptions -------------------------------------------------------------

    def subscribe(self, name, sub_id, url, batch, start="earliest"):
        """Add (or replace) push subscription C{sub_id} of queue C{name}; its runner
        starts when the msgout front door runs. Returns the L{PushSubscription}."""
        check_sub_id(sub_id)
        if not isinstance(batch, int) or isinstance(batch, bool) or not 1 <= batch <= 10000:
            raise InvalidRequest("batch must be 1..10000")
        if self.attrs(name)["mode"] == "topic":
            self.channel_for(name, sub_id, start)
        else:
            self.queue_channel(name)
        old = self.subscriptions.pop((name, sub_id), None)
        if old is not None and old.runner is not None:  # replaced: the position stays
            old.runner.stop()
            old.runner = None
        s = PushSubscription(name, sub_id, url, batch, self.broker.now_ms())
        self.subscriptions[(name, sub_id)] = s
        self.store.mark_dirty()
        if self.push_runner is not None:
            self.push_runner(s)
        return s

    def unsubscribe(self, name, sub_id):
        """Stop and forget push subscription C{sub_id}; returns False if there was none.
        (A topic-mode subscription's channel, and so its position, goes too.)"""
        s = self.subscriptions.pop((name, sub_id), None)
        if s is None:
            return False
        if s.runner is not None:
            s.runner.stop()
            s.runner = None
        if self.broker.topic(name) is not None and self.attrs(name)["mode"] == "topic":
            self.broker.channels.delete_channel(name, sub_channel(sub_id))
        self.store.mark_dirty()
        return True

    def subscription_info(self, s):
        """What GET shows of push subscription C{s}: settings, lag, errors."""
        ch = self.broker.channels.get(
            s.queue, sub_channel(s.sub_id) if self.attrs(s.queue)["mode"] == "topic"
            else QUEUE_CHANNEL)
        return dict(s.durable(), lag=ch.depth() + len(ch.in_flight) if ch else 0,
                    delivered=s.delivered, failures=s.failures, last_error=s.last_error,
                    last_error_ms=s.last_error_ms, running=s.runner is not None)

    def drop_queue(self, name):
        """Forget the push subscriptions of a deleted queue."""
        for key in [k for k in self.subscriptions if k[0] == name]:
            s = self.subscriptions.pop(key)
            if s.runner is not None:
                s.runner.stop()
                s.runner = None
        self.store.mark_dirty()

    # -- reading without a broker-kept position ------------------------------------------

    def wait_data(self, name, wait_s):
        """A Deferred firing (with None) when a message arrives in C{name}, the queue
        goes, or C{wait_s} seconds pass; cancelling it stops the wait."""
        broker = self.broker
        w = _Waiter(broker, name)
        w.timer = broker._reactor.callLater(wait_s, w.fire)
        broker.watch(name, w)
        return w.d

    def read_from(self, name, start, n):
        """Up to C{n} messages of queue C{name} from C{start} ("earliest", "latest" or an
        id: that message and later), in id order, with no receipts."""
        if self.broker.topic(name) is None:
            raise TopicNotFound(name)
        cur = TopicCursor(self.store, name, self._positions(name, start))
        return cursor_deliveries(name, cur, n), cur
