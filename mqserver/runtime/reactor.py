"""An epoll reactor that polls without sleeping for a moment after each burst of I/O.

A broker answering one request at a time spends most of a round trip waking up: each
time its thread blocks in C{epoll_wait}, the next client request has to wake it through
the scheduler, which on virtual machines means an inter-processor interrupt and a VM
exit (about 60 µs each on the project VM, against about 20 µs for the whole round trip
when nobody sleeps). Go's scheduler avoids this by letting an idle thread spin briefly
before it parks; L{SpinningEPollReactor} does the same: after events it keeps calling
C{epoll_wait} with a zero timeout for up to C{spin} seconds, and only then blocks.

The spin pays only when it usually catches the next event, so the reactor keeps a running
share of the events that came later than C{spin} after it went idle (each new event
weighing an eighth) and spins only while fewer than a quarter did: a missed spin burns
the whole C{spin}, a caught one saves a wake-up (about 60 µs here), so with the default
200 µs spinning costs more than it saves past about one miss in four. A client
answering at once keeps the broker spinning; an idle broker, or steady traffic with
gaps longer than the spin, blocks in epoll as usual. (An earlier rule restored the
whole spin whenever one spin caught an event: at 2,000 msgs/s with a consumer attached
each PUB's spin caught the consumer's ack, and the spin after the ack then waited in
vain for the next PUB, which nearly doubled the broker's CPU per message;
docs/performance.md.) While it spins it yields the CPU (C{sched_yield}) between
polls, so a client scheduled on the same CPU is never kept waiting by the spinning.

A caught spin is not enough: it must also pay for itself. A wake-up costs CPU too (the
request handled after one runs on a cold cache and pays the scheduler), so the spin pays
when the CPU it burns is no more than the wake-ups it saves: then the peers that wait for
each answer get it sooner at no cost per request (one request per round trip, and a
catching-up consumer's acks). It does not pay when they send at their own pace (a
publisher at a steady rate: the next PUB comes when it comes, and a spin that waits
100 µs for it burns the CPU a wake-up would have cost a fraction of; at 10,000 PUBs/s
with a consumer attached the spin kept a core busy, 99 µs per message against 64 without
it, docs/performance.md), nor when a client takes long to turn an answer into its next
request (the RocketMQ C++ client, ~290 µs a round trip: the spin catches the request but
burns more than a wake-up to do so). When C{probe} is set the reactor measures, from time
to time once traffic flows: for C{probe_window} seconds with the spin allowed, then as
long with it off, it adds up the bytes its peers sent (C{FIONREAD} before each read, in
these windows only) and the CPU time of its thread, and allows the spin for the next
C{probe_every} seconds only when the CPU per byte with it was at most L{_PROBE_PAYS}
times that without (a window nearly idle says nothing: the miss rule alone decides, and
the next probe comes a window later). A window in which the miss rule kept the spin
off says nothing of what the spin costs either, so the spin stays off until the next
probe. Each verdict that repeats the last doubles the time it holds, up to
C{probe_every_most} seconds, and a changed one starts again from C{probe_every}: steady
traffic is probed less often, so a waiting client spends less time in windows without
the spin and a paced sender less in windows with it. Bytes are the
measure of work because neither the spin nor the reads' timing changes how many a paced
sender sends, where the count of reads would (without the spin the reactor wakes later
and reads two PUBs at once); and CPU time, not the time spent outside polls, because the request that follows a wake-up
costs more to handle (an earlier rule weighed that time and took the spin from clients
that wait for each answer: smss catch-up with batch 20 at 192k msgs/s against 308k,
`bench/spin_probe.py`).

It also dispatches events without Twisted's legacy log context (C{callWithLogger}): that
context only names the "system" of old-style C{log.msg} calls, which mqserver does not
use, and costs about as much as the rest of a small request's dispatch. A plain read
event, nearly every event a busy broker sees, goes to C{doRead} directly, with the same
error handling as Twisted's C{_doReadOrWrite}, which still handles every other event;
and C{runUntilCurrent} returns at once when no timed call is due and no thread has
queued a call, which is what it finds between most polls.

It reads EPollReactor's and ReactorBase's private attributes; L{mqserver.runtime.fastpath} checks
they exist before twistd installs it, and installs Twisted's own epoll reactor if not.
"""

import errno
import sys
from fcntl import ioctl
from os import sched_yield
from select import EPOLLIN
from termios import FIONREAD
from time import monotonic, thread_time

from twisted.internet import posixbase
from twisted.internet.epollreactor import EPollReactor
from twisted.internet.main import installReactor
from twisted.python import log

from mqserver.runtime.soon import SoonCall

__all__ = ["SpinningEPollReactor", "install", "DEFAULT_SPIN"]

