"""Cursors: read a topic's messages in eventId order from a position.

A topic has one or more queues. A cursor keeps a consume-queue offset per queue; with one
queue it reads entries straight through, with several it merges them by eventId (the
smss view of a RocketMQ topic).
"""

import heapq

from mqserver.store import format as fmt

#: Consume-queue entries a merged read takes from a queue at a time.
_MERGE_READ = 32


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
        newest = store.newest_record(self.topic, qid, pos)
        if newest is not None:  # keeping up with a publisher: the record just written
            if not newest:  # past it: nothing more
                return None, [], 0
            return newest, [(0, len(newest))], 1
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

    def _merged_entries(self, max_count):
        """The consume-queue entries of the next C{max_count} records of all queues, as
        C{(log offset, queue id, queue offset, entry)} in eventId order; moves past them.

        The log is append-only and eventIds only grow, so log offset order is eventId
        order: the merge needs the entries only, and just the records taken are read.
        (Reading C{max_count} records from every queue and keeping C{max_count} of them
        cost up to a MiB per queue for one batch: 1024 queues, a GiB.)"""
        store = self._store
        sources = []
        for qid, pos in self.positions.items():
            q = store.queue(self.topic, qid)
            if pos < q.min_offset:
                pos = self.positions[qid] = q.min_offset
            sources.append(self._entries(qid, pos, max_count))
        log_min = store.commitlog.min_offset
        taken = []
        for item in heapq.merge(*sources):
            self.positions[item[1]] = item[2] + 1
            if item[0] < log_min:
                continue  # retention removed the record: passed over, not delivered
            taken.append(item)
            if len(taken) == max_count:
                break
        return taken

    def _entries(self, qid, pos, limit):
        # The entries of queue qid from pos (at most limit), read a few at a time as the
        # merge asks for them.
        read = self._store.read_entries
        step = fmt.CQ_ENTRY_SIZE
        while limit > 0:
            entries = read(self.topic, qid, pos, min(limit, _MERGE_READ))
            if not entries:
                return
            for i, (off, _, _) in enumerate(fmt.CQ_ENTRY.iter_unpack(entries)):
                yield off, qid, pos + i, entries[i * step:(i + 1) * step]
            n = len(entries) // step
            pos += n
            limit -= n

    def _skipped_merged(self, taken, buf, locs):
        # The taken entries whose records the store left out (damaged).
        kept = {(fmt.I32.unpack_from(buf, p + fmt.OFF_QUEUE_ID)[0],
                 fmt.I64.unpack_from(buf, p + fmt.OFF_QUEUE_OFFSET)[0]) for p, _ in locs}
        for _, qid, qoff, _ in taken:
            if (qid, qoff) not in kept:
                self.on_skip(qid, qoff)

    def read_span(self, max_count):
        """Return up to C{max_count} records in eventId order as C{(buffer, [(pos, size),
        ...])}, and move past them: one queue's records straight from the store (no
        per-record tuples), several queues' merged by their consume-queue entries and
        read in one call."""
        if len(self.positions) == 1:
            (qid,) = self.positions
            while True:
                buf, locs, n = self._read_queue(qid, max_count)
                self.positions[qid] += n
                if locs or not n:
                    return buf, locs
                # only damaged records: read on past them
        while True:
            taken = self._merged_entries(max_count)
            if not taken:
                return None, []
            buf, locs = self._store.read_records(b"".join([t[3] for t in taken]))
            if len(locs) < len(taken) and self.on_skip is not None:
                self._skipped_merged(taken, buf, locs)
            if locs:
                return buf, locs
            # only damaged records: read on past them

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
