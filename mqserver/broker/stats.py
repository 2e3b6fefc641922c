"""Statistics counted once for every protocol, and where a consumer's position is set.

What goes in is counted where every protocol's publish ends: the store's write counts
messages and record bytes on the consume queue they went to
(L{mqserver.store.consumequeue.ConsumeQueue.in_msgs} and C{in_bytes}). What goes out is
counted by the consumer that hands messages over: a channel (NSQ, and any
channel-model consumer) counts in L{mqserver.broker.channels.Channel}; cursor consumers
(a RocketMQ group, an smss C{who}, a msgout subscription) are L{Consumer} objects that
their protocol counts deliveries on. Every protocol's stats answer (NSQ C{/stats},
RocketMQ's admin requests, smss C{TOPIC INFO $stats}, the admin API, /metrics) reads
from here, so nothing is counted twice.

Bytes are record bytes as stored (RocketMQ's C{TOPIC_PUT_SIZE}, C{GROUP_GET_SIZE});
L{payload_bytes} turns them into body-and-properties bytes (what NSQ calls
C{message_bytes}).

Replay: L{Statistics.first_event_at} finds the first message stored at or after a time,
and every consumer has C{rewind(event_id)}: its next message is the first of its topic
whose eventId is at least C{event_id}.
"""

import collections
import time
import weakref

from mqserver.store import format as fmt

#: Kinds of consumer, as the admin API and /metrics name them.
ROCKETMQ, CHANNEL, SMSS, MSGOUT = "rocketmq", "channel", "smss", "msgout"
#: Rate windows in seconds (RocketMQ's clusterList shows the 10 s, 60 s and 600 s rates).
WINDOWS = (10, 60, 600)


def record_overhead(topic):
    """Return the bytes every stored message record of C{topic} has besides its body and
    properties."""
    return fmt.MIN_RECORD_SIZE + len(topic.encode("utf-8"))


def payload_bytes(topic, msgs, record_bytes):
    """Return the body-and-properties bytes of C{msgs} records of C{topic} that take
    C{record_bytes} in the log."""
    return max(0, record_bytes - msgs * record_overhead(topic))


def positions_at_event(store, topic, queue_ids, event_id):
    """Return {queue id: offset of the first entry whose eventId >= C{event_id}}."""
    out = {}
    for qid in queue_ids:
        q = store.queue(topic, qid)
        if event_id <= 0:
            out[qid] = q.min_offset
        else:
            out[qid] = max(q.min_offset, store.find_event(topic, qid, event_id)[0])
    return out


def lag_of(store, topic, positions):
    """Return how many messages of C{topic} lie at or after C{positions}."""
    n = 0
    for qid, pos in positions.items():
        q = store.find_queue(topic, qid)
        if q is not None:
            n += max(0, q.max_offset - max(pos, q.min_offset))
    return n


class Consumer:
    """A cursor consumer's counters and position, registered with L{Statistics}.

    Its protocol counts what it hands out (L{delivered}, L{requeued}) and gives the
    position: C{positions} (queue id -> next offset) is read for the lag, and
    C{on_rewind(positions)} (set by the protocol) moves the live consumer when an
    operator rewinds it. Subclass or set the callables.

    @ivar kind: L{ROCKETMQ}, L{SMSS}, L{MSGOUT}.
    @ivar out_msgs: messages handed out (redeliveries too).
    @ivar out_bytes: their record bytes.
    @ivar requeues: messages given back to be delivered again.
    @ivar in_flight: messages handed out and not yet acknowledged.
    @ivar clients: client addresses attached now.
    """

    in_flight = 0

    def __init__(self, kind, name, topic, positions=None, on_rewind=None):
        self.kind = kind
        self.name = name
        self.topic = topic
        self.out_msgs = 0
        self.out_bytes = 0
        self.requeues = 0
        self.clients = []
        self._positions = positions
        self.on_rewind = on_rewind

    def delivered(self, msgs, nbytes):
        """Count C{msgs} messages of C{nbytes} record bytes handed out."""
        self.out_msgs += msgs
        self.out_bytes += nbytes

    def positions(self):
        """Return {queue id: next queue offset} (empty when unknown)."""
        return self._positions() if self._positions is not None else {}

    def rewind(self, positions):
        """Move the consumer to C{positions} (queue id -> offset)."""
        if self.on_rewind is None:
            raise ValueError(f"{self.kind} consumer {self.name} cannot be rewound")
        self.on_rewind(positions)


