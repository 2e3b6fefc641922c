#!/usr/bin/env python
"""smss benchmark: publish throughput, subscriber catch-up, idle and steady-state RSS.

Runs the real broker (``twistd -n mqserver``, through L{harness}) on a
loopback port with its data in a temporary directory, drives it with raw smss requests
from separate processes, and prints a table of figures. It asserts nothing about speed.

    python bench/smss_bench.py                 # full run (several minutes, ~1.5 GB disk)
    python bench/smss_bench.py --quick         # small counts, well under a minute
    python bench/smss_bench.py --only catchup --messages 1000000
    python bench/smss_bench.py --only publish --client-poll 200   # clients poll, as Go's do

See bench/README.md for what each figure means. Needs psutil (the ``bench`` extra).
"""

import argparse
import multiprocessing
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

from harness import ServerProcess

try:
    import psutil
except ImportError:  # pragma: no cover - told to the user below
    psutil = None

from clientwait import Waiter, add_argument, describe
from protocols.smss import client_codec as cc

BODY_SIZE = 200
#: One 200-byte message with no headers, as a PUB payload record: S, H, body.
RECORD = struct.pack("<II", BODY_SIZE, 0) + b"x" * BODY_SIZE
#: Bytes one such record takes in a pushed batch: 32-byte prefix + record.
PUSHED_RECORD_SIZE = 32 + len(RECORD)
OK_HEADER = b"\xc8\x00" + b"\x00" * 8
ACK = b"\x00\x00"
_BATCH_HEADER = struct.Struct("<HBxI2x")
_TS = struct.Struct("<q")
MB = 1024 * 1024

# fork: the workers are plain functions of this module and need nothing re-imported.
MP = multiprocessing.get_context("fork")


# -- raw socket helpers (used in the worker processes) -------------------------------------


def connect(port, timeout=30.0):
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def recv_exact(sock, buf, n):
    """Fill C{buf[:n]} (a bytearray of at least n bytes) from C{sock} (a socket or a
    L{Waiter})."""
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:n])
        if not k:
            raise ConnectionError("server closed the connection")
        got += k


def check_ok(header):
    """Raise unless C{header} (10 bytes) is a simple OK."""
    if header[:2] != b"\xc8\x00":
        raise RuntimeError(f"server answered {bytes(header)!r} instead of OK")


def simple_call(sock, request):
    sock.sendall(request)
    hdr = bytearray(10)
    recv_exact(sock, hdr, 10)
    if hdr[:2] == b"\x90\x01":
        (n,) = struct.unpack_from("<H", hdr, 2)
        text = bytearray(n)
        recv_exact(sock, text, n)
        raise RuntimeError(f"server error: {text.decode('utf-8', 'replace')}")
    check_ok(hdr)


def create_topic(port, topic):
    sock = connect(port)
    try:
        simple_call(sock, cc.encode_create(topic))
    finally:
        sock.close()


def bulk_publish(port, topic, total, per_request=500, window=4):
    """Publish C{total} 200-byte messages in PUBs of C{per_request}, keeping C{window}
    requests in flight on one connection. Returns the seconds it took."""
    sock = connect(port, timeout=120)
    full = cc.encode_pub(topic, RECORD * per_request)
    hdr = bytearray(10)
    t0 = time.monotonic()
    try:
        sizes = []
        left = total
        while left > 0:
            k = min(per_request, left)
            sizes.append(k)
            left -= k
        sent = 0
        inflight = 0
        for k in sizes:
            sock.sendall(full if k == per_request else cc.encode_pub(topic, RECORD * k))
            sent += 1
            inflight += 1
            if inflight >= window:
                recv_exact(sock, hdr, 10)
                check_ok(hdr)
                inflight -= 1
        while inflight:
            recv_exact(sock, hdr, 10)
            check_ok(hdr)
            inflight -= 1
    finally:
        sock.close()
    return time.monotonic() - t0


# -- publish workers -----------------------------------------------------------------------


