"""Fault harness for replica groups: a real etcd and three members on loopback, producers
on smss, NSQ and RocketMQ, and faults injected one at a time in a random sequence.

Each run starts a fresh etcd and group (members under a supervisor loop that starts a
member again when it exits with status 75, as systemd's Restart=on-failure does), creates
the topics, starts one producer per protocol (each sends to whichever member leads,
finding it again after a refusal) and injects C{--faults} faults drawn at random:

  kill     SIGKILL of the leader, started again once another leads
  pause    SIGSTOP of the leader past its lease, then SIGCONT: it must acknowledge
           nothing more (it exits with 75 and comes back as a follower)
  etcd     etcd SIGKILLed, and started again after twice the lease
  wipe     a follower SIGKILLed and started again from an empty data directory
  diskfull a follower's disk full (every write of its store fails with ENOSPC, through
           the store's fault injection) while the group acknowledges writes with the
           other follower; then the space returns and it catches up
  partition  (with --netns) the leader cut off from etcd and the other members for
           twice the lease, then healed

With C{--netns} (as root) each member runs in a network namespace of its own, joined to
this one by a veth pair on a bridge that the harness creates with addresses in
10.213.N.0/24 (etcd listens on the bridge's); a partition sets the leader's veth down. The
harness sends traffic only to loopback and to the addresses it assigned, and removes the
namespaces, veths and bridge when it ends.

After each fault, once the group has one leader followed by the others again:

  - every acknowledged message (of every protocol) is in the leader's log;
  - no eventId names two records in the leader's log, and the records every member
    held at the previous check are unchanged (what a majority holds is never cut);
  - every member's log equals the leader's once caught up;
  - a consumer (an smss subscription on the leader) receives only messages that some
    producer sent;

and it prints the seconds the group had no writable leader (from the fault until a
publish is acknowledged again). Exits 1 on any lost message or divergence.

L{chaos} runs the same from Python and returns the results (the short run of the test
suite calls it).

With C{--rate} it injects no faults and measures instead what a group costs: the smss
publish rate (C{--connections} processes, each sending one 200-byte message a request
and waiting for its answer, for C{--seconds}) of a single broker against the leader of a
group of three with C{syncReplicas: 1}, in C{--rounds} rounds that alternate the two
(each on a fresh broker or group), and the ratio of the medians.

    python bench/chaos.py --rate [--seconds 5] [--rounds 3] [--connections 4] [--sdk PATH]

Each round also prints every broker process's CPU time per message acknowledged (the
leader's and each follower's in a group). C{--sdk} (or C{SMSS_SDK_LOAD}) publishes with
the smss Go SDK's load driver instead (C{--connections} goroutines; built outside the
repository, as C{docs/performance.md} says), whose publishers take less of the machine.

    python bench/chaos.py [--runs 1] [--faults 6] [--seed N] [--lease-ms 2000]
                          [--kinds kill,pause,etcd,wipe,diskfull] [--netns] [--keep]
"""

import argparse
import dataclasses
import multiprocessing as mp
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from harness import (
    SKIP_REASON, EtcdProcess, RemotingClient, ServerProcess, V2, etcd_binary, read_topic,
    rocketmq_send, wait_until, Member, leader_of, member_config, wait_converged,
    writable_leader)

from protocols.remoting import codes
from protocols.smss.client import SmssClient, SmssError

DOORS = ("smss", "nsqd_tcp", "broker")
#: each protocol's topic (created on smss before the producers start)
TOPICS = {"smss": "t", "nsq": "n", "rocketmq": "r"}
#: seconds a producer waits for an answer before it moves to the next member
TIMEOUT = 5
FAULTS = ("kill", "pause", "etcd", "wipe", "diskfull")
NETNS_FAULTS = FAULTS + ("partition",)
SETTLE = 60.0  # seconds a group may take to have one leader and equal logs again
#: publishes the group must acknowledge while a follower's disk is full
ACKED_WHILE_FULL = 20


