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

    python bench/chaos.py [--runs 1] [--faults 6] [--seed N] [--lease-ms 2000]
                          [--kinds kill,pause,etcd,wipe] [--netns]
"""

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

from harness import (
    SKIP_REASON, EtcdProcess, RemotingClient, V2, etcd_binary, read_topic, rocketmq_send,
    wait_until, Member, leader_of, member_config, wait_converged, writable_leader)

from protocols.remoting import codes
from protocols.smss.client import SmssClient, SmssError

DOORS = ("smss", "nsqd_tcp", "broker")
#: each protocol's topic (created on smss before the producers start)
TOPICS = {"smss": "t", "nsq": "n", "rocketmq": "r"}
FAULTS = ("kill", "pause", "etcd", "wipe")
NETNS_FAULTS = FAULTS + ("partition",)
SETTLE = 60.0  # seconds a group may take to have one leader and equal logs again


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
        with SmssClient(member.host, member.port, timeout=5) as c:
            while self.busy():
                body = self.next_body()
                c.publish(TOPICS["smss"], [body])  # raises when refused
                self.acked.append(body)

    def _nsq(self, member):
        conn = V2(member.ports["nsqd_tcp"], timeout=5, host=member.host)
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
        client = RemotingClient(member.host, member.ports["broker"], timeout=5)
        try:
            while self.busy():
                body = self.next_body()
                if rocketmq_send(client, TOPICS["rocketmq"], body).code != codes.SUCCESS:
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

    def __init__(self, work, lease_ms, rng, out, network=None):
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
                                       **where))
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
        received = {m.body for m in read_topic(lead.server, TOPICS["smss"], settle=0.5,
                                               timeout=SETTLE)}
        strange = received - sent
        if strange:
            self.problem(label, f"a consumer received {len(strange)} messages never sent")
        return lead

    def problem(self, label, text):
        self.problems.append(f"{label}: {text}")
        print(f"  PROBLEM {label}: {text}", file=self.out, flush=True)


def run_once(index, args, rng, out):
    with tempfile.TemporaryDirectory(prefix="mq-chaos-") as work:
        network = Network() if args.netns else None
        try:
            if network is not None:
                network.up(3)
            run = Run(work, args.lease_ms, rng, out, network)
            try:
                run.start()
                for k in range(args.faults):
                    faults(run, index, k, args, rng, out)
            finally:
                run.stop()
        finally:
            if network is not None:
                network.down()
        for e in [e for m in run.members for e in m.errors]:
            run.problem(f"run {index}", f"a supervised restart failed: {e}")
        return run.problems


def faults(run, index, k, args, rng, out):
    """Inject fault C{k} of run C{index}, check, and print what it cost."""
    kind = rng.choice(args.kinds)
    time.sleep(rng.uniform(0.2, 1.0))  # let the producers write a while
    down = run.fault(kind)
    lead = run.check(f"run {index} fault {k + 1} ({kind})")
    acked = ", ".join(f"{p.kind} {len(p.acked)}" for p in run.producers)
    print(f"run {index} fault {k + 1}: {kind:9s} {down:5.1f} s without a writable"
          f" leader; leader now {lead.name}; acknowledged so far: {acked}",
          file=out, flush=True)


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
    args = ap.parse_args(argv)
    known = NETNS_FAULTS if args.netns else FAULTS
    args.kinds = [k for k in (args.kinds or ",".join(known)).split(",") if k]
    if set(args.kinds) - set(known) or not args.kinds:
        ap.error(f"--kinds: choose among {', '.join(known)}")
    if etcd_binary() is None:
        print(SKIP_REASON, file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    print(f"seed {seed}", flush=True)
    rng = random.Random(seed)
    problems = []
    for i in range(1, args.runs + 1):
        problems += run_once(i, args, rng, sys.stdout)
    print(f"{args.runs} runs of {args.faults} faults: "
          f"{len(problems)} problems (lost acknowledged messages, divergent logs)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