#: Seconds to keep polling after the last event before blocking.
DEFAULT_SPIN = 0.0002
#: Weight of the newest event in the running share of events the spin would miss.
_MISS_WEIGHT = 0.125
#: Spin only while fewer than this share of recent events came later than the spin.
_MISS_LIMIT = 0.25
#: Seconds of each probe window (spin allowed, then off); see the module docstring.
PROBE_WINDOW = 0.05
#: Seconds between the end of one probe and the start of the next...
PROBE_EVERY = 2.0
#: ...doubled for each verdict that repeats the last, up to this.
PROBE_EVERY_MOST = 8.0
#: The spin stays allowed when the CPU per byte read with it is at most this many times
#: that without it (the margin covers the windows' noise: 0.94 to 1.02 for a client
#: waiting for each answer here, against 1.27 to 1.69 for NSQ PUBs at 10,000/s with a
#: consumer on a quiet machine, 1.16 to 1.19 on a busy one).
_PROBE_PAYS = 1.08
#: A probe window whose thread used less than this share of a CPU gives no verdict...
_PROBE_MIN_CPU = 0.02
#: ...and so does one in which the peers sent fewer bytes than this.
_PROBE_MIN_BYTES = 4096
#: At most this many bytes are counted for one read (Twisted reads 64 KiB at a time: the
#: rest is counted at the next read).
_READ_MOST = 65536
# probe phases
_HOLD, _ON, _OFF = range(3)


class SpinningEPollReactor(EPollReactor):
    """L{EPollReactor} with adaptive busy-polling (see the module docstring).

    @ivar spin: seconds to keep polling after the last event; 0 turns spinning off.
    @ivar probe: whether the spin must pay in probes (C{server.spinProbe}), not only
        catch events.
    @ivar probe_window: seconds of each window of a probe (spin allowed, then off).
    @ivar probe_every: seconds a probe's verdict holds at first.
    @ivar probe_every_most: seconds a verdict holds at most once it has repeated.
    """

    def __init__(self, spin=DEFAULT_SPIN, probe=True):
        super().__init__()
        self._last_event = 0.0
        self._soon = []  # SoonCalls for the next turn (mqserver.runtime.soon)
        self.probe_window = PROBE_WINDOW
        self.probe_every = PROBE_EVERY
        self.probe_every_most = PROBE_EVERY_MOST
        self.probe = probe
        self.spin = spin

    @property
    def spin(self):
        return self._spin

    @spin.setter
    def spin(self, seconds):
        self._spin = seconds
        self._spin_now = seconds  # the current spin: C{spin}, or 0 while it would not pay
        self._missed = 0.0  # running share of events that came later than the spin
        self._idle_since = monotonic()  # when the last events were handled
        self._spin_pays = True  # the last probe's verdict (or the window being probed)
        self._phase = _HOLD
        self._phase_start = self._phase_end = 0.0  # a probe starts a window into traffic
        self._cpu_start = 0.0  # the thread's CPU time when the phase started
        self._bytes = 0  # bytes the peers sent in this phase (counted while probing)
        self._probed_on = (0.0, 0, 0.0)  # CPU seconds, bytes, seconds of the spin window
        self._verdict = None  # the last verdict (True, False; None before the first)
        self._holds = 0.0  # seconds the last verdict holds (0: probe_every)
        self._spun = False  # whether the reactor spun in this phase
        self._spun_on = False  # whether it spun in the last window with the spin allowed

    def doPoll(self, timeout):
        poll = self._poller.poll
        most = len(self._selectables)
        start = monotonic()
        until = self._last_event + self._spin_now
        if timeout is not None and until > start + timeout:
            until = start + timeout
        try:
            if start < until:
                self._spun = True  # for the probe: the spin ran in this phase
                while True:
                    events = poll(0, most)
                    if events:
                        break
                    # Give the CPU to anything else runnable on it (often the very
                    # client we wait for): spinning must never delay the peer.
                    sched_yield()
                    now = monotonic()
                    if now >= until:
                        wait = -1 if timeout is None else max(0.0, timeout - (now - start))
                        events = poll(wait, most)
                        break
            else:
                events = poll(-1 if timeout is None else timeout, most)
        except OSError as err:
            if err.errno == errno.EINTR:
                return
            raise
        now = monotonic()
        if not events:
            return
        self._last_event = now
        spin = self._spin
        if spin:
            missed = self._missed
            if now - self._idle_since < spin:
                missed -= missed * _MISS_WEIGHT
            else:
                missed += (1.0 - missed) * _MISS_WEIGHT
            self._missed = missed
            if now >= self._phase_end and self.probe:
                self._next_phase(now)
            self._spin_now = spin if missed < _MISS_LIMIT and self._spin_pays else 0.0
        selectables = self._selectables
        if self._phase:
            self._bytes += readable_bytes(selectables, events)
        dispatch = self._doReadOrWrite
        for fd, event in events:
            selectable = selectables.get(fd)
            if selectable is None:
                continue
            if event != EPOLLIN:
                dispatch(selectable, fd, event)
                continue
            # _doReadOrWrite's path for a read event, without its other cases.
            in_read = False
            try:
                if selectable.fileno() == -1:
                    why = posixbase._NO_FILEDESC  # checked by mqserver.runtime.fastpath
                else:
                    in_read = True
                    why = selectable.doRead()
            except BaseException:
                why = sys.exc_info()[1]
                log.err()
            if why:
                self._disconnectSelectable(selectable, why, in_read)
        self._idle_since = monotonic()

    doIteration = doPoll

    def _next_phase(self, now):
        """End the probe phase due at C{now} and start the next (see the module
        docstring): hold, then a window with the spin allowed, one without, hold."""
        phase = self._phase
        cpu = thread_time()
        counted = (cpu - self._cpu_start, self._bytes, now - self._phase_start)
        if phase == _HOLD:
            if now - self._phase_end > self.probe_window:
                # traffic starting again after a quiet spell: a window counting its
                # first requests (connections being set up, caches cold) would judge
                # the start, not the traffic, so let it settle for a window first
                self._phase_end = now + self.probe_window
            else:
                self._phase, self._spin_pays = _ON, True
                self._phase_end = now + self.probe_window
        elif phase == _ON:
            self._probed_on, self._spun_on = counted, self._spun
            self._phase, self._spin_pays = _OFF, False
            self._phase_end = now + self.probe_window
        else:
            pays = spin_pays(self._probed_on, counted)
            self._phase = _HOLD
            if not self._spun_on and pays is not False:
                # The miss rule kept the spin off all through its window, so the probe
                # saw nothing of what it costs: no evidence that it pays. It stays off
                # until the next probe (a window later when there was too little traffic
                # to tell), and the last verdict stands. (Taken as paying, the CPU per
                # byte of two windows alike, it held for seconds, in which the spin ran
                # unmeasured once the miss rule let it: a RocketMQ C++ sync send at
                # 162 µs of broker CPU each, against 80 without.)
                self._spin_pays = False
                self._phase_end = now + (self.probe_window if pays is None
                                         else self.probe_every)
            elif pays is None:  # too little traffic (starting or stopping): soon again
                self._spin_pays = True
                self._phase_end = now + self.probe_window
            else:
                if pays == self._verdict:
                    holds = min(2 * (self._holds or self.probe_every), self.probe_every_most)
                else:
                    holds = self.probe_every
                self._verdict, self._holds = pays, holds
                self._spin_pays = pays
                self._phase_end = now + holds
        self._phase_start, self._cpu_start = now, cpu
        self._bytes = 0
        self._spun = False

    def call_soon(self, f, args):
        """Queue C{f(*args)} for the start of the next turn (L{mqserver.runtime.soon.call_soon});
        return its L{SoonCall}."""
        call = SoonCall(f, args)
        self._soon.append(call)
        return call

    def _run_soon(self):
        calls, self._soon = self._soon, []
        for call in calls:
            if call.done:
                continue  # cancelled
            call.done = True
            try:
                call.f(*call.args)
            except BaseException:
                log.err()

    def timeout(self):
        # a call queued by a timer or by another soon call: the next poll must not wait
        return 0.0 if self._soon else super().timeout()

    def runUntilCurrent(self):
        if self._soon:
            self._run_soon()
        if not (self.threadCallQueue or self._newTimedCalls or self._justStopped
                or self._cancellations > 50):
            pending = self._pendingTimedCalls
            if not pending or pending[0].time > self.seconds():
                return  # nothing due: what the base class would find, found sooner
        super().runUntilCurrent()


