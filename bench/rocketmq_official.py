#!/usr/bin/env python
"""RocketMQ's official benchmark (its Producer and Consumer) against mqserver and the Java
RocketMQ broker, side by side, alternating A B A B.

    PYTHONPATH=. .venv/bin/python bench/rocketmq_official.py [--rounds 2]
        [--threads 4,16] [--flush 1,2] [--messages 150000]
        [--benchmark CMD] [--namesrv CMD] [--broker CMD] [--only mqserver|java]
        [--variant NAME:KEY=VALUE[,KEY=VALUE]] [--tree NAME:PATH] [--profile DIR]

For each flush level and producer thread count, every round starts a fresh mqserver
(C{store.flushLevel} 1 or 2, its nameserver and broker doors on loopback) and then a fresh
Java name server and broker (C{flushDiskType} ASYNC_FLUSH or SYNC_FLUSH), each in a
temporary directory. On each: the benchmark C{Producer -w THREADS -s 200 -q MESSAGES}
sends to a new topic, then the benchmark C{Consumer} reads the whole backlog.

Figures per run: send TPS and RT avg (the Producer's own 10-second windows, the median of
the windows after the first; failed sends are the Producer's send and response failures), consume TPS (the backlog over the time the Consumer process
was reading from its sockets, from /proc), broker CPU per message while the producer's
windows ran, the broker's peak RSS, and the connections the producer held to the broker.
The table gives the median of the rounds and the ratio mqserver / Java.

The Java side is built by whoever runs the comparison, outside this repository, and named
by path (options or environment variables); nothing here builds or fetches it:

- C{ROCKETMQ_BENCHMARK}: a command run as C{CMD Producer ARGS} or C{CMD Consumer ARGS}
  that starts C{org.apache.rocketmq.example.benchmark.Producer} or C{.Consumer}.
- C{ROCKETMQ_NAMESRV}: a command starting the name server, run as C{CMD -c FILE}.
- C{ROCKETMQ_BROKER}: a command starting the broker, run as C{CMD -c FILE}. It must listen
  on 127.0.0.1 only (see docs/performance.md).

C{--variant} adds an mqserver column with other settings (e.g.
C{--variant spin0:server.spinMicros=0}), C{--tree NAME:PATH} one run from another
source tree (A B A B of code). C{--profile DIR} runs mqserver under twistd's cProfile
(C{DIR/NAME-fFLUSH-wTHREADS.pstats}, written when it stops) and the Java side not at
all; profiled figures are slow, take throughput from runs without it.
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time

import harness
from harness import ROOT
from compare import Mq, settings
from procstat import cpu_seconds, peak_rss_mb
from refservers import binary, free_port, wait_listening

support = harness.support_module("server")

_SEND = re.compile(r"Send TPS: (\d+) Max RT\(ms\): \d+ Average RT\(ms\):\s*([0-9.]+)")
_COMPLETE = re.compile(r"\[Complete\] Send Total: (\d+)")
_FAILED = re.compile(r"Send Failed: (\d+) Response Failed: (\d+)")

BROKER_CONF = """\
brokerClusterName=DefaultCluster
brokerName=broker-a
brokerId=0
brokerIP1=127.0.0.1
listenPort={port}
namesrvAddr=127.0.0.1:{ns_port}
storePathRootDir={store}
storePathCommitLog={store}/commitlog
autoCreateTopicEnable=true
brokerRole=ASYNC_MASTER
flushDiskType={flush}
"""


def broker_port():
    """A port P with P-2 (the broker's second listener) and P+1 (its HA listener) free too."""
    for _ in range(100):
        p = free_port()
        if all(_port_free(q) for q in (p - 2, p + 1)):
            return p
    raise RuntimeError("no free port triple for the Java broker")


def _port_free(port):
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class JavaRocketMQ:
    """The Java name server and broker, each a process in a temporary directory."""

    def __init__(self, name, tmp, namesrv, broker, flush_level):
        self.name, self.namesrv_cmd, self.broker_cmd = name, namesrv, broker
        self.flush = "SYNC_FLUSH" if flush_level >= 2 else "ASYNC_FLUSH"
        self.dir = os.path.join(tmp, f"{name}-{time.monotonic_ns()}")
        self.procs = []

    def _spawn(self, argv, log_name):
        log = open(os.path.join(self.dir, log_name), "wb")
        try:
            proc = subprocess.Popen(argv, cwd=self.dir, stdout=log, stderr=log,
                                    stdin=subprocess.DEVNULL)
        finally:
            log.close()
        self.procs.append(proc)
        return proc

    def start(self):
        os.makedirs(self.dir)
        ns_port = free_port()
        with open(os.path.join(self.dir, "namesrv.conf"), "w") as f:
            f.write(f"listenPort={ns_port}\n")
        ns = self._spawn([self.namesrv_cmd, "-c", "namesrv.conf"], "namesrv.log")
        wait_listening(ns_port, ns, timeout=60)
        self.rmq_port = broker_port()
        with open(os.path.join(self.dir, "broker.conf"), "w") as f:
            f.write(BROKER_CONF.format(port=self.rmq_port, ns_port=ns_port, flush=self.flush,
                                       store=os.path.join(self.dir, "store")))
        broker = self._spawn([self.broker_cmd, "-c", "broker.conf"], "broker.log")
        wait_listening(self.rmq_port, broker, timeout=60)
        self.namesrv = f"127.0.0.1:{ns_port}"
        self.pid = broker.pid
        self._wait_registered()
        return self

    def _wait_registered(self, timeout=60.0):
        """The broker says it booted once it has registered with the name server."""
        log = os.path.join(self.dir, "broker.log")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(log, errors="replace") as f:
                if "boot success" in f.read():
                    return
            time.sleep(0.1)
        raise RuntimeError(f"the Java broker did not boot in {timeout:.0f} s")

    def stop(self):
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


class Profiled(Mq):
    """mqserver under twistd's cProfile, its stats written to C{path} when it stops."""

    def __init__(self, name, tmp, overrides, path, tree=ROOT):
        super().__init__(name, tmp, overrides, tree=tree, rocket=True)
        self.path = path

    def start(self):
        plain = support.twistd_command
        # twistd's own options go before the plugin name, where ServerProcess puts the
        # command; restored at once so no other server is profiled
        support.twistd_command = lambda root=None: plain(root) + [
            "--profile", self.path, "--profiler", "cprofile", "--savestats"]
        try:
            return super().start()
        finally:
            support.twistd_command = plain


def _rchar(pid):
    """Bytes the process has read through read-like system calls (sockets included)."""
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    return 0


def _connections(port):
    """Established TCP connections to 127.0.0.1:C{port} (the broker's side of them)."""
    out = subprocess.run(["ss", "-Htn", "state", "established", f"( sport = :{port} )"],
                         capture_output=True, text=True).stdout
    return sum(1 for line in out.splitlines() if line.strip())


def produce(cmd, sysm, topic, threads, messages, home):
    """Run the Producer to completion; return send TPS, RT avg, broker CPU per message
    (microseconds) and the producer's connections to the broker."""
    cpu0 = cpu_seconds(sysm.pid)
    proc = subprocess.Popen(
        [cmd, "Producer", "-n", sysm.namesrv, "-t", topic, "-w", str(threads), "-s", "200",
         "-q", str(messages)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=home,
        env=dict(os.environ, HOME=home))
    windows, conns, output = [], [], []
    total = failed = None
    try:
        for line in proc.stdout:
            output.append(line)
            m = _SEND.search(line)
            if m and "Current Time" in line:
                windows.append((time.monotonic(), cpu_seconds(sysm.pid), int(m[1]), float(m[2])))
                conns.append(_connections(sysm.rmq_port))
            c = _COMPLETE.search(line)
            if c:
                total = int(c[1])
                if m and not windows:  # a run shorter than one window: the whole run
                    windows.append((time.monotonic(), cpu_seconds(sysm.pid), int(m[1]),
                                    float(m[2])))
                    conns.append(_connections(sysm.rmq_port))
                f = _FAILED.search(line)
                failed = int(f[1]) + int(f[2]) if f else 0
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if total is None or not windows:
        raise RuntimeError("the producer did not finish:\n" + "".join(output[-20:]))
    steady = windows[1:] or windows
    cpu = msgs = 0.0
    for (t0, c0, _, _), (t1, c1, tps, _) in zip(windows, windows[1:]):
        cpu += c1 - c0
        msgs += tps * (t1 - t0)
    if not msgs:  # one window only: the whole run
        cpu, msgs = cpu_seconds(sysm.pid) - cpu0, total
    return {
        "send_tps": statistics.median(w[2] for w in steady),
        "rt_ms": statistics.median(w[3] for w in steady),
        "cpu_us": 1e6 * cpu / msgs,
        "conns": max(conns),
        "sent": total,
        "failed": failed,
    }


def consume(cmd, sysm, topic, expect, home, quiet=1.0, timeout=300.0):
    """Run the Consumer on the backlog of C{expect} messages; return the consume TPS over
    the time its process was reading (more than 64 KiB per 50 ms) from its sockets."""
    proc = subprocess.Popen(
        [cmd, "Consumer", "-n", sysm.namesrv, "-t", topic, "-g", f"bench_{topic}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=home,
        env=dict(os.environ, HOME=home))
    started = threading.Event()
    output = []

    def read():
        for line in proc.stdout:
            output.append(line)
            if "Consumer Started" in line:
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not started.wait(60):
            raise RuntimeError("the consumer did not start:\n" + "".join(output[-20:]))
        first = last = None
        prev = _rchar(proc.pid)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            time.sleep(0.05)
            now, cur = time.monotonic(), _rchar(proc.pid)
            if cur - prev > 65536:
                first = first or now - 0.05
                last = now
            prev = cur
            if last and now - last > quiet:
                break
        if not last:
            raise RuntimeError("the consumer read nothing")
        return {"consume_tps": expect / (last - first)}
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def one_run(a, make, name, flush, threads, tmp):
    sysm = make().start()
    home = os.path.join(tmp, f"home-{time.monotonic_ns()}")
    os.makedirs(home)
    try:
        topic = f"Bench{name.capitalize()}F{flush}W{threads}"
        r = produce(a.benchmark, sysm, topic, threads, a.messages, home)
        r.update(consume(a.benchmark, sysm, topic, r["sent"], home))
        r["rss_mb"] = peak_rss_mb(sysm.pid)
        return r
    finally:
        sysm.stop()
        shutil.rmtree(home, ignore_errors=True)


FIGURES = [("send_tps", "send TPS", "{:.0f}"), ("rt_ms", "RT avg ms", "{:.2f}"),
           ("consume_tps", "consume TPS", "{:.0f}"), ("cpu_us", "CPU us/msg", "{:.1f}"),
           ("rss_mb", "peak RSS MB", "{:.0f}"), ("conns", "conns", "{:d}"),
           ("failed", "failed sends", "{:d}")]


def print_table(results, systems):
    """Markdown: per figure each system's median (its rounds in brackets), then each
    mqserver column's median over the Java broker's."""
    ours = [s for s in systems if s != "java"] if "java" in systems else []
    print()
    print("| flush | threads | figure | " + " | ".join(systems + [f"{s} / java" for s in ours])
          + " |")
    print("|---|---|---|" + "---:|" * (len(systems) + len(ours)))
    for (flush, threads), by_sys in results.items():
        for key, label, fmt in FIGURES:
            meds, cells = {}, []
            for s in systems:
                runs = [r[key] for r in by_sys.get(s, [])]
                if not runs:
                    cells.append("-")
                    continue
                meds[s] = statistics.median(runs)
                cells.append(fmt.format(type(runs[0])(meds[s])) + " ("
                             + ", ".join(fmt.format(v) for v in runs) + ")")
            for s in ours:
                ok = meds.get("java") and s in meds
                cells.append(f"{meds[s] / meds['java']:.2f}" if ok else "-")
            print(f"| {flush} | {threads} | {label} | " + " | ".join(cells) + " |")


def run(a):
    tmp = tempfile.mkdtemp(prefix="rmq-official-", dir=a.tmpdir)
    systems = []
    variants = {}  # another mqserver column: name -> {setting: value}
    trees = {}  # another mqserver column run from another source tree: name -> path
    if "mqserver" in a.only:
        systems.append("mqserver")
        for v in a.variant:
            name, _, kv = v.partition(":")
            variants[name] = settings(kv.split(","))
            systems.append(name)
        for t in a.tree:
            name, _, path = t.partition(":")
            trees[name] = os.path.abspath(path)
            systems.append(name)
    if "java" in a.only and not a.profile:
        if not (a.namesrv and a.broker):
            print("java: no ROCKETMQ_NAMESRV / ROCKETMQ_BROKER given; mqserver only")
        else:
            systems.append("java")
    results = {}
    try:
        for flush in a.flush:
            for threads in a.threads:
                by_sys = results.setdefault((flush, threads), {})
                for rnd in range(a.rounds):
                    for s in systems:
                        if s == "java":
                            def make(flush=flush):
                                return JavaRocketMQ("java", tmp, a.namesrv, a.broker, flush)
                        elif a.profile:
                            path = os.path.join(a.profile, f"{s}-f{flush}-w{threads}.pstats")

                            def make(flush=flush, path=path, s=s):
                                return Profiled("mq", tmp, {"store.flushLevel": flush,
                                                            **variants.get(s, {})}, path,
                                                tree=trees.get(s, ROOT))
                        else:
                            def make(flush=flush, s=s):
                                return Mq("mq", tmp, {"store.flushLevel": flush,
                                                      **variants.get(s, {})},
                                          tree=trees.get(s, ROOT), rocket=True)
                        with open("/proc/loadavg") as f:
                            ld = f.read().split()[0]
                        r = one_run(a, make, s, flush, threads, tmp)
                        by_sys.setdefault(s, []).append(r)
                        print(f"flush {flush} w{threads} round {rnd + 1} {s:8s} load {ld}: "
                              + ", ".join(f"{label} " + fmt.format(r[k])
                                          for k, label, fmt in FIGURES), flush=True)
        print_table(results, systems)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _ints(text):
    return [int(x) for x in text.split(",")]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=_ints, default=[4, 16])
    ap.add_argument("--flush", type=_ints, default=[1, 2], help="store.flushLevel values")
    ap.add_argument("--messages", type=int, default=150000, help="messages per producer run")
    ap.add_argument("--benchmark", default=os.environ.get("ROCKETMQ_BENCHMARK"))
    ap.add_argument("--namesrv", default=os.environ.get("ROCKETMQ_NAMESRV"))
    ap.add_argument("--broker", default=os.environ.get("ROCKETMQ_BROKER"))
    ap.add_argument("--only", action="append", choices=["mqserver", "java"])
    ap.add_argument("--variant", action="append", default=[],
                    help="another mqserver column: NAME:KEY=VALUE[,KEY=VALUE]")
    ap.add_argument("--tree", action="append", default=[],
                    help="another mqserver column run from another source tree: NAME:PATH "
                         "(its C extensions built in place)")
    ap.add_argument("--profile", metavar="DIR")
    ap.add_argument("--tmpdir")
    a = ap.parse_args(argv)
    a.only = a.only or ["mqserver", "java"]
    for opt in ("benchmark", "namesrv", "broker"):
        path = getattr(a, opt)
        if path and not binary(path, ""):
            ap.error(f"--{opt} {path}: no such executable")
    if not a.benchmark:
        ap.error("RocketMQ's benchmark is needed: --benchmark CMD or ROCKETMQ_BENCHMARK")
    if a.profile:
        os.makedirs(a.profile, exist_ok=True)
        a.profile = os.path.abspath(a.profile)
    return a


def main(argv=None):
    run(parse_args(argv))


if __name__ == "__main__":
    main()