def pub_worker(port, topic, seconds, poll_us, barrier, results):
    """One connection, one message per PUB, wait for each reply (as the smss SDKs do);
    C{poll_us}: see L{Waiter}."""
    try:
        sock = connect(port)
        waiter = Waiter(sock, poll_us)
        send, recv_into = waiter.sendall, waiter.recv_into
        request = cc.encode_pub(topic, RECORD)
        hdr = bytearray(10)
        view = memoryview(hdr)
        lat = []
        barrier.wait()
        clock = time.perf_counter
        t0 = clock()
        deadline = t0 + seconds
        n = 0
        now = t0
        while now < deadline:
            send(request)
            got = 0
            while got < 10:
                k = recv_into(view[got:])
                if not k:
                    raise ConnectionError("server closed the connection")
                got += k
            if hdr[0] != 0xC8:
                check_ok(hdr)
            t = clock()
            lat.append(t - now)
            now = t
            n += 1
        sock.close()
        cpu = time.process_time()
        results.put(("ok", n, t0, now, lat, cpu))
    except BaseException as e:  # noqa: BLE001 - reported by the parent
        results.put(("error", repr(e)))


def paced_pub_worker(port, topic, rate, seconds, poll_us, barrier, results):
    """Publish one message per PUB at about C{rate} msgs/s for C{seconds}, waiting for
    each reply as L{Waiter} C{poll_us} says."""
    try:
        sock = connect(port)
        waiter = Waiter(sock, poll_us)
        request = cc.encode_pub(topic, RECORD)
        hdr = bytearray(10)
        barrier.wait()
        t0 = time.perf_counter()
        interval = 1.0 / rate
        n = 0
        total = int(rate * seconds)
        while n < total:
            due = t0 + n * interval
            now = time.perf_counter()
            if due > now:
                time.sleep(due - now)
            waiter.sendall(request)
            recv_exact(waiter, hdr, 10)
            check_ok(hdr)
            n += 1
        elapsed = time.perf_counter() - t0
        sock.close()
        results.put(("ok", n, elapsed, time.process_time()))
    except BaseException as e:  # noqa: BLE001
        results.put(("error", repr(e)))


# -- subscriber ----------------------------------------------------------------------------


def sub_worker(port, topic, batch, who, expect, poll_us, barrier, results, stop=None,
               idle_timeout=30.0):
    """Subscribe from eventId 0 and read until C{expect} messages have come (or, when
    C{stop} is given, until it is set). Parses only the 10-byte batch header and skips each
    batch body by its length, except for the first record's timestamp (delivery lag).
    C{poll_us}: how to wait for each batch, see L{Waiter}."""
    try:
        sock = connect(port)
        waiter = Waiter(sock, poll_us)
        waiter.sendall(cc.encode_sub(topic, 0, batch, None, who))
        buf = bytearray(1 << 22)
        view = memoryview(buf)
        barrier.wait()
        waiter.settimeout(0.2 if stop is not None else idle_timeout)
        t0 = time.perf_counter()
        c0 = time.process_time()
        got = 0
        body_bytes = 0
        batches = 0
        max_lag_ms = 0
        last = t0
        have = 0  # bytes of the current frame in buf
        while expect is None or got < expect:
            try:
                k = waiter.recv_into(view[have:])
            except socket.timeout:
                if stop is not None and stop.is_set():
                    break
                if stop is None:
                    raise
                continue
            if not k:
                raise ConnectionError("server closed the subscription")
            have += k
            # One batch is in flight at a time (the server waits for our ack), so the
            # buffer only ever holds the current frame (or an ALIVE before it).
            while have >= 10:
                status, count, length = _BATCH_HEADER.unpack_from(buf, 0)
                if status == 201:  # ALIVE
                    buf[0 : have - 10] = buf[10:have]
                    have -= 10
                    continue
                if status != 200:
                    raise RuntimeError(f"unexpected frame status {status}: {bytes(buf[:have])[:200]!r}")
                end = 10 + length
                if end > len(buf):
                    view.release()
                    buf.extend(bytes(end - len(buf)))
                    view = memoryview(buf)
                if have < end:
                    break
                if stop is not None and count:
                    (ts,) = _TS.unpack_from(buf, 10)
                    lag = time.time() * 1000 - ts
                    if lag > max_lag_ms:
                        max_lag_ms = lag
                waiter.sendall(ACK)
                got += count
                body_bytes += length
                batches += 1
                have -= end
                if have:
                    raise RuntimeError("server sent data before the ack")
                last = time.perf_counter()
        elapsed = last - t0
        cpu = time.process_time() - c0
        sock.close()
        results.put(("ok", got, elapsed, cpu, body_bytes, batches, max_lag_ms))
    except BaseException as e:  # noqa: BLE001
        results.put(("error", repr(e)))


