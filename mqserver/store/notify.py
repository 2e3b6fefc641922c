"""Telling waiters about new records, and which records readers may see."""

from collections import deque



class Notifier:
    """Owns what readers may see (L{visible_end}) and the listeners told of new records:
    arrival listeners (new messages in a queue), append listeners (any new record) and
    dispatch listeners (message records, written or replayed, that a listener declared
    it needs: see L{add_dispatch_listener}).

    @ivar visible_end: commit-log offset below which readers may read. At flush level 2
        it is the durable offset, so no consumer sees a message a crash could take back;
        with a sync gate (synchronous replication), the end of the last write that
        enough followers confirmed, so no consumer sees a message a failover could take
        back. On a follower of such a master, the end of the last write the master
        committed (L{follow_commits}), for the same reason.
    @ivar gate: the L{mqserver.replication.sync.SyncGate} every write waits for before
        it is acknowledged and shown to consumers, or None.
    @ivar commit_point: on a follower that shows only what its master committed, the
        master's commit point as last told (L{follow_commits}); else None.
    @ivar dispatch_listeners: the C{callback(offset, topic, properties, store_ts)}s
        called for every message record that carries properties.
    @ivar topic_dispatch_listeners: topic name -> the callbacks called for every message
        record of that topic, with properties or not.
    @ivar all_dispatch_listeners: every dispatch listener, of either kind. The writer
        tests it and L{topic_dispatch_listeners} (the very objects) before it calls
        L{dispatch}; recovery calls L{dispatch_one}.
    """

    def __init__(self, flush_level):
        self.flush_level = flush_level
        #: True when a write is as durable as asked once it is written (flush levels 0
        #: and 1 without a sync gate): L{after_write} then returns its result itself.
        self.complete_at_write = flush_level < 2
        # a write is also shown to readers once written: no gate and no commit point
        # to wait for (after_write's first test)
        self._shown_at_write = self.complete_at_write
        self.visible_end = 0
        self.dispatch_listeners = []
        self.topic_dispatch_listeners = {}
        self.all_dispatch_listeners = []
        self._arrival_listeners = []
        self._append_listeners = []
        self._pending_visible = []  # (end offset, topic, queue id) waiting for fsync
        self.commitlog = None
        self._flusher = None
        self.gate = None
        # with a gate: the end of what is durable here and may be replicated, and the
        # writes not yet confirmed: (last eventId, end offset, topic, queue id)
        self._replicable_end = 0
        self._unconfirmed = deque()
        self.commit_point = None

    def open(self, commitlog, flusher):
        """Make what C{commitlog} holds visible; at flush level 2, wait on C{flusher}."""
        self.commitlog = commitlog
        self._flusher = flusher
        self.visible_end = self._replicable_end = commitlog.end

    def set_gate(self, gate):
        """Make every later write wait for C{gate} (L{mqserver.replication.sync.SyncGate})
        before it is acknowledged or shown to consumers."""
        self.gate = gate
        self.complete_at_write = self._shown_at_write = False
        gate.on_commit = self.confirmed
        self.commit_point = None  # a follower promoted: its own gate commits from now on
        # set at run time (a follower promoted): what is readable now was replicated
        self._replicable_end = max(self._replicable_end, self.visible_end)

    def hide_after(self, offset, writes):
        """Show readers only the log below C{offset}: C{writes}, the (last eventId, end
        offset, topic or None, queue id) of each write after it, wait for the gate's
        confirmation (a restarted master whose checkpoint says they were not confirmed)."""
        self.visible_end = offset
        self._unconfirmed.extend(writes)

    def follow_commits(self, event_id):
        """Show readers only the writes up to C{event_id}, the commit point of the master
        this follower applies the writes of, and every later write only once the master
        commits it too (a later call). The commit point never goes back."""
        if self.gate is not None:
            return
        if self.commit_point is None:
            self.commit_point = 0
            self._shown_at_write = False
            # from now on writes wait here (what is readable now was shown already)
            self._replicable_end = max(self._replicable_end, self.visible_end)
        if event_id > self.commit_point:
            self.commit_point = event_id
        self.confirmed(self.commit_point)

    def stop_following_commits(self):
        """Show readers every write as soon as it is as durable as the flush level asks,
        again (the master followed now commits whatever it sends)."""
        if self.commit_point is None:
            return
        self.commit_point = None
        self._shown_at_write = self.complete_at_write
        held, self._unconfirmed = self._unconfirmed, deque()
        self._release(held)

    def _release(self, writes):
        # writes durable already show now; the others once durable (flush level 2)
        for last, end, topic, qid in writes:
            if end <= self._replicable_end:
                self._show(end, {(topic, qid)} if topic is not None else ())
            else:
                self._pending_visible.append((end, topic, qid))

    @property
    def replicable_end(self):
        """Commit-log offset below which records may be sent to followers: what is as
        durable here as the flush level asks (readers see the same without a gate, or
        on a follower that does not follow its master's commit point)."""
        if self.gate is None and self.commit_point is None:
            return self.visible_end
        return self._replicable_end

    def after_write(self, result, topic, queue_id):
        """Return C{result} when the write that ended the log is already as durable as
        the flush level asks (levels 0 and 1), else a Deferred firing with it once it
        is; tell the listeners when it is visible. C{topic} None: an admin record."""
        end = self.commitlog.end
        if self._shown_at_write:
            self.visible_end = end
            # _notify's work in line: every publish passes here
            if topic is not None:
                for cb in self._arrival_listeners:
                    cb(topic, queue_id)
            for cb in self._append_listeners:
                cb()
            return result
        if self.gate is not None:
            return self._after_write_gated(result, topic, queue_id, end)
        if self.commit_point is not None:
            return self._after_write_held(result, topic, queue_id, end)
        # flush level 2 (every other case is shown at write)
        self._pending_visible.append((end, topic, queue_id))
        return self._flusher.request(end).addCallback(lambda _: result)

    def _after_write_gated(self, result, topic, queue_id, end):
        # Durable here first (flush level 2), which lets the followers have it, then
        # confirmed by enough of them: only then answered and shown to consumers.
        last = result.event_id + len(result.sizes) - 1
        self._unconfirmed.append((last, end, topic, queue_id))
        # a write the gate fails stays in the log: the failure carries its PutResult
        if self.flush_level >= 2:
            gate = self.gate
            return self._flusher.request(end).addCallback(lambda _: gate.wait(last, result))
        self._replicable(end)
        return self.gate.wait(last, result)

    def _after_write_held(self, result, topic, queue_id, end):
        # A follower's write: durable here as the flush level asks (its confirmation to
        # the master waits for that), shown once the master commits it too.
        self._unconfirmed.append((result.event_id + len(result.sizes) - 1, end, topic,
                                  queue_id))
        if self.flush_level >= 2:
            return self._flusher.request(end).addCallback(lambda _: result)
        self._replicable(end)
        return result

    def _replicable(self, end):
        if end > self._replicable_end:
            self._replicable_end = end
            if self.commit_point is not None:
                self.confirmed(self.commit_point)  # committed before it was durable here
            for cb in self._append_listeners:
                cb()

    def confirmed(self, event_id):
        """Enough followers hold every record up to C{event_id}: show its writes (those
        durable here: on a follower the master may commit a write before it is)."""
        ready = self._unconfirmed
        durable = self._replicable_end
        if not ready or ready[0][0] > event_id or ready[0][1] > durable:
            return
        seen = set()
        end = self.visible_end
        while ready and ready[0][0] <= event_id and ready[0][1] <= durable:
            _, end, topic, qid = ready.popleft()
            if topic is not None:
                seen.add((topic, qid))
        self._show(end, seen)

    def _show(self, end, queues):
        self.visible_end = max(self.visible_end, end)
        for topic, qid in queues:
            for cb in self._arrival_listeners:
                cb(topic, qid)

    def durable(self, offset):
        """The log is durable up to C{offset}: at flush level 2, show what it holds."""
        if self.flush_level < 2:
            return
        if self.gate is not None or self.commit_point is not None:
            self._replicable(offset)
            if not self._pending_visible:
                return
            # writes that waited for this fsync before the gate was set (a follower
            # promoted): the old master had them confirmed; later ones wait for the gate
            offset = max(p[0] for p in self._pending_visible if p[0] <= offset) \
                if any(p[0] <= offset for p in self._pending_visible) else self.visible_end
        self.visible_end = max(self.visible_end, offset)
        ready = [p for p in self._pending_visible if p[0] <= offset]
        self._pending_visible = [p for p in self._pending_visible if p[0] > offset]
        seen = set()
        for _, topic, qid in ready:
            if (topic, qid) not in seen:
                seen.add((topic, qid))
                self._notify(topic, qid)

    def add_arrival_listener(self, callback):
        """Call C{callback(topic, queue_id)} whenever new messages become readable."""
        self._arrival_listeners.append(callback)

    def add_append_listener(self, callback):
        """Call C{callback()} whenever any record (message or admin) becomes readable."""
        self._append_listeners.append(callback)

    def remove_append_listener(self, callback):
        """Stop calling C{callback}."""
        if callback in self._append_listeners:
            self._append_listeners.remove(callback)

    def add_dispatch_listener(self, callback, topics=None):
        """Call C{callback(offset, topic, properties, store_ts)} for the message records
        it needs, as they are written and as they are replayed at start-up (so derived
        indexes such as L{mqserver.store.index} can be rebuilt; they must skip records
        they already hold).

        @param topics: None: every message record that carries properties (a record
            without any has no keys for the index to act on; the smss and NSQ publishes,
            which have none, then cost only the writer's check). A collection of topic
            names: every message record of those topics, with properties or not, and no
            other.
        """
        self.all_dispatch_listeners.append(callback)
        if topics is None:
            self.dispatch_listeners.append(callback)
            return
        for topic in topics:
            self.topic_dispatch_listeners.setdefault(topic, []).append(callback)

    def dispatch(self, topic, offsets, messages, store_ts):
        """Tell the dispatch listeners of C{messages} (L{Message}s, or bytes: a body
        without properties), just written to C{topic} at commit-log C{offsets}."""
        by_topic = self.topic_dispatch_listeners.get(topic, ())
        listeners = self.dispatch_listeners
        for off, m in zip(offsets, messages):
            props = b"" if type(m) is bytes else m.properties
            if props:
                for cb in listeners:
                    cb(off, topic, props, store_ts)
            for cb in by_topic:
                cb(off, topic, props, store_ts)

    def dispatch_one(self, offset, topic, properties, store_ts):
        """Tell the dispatch listeners of the message record at C{offset} (replayed at
        start-up, or a write of one message) with C{properties} (b"" for a bare body)."""
        if properties:
            for cb in self.dispatch_listeners:
                cb(offset, topic, properties, store_ts)
        for cb in self.topic_dispatch_listeners.get(topic, ()):
            cb(offset, topic, properties, store_ts)

    def _notify(self, topic, queue_id):
        # topic None: an admin record, which only log readers (replication) care about.
        if topic is not None:
            for cb in self._arrival_listeners:
                cb(topic, queue_id)
        for cb in self._append_listeners:
            cb()
