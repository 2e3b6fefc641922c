"""Applying a master's records on a slave, with the master's eventIds.

The applier knows nothing of the wire: the follower (in the smss front door) parses the
replication stream and calls it. Records are applied through the store's ordinary write
path (same group commit, same recovery), with the master's eventId and write time.
Ids the slave already holds are skipped, so resuming from an older position, or inside a
multi-message record, neither duplicates nor loses anything.
"""

from twisted.logger import Logger


class Applier:
    """The slave's write path and its replication position.

    @ivar last_record_event_id: the first eventId of the last applied record (what a
        reference smss master wants back in REPLICA to resume after that record).
    @ivar applied_event_id: the last eventId the slave holds.
    @ivar lag_ms: master write time to slave apply time of the last record, in ms.
    @ivar records: records applied since start.
    @ivar gaps: eventId gaps in the master's stream since start (records the master
        could not send because they are damaged there).
    @ivar stalled: the slave is stalled (see L{check_stall}): its master is ahead and
        its applied eventId has not moved for the stall limit.
    @ivar master_event_id: the master's last eventId as last learned (0 before).
    """

    log = Logger()
    state_name = "replica"

    def __init__(self, broker):
        self.broker = broker
        self.store = broker.store
        self.last_record_event_id = None
        self.lag_ms = 0
        self.records = 0
        self.master_write_time = 0
        self.connected = False
        self.gaps = 0
        self.stalled = False
        self.master_event_id = 0
        self._stalled_at = 0  # the applied eventId the stall was found at
        self._progress_id = self.applied_event_id
        self._progress_ms = broker.now_ms()
        broker.register_state(self.state_name, self)

    @property
    def applied_event_id(self):
        return self.store.next_event_id - 1

    def since_progress_ms(self, now_ms):
        """Return the ms since the applied eventId last moved, or since
        L{restart_progress}, whichever is later (as seen by the calls)."""
        applied = self.applied_event_id
        if applied != self._progress_id:
            self._progress_id, self._progress_ms = applied, now_ms
        return max(0, now_ms - self._progress_ms)

    def restart_progress(self, now_ms):
        """Count the time without progress from now (a new connection to the master)."""
        self.since_progress_ms(now_ms)
        self._progress_ms = now_ms

    def check_stall(self, master_event_id, now_ms, limit_ms):
        """Apply the stall rule with the master's last eventId: the slave is stalled when
        the master is ahead of it and its applied eventId has not moved for
        C{limit_ms}. Logs once when a stall starts. Returns L{stalled}."""
        self.master_event_id = master_event_id
        applied = self.applied_event_id
        if master_event_id <= applied:
            self._end_stall()
        elif self.since_progress_ms(now_ms) >= limit_ms and not self.stalled:
            self.stalled = True
            self._stalled_at = applied
            self.log.warn(
                "replication stalled: the applied eventId {applied} has not moved for"
                " {s}s while the master is at {master}; reconnecting",
                applied=applied, s=round(limit_ms / 1000.0, 3), master=master_event_id,
            )
        return self.stalled

    def check_moving(self):
        """End a stall once the applied eventId moved past where it stalled."""
        if self.applied_event_id > self._stalled_at:
            self._end_stall()

    def _end_stall(self):
        if self.stalled:
            self.stalled = False
            self.log.info("replication moving again: applied eventId {applied}",
                          applied=self.applied_event_id)

    def resume_point(self, requested=0):
        """Return the eventId to send in REPLICA: the requested start when it is ahead
        of us, else our own last applied record; or the last eventId our log holds when
        the log no longer ends with that record: cut since, or gone on in a term that
        began after it (this member led since, and wrote records no master sent it)."""
        own = self.last_record_event_id
        held = self.applied_event_id
        epochs = self.broker.epochs
        if own is None or own > held or epochs and epochs[-1][1] > own:
            own = held
        return max(requested, own)

    def _check_gap(self, first_id):
        # The master never ships a record that fails its CRC: it sends the next sound
        # one, so the slave sees the eventIds in between missing, and says so.
        expected = self.store.next_event_id
        if first_id > expected and self.applied_event_id > 0:
            self.gaps += 1
            self.log.warn(
                "replication gap: eventIds {first}..{last} are missing from the master's"
                " stream (damaged there); going on from {next}",
                first=expected, last=first_id - 1, next=first_id,
            )

    def _note(self, first_id, last_id, write_time):
        # Resume after this record only once the store holds it whole: one whose write
        # failed (a full disk) must be sent again.
        if self.store.next_event_id > last_id:
            self.last_record_event_id = first_id
        self.master_write_time = write_time
        self.lag_ms = max(0, self.broker.now_ms() - write_time)
        self.records += 1
        self.store.mark_dirty()

    def messages(self, first_id, topic, items, write_time, delay_event_id=None, ends=None):
        """Apply a record of messages (C{items}: [(queue id, Message)]) whose first
        eventId is C{first_id}. Returns a Deferred (durability), or None if skipped.

        C{ends}: None (the items are one write of the master), or bytes as long as
        C{items}, nonzero where one of the master's writes ends (several records of the
        same store time applied at once: each write keeps its end, L{Writer.put})."""
        self._check_gap(first_id)
        skip = max(0, self.store.next_event_id - first_id)
        todo = items[skip:]
        last = None
        eid = first_id + skip
        i = 0
        while i < len(todo):
            qid = todo[i][0]
            j = i
            while j < len(todo) and todo[j][0] == qid:
                j += 1
            msgs = [m for _, m in todo[i:j]]
            last = self.store.put_messages(topic, qid, msgs, now_ms=write_time, event_id=eid,
                                           ends=None if ends is None else ends[skip + i:skip + j])
            eid += j - i
            i = j
        if delay_event_id is not None and todo:
            self.broker.delays.remove(delay_event_id)
            self.broker.store.mark_dirty()
        self._note(first_id, first_id + len(items) - 1, write_time)
        return last

    def admin(self, event_id, op, topic, body, write_time):
        """Apply one admin record. Returns a Deferred, or None if already held."""
        if event_id < self.store.next_event_id:
            self._note(event_id, event_id, write_time)
            return None
        self._check_gap(event_id)
        d = self.store.put_admin(op, topic, body, now_ms=write_time, event_id=event_id)
        self._note(event_id, event_id, write_time)
        return d

    def committed(self, event_id):
        """The master committed every write up to C{event_id}: consumers here see the
        writes up to it, and later ones once it commits them too. None: the master
        holds nothing back (no synchronous replication), so neither do we."""
        if event_id is None:
            self.store.stop_following_commits()
        else:
            self.store.follow_commits(event_id)

    def copy_topics(self, topics):
        """Copy topic metadata from the master's VALID LIST (a slave starting in the
        middle of the master's log): they enter the registry as the master has them."""
        for t in topics:
            if t.name not in self.broker.registry.topics:
                self.broker.registry.topics[t.name] = t
        self.store.mark_dirty()

    def status(self):
        """Return the replication status as a JSON-ready dict."""
        return {
            "role": "slave",
            "appliedEventId": self.applied_event_id,
            "lastRecordEventId": self.last_record_event_id or 0,
            "lagMs": self.lag_ms,
            "masterWriteTime": self.master_write_time,
            "connected": self.connected,
            "records": self.records,
            "gaps": self.gaps,
            "stalled": self.stalled,
            "masterEventId": self.master_event_id,
            "sinceProgressMs": self.since_progress_ms(self.broker.now_ms()),
            "committedEventId": self.store.commit_point,
        }

    # broker extension state (the checkpoint)

    def snapshot_state(self):
        return {"lastRecordEventId": self.last_record_event_id}

    def restore_state(self, state):
        self.last_record_event_id = (state or {}).get("lastRecordEventId")