# -- server and measuring ------------------------------------------------------------------


def read_hwm(pid):
    """Return the kernel's peak RSS (VmHWM) of C{pid} in bytes, or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_hwm(pid):
    """Reset VmHWM to the current RSS (Linux: write 5 to clear_refs). True on success."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def host_steal():
    """CPU seconds the hypervisor took from this virtual machine's CPUs so far (0 on bare
    metal): while it is high, wake-ups are late and every figure drops."""
    return getattr(psutil.cpu_times(), "steal", 0.0)


def host_busy():
    """CPU seconds all CPUs of the machine spent busy so far (guest time is in user)."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0)


class Meter:
    """Samples the server's RSS in a thread (psutil) and its CPU time over a phase."""

    def __init__(self, pid, interval=0.02):
        self.pid = pid
        self.proc = psutil.Process(pid)
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self):
        self.hwm_reset = reset_hwm(self.pid)
        self.peak = self.proc.memory_info().rss
        self.cpu0 = self._cpu()
        self.host0 = host_busy()
        self.steal0 = host_steal()
        self.steal = 0.0
        self.me0 = self._me()
        self.t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _cpu(self):
        t = self.proc.cpu_times()
        return t.user + t.system

    @staticmethod
    def _me():
        t = psutil.Process().cpu_times()
        return t.user + t.system

    def other_pct(self, workers_cpu=0.0):
        """CPU that neither the server, this process nor its workers used during the phase
        (other programs on the machine), in % of one core."""
        other = self.host - self.cpu - self.me - workers_cpu
        return max(0.0, 100 * other / self.wall)

    def steal_pct(self):
        """CPU time the hypervisor stole during the phase, in % of one core."""
        return 100 * self.steal / self.wall

    def _run(self):
        while not self._stop.wait(self.interval):
            try:
                rss = self.proc.memory_info().rss
            except psutil.Error:
                return
            if rss > self.peak:
                self.peak = rss

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        try:
            self.cpu = self._cpu() - self.cpu0
            self.host = host_busy() - self.host0
            self.steal = host_steal() - self.steal0
            self.me = self._me() - self.me0
            self.rss = self.proc.memory_info().rss
            self.peak = max(self.peak, self.rss)
            hwm = read_hwm(self.pid) if self.hwm_reset else None
            if hwm:
                self.peak = max(self.peak, hwm)
        except psutil.Error:
            self.cpu = float("nan")
            self.rss = 0
        self.wall = time.perf_counter() - self.t0
        return False


