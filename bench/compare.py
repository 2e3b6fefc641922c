#!/usr/bin/env python
"""mqserver side by side with the reference servers, in one run, alternating A B A B.

For each figure of docs/performance.md a fresh server of each system is started in turn (mqserver,
then the reference, once per round), measured the same way, and stopped; the table gives
every run and the ratio of the medians (mqserver / reference; for CPU per message lower
is better). Reference servers are optional: with a binary absent its column says why.

    PYTHONPATH=. .venv/bin/python bench/compare.py [--rounds 2] [--seconds 5]
        [--smss-bin PATH] [--smss-sdk PATH] [--nsqd-bin PATH] [--bench-writer PATH]
        [--bench-reader PATH]
        [--only smss|nsq|rocketmq|steady|rss] [--variant NAME:KEY=VALUE[,KEY=VALUE]]
        [--nsq-buffers default,25,none]

The paths can also come from SMSS_BIN, SMSS_SDK_LOAD, NSQD_BIN, NSQ_BENCH_WRITER,
NSQ_BENCH_READER. C{--smss-sdk} adds rows driven by the smss Go SDK (a small load driver
built outside the repository: four goroutines publishing one message per round trip, and
a subscriber catching up with batch 20).
C{--variant} adds a second mqserver column with other configuration (e.g.
C{--variant spin0:server.spinMicros=0}), C{--tree NAME:PATH} one run from another source
tree (e.g. C{--tree main:../main}); see bench/README.md.
"""

import argparse
import json
import multiprocessing as mp
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from harness import ROOT, ServerProcess, run_workers

import compare_rocketmq as crm
import nsq_bench
import smss_bench as sb
from procstat import cpu_seconds, peak_rss_mb, rss_mb, steal_seconds
from protocols.smss import client_codec as cc
from refservers import RefServer, binary, sdk_load

MP = mp.get_context("fork")
_OPS = re.compile(r"duration: ([0-9.]+)(ms|s) - [0-9.]+mb/s - ([0-9.]+)ops/s")


def load():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


# -- the systems --------------------------------------------------------------------------


class Mq:
    """mqserver (C{twistd -n mqserver}) with the smss and NSQ doors on loopback, and the
    RocketMQ nameserver and broker doors too when C{rocket}."""

    def __init__(self, name, tmp, overrides=None, tree=ROOT, rocket=False):
        self.name, self.tmp, self.overrides = name, tmp, dict(overrides or {})
        self.tree, self.rocket = tree, rocket
        self.server = None

    def start(self):
        config = {"store": {"flushLevel": 1}}
        for key, value in self.overrides.items():
            node = config
            *parents, leaf = key.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        data = os.path.join(self.tmp, f"{self.name}-{time.monotonic_ns()}")
        listen = {"smss": "tcp:0:interface=127.0.0.1", "nsqd_tcp": "tcp:0:interface=127.0.0.1"}
        if self.rocket:
            listen.update(namesrv="tcp:0:interface=127.0.0.1", broker="tcp:0:interface=127.0.0.1")
        self.server = ServerProcess(data, config=config, listen=listen, root=self.tree)
        self.server.start(timeout=60)
        self.smss_port = self.server.smss_port
        self.nsq_port = self.server.ports["NsqdFactory"]
        if self.rocket:
            self.namesrv = f"127.0.0.1:{self.server.ports['NamesrvFactory']}"
            self.rmq_port = self.server.ports["BrokerDoor"]
        self.pid = self.server.proc.pid
        return self

    def stop(self):
        try:
            self.server.stop(timeout=60)
        finally:
            self.server.close()
            shutil.rmtree(self.server.data, ignore_errors=True)


class Ref:
    """A reference server: C{kind} is C{"smss"} or C{"nsqd"}; C{extra_args} are added to
    its command line."""

    def __init__(self, name, kind, path, tmp, extra_args=()):
        self.name, self.kind, self.path, self.tmp = name, kind, path, tmp
        self.extra_args = extra_args

    def start(self):
        self.server = RefServer(self.kind, self.path, self.tmp, self.extra_args).start()
        self.pid = self.server.pid
        self.smss_port = self.nsq_port = self.server.port
        return self

    def stop(self):
        self.server.stop()


