"""The busy-polling reactor and the send-now write helper, over real loopback sockets.

Each test runs its own (not installed) reactor instance, so nothing leaks between tests.
"""

import socket
import threading
import time

from twisted.internet import protocol
from twisted.internet.epollreactor import EPollReactor
from twisted.internet.testing import StringTransport

from mqserver.runtime.reactor import SpinningEPollReactor
from mqserver.runtime.output import send_now


def _run(reactor, limit=20.0):
    """Run C{reactor} until it stops, or fail after C{limit} seconds."""
    guard = reactor.callLater(limit, reactor.stop)
    reactor.run(installSignalHandlers=False)
    assert guard.active(), "the reactor ran into the test's time limit"
    guard.cancel()


def _stop_when(reactor, done, every=0.01):
    """Stop C{reactor} once C{done()} is true, checking every C{every} seconds."""
    def check():
        if done():
            reactor.stop()
        else:
            reactor.callLater(every, check)
    reactor.callLater(every, check)


class _Echo(protocol.Protocol):
    def dataReceived(self, data):
        send_now(self.transport, data)


def _client_thread(port, fn):
    result = {}

    def run():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                result["value"] = fn(s)
        except BaseException as e:  # reported by the test
            result["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, result


def _round_trip(s, msg):
    """Send C{msg} on socket C{s} and return as many bytes read back."""
    s.sendall(msg)
    got = b""
    while len(got) < len(msg):
        chunk = s.recv(len(msg) - len(got))
        if not chunk:
            raise ConnectionError("server closed")
        got += chunk
    return got


def _echo_rounds(rounds):
    def fn(s):
        for i in range(rounds):
            msg = b"%06d" % i
            got = _round_trip(s, msg)
            if got != msg:
                raise AssertionError(f"round {i}: sent {msg!r}, got {got!r}")
        return rounds
    return fn


def test_spinning_reactor_serves_request_reply_and_fires_timers():
    """Echo round trips and a chain of short timers both complete while it spins."""
    reactor = SpinningEPollReactor()
    reactor.spin = 0.001
    port = reactor.listenTCP(0, protocol.Factory.forProtocol(_Echo), interface="127.0.0.1")
    fired = []

    def tick():
        fired.append(reactor.seconds())
        if len(fired) < 50:
            reactor.callLater(0.002, tick)

    reactor.callLater(0, tick)
    t, result = _client_thread(port.getHost().port, _echo_rounds(2000))

    _stop_when(reactor, lambda: not t.is_alive() and len(fired) >= 50)
    _run(reactor)
    port.stopListening()
    assert "error" not in result, result.get("error")
    assert result["value"] == 2000
    assert len(fired) == 50
    # each timer waited at least its 2 ms: spinning never runs them early
    gaps = [b - a for a, b in zip(fired, fired[1:])]
    assert min(gaps) >= 0.0019


def test_spinning_reactor_sleeps_when_idle():
    """After traffic stops it blocks in epoll instead of polling: an idle second costs
    (much) less than a second of CPU."""
    reactor = SpinningEPollReactor()
    reactor.spin = 0.001
    port = reactor.listenTCP(0, protocol.Factory.forProtocol(_Echo), interface="127.0.0.1")
    t, result = _client_thread(port.getHost().port, _echo_rounds(200))
    cpu = {}

    def after_traffic():
        if t.is_alive():
            reactor.callLater(0.01, after_traffic)
            return
        cpu["start"] = time.thread_time()
        reactor.callLater(1.0, idle_done)

    def idle_done():
        cpu["idle"] = time.thread_time() - cpu["start"]
        reactor.stop()

    reactor.callLater(0.01, after_traffic)
    _run(reactor)
    port.stopListening()
    assert "error" not in result, result.get("error")
    assert cpu["idle"] < 0.3, f"idle reactor used {cpu['idle']:.2f}s of CPU in 1s"


def test_spin_adapts_to_a_trickle_and_back():
    """Requests slower than the spin make it shrink to nothing (a trickle costs little
    CPU); requests close together bring it back."""
    reactor = SpinningEPollReactor(spin=0.005)
    reactor.probe_window = 1e9  # the miss rule alone (the probes have their own tests)
    port = reactor.listenTCP(0, protocol.Factory.forProtocol(_Echo), interface="127.0.0.1")
    state = {}

    def trickle_then_fast(s):
        fn = _echo_rounds(1)
        for _ in range(60):  # one request every 15 ms, 3x the spin
            fn(s)
            time.sleep(0.015)
        state["after_trickle"] = reactor._spin_now
        return _echo_rounds(300)(s)

    cpu = {"start": time.thread_time()}
    t, result = _client_thread(port.getHost().port, trickle_then_fast)

    def done():
        if "after_trickle" in state and "trickle" not in cpu:
            cpu["trickle"] = time.thread_time() - cpu["start"]
        return not t.is_alive()

    _stop_when(reactor, done, every=0.001)
    _run(reactor)
    port.stopListening()
    assert result.get("value") == 300, result
    assert state["after_trickle"] == 0.0
    # spinning 5 ms of every 15 would cost about 0.3 s over the 0.9 s trickle
    assert cpu["trickle"] < 0.2, f"the trickle cost {cpu['trickle']:.2f}s of CPU"
    assert reactor._spin_now == 0.005  # the fast rounds restored the spin


def test_spin_zero_blocks_like_epoll():
    """spin = 0 is plain epoll behaviour: requests still served."""
    reactor = SpinningEPollReactor()
    reactor.spin = 0
    port = reactor.listenTCP(0, protocol.Factory.forProtocol(_Echo), interface="127.0.0.1")
    t, result = _client_thread(port.getHost().port, _echo_rounds(300))

    _stop_when(reactor, lambda: not t.is_alive())
    _run(reactor)
    port.stopListening()
    assert result.get("value") == 300, result


class _Flood(protocol.Protocol):
    """Writes numbered chunks through send_now: a first burst far larger than the socket
    buffers hold, then one chunk every 2 ms while the peer drains the socket (so
    the socket has room while Twisted still holds queued bytes), then closes."""

    chunks = 600
    burst = 200
    size = 64 * 1024

    def connectionMade(self):
        self.next = 0
        for _ in range(self.burst):
            self._one()
        self.factory.burst_sent.set()
        self.factory.reactor.callLater(0, self._more)

    def _one(self):
        send_now(self.transport, (b"%08d" % self.next) * (self.size // 8))
        self.next += 1

    def _more(self):
        if self.next < self.chunks:
            self._one()
            self.factory.reactor.callLater(0.002, self._more)
        else:
            self.transport.loseConnection()


def test_send_now_keeps_byte_order_when_the_socket_is_full():
    """Once the socket buffer is full, later send_now calls queue behind what Twisted
    already holds: the peer reads every chunk once, in order."""
    reactor = EPollReactor()
    factory = protocol.Factory.forProtocol(_Flood)
    factory.reactor = reactor
    factory.burst_sent = threading.Event()
    port = reactor.listenTCP(0, factory, interface="127.0.0.1")

    def read_all(s):
        # read only once the server has filled the socket buffer and queued the rest
        assert factory.burst_sent.wait(10), "the server never sent its burst"
        parts = []
        while True:
            chunk = s.recv(1 << 20)
            if not chunk:
                return b"".join(parts)
            parts.append(chunk)

    t, result = _client_thread(port.getHost().port, read_all)

    _stop_when(reactor, lambda: not t.is_alive())
    _run(reactor)
    port.stopListening()
    assert "error" not in result, result.get("error")
    data = result["value"]
    size = _Flood.size
    assert len(data) == _Flood.chunks * size
    for i in range(_Flood.chunks):
        assert data[i * size:(i + 1) * size] == (b"%08d" % i) * (size // 8), f"chunk {i}"


def test_send_now_falls_back_to_write_on_other_transports():
    t = StringTransport()
    send_now(t, b"abc")
    send_now(t, b"def")
    assert t.value() == b"abcdef"


def test_spin_stays_off_when_a_reply_is_followed_by_a_long_gap():
    """A request answered at once, a second message right after (a consumer's ack), then
    a gap three spins long: spinning catches the second message but then waits the whole
    spin in vain every time, so the reactor must stop spinning. (The old rule restored
    the whole spin after every caught message, which doubled the broker's CPU per
    message at 2,000 msgs/s with a consumer attached.)"""
    reactor = SpinningEPollReactor(spin=0.005)
    reactor.probe_window = 1e9  # the miss rule alone (the probes have their own tests)
    port = reactor.listenTCP(0, protocol.Factory.forProtocol(_Echo), interface="127.0.0.1")
    spins = []

    def request_ack_gap(s):
        fn = _echo_rounds(1)
        for i in range(40):
            if i >= 10:
                spins.append(reactor._spin_now)  # what it would spin after our next request
            fn(s)  # request and its reply
            fn(s)  # the ack, sent as soon as the reply came
            time.sleep(0.015)
        return 40

    t, result = _client_thread(port.getHost().port, request_ack_gap)
    _stop_when(reactor, lambda: not t.is_alive())
    _run(reactor)
    port.stopListening()
    assert result.get("value") == 40, result
    assert spins == [0.0] * 30, spins


class _FakeClock:
    """The model's wall clock (called) and the reactor thread's CPU clock (L{cpu})."""

    def __init__(self):
        self.now = 1000.0
        self.used = 0.0

    def __call__(self):
        return self.now

    def cpu(self):
        return self.used

    def run(self, seconds):
        """The reactor's thread works for C{seconds}."""
        self.now += seconds
        self.used += seconds


_MODEL_FD = 10_000


class _ModelPeer:
    """Stands in for the reactor's epoll and one connection, on a fake clock: a peer that
    either sends at its own pace (a message every C{paced} seconds, or two 20 µs apart
    when C{pair}, whatever the reactor does) or waits for each answer (its next message
    comes C{turnaround} seconds after the reactor read the last). Waking the blocked
    reactor takes C{wake} seconds, and the read that follows a wake-up C{wake_cpu} more
    (the scheduler, and a cold cache), a poll while spinning
    C{poll_cost}, a read C{read} and each message in it C{work}. Each message is
    C{size} bytes."""

    def __init__(self, clock, paced=None, pair=False, turnaround=None, wake=60e-6,
                 wake_cpu=40e-6, read=10e-6, work=20e-6, poll_cost=2e-6, size=200):
        self.clock, self.paced, self.pair, self.turnaround = clock, paced, pair, turnaround
        self.wake, self.wake_cpu, self.read, self.work = wake, wake_cpu, read, work
        self.poll_cost, self.size = poll_cost, size
        self.start = clock.now
        self.arrivals = [clock.now]
        self.sent = 0
        self.messages = 0
        self.spin_polls = 0
        self.cold = False

    def _schedule(self, now):
        # a paced sender's next messages, whatever the reactor did
        while self.arrivals[-1] <= now:
            self.sent += 1
            start = self.start + (self.sent // 2 if self.pair else self.sent) * self.paced
            self.arrivals.append(start + 20e-6 if self.pair and self.sent % 2 else start)

    def poll(self, timeout, most):
        c = self.clock
        first = self.arrivals[0]
        if timeout == 0:
            c.run(self.poll_cost)
            self.spin_polls += 1
            if c.now < first:
                return []
        elif c.now < first:
            c.now = first + self.wake  # blocked: the message wakes the reactor
            self.cold = True
        return [(_MODEL_FD, 1)]

    def readable_bytes(self, selectables, events):
        """What FIONREAD tells the probing reactor: the bytes of the messages come."""
        if self.paced:
            self._schedule(self.clock.now)
        return self.size * sum(1 for t in self.arrivals if t <= self.clock.now)

    # the peer's connection, as the reactor sees it

    def fileno(self):
        return _MODEL_FD

    def doRead(self):
        c = self.clock
        if self.paced:
            self._schedule(c.now)
        n = sum(1 for t in self.arrivals if t <= c.now)
        del self.arrivals[:n]
        self.messages += n
        c.run(self.read + n * self.work + (self.wake_cpu if self.cold else 0.0))
        self.cold = False
        if self.paced:
            self._schedule(c.now)
        else:
            self.arrivals = [c.now + self.turnaround]

    def register(self, *args):
        pass

    def unregister(self, *args):
        pass

    def close(self):
        pass


def _model_run(monkeypatch, seconds, probe=True, **peer):
    """Run a spinning reactor's polls (with probes, unless C{probe} is false) against a
    L{_ModelPeer} for C{seconds} of the fake clock; return the share of that time it
    spent spinning, the messages per second and the reactor's CPU per message."""
    clock, fake, reactor = _model_reactor(monkeypatch, probe, **peer)
    start = clock.now
    _poll_for(reactor, clock, seconds)
    elapsed = clock.now - start
    return (fake.spin_polls * fake.poll_cost / elapsed, fake.messages / elapsed,
            clock.used / fake.messages)


def _model_reactor(monkeypatch, probe=True, **peer):
    """A spinning reactor (200 µs spin, 10 ms probe windows every 50 ms) whose epoll,
    clocks and one connection are a L{_ModelPeer}'s: (clock, peer, reactor)."""
    import mqserver.runtime.reactor as mr

    clock = _FakeClock()
    fake = _ModelPeer(clock, **peer)
    monkeypatch.setattr(mr, "monotonic", clock)
    monkeypatch.setattr(mr, "thread_time", clock.cpu)
    monkeypatch.setattr(mr, "sched_yield", lambda: None)
    monkeypatch.setattr(mr, "readable_bytes", fake.readable_bytes)
    reactor = SpinningEPollReactor(spin=0.0002, probe=probe)
    reactor.probe_window, reactor.probe_every = 0.01, 0.05
    reactor._poller = fake
    reactor._selectables[_MODEL_FD] = fake
    return clock, fake, reactor


def _poll_for(reactor, clock, seconds):
    """Run the model reactor's polls for C{seconds} of the fake clock."""
    start = clock.now
    while clock.now - start < seconds:
        reactor.doPoll(None)


def test_spin_stops_for_a_sender_at_its_own_pace(monkeypatch):
    """A publisher at a steady 10,000 msgs/s: the next message comes 100 µs after the
    last whatever the reactor does, so a 200 µs spin always catches it but never makes
    it come sooner, and burns 70 µs of CPU per message where a wake-up costs 40. The
    probes find the CPU per byte higher with the spin, so it spins only in their
    windows (the miss rule alone spun 70% of the time)."""
    share, rate, cpu = _model_run(monkeypatch, 0.5, paced=100e-6)
    assert 9_900 < rate < 10_100
    # probes: a 10 ms window with the spin every 70 ms at most, about 10% of the time
    assert share < 0.15, share
    assert cpu < 85e-6, cpu  # 100 µs spinning, 70 sleeping


def test_spin_stops_for_a_sender_at_its_own_pace_sending_bursts(monkeypatch):
    """The same with the messages coming two at a time (a sender whose sleeps overshoot
    catches up): without the spin the reactor reads each pair at once, with it more
    often, so counting reads would credit the spin; counting bytes does not."""
    share, _, _ = _model_run(monkeypatch, 0.5, paced=200e-6, pair=True)
    assert share < 0.15, share


def test_spin_stays_on_while_a_peer_waits_for_each_answer(monkeypatch):
    """One request per round trip: the peer's next request comes 40 µs after the answer,
    so the spin makes round trips 70 µs instead of 130 (no wake-up), and the 40 µs it
    burns per request are what the wake-up would have cost: it pays, and the probes keep
    it. (The earlier probes weighed the share of time spent outside polls, which the
    wake-up's cost on the next request keeps about equal with and without the spin: they
    took the spin away here.)"""
    share, rate, _ = _model_run(monkeypatch, 0.5, turnaround=40e-6)
    assert share > 0.4, share
    assert rate > 12_000, rate


def test_spin_stops_for_a_peer_slow_to_turn_answers_around(monkeypatch):
    """A peer that waits for each answer but takes 150 µs to send the next request (the
    RocketMQ C++ client's synchronous send): the 200 µs spin catches every request, but
    burns 150 µs for each where a wake-up costs 40, so it does not pay."""
    share, rate, cpu = _model_run(monkeypatch, 0.5, turnaround=150e-6)
    assert share < 0.15, share
    assert cpu < 110e-6, cpu


def test_probes_are_on_by_default_and_can_be_turned_off(monkeypatch):
    """The default configuration and reactor probe; with C{server.spinProbe} false the
    miss rule alone decides, and a paced sender the spin always catches keeps it."""
    from mqserver.config import SCHEMA

    assert SCHEMA["server.spinProbe"][1] is True
    assert SpinningEPollReactor().probe is True
    share, rate, _ = _model_run(monkeypatch, 0.5, probe=False, paced=100e-6)
    assert 9_900 < rate < 10_100
    assert share > 0.5, share


def test_a_spin_the_miss_rule_kept_off_is_not_taken_as_paying(monkeypatch):
    """A peer sending every millisecond (the spin never catches anything, so the miss
    rule keeps it off, and the probes' two windows cost alike), then a peer slow to turn
    answers around (the RocketMQ C++ client's synchronous send: the 200 µs spin catches
    each request, 100 µs after the answer, but burns more than the wake-up it saves).
    Windows that saw no spin must not count as the spin paying: taken so, the verdict
    repeated and held ever longer, and the spin then ran unmeasured through the slow
    peer's requests (a benchmark round at twice the broker's CPU per send)."""
    # enough bytes in a window for a verdict
    clock, fake, reactor = _model_reactor(monkeypatch, paced=1e-3, size=1000)
    _poll_for(reactor, clock, 2.0)
    # the peer now waits for each answer and sends its next request 100 µs later
    fake.paced, fake.turnaround = None, 100e-6
    fake.arrivals = [clock.now + 100e-6]
    start, polls, messages = clock.now, fake.spin_polls, fake.messages
    _poll_for(reactor, clock, 0.5)
    share = (fake.spin_polls - polls) * fake.poll_cost / (clock.now - start)
    assert fake.messages - messages > 1000
    assert share < 0.15, share  # the probes' windows with the spin (0.77 without the rule)


def test_a_probe_without_a_spin_gives_no_verdict_that_it_pays(monkeypatch):
    """The verdict after a window with the spin allowed in which the reactor never spun:
    whatever the windows' CPU per byte says, the spin stays off, until the next probe
    (C{probe_every} later, or a window later when there was too little traffic to
    tell), and the last verdict is kept for the next one's hold; a window in which it
    spun is judged as before."""
    import mqserver.runtime.reactor as mr

    verdict = []
    monkeypatch.setattr(mr, "spin_pays", lambda on, off: verdict[-1])
    reactor = SpinningEPollReactor(probe=True)
    reactor.probe_window, reactor.probe_every, reactor.probe_every_most = 0.05, 2.0, 8.0
    now = 100.0
    reactor._phase_end = now  # traffic flowing: the next phase is a probe

    def probe(pays, spun):
        nonlocal now
        verdict.append(pays)
        reactor._next_phase(now)  # hold -> window with the spin
        reactor._spun = spun
        now += 0.05
        reactor._next_phase(now)  # -> window without
        reactor._spun = True  # the spin is not allowed here: it cannot run
        now += 0.05
        reactor._next_phase(now)  # -> the verdict, and hold
        held = (reactor._spin_pays, round(reactor._phase_end - now, 6))
        now = reactor._phase_end
        return held

    assert probe(True, True) == (True, 2.0)
    assert probe(True, False) == (False, 2.0)
    assert probe(None, False) == (False, 0.05)
    assert probe(False, False) == (False, 2.0)  # a verdict: it changed from True
    assert probe(True, True) == (True, 2.0)
    assert probe(True, False) == (False, 2.0)
    assert probe(True, True) == (True, 4.0)  # repeats the last verdict: holds longer
    assert probe(None, True) == (True, 0.05)


def test_spin_pays_verdict():
    """(CPU seconds, bytes, seconds) of the window with the spin, then of the one
    without."""
    from mqserver.runtime.reactor import spin_pays

    # the same CPU per byte: the spin bought back the wake-ups it saved
    assert spin_pays((0.008, 200_000, 0.01), (0.004, 100_000, 0.01))
    assert spin_pays((0.0042, 100_000, 0.01), (0.004, 100_000, 0.01))  # within the noise
    # the same bytes for more CPU: a paced sender, or a peer slow to answer
    assert not spin_pays((0.006, 100_000, 0.01), (0.004, 100_000, 0.01))
    assert not spin_pays((0.008, 120_000, 0.01), (0.004, 100_000, 0.01))
    # nearly idle: no verdict
    assert spin_pays((0.0001, 100_000, 0.01), (0.005, 100_000, 0.01)) is None
    assert spin_pays((0.005, 100_000, 0.01), (0.0001, 100_000, 0.01)) is None
    assert spin_pays((0.005, 100, 0.01), (0.005, 100_000, 0.01)) is None


def test_readable_bytes_counts_what_waits_on_real_sockets():
    """FIONREAD on the connections epoll reported readable: the bytes waiting on each,
    nothing for a listening socket, a descriptor the reactor does not watch, or one
    that is not readable in the event."""
    from select import EPOLLIN, EPOLLOUT

    from mqserver.runtime.reactor import readable_bytes

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    a = socket.create_connection(listener.getsockname())
    b, _ = listener.accept()
    c = socket.create_connection(listener.getsockname())
    d, _ = listener.accept()
    try:
        a.sendall(b"x" * 123)
        c.sendall(b"y" * 7)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and readable_bytes(
                {b.fileno(): b, d.fileno(): d}, [(b.fileno(), EPOLLIN), (d.fileno(), EPOLLIN)]) < 130:
            time.sleep(0.001)
        watched = {b.fileno(): b, d.fileno(): d, listener.fileno(): listener}
        assert readable_bytes(watched, [(b.fileno(), EPOLLIN), (d.fileno(), EPOLLIN)]) == 130
        assert readable_bytes(watched, [(b.fileno(), EPOLLOUT)]) == 0
        assert readable_bytes(watched, [(listener.fileno(), EPOLLIN)]) == 0
        assert readable_bytes({}, [(b.fileno(), EPOLLIN)]) == 0
        assert b.recv(200) == b"x" * 123  # counting reads nothing
    finally:
        for s in (a, b, c, d, listener):
            s.close()


def test_probes_count_the_bytes_real_peers_send(monkeypatch):
    """A probing reactor and a real client that waits for each 200-byte answer: the
    probes' windows count the bytes read through FIONREAD on the real connection (whole
    requests, since each read finds exactly one) and the thread's CPU time."""
    import mqserver.runtime.reactor as mr

    windows = []
    real = mr.spin_pays

    def recorded(with_spin, without):
        windows.append((with_spin, without))
        return real(with_spin, without)

    monkeypatch.setattr(mr, "spin_pays", recorded)
    reactor = SpinningEPollReactor(spin=0.0002, probe=True)
    reactor.probe_window, reactor.probe_every = 0.03, 0.03
    port = reactor.listenTCP(0, protocol.Factory.forProtocol(_Echo), interface="127.0.0.1")

    def requests(s):
        msg = b"q" * 200
        n = 0
        end = time.monotonic() + 0.6
        while time.monotonic() < end or not windows:
            _round_trip(s, msg)
            n += 1
            if n > 200_000:
                raise AssertionError("no probe came to a verdict")
        return n

    t, result = _client_thread(port.getHost().port, requests)
    _stop_when(reactor, lambda: not t.is_alive())
    _run(reactor)
    port.stopListening()
    assert result.get("value"), result
    assert windows
    for window in windows:
        for cpu, nbytes, seconds in window:
            assert nbytes > 0 and nbytes % 200 == 0, window
            assert 0 < cpu <= seconds * 1.5, window


def test_a_repeated_verdict_holds_longer(monkeypatch):
    """Each verdict that repeats the last doubles the time it holds, up to
    C{probe_every_most}; a changed one starts again from C{probe_every}; a window nearly
    idle (no verdict) changes nothing and is followed by a probe a window later."""
    import mqserver.runtime.reactor as mr

    verdicts = iter([False, False, False, False, False, True, True, None, True, False])
    monkeypatch.setattr(mr, "spin_pays", lambda on, off: next(verdicts))
    reactor = SpinningEPollReactor(probe=True)
    reactor.probe_window, reactor.probe_every, reactor.probe_every_most = 0.05, 2.0, 8.0
    now = 100.0
    reactor._phase_end = now  # traffic flowing: the next phase is a probe
    holds = []
    for _ in range(10):
        reactor._next_phase(now)  # hold -> window with the spin
        reactor._spun = True  # which it used
        now += 0.05
        reactor._next_phase(now)  # -> window without
        now += 0.05
        reactor._next_phase(now)  # -> the verdict, and hold
        holds.append((reactor._spin_pays, round(reactor._phase_end - now, 6)))
        now = reactor._phase_end
    assert holds == [(False, 2.0), (False, 4.0), (False, 8.0), (False, 8.0), (False, 8.0),
                     (True, 2.0), (True, 4.0), (True, 0.05), (True, 8.0), (False, 2.0)]