class Profiler:
    """Optionally runs ``py-spy record`` on the server for one phase."""

    def __init__(self, pid, out_dir, name, rate=250, gil=False):
        self.pid = pid
        self.gil = gil
        self.out_dir = out_dir
        self.name = name
        self.rate = rate
        self.proc = None

    def __enter__(self):
        if self.out_dir:
            exe = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
            out = os.path.join(self.out_dir, f"{self.name}.txt")
            self.proc = subprocess.Popen(
                [exe, "record", "--pid", str(self.pid), "--rate", str(self.rate),
                 "--format", "raw", "--threads", "-o", out] + (["--gil"] if self.gil else []),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            time.sleep(0.5)  # let it attach
        return self

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return False


class Bench:
    def __init__(self, args):
        self.args = args
        self.tmp = tempfile.mkdtemp(prefix="smss-bench-", dir=args.tmpdir)
        self.servers = []
        self.children = []
        self.rows = []  # (section, config, figures dict)
        self.notes = []

    # servers

    def server(self, name):
        config = {"store": {"flushLevel": 1}}
        s = ServerProcess(os.path.join(self.tmp, name), config=config)
        self.servers.append(s)
        s.start(timeout=60)
        return s

    def stop_server(self, s):
        try:
            s.stop(timeout=120)
        finally:
            s.close()

    def close(self):
        for p in self.children:
            if p.is_alive():
                p.kill()
            p.join(5)
        for s in self.servers:
            try:
                s.stop(timeout=30)
            except Exception:  # noqa: BLE001
                pass
            s.close()
        if not self.args.keep:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def spawn(self, target, *args):
        p = MP.Process(target=target, args=args, daemon=True)
        self.children.append(p)
        p.start()
        return p

    def collect(self, results, procs, timeout):
        out = []
        deadline = time.monotonic() + timeout
        for _ in procs:
            left = max(0.1, deadline - time.monotonic())
            r = results.get(timeout=left)
            if r[0] != "ok":
                raise RuntimeError(f"worker failed: {r[1]}")
            out.append(r[1:])
        for p in procs:
            p.join(10)
        return out

    def say(self, text):
        print(text, flush=True)

    def wait_quiet(self, what):
        """With --wait-quiet, wait until other programs leave the CPUs (nearly) idle."""
        limit = self.args.wait_quiet
        if not limit:
            return
        deadline = time.monotonic() + limit
        ncpu = os.cpu_count() or 1
        while True:
            busy = psutil.cpu_percent(interval=1.0) * ncpu
            if busy <= self.args.quiet_below:
                return
            if time.monotonic() >= deadline:
                self.say(f"({what}: machine still {busy:.0f}% busy after {limit:g}s; going on)")
                return

    # phases

    def run_publish(self):
        a = self.args
        for conns in a.conns:
            runs = [self._publish_once(conns, i) for i in range(a.repeat)]
            runs.sort(key=lambda f: f["msgs/s"])
            fig = runs[len(runs) // 2]  # the median run
            label = f"{conns} conn"
            if a.repeat > 1:
                label += f" (median of {a.repeat})"
                self.notes.append(f"publish {conns} conn: msgs/s of the {a.repeat} runs: "
                                  + ", ".join(f"{r['msgs/s']:.0f}" for r in runs))
            self.rows.append(("publish", label, fig))

    def _publish_once(self, conns, run):
        a = self.args
        self.wait_quiet(f"publish {conns}")
        s = self.server(f"publish-{conns}-{run}")
        try:
            topic = "bench-pub"
            create_topic(s.smss_port, topic)
            results = MP.Queue()
            barrier = MP.Barrier(conns + 1)
            procs = [
                self.spawn(pub_worker, s.smss_port, topic, a.seconds, a.client_poll, barrier,
                           results)
                for _ in range(conns)
            ]
            profile = a.profile if conns in a.profile_conns and run == 0 else None
            with Profiler(s.proc.pid, profile, f"publish-{conns}", gil=a.profile_gil):
                with Meter(s.proc.pid) as m:
                    barrier.wait(30)
                    out = self.collect(results, procs, a.seconds + 60)
        finally:
            self.stop_server(s)
        n = sum(r[0] for r in out)
        t0 = min(r[1] for r in out)
        t1 = max(r[2] for r in out)
        lat = sorted(x for r in out for x in r[3])
        client_cpu = sum(r[4] for r in out)
        rate = n / (t1 - t0)
        fig = {
            "msgs/s": rate,
            "peak RSS MB": m.peak / MB,
            "server CPU s": m.cpu,
            "server CPU %": 100 * m.cpu / m.wall,
            "client CPU %": 100 * client_cpu / m.wall,
            "other CPU %": m.other_pct(client_cpu), "steal %": m.steal_pct(),
            "p50 ms": 1000 * lat[len(lat) // 2],
            "p99 ms": 1000 * lat[int(len(lat) * 0.99)],
            "messages": n,
        }
        self.say(f"publish {conns:>2} conn: {rate:9.0f} msgs/s  peak RSS {m.peak / MB:.1f} MB"
                 f"  server CPU {m.cpu:.1f}s ({fig['server CPU %']:.0f}%)"
                 f"  p50 {fig['p50 ms']:.2f} ms  p99 {fig['p99 ms']:.2f} ms"
                 f"  other load {fig['other CPU %']:.0f}%  steal {fig['steal %']:.0f}%")
        return fig

    def run_catchup(self):
        a = self.args
        self.wait_quiet("backlog")
        s = self.server("catchup")
        topic = "bench-catchup"
        create_topic(s.smss_port, topic)
        with Meter(s.proc.pid) as m:
            secs = bulk_publish(s.smss_port, topic, a.messages, per_request=500)
        self.rows.append(("backlog", f"{a.messages} msgs, PUB x500", {
            "msgs/s": a.messages / secs, "peak RSS MB": m.peak / MB, "server CPU s": m.cpu,
            "server CPU %": 100 * m.cpu / m.wall, "client CPU %": 100 * m.me / m.wall,
            "other CPU %": m.other_pct(), "steal %": m.steal_pct(), "messages": a.messages,
        }))
        self.say(f"backlog: {a.messages} messages in {secs:.1f}s ({a.messages / secs:.0f} msgs/s,"
                 f" PUB batches of 500), peak RSS {m.peak / MB:.1f} MB")
        for batch in a.batches:
            self.wait_quiet(f"catch-up {batch}")
            results = MP.Queue()
            barrier = MP.Barrier(2)
            p = self.spawn(sub_worker, s.smss_port, topic, batch, f"catchup-{batch}",
                           a.messages, a.client_poll, barrier, results)
            with Profiler(s.proc.pid, a.profile if batch in a.profile_batches else None,
                          f"catchup-{batch}", gil=a.profile_gil):
                with Meter(s.proc.pid) as m:
                    barrier.wait(30)
                    ((got, elapsed, cpu, body_bytes, batches, _),) = self.collect(
                        results, [p], 600)
            if body_bytes != got * PUSHED_RECORD_SIZE:
                raise RuntimeError(f"catch-up batch {batch}: {body_bytes} body bytes for {got}"
                                   f" messages, expected {got * PUSHED_RECORD_SIZE}")
            rate = got / elapsed
            fig = {
                "msgs/s": rate,
                "peak RSS MB": m.peak / MB,
                "server CPU s": m.cpu,
                "server CPU %": 100 * m.cpu / m.wall,
                "client CPU %": 100 * cpu / elapsed,
                "other CPU %": m.other_pct(cpu), "steal %": m.steal_pct(),
                "messages": got,
            }
            self.rows.append(("catch-up", f"batch {batch}", fig))
            self.say(f"catch-up batch {batch:>3}: {rate:9.0f} msgs/s  ({got} msgs in {elapsed:.1f}s,"
                     f" {batches} batches)  peak RSS {m.peak / MB:.1f} MB"
                     f"  server CPU {fig['server CPU %']:.0f}%  client CPU {fig['client CPU %']:.0f}%")
            # A polling client is busy by design, so its CPU says nothing about limits.
            if fig["client CPU %"] > 80 and not a.client_poll:
                self.notes.append(f"catch-up batch {batch}: the client used {fig['client CPU %']:.0f}%"
                                  " of a core; it may be the bottleneck")
        self.stop_server(s)

    def run_idle(self):
        a = self.args
        self.wait_quiet("idle")
        s = self.server("idle")
        topic = "bench-idle"
        create_topic(s.smss_port, topic)
        with Meter(s.proc.pid) as m:
            secs = bulk_publish(s.smss_port, topic, a.idle_messages, per_request=2000)
        self.rows.append(("backlog", f"{a.idle_messages} msgs, PUB x2000", {
            "msgs/s": a.idle_messages / secs, "peak RSS MB": m.peak / MB, "server CPU s": m.cpu,
            "server CPU %": 100 * m.cpu / m.wall, "client CPU %": 100 * m.me / m.wall,
            "other CPU %": m.other_pct(), "steal %": m.steal_pct(), "messages": a.idle_messages,
        }))
        self.say(f"idle backlog: {a.idle_messages} messages in {secs:.1f}s"
                 f" ({a.idle_messages / secs:.0f} msgs/s), peak RSS {m.peak / MB:.1f} MB")
        rss_before = psutil.Process(s.proc.pid).memory_info().rss
        disk = sum(os.path.getsize(os.path.join(d, f))
                   for d, _, fs in os.walk(s.data) for f in fs)
        t0 = time.monotonic()
        self.stop_server(s)
        t_stop = time.monotonic() - t0
        t0 = time.monotonic()
        s.start(timeout=600)
        t_start = time.monotonic() - t0
        time.sleep(a.idle_wait)
        proc = psutil.Process(s.proc.pid)
        rss = proc.memory_info().rss
        hwm = read_hwm(s.proc.pid)
        cpu = proc.cpu_times()
        self.rows.append(("idle", f"{a.idle_messages} msgs after restart", {
            "RSS MB": rss / MB,
            "peak RSS MB": (hwm or rss) / MB,
            "server CPU s": cpu.user + cpu.system,
            "messages": a.idle_messages,
        }))
        self.say(f"idle: RSS {rss / MB:.1f} MB {a.idle_wait:g}s after restart (peak since start"
                 f" {(hwm or rss) / MB:.1f} MB; start took {t_start:.1f}s, stop {t_stop:.1f}s;"
                 f" RSS before restart {rss_before / MB:.1f} MB; data {disk / MB:.0f} MB)")
        self.notes.append(f"idle: store on disk {disk / MB:.0f} MB; restart (SIGTERM + start until"
                          f" listening) {t_stop:.1f}s + {t_start:.1f}s;"
                          f" RSS before the restart {rss_before / MB:.1f} MB")
        self.stop_server(s)

    def run_steady(self):
        a = self.args
        self.wait_quiet("steady")
        s = self.server("steady")
        topic = "bench-steady"
        create_topic(s.smss_port, topic)
        results = MP.Queue()
        sub_results = MP.Queue()
        barrier = MP.Barrier(3)
        stop = MP.Event()
        sub = self.spawn(sub_worker, s.smss_port, topic, a.steady_batch, "steady", None,
                         a.client_poll, barrier, sub_results, stop)
        pub = self.spawn(paced_pub_worker, s.smss_port, topic, a.steady_rate, a.steady_seconds,
                         a.client_poll, barrier, results)
        with Meter(s.proc.pid) as m:
            barrier.wait(30)
            ((n, elapsed, pub_cpu),) = self.collect(results, [pub], a.steady_seconds + 60)
            deadline = time.monotonic() + 5
            # Let the subscriber drain, then stop it.
            time.sleep(0.5)
            stop.set()
            ((got, _, cpu, _, _, max_lag),) = self.collect(
                sub_results, [sub], max(1, deadline - time.monotonic()) + 10)
        fig = {
            "msgs/s": n / elapsed,
            "peak RSS MB": m.peak / MB,
            "server CPU s": m.cpu,
            "server CPU %": 100 * m.cpu / m.wall,
            "client CPU %": 100 * (pub_cpu + cpu) / m.wall,
            "other CPU %": m.other_pct(pub_cpu + cpu), "steal %": m.steal_pct(),
            "messages": n,
        }
        self.rows.append(("steady", f"{a.steady_rate}/s + 1 sub (batch {a.steady_batch})", fig))
        self.say(f"steady: published {n} at {n / elapsed:.0f} msgs/s, subscriber got {got}"
                 f" (max delivery lag {max_lag:.0f} ms), peak RSS {m.peak / MB:.1f} MB,"
                 f" server CPU {fig['server CPU %']:.0f}%")
        self.notes.append(f"steady: subscriber received {got} of {n}, max delivery lag"
                          f" {max_lag:.0f} ms (server write time to first record of a batch)")
        self.stop_server(s)

    # output

    def table(self):
        cols = ["msgs/s", "peak RSS MB", "RSS MB", "server CPU s", "server CPU %",
                "client CPU %", "other CPU %", "steal %", "p50 ms", "p99 ms", "messages"]
        used = [c for c in cols if any(c in r[2] for r in self.rows)]
        head = ["section", "config"] + used
        lines = []
        for section, config, fig in self.rows:
            row = [section, config]
            for c in used:
                v = fig.get(c)
                if v is None:
                    row.append("")
                elif c == "messages":
                    row.append(str(v))
                elif c in ("msgs/s",):
                    row.append(f"{v:,.0f}")
                elif c.endswith("ms"):
                    row.append(f"{v:.2f}")
                else:
                    row.append(f"{v:.1f}")
            lines.append(row)
        widths = [max(len(x) for x in col) for col in zip(head, *lines)]
        fmt_row = lambda r: "  ".join(  # noqa: E731
            x.ljust(w) if i < 2 else x.rjust(w) for i, (x, w) in enumerate(zip(r, widths))
        )
        out = [fmt_row(head), "  ".join("-" * w for w in widths)]
        out += [fmt_row(r) for r in lines]
        return "\n".join(out)


def _ints(text):
    return tuple(int(x) for x in text.split(","))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small counts (CI smoke run, < 60 s)")
    p.add_argument("--only", choices=["publish", "catchup", "idle", "steady"], action="append",
                   help="run only this part (may be repeated)")
    p.add_argument("--messages", type=int, help="catch-up backlog (default 500000; quick 50000)")
    p.add_argument("--conns", type=_ints, default=(1, 4, 16),
                   help="publish connection counts (default 1,4,16)")
    p.add_argument("--batches", type=_ints, default=(1, 20, 100),
                   help="catch-up batch sizes (default 1,20,100)")
    p.add_argument("--seconds", type=float, help="publish run per config (default 10; quick 3)")
    p.add_argument("--repeat", type=int, default=1,
                   help="publish runs per config; the table shows the median (default 1)")
    p.add_argument("--idle-messages", type=int,
                   help="idle-RSS backlog (default 5000000; quick 100000)")
    p.add_argument("--idle-wait", type=float, default=2.0, help="seconds after restart (2)")
    p.add_argument("--steady-rate", type=int, default=3000, help="msgs/s in steady mode (3000)")
    p.add_argument("--steady-seconds", type=float, help="steady run (default 10; quick 3)")
    p.add_argument("--steady-batch", type=int, default=20, help="steady subscriber batch (20)")
    p.add_argument("--wait-quiet", type=float, default=0, metavar="S",
                   help="before each part, wait up to S seconds for other programs to leave "
                        "the machine idle (for shared machines; default 0: don't wait)")
    p.add_argument("--quiet-below", type=float, default=15, metavar="PCT",
                   help="what --wait-quiet calls idle: %% of one core busy (default 15)")
    add_argument(p)
    p.add_argument("--tmpdir", help="where to put the server's data (default: system temp)")
    p.add_argument("--keep", action="store_true", help="keep the data directory")
    p.add_argument("--profile", metavar="DIR",
                   help="run py-spy record (raw collapsed stacks) on the server into DIR for "
                        "publish with 1 connection and catch-up with batch 100 (see "
                        "--profile-conns, --profile-batches)")
    p.add_argument("--profile-conns", type=_ints, default=(1,),
                   help="publish configs to profile (default 1)")
    p.add_argument("--profile-batches", type=_ints, default=(100,),
                   help="catch-up batch sizes to profile (default 100)")
    p.add_argument("--profile-gil", action="store_true",
                   help="py-spy --gil: only samples that hold the GIL (Python CPU work)")
    a = p.parse_args(argv)
    q = a.quick
    if a.messages is None:
        a.messages = 50_000 if q else 500_000
    if a.seconds is None:
        a.seconds = 3.0 if q else 10.0
    if a.idle_messages is None:
        a.idle_messages = 100_000 if q else 5_000_000
    if a.steady_seconds is None:
        a.steady_seconds = 3.0 if q else 10.0
    a.only = a.only or ["publish", "catchup", "idle", "steady"]
    if a.profile:
        os.makedirs(a.profile, exist_ok=True)
    return a


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None):
    args = parse_args(argv)
    if psutil is None:
        sys.exit("smss_bench needs psutil: pip install psutil (or the 'bench' extra)")
    # Clean up (servers, workers, data) on SIGTERM and SIGINT too, even when started in
    # the background by a shell that ignores SIGINT. Workers forked later inherit this;
    # they are stopped with SIGKILL.
    signal.signal(signal.SIGTERM, _interrupted)
    signal.signal(signal.SIGINT, _interrupted)
    busy = psutil.cpu_percent(interval=1.0) * (os.cpu_count() or 1)
    bench = Bench(args)
    t0 = time.monotonic()
    print(f"smss benchmark: {os.cpu_count()} CPUs, Python {sys.version.split()[0]},"
          f" data under {bench.tmp}", flush=True)
    print(f"machine load before start: {busy:.0f}% of one core busy,"
          f" load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    print(describe(args.client_poll), flush=True)
    if busy > 20:
        bench.notes.append(f"other programs kept {busy:.0f}% of one core busy before the run;"
                           " figures are lower and noisier than on an idle machine")
    status = 0
    try:
        for part in ("publish", "catchup", "idle", "steady"):
            if part in args.only:
                getattr(bench, "run_" + part)()
    except KeyboardInterrupt as e:
        bench.notes.append(f"interrupted ({e or 'SIGINT'}); the table holds the parts done")
        status = 130
    finally:
        bench.close()
    print()
    print(bench.table())
    for note in bench.notes:
        print("note:", note)
    print(f"total {time.monotonic() - t0:.0f}s")
    return status


if __name__ == "__main__":
    sys.exit(main())
