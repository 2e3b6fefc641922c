"""What synchronous replication costs: publish rate and latency with
``replication.syncReplicas: 1`` against 0, side by side.

Each round starts a master and one follower (both flush level 1, on loopback), runs the
publishers for ``--seconds``, and stops both; rounds alternate the two settings (A B A B)
so the machine's drift falls on both. Publishers are processes sending one request and
waiting for its answer: smss PUB of one 200-byte message on 1 and on 4 connections, NSQ
MPUB of 100 messages on 1 connection, and RocketMQ SEND_MESSAGE on 1 connection.

    python bench/sync_cost.py [--seconds 5] [--rounds 2] [--only smss1,smss4,nsq,rocketmq]
"""

import argparse
import multiprocessing as mp
import os
import shutil
import socket
import tempfile
import time

from harness import RemotingClient, ServerProcess, wait_until
from procstat import steal_seconds

from protocols.remoting import codes
from protocols.smss.client import SmssClient

BODY = b"x" * 200
LOOP = "tcp:0:interface=127.0.0.1"


def _smss(port, seconds, out):
    lat = []
    with SmssClient("127.0.0.1", port) as c:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t = time.perf_counter()
            c.publish("bench", [BODY])
            lat.append(time.perf_counter() - t)
    out.put((len(lat), lat))


def _nsq(port, seconds, out):
    body = b"".join(len(BODY).to_bytes(4, "big") + BODY for _ in range(100))
    cmd = b"MPUB bench\n" + (len(body) + 4).to_bytes(4, "big") + (100).to_bytes(4, "big") + body
    lat = []
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"  V2")
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t = time.perf_counter()
            s.sendall(cmd)
            need, got = 4, b""
            while len(got) < need:
                got += s.recv(65536)
                if len(got) >= 4:
                    need = 4 + int.from_bytes(got[:4], "big")
            if b"OK" not in got:
                raise RuntimeError(got)
            lat.append(time.perf_counter() - t)
    out.put((100 * len(lat), lat))


def _rocketmq(port, seconds, out):
    lat = []
    c = RemotingClient("127.0.0.1", port)
    header = {"producerGroup": "PG", "topic": "bench", "defaultTopic": "TBW102",
              "defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": "0",
              "bornTimestamp": "0", "flag": "0", "properties": "", "reconsumeTimes": "0",
              "unitMode": "false", "batch": "false"}
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t = time.perf_counter()
            r = c.call(codes.SEND_MESSAGE, header, BODY)
            if r.code != codes.SUCCESS:
                raise RuntimeError((r.code, r.remark))
            lat.append(time.perf_counter() - t)
    finally:
        c.close()
    out.put((len(lat), lat))


SCENARIOS = {
    "smss1": ("smss publish, 1 conn", _smss, "SmssFactory", 1),
    "smss4": ("smss publish, 4 conns", _smss, "SmssFactory", 4),
    "nsq": ("NSQ MPUB of 100, 1 conn", _nsq, "NsqdFactory", 1),
    "rocketmq": ("RocketMQ SEND_MESSAGE, 1 conn", _rocketmq, "BrokerDoor", 1),
}


def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p / 100))] if s else 0.0


def one_round(work, replicas, scenario, seconds):
    label, fn, door, conns = SCENARIOS[scenario]
    cfg = {"store": {"flushLevel": 1}, "timeout": {"server": {"alive": 500}},
           "replication": {"syncReplicas": replicas}}
    listen = {"smss": LOOP, "nsqd_tcp": LOOP, "broker": LOOP}
    master = ServerProcess(os.path.join(work, "master"), config=cfg, listen=listen)
    follower = None
    try:
        master.start()
        follower = ServerProcess(os.path.join(work, "follower"), config={"store": {"flushLevel": 1}},
                                 extra_args=["--role", "slave", "--master",
                                             f"127.0.0.1:{master.smss_port}"]).start()

        def ready():
            with SmssClient("127.0.0.1", master.smss_port) as c:
                return c.topic_info("$replication").get("slaves", 0) >= 1

        wait_until(ready, 30, "the follower")
        with SmssClient("127.0.0.1", master.smss_port) as c:
            c.create("bench")
        out = mp.Queue()
        procs = [mp.Process(target=fn, args=(master.ports[door], seconds, out)) for _ in range(conns)]
        for p in procs:
            p.start()
        results = [out.get(timeout=seconds + 60) for _ in procs]
        for p in procs:
            p.join()
        n = sum(r[0] for r in results)
        lat = [x for r in results for x in r[1]]
        return n / seconds, pct(lat, 50) * 1000, pct(lat, 99) * 1000
    finally:
        for s in (follower, master):
            if s is not None:
                s.stop()
                s.close()
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", default=",".join(SCENARIOS))
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="mq-sync-cost-")
    rows = []
    steal0, wall0 = steal_seconds(), time.monotonic()
    try:
        for scenario in args.only.split(","):
            got = {0: [], 1: []}
            for r in range(args.rounds):
                for replicas in (0, 1):
                    got[replicas].append(one_round(os.path.join(base, f"{scenario}-{r}-{replicas}"),
                                                   replicas, scenario, args.seconds))
            rows.append((SCENARIOS[scenario][0], got))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"{'publish':32} {'syncReplicas':>12} {'msgs/s (rounds)':>28} {'p50 ms':>8} {'p99 ms':>8} {'1 / 0':>6}")
    for label, got in rows:
        med = {}
        for replicas in (0, 1):
            rates = [g[0] for g in got[replicas]]
            med[replicas] = sorted(rates)[len(rates) // 2]
            p50 = sorted(g[1] for g in got[replicas])[len(rates) // 2]
            p99 = sorted(g[2] for g in got[replicas])[len(rates) // 2]
            ratio = f"{med[1] / med[0]:.2f}" if replicas == 1 and med[0] else ""
            print(f"{label:32} {replicas:>12} {med[replicas]:>10,.0f} ({'/'.join(f'{x:,.0f}' for x in rates)}) "
                  f"{p50:>8.2f} {p99:>8.2f} {ratio:>6}")
    # A synchronous write waits for two more wake-ups than an asynchronous one: what the
    # host takes from this machine's CPUs moves the ratios more than the rates alone.
    steal = steal_seconds() - steal0
    print(f"load average now {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores); host steal during the run:"
          f" {100 * steal / (time.monotonic() - wall0):.1f}% of one core")


if __name__ == "__main__":
    main()