# -- measurements: each takes a started system and returns a dict of figures ---------------


def _collect(results, procs, timeout):
    out = []
    for _ in procs:
        r = results.get(timeout=timeout)
        if r[0] != "ok":
            raise RuntimeError(r[1])
        out.append(r[1:])
    for p in procs:
        p.join(10)
    return out


def smss_publish(sysm, a, conns):
    topic = "cmp-pub"
    sb.create_topic(sysm.smss_port, topic)
    results, barrier = MP.Queue(), MP.Barrier(conns + 1)
    procs = [MP.Process(target=sb.pub_worker, daemon=True,
                        args=(sysm.smss_port, topic, a.seconds, a.client_poll, barrier, results))
             for _ in range(conns)]
    for p in procs:
        p.start()
    c0 = cpu_seconds(sysm.pid)
    barrier.wait(60)
    out = _collect(results, procs, a.seconds + 60)
    cpu = cpu_seconds(sysm.pid) - c0
    n = sum(r[0] for r in out)
    t = max(r[2] for r in out) - min(r[1] for r in out)
    return {"rate": n / t, "cpu_us": 1e6 * cpu / n, "client_us": 1e6 * sum(r[4] for r in out) / n}


def smss_catchup(sysm, a, batch):
    topic = "cmp-catchup"
    sb.create_topic(sysm.smss_port, topic)
    sb.bulk_publish(sysm.smss_port, topic, a.backlog)
    results, barrier = MP.Queue(), MP.Barrier(2)
    p = MP.Process(target=sb.sub_worker, daemon=True,
                   args=(sysm.smss_port, topic, batch, f"cmp{batch}", a.backlog,
                         a.client_poll, barrier, results))
    p.start()
    c0 = cpu_seconds(sysm.pid)
    barrier.wait(60)
    (r,) = _collect(results, [p], 300)
    cpu = cpu_seconds(sysm.pid) - c0
    got, elapsed = r[0], r[1]
    return {"rate": got / elapsed, "cpu_us": 1e6 * cpu / got}


def smss_sdk_publish(sysm, a, conns):
    """C{conns} goroutines of the smss Go SDK, one Publish (200 bytes) per round trip."""
    topic = "cmp-sdk-pub"
    sb.create_topic(sysm.smss_port, topic)
    c0 = cpu_seconds(sysm.pid)
    n, t = sdk_load(a.smss_sdk, sysm.smss_port, "-topic", topic, "-conns", conns, "-seconds",
                     a.seconds, "-size", 200, "pub", timeout=a.seconds + 60)
    return {"rate": n / t, "cpu_us": 1e6 * (cpu_seconds(sysm.pid) - c0) / n}


def smss_sdk_catchup(sysm, a, batch):
    """One smss Go SDK subscriber from eventId 0 reads the C{--backlog}, C{batch} a time."""
    topic = "cmp-sdk-catchup"
    sb.create_topic(sysm.smss_port, topic)
    sb.bulk_publish(sysm.smss_port, topic, a.backlog)
    c0 = cpu_seconds(sysm.pid)
    n, t = sdk_load(a.smss_sdk, sysm.smss_port, "-topic", topic, "-batch", batch, "-expect",
                     a.backlog, "sub", timeout=300)
    return {"rate": n / t, "cpu_us": 1e6 * (cpu_seconds(sysm.pid) - c0) / n}


def _go_tool(path, port, topic, seconds, extra=()):
    """Run nsq's bench_writer / bench_reader; return (ops/s, messages)."""
    argv = [path, f"--nsqd-tcp-address=127.0.0.1:{port}", f"--topic={topic}",
            f"--runfor={seconds}s", "--size=200", *extra]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 120)
    m = _OPS.search(done.stderr + done.stdout)
    if done.returncode or not m:
        raise RuntimeError(f"{os.path.basename(path)} failed: {done.stderr[-500:]}")
    secs = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
    ops = float(m.group(3))
    return ops, ops * secs


