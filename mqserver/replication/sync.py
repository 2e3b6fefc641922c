"""Synchronous replication on a master: a write is acknowledged once enough followers
hold it.

Followers that confirm (mqserver followers, which negotiate it on their replication
connection: see L{protocols.smss.replica}) are attached to the L{SyncGate} while their
connection lasts and report the highest eventId they hold durably at their own flush
level. The I{commit point} is the eventId that C{replicas} of them have confirmed. The
store holds every write back from consumers until the commit point passes it, and its
client's answer waits for the same (L{mqserver.store.notify.Notifier}); the gate only
counts.
"""

import heapq
import itertools
from collections import deque

from twisted.internet import defer

from mqserver.errors import ReplicasUnavailable, ReplicationError, ReplicationTimeout


class SyncGate:
    """Confirmations of the attached followers, and the writes waiting for them.

    @ivar replicas: how many followers must hold a write before it is acknowledged.
    @ivar timeout: seconds a write waits for them before it fails.
    @ivar fallbehind_bytes: a follower whose feed is more than this many bytes of log
        behind does not count as available (None: no limit).
    @ivar committed_event_id: the commit point (never goes back).
    @ivar on_commit: called with the new commit point whenever it moves.
    @ivar timeouts: writes that failed because confirmations came too late.
    @ivar unavailable: writes that failed at once for want of followers.
    @ivar refusing: why every write fails from now on (L{fail_all}), or None.
    """

    def __init__(self, reactor, replicas, timeout_ms, fallbehind_bytes=None):
        self._reactor = reactor
        self.replicas = replicas
        self.timeout = timeout_ms / 1000.0
        self.fallbehind_bytes = fallbehind_bytes
        self.committed_event_id = 0
        #: the commit point the last checkpoint held (None: none was kept)
        self.restored_event_id = None
        self.on_commit = None
        self._commit_listeners = []
        self.timeouts = 0
        self.unavailable = 0
        self._confirmed = {}  # follower -> the highest eventId it confirmed
        # the writes waiting: a heap by eventId (confirmations release them), and the same
        # entries [eventId, sequence, Deferred or None once done, deadline] in the order
        # they came, which is the order of their deadlines (one timeout for all), so one
        # timer serves them all
        self._waiting = []
        self._deadlines = deque()
        self._timer = None
        self._sequence = itertools.count()
        self.refusing = None

    # -- followers -------------------------------------------------------------------

    def attach(self, follower, confirmed=0):
        """Count C{follower} (an object with C{behind_bytes()}) from now on."""
        self._confirmed[follower] = confirmed
        self._advance()

    def detach(self, follower):
        """Stop counting C{follower} (its connection is gone). Writes already waiting
        keep waiting for the others, or for their timeout."""
        self._confirmed.pop(follower, None)

    def confirm(self, follower, event_id):
        """C{follower} holds every record up to C{event_id} durably."""
        if event_id > self._confirmed.get(follower, event_id):
            self._confirmed[follower] = event_id
            self._advance()

    def confirmed(self, follower):
        """Return the highest eventId C{follower} confirmed, or None if not attached."""
        return self._confirmed.get(follower)

    def add_commit_listener(self, callback):
        """Call C{callback()} whenever the commit point moves (after L{on_commit})."""
        self._commit_listeners.append(callback)

    def remove_commit_listener(self, callback):
        """Stop calling C{callback}."""
        if callback in self._commit_listeners:
            self._commit_listeners.remove(callback)

    def followers(self):
        """Return the attached followers."""
        return list(self._confirmed)

    def available(self):
        """Return True when enough attached followers are close enough to count."""
        limit = self.fallbehind_bytes
        if limit is None:  # asked on every write: no follower to look at
            return len(self._confirmed) >= self.replicas
        caught_up = sum(1 for f in self._confirmed if f.behind_bytes() <= limit)
        return caught_up >= self.replicas

    # -- writes ----------------------------------------------------------------------

    def wait(self, event_id, result=None):
        """Return a Deferred that fires with C{result} (the write's L{PutResult}) once
        C{replicas} followers hold C{event_id}; it fails with L{ReplicasUnavailable} at
        once when too few are attached and caught up, and with L{ReplicationTimeout}
        after L{timeout}, each a L{ReplicationError} carrying C{result} as its
        C{put_result}."""
        if event_id <= self.committed_event_id:
            return defer.succeed(result)
        if self.refusing is not None:
            return defer.fail(ReplicationError(self.refusing, result))
        if not self.available():
            self.unavailable += 1
            return defer.fail(ReplicasUnavailable(
                f"{len(self._confirmed)} of {self.replicas} replicas connected and caught up",
                result))
        d = defer.Deferred()
        entry = [event_id, next(self._sequence), d, self._reactor.seconds() + self.timeout,
                 result]
        heapq.heappush(self._waiting, entry)
        self._deadlines.append(entry)
        if self._timer is None:
            self._timer = self._reactor.callLater(self.timeout, self._expire)
        return d

    def fail_all(self, why):
        """Acknowledge nothing more: every write waiting fails at once with
        L{ReplicationError}(C{why}), and so does every later one not yet confirmed (a
        leader that lost its leadership; its unconfirmed writes stay in its log, to be
        cut or confirmed under the next leader)."""
        self.refusing = why
        waiting, self._waiting = self._waiting, []
        self._deadlines.clear()
        self._stop_timer()
        for entry in sorted(waiting):
            d = entry[2]
            if d is not None:
                entry[2] = None
                d.errback(ReplicationError(why, entry[4]))

    def _expire(self):
        # Fail the writes past their deadline, oldest first; the timer is set again for
        # the next one still waiting (if any).
        self._timer = None
        deadlines = self._deadlines
        now = self._reactor.seconds()
        while deadlines:
            entry = deadlines[0]
            d = entry[2]
            if d is not None and entry[3] > now:
                self._timer = self._reactor.callLater(entry[3] - now, self._expire)
                return
            deadlines.popleft()
            if d is None:
                continue  # confirmed (or failed) already
            entry[2] = None  # left in the heap; _advance skips it
            self.timeouts += 1
            d.errback(ReplicationTimeout(
                f"no {self.replicas} replicas confirmed eventId {entry[0]} within "
                f"{self.timeout * 1000:.0f} ms", entry[4]))

    def _stop_timer(self):
        if self._timer is not None:
            if self._timer.active():
                self._timer.cancel()
            self._timer = None

    def _commit_point(self):
        if len(self._confirmed) < self.replicas:
            return self.committed_event_id
        if self.replicas == 1:
            return max(self._confirmed.values())
        return sorted(self._confirmed.values(), reverse=True)[self.replicas - 1]

    def _advance(self):
        point = self._commit_point()
        if point <= self.committed_event_id:
            return
        self.committed_event_id = point
        if self.on_commit is not None:
            self.on_commit(point)
        for cb in self._commit_listeners:
            cb()
        waiting = self._waiting
        while waiting and waiting[0][0] <= point:
            entry = heapq.heappop(waiting)
            d = entry[2]
            if d is not None:
                entry[2] = None
                d.callback(entry[4])
        # The confirmed at the head of the deadlines are done with. The timer stays
        # armed while none waits (it then fires once, finds nothing and disarms): one
        # timer per timeout, not a timer set and cancelled per write.
        deadlines = self._deadlines
        while deadlines and deadlines[0][2] is None:
            deadlines.popleft()

    # the checkpoint keeps the commit point, so that a restarted master shows consumers
    # only what enough followers had confirmed (L{mqserver.store.notify.Notifier.hide_after})

    def snapshot_state(self):
        return {"committedEventId": self.committed_event_id}

    def restore_state(self, state):
        self.restored_event_id = (state or {}).get("committedEventId")
        if self.restored_event_id is not None:
            self.committed_event_id = max(self.committed_event_id, self.restored_event_id)

    def stop(self):
        """Cancel the timer of the writes still waiting (the broker is stopping)."""
        self._stop_timer()
        self._waiting = []
        self._deadlines.clear()