class Producer(threading.Thread):
    """Sends numbered messages over one protocol to whichever member leads.

    @ivar acked: bodies acknowledged.
    @ivar sent: every body sent (acknowledged or not: it may be stored).
    """

    def __init__(self, kind, members, tag):
        super().__init__(daemon=True)
        self.kind = kind
        self.members = members
        self.tag = tag
        self.acked = []
        self.sent = set()
        self.stopping = threading.Event()
        #: set by the harness to hold the producer still (its checks compare logs)
        self.hold = threading.Event()
        #: set while it is held and has no request in flight
        self.parked = threading.Event()
        self._n = 0
        self._target = 0

    def next_body(self):
        self._n += 1
        body = b"%s-%s-%d" % (self.tag, self.kind.encode(), self._n)
        self.sent.add(body)
        return body

    def busy(self):
        """False once the producer should stop sending (stopping, or held)."""
        return not (self.stopping.is_set() or self.hold.is_set())

    def run(self):
        while not self.stopping.is_set():
            if self.hold.is_set():
                self.parked.set()
                self.stopping.wait(0.05)
                continue
            self.parked.clear()
            member = self.members[self._target % len(self.members)]
            try:
                getattr(self, "_" + self.kind)(member)
            except (OSError, SmssError, ConnectionError, AssertionError):
                pass
            if self.busy():  # refused, or the member is gone: try the next one
                self._target += 1
                self.stopping.wait(0.05)

    def _smss(self, member):
        with SmssClient(member.host, member.port, timeout=TIMEOUT) as c:
            while self.busy():
                body = self.next_body()
                c.publish(TOPICS["smss"], [body])  # raises when refused
                self.acked.append(body)

    def _nsq(self, member):
        conn = V2(member.ports["nsqd_tcp"], timeout=TIMEOUT, host=member.host)
        try:
            while self.busy():
                body = self.next_body()
                conn.send(b"PUB %s\n" % TOPICS["nsq"].encode() + len(body).to_bytes(4, "big")
                          + body)
                kind, data = conn.frame()
                if kind != 0 or data != b"OK":
                    return
                self.acked.append(body)
        finally:
            conn.close()

    def _rocketmq(self, member):
        client = RemotingClient(member.host, member.ports["broker"], timeout=TIMEOUT)
        try:
            while self.busy():
                body = self.next_body()
                # the same 5 s as the other producers' (the call's own default is 10)
                answer = rocketmq_send(client, TOPICS["rocketmq"], body, timeout=TIMEOUT)
                if answer.code != codes.SUCCESS:
                    return
                self.acked.append(body)
        finally:
            client.close()


def ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True)


