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
        broker.register_state(self.state_name, self)

    @property
    def applied_event_id(self):
        return self.store.next_event_id - 1

    def resume_point(self, requested=0):
        """Return the eventId to send in REPLICA: the requested start when it is ahead
        of us, else our own last applied record."""
        own = self.last_record_event_id
        if own is None:
            own = self.applied_event_id
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

    def _note(self, first_id, write_time):
        self.last_record_event_id = first_id
        self.master_write_time = write_time
        self.lag_ms = max(0, self.broker.now_ms() - write_time)
        self.records += 1
        self.store.mark_dirty()

    def messages(self, first_id, topic, items, write_time, delay_event_id=None):
        """Apply a record of messages (C{items}: [(queue id, Message)]) whose first
        eventId is C{first_id}. Returns a Deferred (durability), or None if skipped."""
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
            last = self.store.put_messages(topic, qid, msgs, now_ms=write_time, event_id=eid)
            eid += j - i
            i = j
        if delay_event_id is not None and todo:
            self.broker.delays.remove(delay_event_id)
            self.broker.store.mark_dirty()
        self._note(first_id, write_time)
        return last

    def admin(self, event_id, op, topic, body, write_time):
        """Apply one admin record. Returns a Deferred, or None if already held."""
        if event_id < self.store.next_event_id:
            self._note(event_id, write_time)
            return None
        self._check_gap(event_id)
        d = self.store.put_admin(op, topic, body, now_ms=write_time, event_id=event_id)
        self._note(event_id, write_time)
        return d

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
        }

    # broker extension state (the checkpoint)

    def snapshot_state(self):
        return {"lastRecordEventId": self.last_record_event_id}

    def restore_state(self, state):
        self.last_record_event_id = (state or {}).get("lastRecordEventId")