class OffsetConsumer(Consumer):
    """A consumer group whose position is its committed offsets in the core offset table
    (L{mqserver.broker.offsets}; RocketMQ's groups): what it pulled and has not committed
    yet is its in-flight count. Rewinding commits the new offsets, then calls
    C{on_rewind(positions)} if its protocol set one (to tell the live clients)."""

    def __init__(self, broker, kind, group, topic, on_rewind=None):
        super().__init__(kind, group, topic, on_rewind=on_rewind)
        self._offsets = broker.offsets
        self.pulled = {}  # queue id -> next offset after the last pull answered

    def positions(self):
        return dict(self._offsets.table.get((self.topic, self.name), {}))

    @property
    def in_flight(self):
        committed = self.positions()
        return sum(max(0, nxt - committed.get(q, 0)) for q, nxt in self.pulled.items())

    def pulled_to(self, queue_id, next_offset, msgs, nbytes):
        """A pull of C{queue_id} answered C{msgs} messages (C{nbytes} record bytes)."""
        self.pulled[queue_id] = next_offset
        self.delivered(msgs, nbytes)

    def rewind(self, positions):
        for qid, off in positions.items():
            self._offsets.commit(self.topic, self.name, qid, off)
        self.pulled = {}
        if self.on_rewind is not None:
            self.on_rewind(positions)


#: Channels msgout makes (``msgout:queue``, ``msgout:sub:<sub_id>``) start with this.
MSGOUT_CHANNEL_PREFIX = "msgout:"


class ChannelConsumer:
    """The L{Consumer} view of a core channel (whose own counters are read live): kind
    L{CHANNEL} (NSQ's), or L{MSGOUT} for the channels of msgout queues and topic-mode
    subscriptions."""

    def __init__(self, channel):
        self.channel = channel
        self.name = channel.name
        self.topic = channel.topic
        self.kind = MSGOUT if channel.name.startswith(MSGOUT_CHANNEL_PREFIX) else CHANNEL

    @property
    def out_msgs(self):
        return self.channel.delivered_count

    @property
    def out_bytes(self):
        return self.channel.delivered_bytes

    @property
    def requeues(self):
        return self.channel.requeue_count + self.channel.timeout_count

    @property
    def in_flight(self):
        return len(self.channel.in_flight)

    @property
    def clients(self):
        return [getattr(c, "remote_address", "") for c in self.channel.consumers]

    def positions(self):
        return dict(self.channel.cursor.positions)

    def lag(self):
        return self.channel.depth()

    def rewind(self, positions):
        self.channel.rewind(positions)


#: Seconds between two samples of the per-topic and per-consumer totals.
SAMPLE_S = 10