def spin_pays(with_spin, without):
    """The verdict of a probe: C{with_spin} and C{without} are (CPU seconds of the
    reactor's thread, bytes its peers sent, seconds) of its two windows. True when the
    CPU per byte with the spin was at most L{_PROBE_PAYS} times that without (the CPU
    the spin burned bought back the wake-ups it saved), None when either window was
    nearly idle (too little to tell: the miss rule alone decides until the next probe,
    a window later)."""
    on_cpu, on_bytes, on_secs = with_spin
    off_cpu, off_bytes, off_secs = without
    if (on_cpu < _PROBE_MIN_CPU * on_secs or off_cpu < _PROBE_MIN_CPU * off_secs
            or on_bytes < _PROBE_MIN_BYTES or off_bytes < _PROBE_MIN_BYTES):
        return None
    return on_cpu * off_bytes <= _PROBE_PAYS * off_cpu * on_bytes


def readable_bytes(selectables, events):
    """The bytes waiting to be read on the connections of C{events} (epoll's (fd, event)
    pairs) that are readable, each counted up to L{_READ_MOST}; 0 for a descriptor that
    is not a connected socket or pipe (a listening socket, one just closed)."""
    counted = 0
    buf = bytearray(4)
    for fd, event in events:
        if not event & EPOLLIN or fd not in selectables:
            continue
        try:
            ioctl(fd, FIONREAD, buf)
        except OSError:
            continue
        n = int.from_bytes(buf, sys.byteorder, signed=True)
        if n > 0:
            counted += n if n < _READ_MOST else _READ_MOST
    return counted


def install(spin=DEFAULT_SPIN, probe=True):
    """Install a L{SpinningEPollReactor} as the global reactor and return it."""
    reactor = SpinningEPollReactor(spin, probe)
    installReactor(reactor)
    return reactor
