"""Channels: the "channel" consumption model over the shared log (NSQ's, without its wire).

A channel reads its topic through a L{TopicCursor} and hands each message to one of its
consumers. It keeps an in-flight table with deadlines and attempts, a requeue list and a
deferred heap; a FINed message is forgotten. Its durable position per queue is the lowest
queue offset not yet finished (the floor) plus the set of finished offsets above it, so a
restart never redelivers a finished message and never loses an unfinished one.

A consumer is any object with these attributes, which the channel reads and updates:
C{rdy} (window size), C{in_flight} (the channel keeps it), C{msg_timeout} (seconds),
C{sample_rate} (0..99), C{can_receive} (bool), a method C{deliver(items)} taking a list of
C{(ts_ns, attempts, event_id, buf, body_start, body_end)}, and C{channel_closed()}
(the channel was deleted).

A consumer also has C{defer_room}: 0, or, while it buffers what it is handed until a
flush it has scheduled (NSQ's output buffer), how many more messages it could take
before they would leave at once (its ready window or its buffer full). While a channel's only
consumer has room for every message waiting, an arrival leaves them in the store
(L{Channel.left_for_flush}) instead of handing them over one pump at a time; the consumer
calls L{Channel.pump_deferred} before it flushes, and takes them all in one pass. What
the client receives, and when, is the same.
"""

import heapq
import random
from collections import deque
from operator import itemgetter

from mqserver import speedups
from mqserver.broker.cursor import TopicCursor
from mqserver.runtime.soon import call_soon
from mqserver.store import format as fmt

_FIELDS = fmt.CHANNEL_FIELDS.unpack_from
_BODY = fmt.HEADER_SIZE
#: How often timeouts and deferred messages are looked at, in seconds.
SCAN_INTERVAL = 0.05
#: Messages handed to one consumer at a time when several are ready.
SHARE_CHUNK = 16
_MS_NS = 1_000_000
_size_of = itemgetter(1)

# in-flight / requeue entry: a list, cheapest to build on the hot path
EID, QID, QOFF, LOFF, SIZE, ATTEMPTS, DEADLINE, OWNER, STARTED = range(9)


def _take_fresh_py(buf, locs, in_flight, deadline, owner, now, ms_ns, out):
    """Hand out the records at C{locs} in C{buf} as first attempts: an in-flight entry
    each, and a delivery item each appended to C{out} (the C speedup does the same)."""
    append = out.append
    for pos, _ in locs:
        size, qid, qoff, loff, ts, eid, blen = _FIELDS(buf, pos)
        in_flight[eid] = [eid, qid, qoff, loff, size, 1, deadline, owner, now]
        b0 = pos + _BODY
        append((ts * ms_ns, 1, eid, buf, b0, b0 + blen))


def _finish_py(eids, in_flight, owner, floor, done):
    """FIN C{eids} in order until one is not in flight or not C{owner}'s: each leaves
    C{in_flight} and moves its queue's floor, or joins the done set above the floor.
    Returns how many were finished (the C speedup does the same)."""
    n = 0
    for eid in eids:
        e = in_flight.get(eid)
        if e is None or e[OWNER] is not owner:
            break
        del in_flight[eid]
        _finished(floor, done, e[QID], e[QOFF])
        n += 1
    return n


def _finished(floor, done, qid, qoff):
    """Record that (qid, qoff) is finished: the floor moves past it and any finished
    offsets right above, or it waits in the done set above the floor."""
    f = floor[qid]
    if qoff == f:
        f += 1
        d = done[qid]
        if d:
            while f in d:
                d.discard(f)
                f += 1
        floor[qid] = f
    elif qoff > f:
        done[qid].add(qoff)


_inflight = speedups.load("mqserver.broker._inflight")
if _inflight is not None:
    _inflight.configure(
        (fmt.OFF_TOTAL_SIZE, fmt.OFF_QUEUE_ID, fmt.OFF_QUEUE_OFFSET, fmt.OFF_PHYSICAL_OFFSET,
         fmt.OFF_STORE_TS, fmt.OFF_EVENT_ID, fmt.OFF_BODY_LEN, fmt.HEADER_SIZE),
        (EID, QID, QOFF, LOFF, SIZE, ATTEMPTS, DEADLINE, OWNER, STARTED),
    )
    _take_fresh, _finish = _inflight.take, _inflight.finish
else:
    _take_fresh, _finish = _take_fresh_py, _finish_py


class ChannelExists(Exception):
    """A channel of that name already exists."""


