"""Cursors: read a topic's messages in eventId order from a position.

A topic has one or more queues. A cursor keeps a consume-queue offset per queue; with one
queue it reads entries straight through, with several it merges them by eventId (the
smss view of a RocketMQ topic).
"""

from mqserver.store import format as fmt


class EventNotFound(Exception):
    """A start eventId that is not a message of the topic.

    @ivar below: True when it is below the topic's first retained message.
    """

    def __init__(self, below):
        super().__init__("can't find event id" if below else "EOF")
        self.below = below


class TopicCursor:
    """A read position in one topic.

    @ivar positions: queue id -> next consume-queue offset to read.
    @ivar on_skip: None, or C{on_skip(queue id, queue offset)} called for each damaged
        record the cursor passes over (a reader that tracks what it finished, such as an
        NSQ channel, counts them as done). It may be called more than once for one.
    """

    on_skip = None

    def __init__(self, store, topic, positions):
        self._store = store
        self.topic = topic
        self.positions = dict(positions)

    @classmethod
    def after_event(cls, store, topic, queue_ids, event_id):
        """Return a cursor just after C{event_id} (0: from the oldest retained message).

        A non-zero C{event_id} must be exactly a message of this topic, as smss requires;
        on a topic that never held a message, any eventId starts at the next message.
        Raises L{EventNotFound} otherwise."""
        queues = {qid: store.queue(topic, qid) for qid in queue_ids}
        if event_id == 0:
            return cls(store, topic, {qid: q.min_offset for qid, q in queues.items()})
        if all(q.max_offset == q.min_offset for q in queues.values()):
            return cls(store, topic, {qid: q.max_offset for qid, q in queues.items()})
        positions, found = {}, False
        for qid in queue_ids:
            qoff, exact = store.find_event(topic, qid, event_id)
            if exact:
                found = True
                qoff += 1
            positions[qid] = qoff
        if not found:
            first = min(
                store.event_id_at(q.entry(q.min_offset)[0])
                for q in queues.values()
                if q.max_offset > q.min_offset
            )
            raise EventNotFound(below=event_id < first)
        return cls(store, topic, positions)

    @classmethod
    def at_end(cls, store, topic, queue_ids):
        """Return a cursor after the last message (only new messages will be read)."""
        return cls(store, topic, {q: store.queue(topic, q).max_offset for q in queue_ids})

    def _read_queue(self, qid, max_count):
        # (buffer, locs, entries read): damaged records are not in locs (the store left
        # them out), so a reader moves on by the entries it read, not the records.
        store = self._store
        pos = self.positions[qid]
        q = store.queue(self.topic, qid)
        if pos < q.min_offset:
            pos = self.positions[qid] = q.min_offset
        entries = store.read_entries(self.topic, qid, pos, max_count)
        if not entries:
            return None, [], 0
        log_min = store.commitlog.min_offset
        skipped = 0
        # Entries whose records retention removed are skipped, not delivered.
        step = fmt.CQ_ENTRY_SIZE
        while skipped * step < len(entries) and fmt.CQ_ENTRY.unpack_from(entries, skipped * step)[0] < log_min:
            skipped += 1
        if skipped:
            self.positions[qid] += skipped
            entries = entries[skipped * step :]
            if not entries:
                return None, [], 0
        buf, locs = store.read_records(entries)
        n = len(entries) // fmt.CQ_ENTRY_SIZE
        if len(locs) < n and self.on_skip is not None:
            self._skipped(qid, self.positions[qid], n, buf, locs)
        return buf, locs, n

    def _skipped(self, qid, pos, n, buf, locs):
        # The queue offsets among pos..pos+n-1 that the store left out (damaged).
        kept = {fmt.I64.unpack_from(buf, p + fmt.OFF_QUEUE_OFFSET)[0] for p, _ in locs}
        for qoff in range(pos, pos + n):
            if qoff not in kept:
                self.on_skip(qid, qoff)

    def _read_merged(self, max_count):
        """Up to C{max_count} records of several queues as C{(buffer, pos, size)}, merged
        in eventId order; moves past them."""
        merged = []
        passed = True
        while passed and not merged:
            passed = self._read_each(max_count, merged)
        merged.sort(key=lambda r: r[0])
        out = []
        for eid, qid, buf, p, s in merged[:max_count]:
            # The record's own queue offset, not a count: a damaged record left out
            # before it is passed over too.
            self.positions[qid] = fmt.I64.unpack_from(buf, p + fmt.OFF_QUEUE_OFFSET)[0] + 1
            out.append((buf, p, s))
        return out

    def _read_each(self, max_count, merged):
        # Reads every queue into merged; returns True when a queue read only damaged
        # records (it moved past them, so the caller reads again).
        passed = False
        for qid in self.positions:
            buf, locs, n = self._read_queue(qid, max_count)
            if n and not locs:
                self.positions[qid] += n
                passed = True
            for p, s in locs:
                eid, = fmt.I64.unpack_from(buf, p + fmt.OFF_EVENT_ID)
                merged.append((eid, qid, buf, p, s))
        return passed

    def read_span(self, max_count):
        """Return up to C{max_count} records in eventId order as C{(buffer, [(pos, size),
        ...])}, and move past them: one queue's records straight from the store (no
        per-record tuples), several queues' merged into one buffer."""
        if len(self.positions) == 1:
            (qid,) = self.positions
            while True:
                buf, locs, n = self._read_queue(qid, max_count)
                self.positions[qid] += n
                if locs or not n:
                    return buf, locs
                # only damaged records: read on past them
        records = self._read_merged(max_count)
        if not records:
            return None, []
        if all(r[0] is records[0][0] for r in records):
            return records[0][0], [(p, s) for _, p, s in records]
        buf = b"".join(bytes(b[p:p + s]) for b, p, s in records)
        locs, pos = [], 0
        for _, _, s in records:
            locs.append((pos, s))
            pos += s
        return buf, locs

    def log_offset(self):
        """Return the lowest commit-log offset this cursor will read next (for retention),
        or None when it is at the end of every queue."""
        lowest = None
        for qid, pos in self.positions.items():
            q = self._store.queue(self.topic, qid)
            if pos < q.max_offset and pos >= q.min_offset:
                off = q.entry(pos)[0]
                lowest = off if lowest is None else min(lowest, off)
        return lowest