def nsq_writer_reader(sysm, a):
    topic = "cmp_bench"
    c0 = cpu_seconds(sysm.pid)
    wrate, written = _go_tool(a.bench_writer, sysm.nsq_port, topic, a.seconds,
                              ["--batch-size=200"])
    c1 = cpu_seconds(sysm.pid)
    # bench_reader reads for a fixed time: give it less than the backlog needs
    rrate, read = _go_tool(a.bench_reader, sysm.nsq_port, topic, max(1, a.seconds // 2),
                           ["--channel=ch", "--rdy=2500"])
    c2 = cpu_seconds(sysm.pid)
    return {"rows": {
        "nsq bench_writer MPUB 200": {"rate": wrate, "cpu_us": 1e6 * (c1 - c0) / max(written, 1)},
        "nsq bench_reader": {"rate": rrate, "cpu_us": 1e6 * (c2 - c1) / max(read, 1),
                             "note": "drained the backlog" if read >= 0.99 * written else ""}}}


def nsq_round_trip(sysm, a):
    c0 = cpu_seconds(sysm.pid)
    n, t = run_workers(nsq_bench._pub_one, 1,
                          (sysm.nsq_port, "cmp_rt", a.seconds, 200, a.client_poll))
    return {"rate": n / t, "cpu_us": 1e6 * (cpu_seconds(sysm.pid) - c0) / n}


# -- steady rate with one consumer ----------------------------------------------------------


def paced_pipelined(port, request, reply_size, rate, seconds, per_write, handshake, out):
    """Send C{rate} requests a second (one message each), C{per_write} of them in one
    write at evenly spaced times, for C{seconds}; a thread reads the replies meanwhile,
    so a slow reply never delays the next send. Put the count sent.

    @param reply_size: the size of every reply, or a function of the bytes read that
        returns how many whole replies they start with and the bytes those take."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if handshake:
        sock.sendall(handshake)
    writes = int(rate * seconds / per_write)
    want = per_write * writes

    def drain():
        got, nbytes, buf = 0, 0, b""
        while got < want:
            data = sock.recv(1 << 16)
            if not data:
                break
            if callable(reply_size):
                n, used = reply_size(buf + data)
                buf = (buf + data)[used:]
                got += n
            else:
                nbytes += len(data)
                got = nbytes // reply_size

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    chunk = request * per_write
    interval = per_write / rate
    t0 = time.perf_counter()
    for i in range(writes):
        due = t0 + i * interval
        now = time.perf_counter()
        if due > now:
            time.sleep(due - now)
        sock.sendall(chunk)
    reader.join(60)
    sock.close()
    out.put(writes * per_write)


def paced(port, request, reply_size, rate, seconds, per_write, handshake=b""):
    """Run L{paced_pipelined} in its own process; return the count of requests sent."""
    sent_q = MP.Queue()
    pub = MP.Process(target=paced_pipelined, daemon=True,
                     args=(port, request, reply_size, rate, seconds, per_write, handshake,
                           sent_q))
    pub.start()
    sent = sent_q.get(timeout=seconds + 120)
    pub.join(10)
    return sent


def _nsq_consumer(port, topic, total, counter, out, settings):
    nsq_bench._reader(port, topic, 120.0, 200, total, counter, 0, out, settings)


def nsq_buffer(spec):
    """(IDENTIFY settings or None, row label suffix) of one C{--nsq-buffers} item: what
    the NSQ steady consumer asks of its output buffer. "default": no IDENTIFY (16 KB,
    flushed every 250 ms at the latest); "none": no buffer, every delivery written at
    once; N: flushed every N ms at the latest (nsqd's least is 25 unless its
    --min-output-buffer-timeout is lowered: L{nsq_flush_floor})."""
    if spec == "default":
        return None, ""
    if spec == "none":
        return {"output_buffer_size": -1}, ", unbuffered"
    return {"output_buffer_timeout": int(spec)}, f", buffer {int(spec)} ms"


def nsq_flush_floor(specs):
    """(mqserver config overrides, nsqd arguments) that let a consumer ask for the
    shortest flush interval among C{--nsq-buffers} C{specs} when it is below nsqd's
    least (25 ms): both servers get the same floor, C{nsq.minOutputBufferTimeout} and
    C{--min-output-buffer-timeout}. Nothing when no spec goes below 25 ms."""
    asked = [int(s) for s in specs if s.isdigit()]
    if not asked or min(asked) >= 25:
        return {}, []
    floor = min(asked)
    return {"nsq.minOutputBufferTimeout": floor}, [f"--min-output-buffer-timeout={floor}ms"]


def steady(sysm, a, proto, rate, nsq_settings=None):
    """CPU of the server per message at a steady C{rate} with one consumer attached:
    from the first publish until the consumer has every message. C{nsq_settings}: the
    NSQ consumer's IDENTIFY (L{nsq_buffer})."""
    total = int(rate * a.steady_seconds)
    out = MP.Queue()
    if proto == "smss":
        topic = "cmp-steady"
        sb.create_topic(sysm.smss_port, topic)
        barrier = MP.Barrier(2)
        consumer = MP.Process(target=sb.sub_worker, daemon=True,
                              args=(sysm.smss_port, topic, 20, "steady", total, 0, barrier,
                                    out))
        consumer.start()
        barrier.wait(60)
        port, request, reply, hs = sysm.smss_port, cc.encode_pub(topic, sb.RECORD), 10, b""
    else:
        topic = "cmp_steady"
        counter = MP.Value("q", 0)
        # the topic and channel exist before the first PUB, so nothing is left behind
        s = socket.create_connection(("127.0.0.1", sysm.nsq_port))
        s.sendall(b"  V2PUB %s\n\x00\x00\x00\x01x" % topic.encode())
        nsq_bench._read_frame(s, bytearray())
        s.close()
        consumer = MP.Process(target=_nsq_consumer, daemon=True,
                              args=(sysm.nsq_port, topic, total + 1, counter, out,
                                    nsq_settings))
        consumer.start()
        deadline = time.monotonic() + 30
        while counter.value < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        body = b"x" * 200
        port, hs = sysm.nsq_port, b"  V2"
        request = b"PUB " + topic.encode() + b"\n" + len(body).to_bytes(4, "big") + body
        reply = 10  # size(4) type(4) "OK"
    c0, t0 = cpu_seconds(sysm.pid), time.monotonic()
    sent = paced(port, request, reply, rate, a.steady_seconds, a.steady_per_write, hs)
    r = out.get(timeout=120)
    if not isinstance(r, int) and r[0] != "ok":
        raise RuntimeError(r)
    cpu, wall = cpu_seconds(sysm.pid) - c0, time.monotonic() - t0
    consumer.join(10)
    if consumer.is_alive():
        consumer.kill()
    return {"rate": sent / a.steady_seconds, "cpu_us": 1e6 * cpu / sent,
            "note": f"server CPU {100 * cpu / wall:.0f}% of a core"}


def idle_rss(sysm, a):
    time.sleep(a.idle_wait)
    return {"rss": rss_mb(sysm.pid)}


# -- the run --------------------------------------------------------------------------------


class Table:
    def __init__(self):
        self.rows = {}  # figure -> system -> [(value, load)]
        self.order = []
        self.notes = {}

    def add(self, figure, system, value, ld, note=""):
        if figure not in self.rows:
            self.rows[figure] = {}
            self.order.append(figure)
        self.rows[figure].setdefault(system, []).append((value, ld))
        if note:
            self.notes.setdefault(figure, set()).add(f"{system}: {note}")

    def print(self, systems, refs, skipped):
        print()
        lines = []
        for fig in self.order:
            cells, medians = [], {}
            for s in systems:
                runs = self.rows[fig].get(s)
                if not runs:
                    cells.append("-")
                    continue
                medians[s] = med = statistics.median(v for v, _ in runs)
                cells.append(_fmt(med) + " (" + "/".join(_fmt(v) for v, _ in runs) + ")")
            ref = [medians[r] for r in refs if medians.get(r)]
            ratio = f"{medians[systems[0]] / ref[0]:.2f}" if ref and medians.get(systems[0]) else ""
            lines.append((fig, cells, ratio))
        w = max([26] + [len(c) + 2 for _, cells, _ in lines for c in cells])
        head = f"{'figure':<56}" + "".join(f"{s:>{w}}" for s in systems) + f"{'mq/ref':>8}"
        print(head)
        print("-" * len(head))
        for fig, cells, ratio in lines:
            print(f"{fig:<56}" + "".join(f"{c:>{w}}" for c in cells) + f"{ratio:>8}")
        print("\nmedian (each run, in order); mq/ref = the first column's median over the"
              " reference server's.\nLoad average (1 min) at the start of each run:")
        seen = set()
        for fig in self.order:
            base = re.sub(r" (msgs/s|server CPU us/msg|client CPU us/msg|server/client CPU|"
                          r"peak RSS MB)$", "", fig)
            if base in seen:
                continue
            seen.add(base)
            loads = "; ".join(f"{s} " + "/".join(f"{ld:.1f}" for _, ld in runs)
                              for s, runs in self.rows[fig].items())
            print(f"  {base}: {loads}")
            for n in sorted(self.notes.get(fig, ())):
                print(f"    {n}")
        for what, why in skipped:
            print(f"skipped {what}: {why}")


def _fmt(v):
    if v < 10:
        return f"{v:.2f}"
    if v >= 100:
        return f"{v:,.0f}"
    return f"{v:.1f}"


def _record(table, sysm, fig, res, ld):
    if "rss" in res:
        table.add(fig, sysm.name, res["rss"], ld)
        return
    table.add(f"{fig} msgs/s", sysm.name, res["rate"], ld, res.get("note", ""))
    table.add(f"{fig} server CPU us/msg", sysm.name, res["cpu_us"], ld)
    if "client_us" in res:
        table.add(f"{fig} client CPU us/msg", sysm.name, res["client_us"], ld)
    if "broker_client" in res:
        table.add(f"{fig} server/client CPU", sysm.name, res["broker_client"], ld)


def _measure(table, make, fig, fn, rnd, peaks):
    """Start one system, measure C{fn} on it, stop it, record and print the figures.

    C{fn} returns one result, or C{{"rows": {figure: result}}} for several figures of one
    run; the server's peak RSS over the run is one more row."""
    sysm = make().start()
    try:
        ld = load()
        res = fn(sysm)
        peak = peak_rss_mb(sysm.pid)
        peaks[sysm.name] = max(peaks.get(sysm.name, 0), peak)
    finally:
        sysm.stop()
    rows = res["rows"] if "rows" in res else {fig: res}
    for name, r in rows.items():
        _record(table, sysm, name, r, ld)
        summary = ", ".join(f"{k} {v:,.2f}" for k, v in r.items() if not isinstance(v, str))
        print(f"  round {rnd + 1} {name:<40} {sysm.name:<12} {summary}  (load {ld:.1f})",
              flush=True)
    if "RSS" not in fig:  # the idle row is a resident size already
        table.add(f"{fig} peak RSS MB", sysm.name, peak, ld)


def settings(items):
    """{key: value} of C{KEY=VALUE} strings: ints and true/false as such, else text."""
    over = {}
    for item in items:
        k, _, val = item.partition("=")
        over[k] = int(val) if val.lstrip("-").isdigit() else {"true": True, "false": False}.get(val, val)
    return over


def run(a):
    tmp = tempfile.mkdtemp(prefix="mq-compare-")
    skipped = []
    table = Table()
    smss_bin = binary(a.smss_bin, "SMSS_BIN")
    nsqd_bin = binary(a.nsqd_bin, "NSQD_BIN")
    a.bench_writer = binary(a.bench_writer, "NSQ_BENCH_WRITER")
    a.bench_reader = binary(a.bench_reader, "NSQ_BENCH_READER")
    a.smss_sdk = binary(a.smss_sdk, "SMSS_SDK_LOAD")
    if not a.smss_sdk:
        skipped.append(("smss Go SDK rows", "no smss SDK load driver (--smss-sdk or "
                        "SMSS_SDK_LOAD)"))
    if not smss_bin:
        skipped.append(("Go smss column", "no smss binary (--smss-bin or SMSS_BIN)"))
    if not nsqd_bin:
        skipped.append(("nsqd column", "no nsqd binary (--nsqd-bin or NSQD_BIN)"))
    if not (a.bench_writer and a.bench_reader):
        skipped.append(("bench_writer / bench_reader rows",
                        "no nsq bench tools (--bench-writer/--bench-reader or "
                        "NSQ_BENCH_WRITER/NSQ_BENCH_READER)"))
    skipped.append(("RocketMQ reference column", "no reference RocketMQ broker (the Java "
                    "broker is not built here): its rows compare the broker with the C++ "
                    "client's CPU (the aim: at most half of it)"))
    floor_over, nsqd_args = nsq_flush_floor(a.nsq_buffers)
    mqs = [lambda **kw: Mq("mqserver", tmp, floor_over, **kw)]
    names = ["mqserver"]
    for v in a.variant:
        name, _, kv = v.partition(":")
        over = {**floor_over, **settings(kv.split(","))}
        mqs.append(lambda name=name, over=over, **kw: Mq(name, tmp, over, **kw))
        names.append(name)
    for t in a.tree:
        name, _, path = t.partition(":")
        mqs.append(lambda name=name, path=os.path.abspath(path), **kw: Mq(
            name, tmp, floor_over, tree=path, **kw))
        names.append(name)
    # the smss and NSQ rows start only their doors, unless asked for the RocketMQ ones too
    door = {"rocket": True} if a.rocketmq_door else {}
    mq_sys = [lambda m=m: m(**door) for m in mqs]
    smss_sys = mq_sys + ([lambda: Ref("Go smss", "smss", smss_bin, tmp)] if smss_bin else [])
    floors = []
    if a.floor:
        # null smss servers: the publish rows only (they store nothing to catch up on)
        floors = [lambda: Ref("floor", "null", None, tmp),
                  lambda: Ref("floor-nowrite", "null-nowrite", None, tmp)]
    nsq_sys = mq_sys + ([lambda: Ref("nsqd 1.3", "nsqd", nsqd_bin, tmp, nsqd_args)]
                        if nsqd_bin else [])
    rmq_sys = [lambda m=m: m(rocket=True) for m in mqs]

    plan = []  # (systems, figure, function)
    only = set(a.only or ONLY)
    if "smss" in only:
        for c in a.conns:
            plan.append((smss_sys + floors, f"smss publish {c} conn",
                         lambda s, c=c: smss_publish(s, a, c)))
        for b in a.batches:
            plan.append((smss_sys, f"smss catch-up batch {b}",
                         lambda s, b=b: smss_catchup(s, a, b)))
        if a.smss_sdk:
            plan.append((smss_sys, "smss Go SDK publish 4 goroutines",
                         lambda s: smss_sdk_publish(s, a, 4)))
            plan.append((smss_sys, "smss Go SDK catch-up batch 20",
                         lambda s: smss_sdk_catchup(s, a, 20)))
    if "nsq" in only:
        if a.bench_writer and a.bench_reader:
            plan.append((nsq_sys, "nsq bench", lambda s: nsq_writer_reader(s, a)))
        plan.append((nsq_sys, "nsq 1 msg/round trip 1 conn", lambda s: nsq_round_trip(s, a)))
    if "rocketmq" in only:
        plan.append((rmq_sys, "rocketmq C++ client", lambda s: {"rows": crm.client_rows(s, a)}))
    if "steady" in only:
        for proto, systems in (("smss", smss_sys), ("nsq", nsq_sys)):
            if proto not in a.steady_protos:
                continue
            for rate in a.rates:
                for ident, label in ([nsq_buffer(b) for b in a.nsq_buffers]
                                        if proto == "nsq" else [(None, "")]):
                    plan.append((systems, f"{proto} steady {rate}/s + consumer{label}",
                                 lambda s, p=proto, r=rate, c=ident: steady(s, a, p, r, c)))
        for rate in a.rates if "rocketmq" in a.steady_protos else ():
            plan.append((rmq_sys, f"rocketmq steady {rate}/s + consumer",
                         lambda s, r=rate: crm.steady(s, a, r, _rmq_paced(a))))
    if "rss" in only:
        plan.append((smss_sys + nsq_sys[len(mqs):],
                     "idle RSS MB", lambda s: idle_rss(s, a)))

    peaks = {}
    steal0, wall0 = steal_seconds(), time.monotonic()
    print(f"compare: {a.rounds} rounds, {a.seconds:g} s per run; load {load():.1f} "
          f"({os.cpu_count()} cores); {sb.describe(a.client_poll)}", flush=True)
    try:
        for systems, fig, fn in plan:
            for rnd in range(a.rounds):
                for make in systems:
                    _measure(table, make, fig, fn, rnd, peaks)
        for name, peak in peaks.items():
            table.add("peak RSS MB (any run)", name, peak, load())
        refs = [n for n in ("Go smss", "nsqd 1.3") if any(
            n in table.rows[f] for f in table.order)]
        shown = names + refs + [n for n in ("floor", "floor-nowrite") if a.floor]
        table.print(shown, refs, skipped)
        steal = steal_seconds() - steal0
        print(f"host steal during the run: {100 * steal / (time.monotonic() - wall0):.0f}% "
              f"of one core; load average now {load():.1f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


ONLY = ["smss", "nsq", "rocketmq", "steady", "rss"]


def _rmq_paced(a):
    return lambda port, request, reply_size, rate, seconds: paced(
        port, request, reply_size, rate, seconds, a.steady_per_write)


def _ints(text):
    return [int(x) for x in text.split(",") if x]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="A B rounds per figure (2)")
    ap.add_argument("--seconds", type=float, default=5.0, help="per timed run (5)")
    ap.add_argument("--conns", type=_ints, default=[1, 4])
    ap.add_argument("--batches", type=_ints, default=[20, 100])
    ap.add_argument("--backlog", type=int, default=200_000, help="catch-up backlog")
    ap.add_argument("--rates", type=_ints, default=[2000, 10000])
    ap.add_argument("--steady-seconds", type=float, default=5.0)
    ap.add_argument("--steady-per-write", type=int, default=1,
                    help="messages per write in the steady rows (1: each PUB sent alone)")
    ap.add_argument("--steady-protos", type=lambda t: t.split(","),
                    default=["smss", "nsq", "rocketmq"],
                    help="protocols of the steady rows (smss,nsq,rocketmq)")
    ap.add_argument("--nsq-buffers", type=lambda t: t.split(","), default=["default"],
                    help="the NSQ steady consumer's output buffer, one row each: default "
                         "(16 KB, 250 ms), none (unbuffered) or N ms (default: default)")
    ap.add_argument("--idle-wait", type=float, default=2.0)
    ap.add_argument("--only", action="append", choices=ONLY)
    ap.add_argument("--rmq-sends", type=int, default=10_000,
                    help="sync sends of the RocketMQ C++ producer row (10,000)")
    ap.add_argument("--variant", action="append", default=[],
                    help="another mqserver column: NAME:KEY=VALUE[,KEY=VALUE]")
    ap.add_argument("--tree", action="append", default=[],
                    help="another mqserver column run from another source tree: NAME:PATH "
                         "(its C extensions built in place; this interpreter runs it)")
    ap.add_argument("--rocketmq-door", action="store_true",
                    help="start the RocketMQ nameserver and broker doors in the smss and NSQ "
                         "rows too, as the default configuration does (their store dispatch "
                         "listeners then see every publish)")
    ap.add_argument("--floor", action="store_true",
                    help="add null smss servers (bench/null_smss.py: mqserver's system calls "
                         "per PUB and nothing else, with and without the pwrite) to the smss "
                         "publish rows: the floor under the broker's own work")
    ap.add_argument("--smss-bin")
    ap.add_argument("--smss-sdk", help="a load driver on the smss Go SDK (see "
                    "docs/performance.md): `-port P -topic T -conns N -seconds S -size B pub` "
                    "and `-port P -topic T -batch N -expect M sub`, each printing "
                    '{"messages": N, "seconds": T}')
    ap.add_argument("--nsqd-bin")
    ap.add_argument("--bench-writer")
    ap.add_argument("--bench-reader")
    ap.add_argument("--quick", action="store_true", help="1 round, 2 s runs, small backlog")
    sb.add_argument(ap)
    a = ap.parse_args(argv)
    if a.quick:
        a.rounds, a.seconds, a.backlog, a.steady_seconds, a.idle_wait = 1, 2.0, 20_000, 2.0, 1.0
        a.rmq_sends = 2000
    return a


def main(argv=None):
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    run(parse_args(argv))


if __name__ == "__main__":
    main()
