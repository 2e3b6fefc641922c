"""Pending delayed messages.

A DELAY is one admin record holding the trigger time and the messages; it takes one
eventId. When it fires, the broker writes the messages as ordinary message records (one
eventId each) in a single write, each with the property ``MQ_DELAY_ID`` naming the delay.
Replaying those records tells recovery that the delay fired; since one write can only be
cut short at its end, a delay whose messages are only partly in the log is re-fired for
the missing tail, so a delayed message is neither lost nor duplicated by a crash.
"""

import heapq
from dataclasses import dataclass

from mqserver.store.format import DELAY_PROPERTY

__all__ = ["DELAY_PROPERTY", "DelayIndex", "PendingDelay"]


@dataclass(slots=True)
class PendingDelay:
    """One delay waiting for its trigger time.

    @ivar applied: how many of its messages are already in the log (a crash mid-apply).
    """

    event_id: int
    trigger_ms: int
    topic: str
    log_offset: int
    size: int
    count: int
    applied: int = 0


class DelayIndex:
    """Pending delays by eventId, with a heap by trigger time."""

    def __init__(self):
        self.pending = {}
        self._heap = []

    def add(self, delay):
        """Register C{delay} (a L{PendingDelay})."""
        self.pending[delay.event_id] = delay
        heapq.heappush(self._heap, (delay.trigger_ms, delay.event_id))

    def note_applied(self, event_id):
        """A message of delay C{event_id} was found in the log (replay)."""
        d = self.pending.get(event_id)
        if d is not None:
            d.applied += 1
            if d.applied >= d.count:
                del self.pending[event_id]

    def remove(self, event_id):
        """Forget delay C{event_id} (it fired, or its topic is gone)."""
        self.pending.pop(event_id, None)

    def next_trigger(self):
        """Return the earliest trigger time, or None."""
        while self._heap and self._heap[0][1] not in self.pending:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def due(self, now_ms, limit=100):
        """Pop and return up to C{limit} delays whose trigger time has come."""
        out = []
        while self._heap and len(out) < limit:
            trigger, eid = self._heap[0]
            if eid not in self.pending:
                heapq.heappop(self._heap)
                continue
            if trigger > now_ms:
                break
            heapq.heappop(self._heap)
            out.append(self.pending[eid])
        return out

    def snapshot(self):
        """Return the pending delays as JSON-ready data."""
        return [
            [d.event_id, d.trigger_ms, d.topic, d.log_offset, d.size, d.count, d.applied]
            for d in self.pending.values()
        ]

    def restore(self, data):
        """Replace the pending delays with what L{snapshot} returned."""
        self.pending = {}
        self._heap = []
        for row in data:
            self.add(PendingDelay(*row))
