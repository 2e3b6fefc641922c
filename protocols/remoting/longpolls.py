"""Long polling (as RocketMQ 4.9.4's PullRequestHoldService): PULLs that found nothing,
parked until a message arrives in their queue or their suspend time is up.

A parked pull costs no Deferred and no timer of its own: its connection answers it
itself when it finishes (C{protocol.finish_pull}), and one timer per door, set for the
earliest deadline of the pulls parked, answers those whose time is up. A consumer
keeping up parks one pull per message, each answered by the next message long before
its deadline, so that timer rarely fires (about once per suspend time) and never needs
to move.

A message that arrives for a pull parked less than C{batch} seconds before
(C{rocketmq.longPollBatchMs}) does not wake it at once: the queue's parked pulls run
again up to C{batch} later, with every message that arrived meanwhile. A consumer keeping
up with a busy queue then gets several messages per answer instead of one answer, and
one more PULL to read, per message. The 4.9 broker's wait is of the same size: its reput
service, which tells held pulls of arrivals, passes over the commit log once a
millisecond. A pull parked longer (a consumer waiting on a quiet queue) is answered at
once, as before.
"""

from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from mqserver.interfaces import IWatcher

log = Logger()
_NEVER = float("inf")
#: A parked pull whose deadline is this close (seconds) when the timer fires is answered
#: then: the timer's time and a deadline may differ by a rounding of the clock's float.
EARLY = 0.001


class Hold:
    """A parked pull waiting for a message or its deadline (reactor seconds)."""

    __slots__ = ("protocol", "cmd", "args", "deadline", "parked", "done")

    def __init__(self, protocol, cmd, args, deadline, parked):
        self.protocol = protocol
        self.cmd = cmd
        self.args = args  # (topic, queue id, ...): what finish_pull needs to run it again
        self.deadline = deadline
        self.parked = parked  # reactor seconds when it was parked
        self.done = False


@implementer(IWatcher)
class LongPolls:
    """Parked pulls per (topic, queue), woken by the broker's arrival notifications; each
    is answered at its deadline at the latest (no more than L{EARLY} before it)."""

    def __init__(self, broker, reactor, batch=0.0):
        """@param batch: seconds an arrival waits before it runs the pulls parked on its
            queue less than that long before (0: at once; see the module docstring)."""
        self.broker = broker
        self.reactor = reactor
        self.batch = batch
        self.holds = {}  # (topic, qid) -> list of Hold, in the order parked
        self._watched = set()
        self._timer = None  # the one DelayedCall, at self._timer_at
        self._timer_at = _NEVER
        self._due = set()  # (topic, qid) whose parked pulls the batch timer runs
        self._wake = None  # that timer
        if batch:  # chosen once: with no batch an arrival tests nothing more
            self.data_available = self._arrived_in_batch

    def park(self, protocol, cmd, args, hold_ms):
        """Park a pull of (C{args[0]}, C{args[1]}) for C{hold_ms}; C{protocol.finish_pull(hold,
        final)} answers it later (C{final}: its time is up, answer it whatever it finds)."""
        key = (args[0], args[1])
        now = self.reactor.seconds()
        h = Hold(protocol, cmd, args, now + hold_ms / 1000.0, now)
        lst = self.holds.get(key)
        if lst is None:
            self.holds[key] = [h]
            if key[0] not in self._watched:
                self._watched.add(key[0])
                self.broker.watch(key[0], self)
        else:
            lst.append(h)
        if h.deadline < self._timer_at:  # rare: pulls usually ask for the same time
            self._set_timer(h.deadline)
        return h

    def _set_timer(self, at):
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer_at = at
        self._timer = self.reactor.callLater(max(0.0, at - self.reactor.seconds()), self._expire)

    def _expire(self):
        """Answer the parked pulls whose time is up; set the timer for the next deadline."""
        self._timer, self._timer_at = None, _NEVER
        now = self.reactor.seconds() + EARLY
        nxt = _NEVER
        for lst in list(self.holds.values()):
            for h in list(lst):
                if h.deadline <= now:
                    self._finish(h, True)
                elif h.deadline < nxt:
                    nxt = h.deadline
        if nxt < self._timer_at:
            self._set_timer(nxt)

    def _finish(self, h, final):
        if not h.done and self._run(h, final):
            self._forget(h)

    @staticmethod
    def _run(h, final):
        """Run the parked pull C{h} again; return True (and mark it done) when answered."""
        try:
            finished = h.protocol.finish_pull(h, final)
        except Exception:
            # never let one bad pull break the store's arrival notification: it is
            # answered with SYSTEM_ERROR, as a handler that raised
            finished = True
            h.protocol.request_failed(Failure(), h.cmd)
        if finished:
            h.done = True
        return finished

    def _forget(self, h):
        h.done = True
        key = (h.args[0], h.args[1])
        lst = self.holds.get(key)
        if lst is not None:
            try:
                lst.remove(h)
            except ValueError:
                pass
            if not lst:
                del self.holds[key]

    def drop(self, protocol):
        """Forget the pulls C{protocol} parked, unanswered (its connection closed)."""
        for lst in list(self.holds.values()):
            for h in [h for h in lst if h.protocol is protocol]:
                self._forget(h)

    # broker watcher interface
    def data_available(self, topic, queue_id):
        """A message arrived in (C{topic}, C{queue_id}): run the pulls parked there again."""
        key = (topic, queue_id)
        lst = self.holds.pop(key, None)
        if lst is None:
            return
        # the usual case: every pull parked there is answered (one, of a consumer
        # keeping up); those still finding nothing (the message is not readable yet, at
        # flush level 2) go back
        kept = [h for h in lst if not h.done and not self._run(h, False)]
        if kept:
            new = self.holds.get(key)  # parked while these ran
            self.holds[key] = kept + new if new else kept

    def _arrived_in_batch(self, topic, queue_id):
        """L{data_available} with a batch: pulls parked just now run again when the
        batch is due."""
        key = (topic, queue_id)
        lst = self.holds.get(key)
        if lst is None or key in self._due:
            return
        recent = self.reactor.seconds() - self.batch
        for h in lst:
            if h.parked > recent:  # a consumer keeping up: its next messages are near
                self._due.add(key)
                if self._wake is None:
                    self._wake = self.reactor.callLater(self.batch, self._batch_due)
                return
        LongPolls.data_available(self, topic, queue_id)

    def _batch_due(self):
        self._wake = None
        due, self._due = self._due, set()
        for topic, queue_id in due:
            LongPolls.data_available(self, topic, queue_id)

    def topic_deleted(self, topic):
        self._watched.discard(topic)
        for key in [k for k in self.holds if k[0] == topic]:
            for h in list(self.holds.get(key, ())):
                self._finish(h, True)

    def stop(self):
        for call in (self._timer, self._wake):
            if call is not None and call.active():
                call.cancel()
        self._wake, self._due = None, set()
        self._timer, self._timer_at = None, _NEVER
        self.holds = {}
        for topic in self._watched:
            self.broker.unwatch(topic, self)
        self._watched = set()