class _History:
    """Totals per key sampled every L{SAMPLE_S} seconds for an hour, and every hour for
    a day, so a window's sum and rate is the difference to the sample that old."""

    def __init__(self, clock):
        self._clock = clock
        self._recent = collections.deque(maxlen=3600 // SAMPLE_S + 1)
        self._hourly = collections.deque(maxlen=25)
        self._recent.append((clock(), {}))
        self._hourly.append((clock(), {}))
        self.day_marks = ({}, {})  # totals at yesterday's and today's first sample
        self._day = time.localtime(clock()).tm_yday

    def sample(self, counts):
        now = self._clock()
        if now - self._recent[-1][0] >= SAMPLE_S - 0.5:
            self._recent.append((now, counts))
        if now - self._hourly[-1][0] >= 3600 - 0.5:
            self._hourly.append((now, counts))
        day = time.localtime(now).tm_yday
        if day != self._day:
            self._day = day
            self.day_marks = (self.day_marks[1], counts)

    def window(self, key, index, seconds, now_value):
        """Return (sum, per-second rate) of C{key}'s total C{index} over the last
        C{seconds} (over the time since the start when that is shorter)."""
        now = self._clock()
        series = self._recent if seconds <= 3600 else self._hourly
        for t, counts in series:
            if now - t <= seconds + SAMPLE_S / 2:
                base = counts.get(key, (0, 0))[index]
                delta = max(0, now_value - base)
                span = max(now - t, 1e-9)
                return delta, delta / max(span, min(seconds, SAMPLE_S))
        return 0, 0.0


class Statistics:
    """The broker's statistics: messages in per queue, consumers, front-door connections.

    @ivar consumers: C{(kind, topic, name)} -> registered L{Consumer}.
    @ivar start_ms: when the broker started (ms).
    """

    def __init__(self, broker, clock=time.time):
        self.broker = broker
        self.store = broker.store
        self._clock = clock
        self.start_ms = int(clock() * 1000)
        self.consumers = {}
        self._doors = {}  # door name -> WeakKeyDictionary transport -> peer address
        self._replicas = {}  # feeds to slaves (insertion ordered)
        self.history = _History(clock)
        self.get_msgs = 0  # messages handed out by every consumer, for the rates
        self.get_bytes = 0

    # -- in ------------------------------------------------------------------------------

    def queue_in(self, topic, queue_id):
        """Return (messages, record bytes) stored in (topic, queue) since the start."""
        q = self.store.find_queue(topic, queue_id)
        return (q.in_msgs, q.in_bytes) if q is not None else (0, 0)

    def topic_in(self, topic):
        """Return (messages, record bytes) stored in C{topic} since the start."""
        msgs = nbytes = 0
        for (t, _), q in self.store.open_queues():
            if t == topic:
                msgs += q.in_msgs
                nbytes += q.in_bytes
        return msgs, nbytes

    def counts(self):
        """Return {key: (messages, bytes)} of every topic put (key C{"put", topic}), every
        consumer's gets (key C{"get", "topic@name"}) and the broker's totals (topic or
        name None)."""
        out = {}
        for (t, _), q in self.store.open_queues():
            m, b = out.get(("put", t), (0, 0))
            out[("put", t)] = (m + q.in_msgs, b + q.in_bytes)
        put = (sum(v[0] for v in out.values()), sum(v[1] for v in out.values()))
        get_m, get_b = self.get_msgs, self.get_bytes
        for c in self.all_consumers():
            key = ("get", f"{c.topic}@{c.name}")
            m, b = out.get(key, (0, 0))
            out[key] = (m + c.out_msgs, b + c.out_bytes)
            get_m += c.out_msgs
            get_b += c.out_bytes
        out[("put", None)] = put
        out[("get", None)] = (get_m, get_b)
        return out

    def tick(self):
        """Sample the totals (called once a second; samples are kept every
        L{SAMPLE_S} seconds)."""
        self.history.sample(self.counts())

    def window(self, key, index, seconds, counts=None):
        """Return (sum, rate per second) of C{key}'s messages (C{index} 0) or bytes (1)
        over the last C{seconds}."""
        counts = self.counts() if counts is None else counts
        return self.history.window(key, index, seconds, counts.get(key, (0, 0))[index])

    # -- consumers -----------------------------------------------------------------------

    def consumer(self, kind, name, topic, **kw):
        """Return the registered consumer (kind, name, topic), registering a new
        L{Consumer} when there is none."""
        key = (kind, topic, name)
        c = self.consumers.get(key)
        if c is None:
            c = self.consumers[key] = Consumer(kind, name, topic, **kw)
        return c

    def add_consumer(self, c):
        """Register C{c} (a L{Consumer} or an object with its attributes)."""
        self.consumers[(c.kind, c.topic, c.name)] = c

    def remove_consumer(self, c):
        """Forget C{c}; what it handed out still counts in the broker's totals."""
        if self.consumers.get((c.kind, c.topic, c.name)) is c:
            del self.consumers[(c.kind, c.topic, c.name)]
            self.get_msgs += c.out_msgs
            self.get_bytes += c.out_bytes

    def _channels(self):
        for by_name in self.broker.channels.channels.values():
            yield from by_name.values()

    def group(self, group, topic, kind=ROCKETMQ):
        """Return the L{OffsetConsumer} of (group, topic), registering it."""
        c = self.consumers.get((kind, topic, group))
        if c is None:
            c = OffsetConsumer(self.broker, kind, group, topic)
            self.consumers[(kind, topic, group)] = c
        return c

    def all_consumers(self, topic=None, kind=None):
        """Return every consumer (channels as L{ChannelConsumer}s, and every group of the
        offset table, also one that has not pulled since the start), sorted."""
        for t, g in list(self.broker.offsets.table):
            if (ROCKETMQ, t, g) not in self.consumers:
                self.group(g, t)
        out = [ChannelConsumer(ch) for ch in self._channels()]
        out += list(self.consumers.values())
        out = [c for c in out if (topic is None or c.topic == topic)
               and (kind is None or c.kind == kind)]
        return sorted(out, key=lambda c: (c.topic, c.kind, c.name))

    def find(self, kind, name, topic):
        """Return the consumer, or None."""
        if kind == CHANNEL:
            ch = self.broker.channels.get(topic, name)
            if ch is None or ch.name.startswith(MSGOUT_CHANNEL_PREFIX):
                # msgout's channels are consumers of kind msgout, found as such below
                return None
            return ChannelConsumer(ch)
        c = self.consumers.get((kind, topic, name))
        if c is None and kind == MSGOUT:
            for n in (name, MSGOUT_CHANNEL_PREFIX + name, MSGOUT_CHANNEL_PREFIX + "sub:" + name):
                ch = self.broker.channels.get(topic, n)
                if ch is not None and n.startswith(MSGOUT_CHANNEL_PREFIX):
                    return ChannelConsumer(ch)
        if c is None and kind == ROCKETMQ and (topic, name) in self.broker.offsets.table:
            c = self.group(name, topic)
        return c

    def lag(self, c):
        """Return the messages of C{c}'s topic it has not read yet."""
        own = getattr(c, "lag", None)
        if own is not None:
            return own()
        return lag_of(self.store, c.topic, c.positions())

    def consumer_stats(self, c):
        """Return one consumer's figures as a dict."""
        return {"kind": c.kind, "name": c.name, "topic": c.topic, "out_msgs": c.out_msgs,
                "out_bytes": c.out_bytes, "lag": self.lag(c), "in_flight": c.in_flight,
                "requeues": c.requeues, "clients": list(c.clients)}

    def topic_stats(self, topic):
        """Return a topic's figures: messages and bytes in (record and payload bytes),
        per queue (every queue the topic has, those never written to with zeros), and its
        consumers."""
        queues = {}
        for (t, qid), q in self.store.open_queues():
            if t == topic:
                queues[qid] = {"in_msgs": q.in_msgs, "in_bytes": q.in_bytes,
                               "min_offset": q.min_offset, "max_offset": q.max_offset}
        meta = self.broker.topic(topic)
        for qid in range(meta.queues if meta is not None else 0):
            queues.setdefault(qid, {"in_msgs": 0, "in_bytes": 0, "min_offset": 0,
                                    "max_offset": 0})
        msgs = sum(v["in_msgs"] for v in queues.values())
        nbytes = sum(v["in_bytes"] for v in queues.values())
        return {"topic": topic, "in_msgs": msgs, "in_bytes": nbytes,
                "in_payload_bytes": payload_bytes(topic, msgs, nbytes),
                "queues": {str(q): v for q, v in sorted(queues.items())},
                "consumers": [self.consumer_stats(c) for c in self.all_consumers(topic)]}

    def snapshot(self, topic=None):
        """Return every figure as one JSON-ready dict (of C{topic} only, if given)."""
        names = [topic] if topic is not None else [t.name for t in self.broker.topics()]
        counts = self.counts()
        put_m, put_b = counts[("put", None)]
        get_m, get_b = counts[("get", None)]
        rates = {f"{what}_{w}s": round(self.window((what, None), 0, w, counts)[1], 3)
                 for what in ("put", "get") for w in WINDOWS}
        return {"start_ms": self.start_ms, "next_event_id": self.store.next_event_id,
                "in_msgs": put_m, "in_bytes": put_b,
                "out_msgs": get_m, "out_bytes": get_b, "rates": rates,
                "topics": [self.topic_stats(n) for n in names],
                "connections": self.connections(), "replicas": self.replicas()}

    # -- replay --------------------------------------------------------------------------

    def first_event_at(self, topic, ts_ms):
        """Return the eventId of the first message of C{topic} stored at or after
        C{ts_ms}, or the next eventId when there is none."""
        best = None
        for (t, qid), q in self.store.open_queues():
            if t != topic:
                continue
            off = self.offset_at_time(topic, qid, ts_ms)
            if off < q.max_offset:
                eid = self.store.event_id_at(q.entry(off)[0])
                best = eid if best is None else min(best, eid)
        return best if best is not None else self.store.next_event_id

    def offset_at_time(self, topic, queue_id, ts_ms):
        """Return the queue offset of the first message of (topic, queue) stored at or
        after C{ts_ms} (the queue's end when none is)."""
        store = self.store
        q = store.queue(topic, queue_id)
        lo, hi = q.min_offset, q.max_offset
        log_min = store.commitlog.min_offset
        while lo < hi and q.entry(lo)[0] < log_min:
            lo += 1
        while lo < hi:
            mid = (lo + hi) // 2
            off = q.entry(mid)[0]
            ts = fmt.I64.unpack(store.commitlog.read(off + fmt.OFF_STORE_TS, 8))[0]
            if ts < ts_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def rewind(self, c, event_id=None, ts_ms=None):
        """Move consumer C{c} to the first message with eventId >= C{event_id}, or stored
        at or after C{ts_ms}. Returns the new positions."""
        if (event_id is None) == (ts_ms is None):
            raise ValueError("give exactly one of an eventId and a time")
        if ts_ms is not None:
            event_id = self.first_event_at(c.topic, ts_ms)
        t = self.broker.topic(c.topic)
        qids = range(t.queues) if t is not None else c.positions().keys()
        positions = positions_at_event(self.store, c.topic, qids, event_id)
        c.rewind(positions)
        return positions

    # -- replication ---------------------------------------------------------------------

    def add_replica(self, feed):
        """Count a master's feed to one slave (an object with C{peer} and
        C{last_event_id}, the last eventId sent)."""
        self._replicas[feed] = None

    def remove_replica(self, feed):
        """Forget a feed (its slave left)."""
        self._replicas.pop(feed, None)

    def replicas(self):
        """Return [{slave, sent_event_id, lag_events}] of the slaves following this
        master: how many eventIds each is behind the log."""
        last = self.store.next_event_id - 1
        return [{"slave": f.peer, "sent_event_id": f.last_event_id,
                 "lag_events": max(0, last - f.last_event_id)} for f in list(self._replicas)]

    # -- front doors ---------------------------------------------------------------------

    def door_listening(self, door):
        """Front door C{door} listens: L{connections} lists it from now on, with no
        connection until its first one."""
        if door not in self._doors:
            self._doors[door] = weakref.WeakKeyDictionary()

    def connection_made(self, door, transport, address):
        """Count a connection of front door C{door}, by its C{transport} (forgotten when
        it closes)."""
        conns = self._doors.get(door)
        if conns is None:
            conns = self._doors[door] = weakref.WeakKeyDictionary()
        conns[transport] = address

    def connections(self, door=None):
        """Return {door: [client address, ...]} of the connections open now."""
        out = {}
        for name, conns in sorted(self._doors.items()):
            if door is not None and name != door:
                continue
            live = []
            for t, addr in list(conns.items()):
                if getattr(t, "disconnected", False):
                    continue
                live.append(_address(addr))
            out[name] = sorted(live)
        return out


def _address(addr):
    host = getattr(addr, "host", None)
    port = getattr(addr, "port", None)
    if host is None:
        return str(addr)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