class Network:
    """Network namespaces for the members: each joined by a veth pair to a bridge in this
    namespace, all on 10.213.N.0/24 (N from this process's id); the bridge has .1."""

    def __init__(self):
        tag = f"{os.getpid() % 100000}"
        self.prefix = f"10.213.{os.getpid() % 250}."
        self.host = self.prefix + "1"
        self.bridge = f"mqc{tag}br"
        self.namespaces = []
        self.outer = {}  # member index -> its veth end on the bridge
        self._tag = tag

    def up(self, members):
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.host}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for i in range(members):
            ns, outer, inner = (f"mqc{self._tag}n{i}", f"mqc{self._tag}o{i}",
                                f"mqc{self._tag}i{i}")
            ip("netns", "add", ns)
            self.namespaces.append(ns)
            ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            self.outer[i] = outer
            ip("link", "set", inner, "netns", ns)
            ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", inner)
            ip("-n", ns, "link", "set", inner, "up")
            ip("-n", ns, "link", "set", "lo", "up")
            ip("link", "set", outer, "master", self.bridge)
            ip("link", "set", outer, "up")

    def address(self, i):
        return f"{self.prefix}{i + 2}"

    def cut(self, i, cut=True):
        ip("link", "set", self.outer[i], "down" if cut else "up")

    def down(self):
        """Remove what L{up} made (the veths go with their namespaces)."""
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for outer in self.outer.values():
            subprocess.run(["ip", "link", "del", outer], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        self.namespaces, self.outer = [], {}


class Run:
    """One group, its producers, and the checks."""

    def __init__(self, work, lease_ms, rng, out, network=None, disk_faults=False):
        self.lease = lease_ms / 1000.0
        self.rng = rng
        self.out = out
        self.network = network
        self.etcd = EtcdProcess(os.path.join(work, "etcd"),
                                host=network.host if network else "127.0.0.1")
        self.members = []
        for i, name in enumerate(("m1", "m2", "m3")):
            config = member_config(self.etcd, name, lease_ms,
                                   rocketmq={"brokerName": "chaos"})
            where = ({"host": network.address(i), "netns": network.namespaces[i]}
                     if network else {})
            self.members.append(Member(os.path.join(work, name), name, config, DOORS,
                                       disk_faults=disk_faults, **where))
        self.producers = []
        self.held = []  # the records every member held at the last check
        self.problems = []

    def start(self):
        self.etcd.start()
        for m in self.members:
            m.start()
        lead = leader_of(self.members, SETTLE)
        wait_until(lambda: lead.status().get("sync", {}).get("available"), SETTLE,
                   "a follower confirming to the leader", interval=0.1)
        with SmssClient(lead.host, lead.port) as c:
            for topic in TOPICS.values():
                c.create(topic)
        self.producers = [Producer(kind, self.members, b"p%d" % i)
                          for i, kind in enumerate(TOPICS)]
        for p in self.producers:
            p.start()

    def stop(self):
        for p in self.producers:
            p.stopping.set()
        for p in self.producers:
            p.join(15)
        for m in self.members:
            m.stop()
        self.etcd.stop()

    # -- faults: each returns once it is healed --

    def fault(self, kind):
        began = time.monotonic()
        lead = leader_of(self.members, SETTLE)
        rest = [m for m in self.members if m is not lead]
        if kind == "kill":
            lead.kill()
            writable_leader(rest, SETTLE)
            down = time.monotonic() - began
            lead.start()
        elif kind == "pause":
            lead.server.proc.send_signal(signal.SIGSTOP)
            try:
                writable_leader(rest, SETTLE)
                down = time.monotonic() - began
            finally:
                lead.server.proc.send_signal(signal.SIGCONT)
        elif kind == "etcd":
            self.etcd.kill()
            time.sleep(2 * self.lease)  # the outage itself, not a wait for a condition
            self.etcd.start()
            writable_leader(self.members, SETTLE)
            down = time.monotonic() - began
        elif kind == "wipe":
            victim = self.rng.choice(rest)
            victim.kill()
            victim.wipe()
            writable_leader(self.members, SETTLE)
            down = time.monotonic() - began
            victim.start()
        elif kind == "diskfull":
            victim = self.rng.choice(rest)
            victim.disk_full()
            try:
                wait_until(lambda: "disk trouble" in victim.server.current_log(), SETTLE,
                           "the follower's writes failing")
                began = time.monotonic()
                writable_leader(self.members, SETTLE)
                down = time.monotonic() - began
                # the group goes on acknowledging with the other follower
                before = self.acknowledged()
                wait_until(lambda: self.acknowledged() >= before + ACKED_WHILE_FULL, SETTLE,
                           "the group acknowledging writes with a follower's disk full")
            finally:
                victim.disk_full(False)
        elif kind == "partition":
            i = self.members.index(lead)
            self.network.cut(i)
            try:
                writable_leader(rest, SETTLE)
                down = time.monotonic() - began
                time.sleep(2 * self.lease)  # the partition lasts on, not a wait for a condition
            finally:
                self.network.cut(i, cut=False)
        return down

    def acknowledged(self):
        """Publishes acknowledged so far, over every protocol."""
        return sum(len(p.acked) for p in self.producers)

    # -- checks --

    def check(self, label):
        """Hold the producers still, check, and let them go on."""
        for p in self.producers:
            p.hold.set()
        for p in self.producers:
            p.parked.wait(SETTLE)
        try:
            return self._check(label)
        finally:
            for p in self.producers:
                p.hold.clear()

    def _check(self, label):
        lead = leader_of(self.members, SETTLE)
        records = wait_converged(self.members, SETTLE)
        ids = [r[0] for r in records]
        if len(ids) != len(set(ids)):
            self.problem(label, "an eventId names two records in the leader's log")
        if records[:len(self.held)] != self.held:
            self.problem(label, "records every member held at the last check changed")
        self.held = records
        bodies = {}
        for r in records:
            bodies.setdefault(r[3], set()).add(r[6])
        for p in self.producers:
            topic = TOPICS[p.kind]
            lost = [b for b in list(p.acked) if b not in bodies.get(topic, ())]
            if lost:
                self.problem(label, f"{len(lost)} of {len(p.acked)} messages acknowledged"
                                    f" over {p.kind} are not in the leader's log")
        sent = self.producers[0].sent | {b"probe"}
        strange = self.consumed() - sent
        if strange:
            self.problem(label, f"a consumer received {len(strange)} messages never sent")
        return lead

    def consumed(self):
        """The bodies of the smss topic a consumer on the leader receives (from the
        leader found again, should it step down meanwhile: a late lease renewal on a
        loaded machine makes it do so, by design)."""
        got = []

        def read():
            lead = leader_of(self.members, SETTLE)
            try:
                got.append({m.body for m in read_topic(lead.server, TOPICS["smss"],
                                                       settle=0.5, timeout=SETTLE)})
            except (OSError, SmssError):
                return False
            return True

        wait_until(read, SETTLE, "a consumer reading the leader's log")
        return got[0]

    def problem(self, label, text):
        self.problems.append(f"{label}: {text}")
        print(f"  PROBLEM {label}: {text}", file=self.out, flush=True)


@dataclasses.dataclass
class Results:
    """What L{chaos} found.

    @ivar seed: the seed of the random sequence.
    @ivar problems: lost acknowledged messages, divergent logs and the like, one text
        each (none: the group kept its promises).
    @ivar faults: (run, fault kind, seconds without a writable leader) of each fault.
    @ivar acknowledged: publishes acknowledged over all runs.
    """

    seed: int
    problems: list = dataclasses.field(default_factory=list)
    faults: list = dataclasses.field(default_factory=list)
    acknowledged: int = 0


def run_once(index, settings, rng, out, results):
    """Run C{index}: a fresh etcd and group, its faults and checks, into C{results}."""
    work = tempfile.mkdtemp(prefix="mq-chaos-")
    failed = True
    try:
        network = Network() if settings.netns else None
        try:
            if network is not None:
                network.up(3)
            run = Run(work, settings.lease_ms, rng, out, network,
                      disk_faults="diskfull" in (settings.sequence or settings.kinds))
            try:
                run.start()
                for k in range(settings.faults):
                    kind = (settings.sequence[k % len(settings.sequence)] if settings.sequence
                            else rng.choice(settings.kinds))
                    results.faults.append((index, kind, inject(run, index, k, kind, rng, out)))
            finally:
                run.stop()
                results.acknowledged += run.acknowledged()
        finally:
            if network is not None:
                network.down()
        for e in [e for m in run.members for e in m.errors]:
            run.problem(f"run {index}", f"a supervised restart failed: {e}")
        results.problems += run.problems
        failed = bool(run.problems)
    finally:
        if settings.keep or failed:  # a failed run's data and logs tell what happened
            print(f"run {index}: kept {work}", file=out, flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)


def inject(run, index, k, kind, rng, out):
    """Inject fault C{k} (of C{kind}) of run C{index}, check, and print what it cost;
    return the seconds without a writable leader."""
    time.sleep(rng.uniform(0.2, 1.0))  # let the producers write a while
    down = run.fault(kind)
    lead = run.check(f"run {index} fault {k + 1} ({kind})")
    acked = ", ".join(f"{p.kind} {len(p.acked)}" for p in run.producers)
    print(f"run {index} fault {k + 1}: {kind:9s} {down:5.1f} s without a writable"
          f" leader; leader now {lead.name}; acknowledged so far: {acked}",
          file=out, flush=True)
    return down


@dataclasses.dataclass
class Settings:
    runs: int = 1
    faults: int = 6
    seed: int = None
    lease_ms: int = 2000
    kinds: tuple = FAULTS
    netns: bool = False
    #: the faults in this order (repeated as needed) instead of drawn at random
    sequence: tuple = ()
    #: keep each run's directory (data, logs) instead of removing it (a failed run's is
    #: kept anyway)
    keep: bool = False


def chaos(out=sys.stdout, **settings):
    """Run the harness (keywords as L{Settings} names them; the faults drawn from
    C{kinds}, or C{sequence} in order) and return its L{Results}. Needs etcd
    (L{etcd_binary}); C{netns} needs root."""
    settings = Settings(**settings)
    seed = settings.seed if settings.seed is not None else random.randrange(1 << 30)
    print(f"seed {seed}", file=out, flush=True)
    rng = random.Random(seed)
    results = Results(seed)
    for i in range(1, settings.runs + 1):
        run_once(i, settings, rng, out, results)
    return results


def rate_round(work, group, seconds, connections, lease_ms, sdk=None):
    """Return C{(msgs/s, {process: CPU µs per message})} of smss publishes to a single
    broker (C{group} False) or to the leader of a group of three with C{syncReplicas:
    1}, each fresh in C{work}: C{connections} Python publishers one request at a time,
    or, with C{sdk} (the smss Go SDK load driver), as many of its goroutines."""
    from procstat import cpu_seconds
    from refservers import sdk_load
    from sync_cost import _smss as publisher  # one request at a time, 200 bytes

    etcd, servers = None, []
    try:
        if group:
            etcd = EtcdProcess(os.path.join(work, "etcd"))
            etcd.start()
            servers = [Member(os.path.join(work, name), name,
                              member_config(etcd, name, lease_ms))
                       for name in ("m1", "m2", "m3")]
            for m in servers:
                m.start()
            lead = leader_of(servers, SETTLE)
            wait_until(lambda: lead.status().get("sync", {}).get("available"), SETTLE,
                       "a follower confirming to the leader", interval=0.1)
            port = lead.port
            pids = {"leader": lead.server.proc.pid}
            pids.update({f"follower {i + 1}": m.server.proc.pid
                         for i, m in enumerate(m for m in servers if m is not lead)})
        else:
            single = ServerProcess(os.path.join(work, "single"),
                                   config={"timeout": {"server": {"alive": 300}}})
            servers = [single]
            single.start()
            port = single.smss_port
            pids = {"broker": single.proc.pid}
        with SmssClient("127.0.0.1", port) as c:
            c.create("bench")
        before = {k: cpu_seconds(pid) for k, pid in pids.items()}
        if sdk:
            sent, took = sdk_load(sdk, port, "-topic", "bench", "-conns", connections,
                                  "-seconds", seconds, "-size", 200, "pub", timeout=seconds + 60)
        else:
            queue = mp.Queue()
            procs = [mp.Process(target=publisher, args=(port, seconds, queue))
                     for _ in range(connections)]
            for p in procs:
                p.start()
            sent, took = sum(queue.get(timeout=seconds + 60)[0] for _ in procs), seconds
            for p in procs:
                p.join()
        cpu = {k: 1e6 * (cpu_seconds(pid) - before[k]) / max(1, sent) for k, pid in pids.items()}
        return sent / took, cpu
    finally:
        for s in servers:
            s.stop()
            if isinstance(s, ServerProcess):
                s.close()
        if etcd is not None:
            etcd.stop()


def rate(seconds=5.0, rounds=3, connections=4, lease_ms=2000, out=sys.stdout, sdk=None):
    """Measure (see the module docstring) and print the rates and each process's CPU per
    message; return C{{"single": [msgs/s...], "group": [msgs/s...]}}."""
    got = {"single": [], "group": []}
    for r in range(rounds):
        for kind in ("single", "group"):
            with tempfile.TemporaryDirectory(prefix="mq-chaos-rate-") as work:
                msgs, cpu = rate_round(work, kind == "group", seconds, connections,
                                       lease_ms, sdk)
            got[kind].append(msgs)
            per = ", ".join(f"{k} {v:.1f}" for k, v in cpu.items())
            print(f"round {r + 1}: {kind:6s} {msgs:10,.0f} msgs/s; CPU µs per message: {per}",
                  file=out, flush=True)
    med = {k: sorted(v)[len(v) // 2] for k, v in got.items()}
    load = "goroutines of the smss Go SDK" if sdk else "connections"
    print(f"smss publish, {connections} {load}, one request at a time, median of"
          f" {rounds}: single broker {med['single']:,.0f} msgs/s, group of three"
          f" (syncReplicas 1) {med['group']:,.0f} msgs/s: {med['group'] / med['single']:.2f}"
          f" of the single broker's rate", file=out, flush=True)
    return got


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--faults", type=int, default=6, help="faults per run")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--lease-ms", type=int, default=2000)
    ap.add_argument("--kinds", default=None,
                    help="the faults to draw from, comma-separated (default: all)")
    ap.add_argument("--netns", action="store_true",
                    help="run each member in a network namespace of its own (root) and "
                         "add the partition fault")
    ap.add_argument("--keep", action="store_true",
                    help="keep each run's directory (data and logs) and print where")
    ap.add_argument("--rate", action="store_true",
                    help="no faults: the publish rate of a single broker against a group")
    ap.add_argument("--seconds", type=float, default=5.0, help="with --rate: per round")
    ap.add_argument("--rounds", type=int, default=3, help="with --rate: rounds of each")
    ap.add_argument("--connections", type=int, default=4, help="with --rate: publishers")
    ap.add_argument("--sdk", default=os.environ.get("SMSS_SDK_LOAD"), metavar="PATH",
                    help="with --rate: publish with the smss Go SDK's load driver at PATH"
                         " (default: $SMSS_SDK_LOAD; unset: Python publishers)")
    args = ap.parse_args(argv)
    known = NETNS_FAULTS if args.netns else FAULTS
    args.kinds = [k for k in (args.kinds or ",".join(known)).split(",") if k]
    if set(args.kinds) - set(known) or not args.kinds:
        ap.error(f"--kinds: choose among {', '.join(known)}")
    if etcd_binary() is None:
        print(SKIP_REASON, file=sys.stderr)
        return 2
    if args.rate:
        rate(args.seconds, args.rounds, args.connections, args.lease_ms, sdk=args.sdk)
        return 0
    results = chaos(runs=args.runs, faults=args.faults, seed=args.seed,
                    lease_ms=args.lease_ms, kinds=tuple(args.kinds), netns=args.netns,
                    keep=args.keep)
    print(f"{args.runs} runs of {args.faults} faults: "
          f"{len(results.problems)} problems (lost acknowledged messages, divergent logs)")
    return 1 if results.problems else 0


if __name__ == "__main__":
    sys.exit(main())