def _ranges(offsets):
    out = []
    for o in sorted(offsets):
        if out and out[-1][1] == o:
            out[-1][1] = o + 1
        else:
            out.append([o, o + 1])
    return out


class Channel:
    """One channel of a topic.

    @ivar floor: queue id -> lowest queue offset not yet finished.
    @ivar done: queue id -> finished offsets above the floor.
    @ivar in_flight: eventId -> entry (see the module's entry layout).
    @ivar delivered_count: deliveries since the start (redeliveries too).
    @ivar delivered_bytes: their record bytes.
    """

    def __init__(self, registry, topic, name, positions, done=None, paused=False,
                 ephemeral=False, entered_from=None):
        """C{entered_from}: queue offsets from which messages count as having entered
        the channel (L{message_count}); by default C{positions}, so a new channel's
        backlog counts. A channel restored at start-up counts from the queues' ends."""
        self.registry = registry
        self.store = registry.store
        self.reactor = registry.reactor
        self.topic = topic
        self.name = name
        self.ephemeral = ephemeral
        self.paused = paused
        self.cursor = TopicCursor(self.store, topic, positions)
        self.floor = dict(positions)
        self.done = {q: set(done.get(q, ())) if done else set() for q in positions}
        # queue id -> the highest offset finished before a restart: only those can lie
        # ahead of the cursor (what is finished later was read first), so reads are
        # checked against done only while the cursor has not passed one of them
        self._done_ahead = {q: max(d) for q, d in self.done.items() if d}
        # A damaged record the cursor passes over is never delivered: it counts as
        # finished, so the floor moves past it.
        self.cursor.on_skip = lambda qid, qoff: _finished(self.floor, self.done, qid, qoff)
        # eventId -> entry, in deadline order while every consumer has the same timeout
        self.in_flight = {}
        self._timeouts = set()  # distinct msg_timeouts of the consumers seen
        self.requeued = deque()
        self.deferred = []  # heap of (due, eventId, entry)
        self.consumers = []
        self._entered_base = dict(entered_from if entered_from is not None else positions)
        self.delivered_count = 0
        self.delivered_bytes = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.deleted = False
        self._pump_call = None
        self._rr = 0
        self.left_for_flush = False  # arrivals left in the store for the consumer's flush

    # -- state ---------------------------------------------------------------------------

    @property
    def message_count(self):
        """Messages that entered the channel since it was made or the broker started
        (nsqd's channel C{message_count}): redeliveries do not count again."""
        n = 0
        for qid, base in self._entered_base.items():
            q = self.store.find_queue(self.topic, qid)
            if q is not None:
                n += max(0, q.max_offset - base)
        return n

    def depth(self):
        """Messages waiting to be delivered (not counting in-flight or deferred ones)."""
        n = len(self.requeued)
        for qid, pos in self.cursor.positions.items():
            q = self.store.queue(self.topic, qid)
            n += max(0, q.max_offset - max(pos, q.min_offset))
        return n

    def snapshot(self):
        """The durable part: name, paused flag and position."""
        floor, done = {}, {}
        for qid, f in self.floor.items():
            q = self.store.queue(self.topic, qid)
            if f < q.min_offset:  # retention took what was never finished
                f = self.floor[qid] = q.min_offset
                self.done[qid] = {o for o in self.done[qid] if o >= f}
            floor[str(qid)] = f
            if self.done[qid]:
                done[str(qid)] = _ranges(self.done[qid])
        return {"topic": self.topic, "name": self.name, "paused": self.paused,
                "floor": floor, "done": done}

    # -- consumers -----------------------------------------------------------------------

    def add_consumer(self, consumer):
        """Attach C{consumer}; it receives messages while it has free RDY slots."""
        self.consumers.append(consumer)
        self._timeouts.add(consumer.msg_timeout)
        self.schedule_pump()

    def remove_consumer(self, consumer):
        """Detach C{consumer}. Its in-flight messages stay in flight until they time out
        (as nsqd does). An ephemeral channel goes away with its last consumer."""
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        if self.ephemeral and not self.consumers:
            self.registry.delete_channel(self.topic, self.name)

    def schedule_pump(self):
        """Deliver soon (coalesces many triggers in one reactor turn into one pass)."""
        if self._pump_call is None and not self.deleted and not self.registry.stopped:
            self._pump_call = call_soon(self.reactor, self.pump)

    def arrived(self, queue_id):
        """The store has new messages in C{queue_id}: pump soon, or leave them for the
        consumer's flush (see the module docstring)."""
        consumers = self.consumers
        if len(consumers) == 1:
            room = consumers[0].defer_room
            positions = self.cursor.positions
            pos = positions.get(queue_id) if len(positions) == 1 else None
            if room and pos is not None and not self.requeued:
                if self.store.queue(self.topic, queue_id).max_offset - pos <= room:
                    self.left_for_flush = True
                    return
        self.schedule_pump()

    def pump_deferred(self):
        """Hand over the arrivals L{arrived} left in the store (the consumer is about to
        flush)."""
        if self.left_for_flush:
            self.pump()

    def cancel_pump(self):
        """Cancel the pump L{schedule_pump} armed, if any."""
        if self._pump_call is not None and self._pump_call.active():
            self._pump_call.cancel()
        self._pump_call = None

    def pump(self):
        """Give ready consumers as many messages as their free RDY slots allow, in
        round-robin chunks of L{SHARE_CHUNK} when several are ready (so they share)."""
        if self._pump_call is not None:
            # called directly (a FETCH) with one armed: this pass does its work, and a
            # call left armed but unreferenced could not be cancelled at stop
            self.cancel_pump()
        self.left_for_flush = False  # this pass takes what waits
        if (self.paused or self.deleted or self.registry.stopped
                or self.topic in self.registry.paused_topics):
            return
        consumers = self.consumers
        if len(consumers) == 1:
            # one consumer (the usual channel): what the round robin below does for one
            c = consumers[0]
            free = c.rdy - c.in_flight
            if free > 0 and c.can_receive:
                items = self._take(c, free)
                if items:
                    c.in_flight += len(items)
                    self.delivered_count += len(items)
                    c.deliver(items)
            return
        ready = [c for c in consumers if c.can_receive and c.rdy > c.in_flight]
        if not ready:
            return
        self._rr = start = (self._rr + 1) % len(ready)
        ready = ready[start:] + ready[:start]
        chunk = SHARE_CHUNK if len(ready) > 1 else None
        while ready:
            still = []
            for c in ready:
                free = c.rdy - c.in_flight
                if free <= 0 or not c.can_receive:
                    continue
                want = min(free, chunk) if chunk else free
                items = self._take(c, want)
                if not items:
                    return
                c.in_flight += len(items)
                self.delivered_count += len(items)
                c.deliver(items)
                if len(items) == want and c.rdy > c.in_flight:
                    still.append(c)
            ready = still

    def _take(self, owner, n):
        out = []
        append = out.append
        now = self.reactor.seconds()
        deadline = now + owner.msg_timeout
        in_flight = self.in_flight
        requeued = self.requeued
        while requeued and len(out) < n:
            e = requeued.popleft()
            view = self.store.read_sound_record(e[LOFF], e[SIZE])
            if view is None:  # damaged since it was first read: reported, passed over
                in_flight.pop(e[EID], None)
                _finished(self.floor, self.done, e[QID], e[QOFF])
                continue
            e[ATTEMPTS] += 1
            e[DEADLINE] = deadline
            e[OWNER] = owner
            e[STARTED] = now
            in_flight[e[EID]] = e
            self.delivered_bytes += e[SIZE]
            body = view.body
            append((view.store_ts * _MS_NS, e[ATTEMPTS], e[EID], body, 0, len(body)))
        rate = owner.sample_rate
        done = self.done
        read_span = self.cursor.read_span
        take_fresh = _take_fresh
        while len(out) < n:
            check = rate or (self._done_ahead and self._restored_ahead())
            buf, locs = read_span(n - len(out))
            if not locs:
                break
            if check:
                # Skip what was finished before a restart; sampling consumes what it
                # leaves out without delivering it.
                keep = []
                for loc in locs:
                    _, qid, qoff, _, _, _, _ = _FIELDS(buf, loc[0])
                    d = done[qid]
                    if d and qoff in d:
                        continue
                    if rate and random.random() * 100 >= rate:
                        _finished(self.floor, done, qid, qoff)
                        continue
                    keep.append(loc)
                locs = keep
            take_fresh(buf, locs, in_flight, deadline, owner, now, _MS_NS, out)
            self.delivered_bytes += sum(map(_size_of, locs))
        if out:
            self.registry.arm(self)
        return out

    def _restored_ahead(self):
        """True while an offset finished before the restart lies at or past the
        cursor; forgets the queues whose cursor has passed theirs."""
        ahead, pos = self._done_ahead, self.cursor.positions
        for qid in [q for q, top in ahead.items() if pos.get(q, top + 1) > top]:
            del ahead[qid]
        return bool(ahead)

    # -- FIN / REQ / TOUCH ---------------------------------------------------------------

    def _owned(self, eid, owner):
        e = self.in_flight.get(eid)
        if e is None:
            return None, "ID not in flight"
        if e[OWNER] is not owner:
            return None, "client does not own message"
        return e, None

    def finish(self, eid, owner):
        """FIN: forget the message. Returns None, or the reason it failed."""
        if self.finish_many((eid,), owner):
            return None
        return "ID not in flight" if eid not in self.in_flight else "client does not own message"

    def finish_many(self, eids, owner):
        """FIN a run of messages in order, stopping at the first that fails.

        Returns how many were finished; the caller handles the one at that index (if
        any) on its own (L{finish} tells why it fails)."""
        n = _finish(eids, self.in_flight, owner, self.floor, self.done)
        if n:
            owner.in_flight -= n
            self.store.mark_dirty()
            if self._pump_call is None:
                self.schedule_pump()
        return n

    def requeue(self, eid, owner, delay_ms):
        """REQ: back to the channel now, or after C{delay_ms}. Returns None or a reason."""
        e, why = self._owned(eid, owner)
        if e is None:
            return why
        del self.in_flight[eid]
        owner.in_flight -= 1
        e[OWNER] = None
        self.requeue_count += 1
        if delay_ms > 0:
            heapq.heappush(self.deferred, (self.reactor.seconds() + delay_ms / 1000.0, eid, e))
            self.registry.arm(self)
        else:
            self.requeued.append(e)
        self.schedule_pump()
        return None

    def touch(self, eid, owner, max_timeout):
        """TOUCH: push the deadline to now + the consumer's timeout (capped at the attempt's
        start + C{max_timeout} seconds). Returns None or a reason."""
        e, why = self._owned(eid, owner)
        if e is None:
            return why
        e[DEADLINE] = min(self.reactor.seconds() + owner.msg_timeout, e[STARTED] + max_timeout)
        del self.in_flight[eid]
        self.in_flight[eid] = e  # keep the table in deadline order
        return None

    def scan(self, now):
        """Requeue expired in-flight messages and due deferred ones. Returns True while
        the channel still has something to watch."""
        in_flight = self.in_flight
        if len(self._timeouts) <= 1:
            expired = []
            for eid, e in in_flight.items():
                if e[DEADLINE] > now:
                    break  # the table is in deadline order
                expired.append(eid)
        else:
            expired = [eid for eid, e in in_flight.items() if e[DEADLINE] <= now]
        for eid in expired:
            e = in_flight.pop(eid)
            e[OWNER].in_flight -= 1
            e[OWNER] = None
            self.requeued.append(e)
            self.timeout_count += 1
        deferred = self.deferred
        moved = bool(expired)
        while deferred and deferred[0][0] <= now:
            self.requeued.append(heapq.heappop(deferred)[2])
            moved = True
        if moved:
            self.schedule_pump()
        return bool(in_flight or deferred)

    def empty(self):
        """Drop everything queued, in flight and deferred; only new messages will come."""
        for c in {e[OWNER] for e in self.in_flight.values()} | set(self.consumers):
            c.in_flight = 0
        self.in_flight.clear()
        self.requeued.clear()
        self.deferred = []
        ends = {qid: self.store.queue(self.topic, qid).max_offset for qid in self.cursor.positions}
        self.cursor.positions = dict(ends)
        self.floor = dict(ends)
        self.done = {q: set() for q in ends}
        self._done_ahead = {}
        self.store.mark_dirty()

    def rewind(self, positions):
        """Move the channel to C{positions} (queue id -> offset): what is in flight,
        requeued or deferred is dropped (a later FIN of it fails as "not in flight"),
        and consumers go on from there. Messages read again count as entering again."""
        for c in {e[OWNER] for e in self.in_flight.values()} - {None}:
            c.in_flight = 0
        self.in_flight.clear()
        self.requeued.clear()
        self.deferred = []
        for qid, pos in positions.items():
            old = self.cursor.positions.get(qid, pos)
            if pos < old:
                self._entered_base[qid] = self._entered_base.get(qid, old) - (old - pos)
        self.cursor.positions = dict(positions)
        self.floor = dict(positions)
        self.done = {q: set() for q in positions}
        self._done_ahead = {}
        self.store.mark_dirty()
        self.schedule_pump()

    def close(self):
        """Stop for good (deleted): consumers are the caller's business."""
        self.deleted = True
        self.cancel_pump()
        self.registry.broker.close_cursor(self.cursor)
