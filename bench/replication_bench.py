"""Replication benchmark: a master under a 4-connection publish load and one slave.

Prints the master's publish rate, the slave's apply rate, and the replication lag (p50 /
p99 / max) in eventIds (master head minus slave applied, sampled every 20 ms) and in ms
(the slave's own measure: master write time to slave apply time of its last record).

    python bench/replication_bench.py [--seconds 10] [--connections 4] [--batch 1]
"""

import argparse
import multiprocessing as mp
import os
import shutil
import tempfile
import time

from harness import ServerProcess

from protocols.smss.client import SmssClient


def publisher(port, topic, seconds, batch, counter):
    """Publish 200-byte messages, one PUB (of C{batch} messages) per round trip."""
    body = b"x" * 200
    msgs = [body] * batch
    n = 0
    with SmssClient("127.0.0.1", port) as c:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            c.publish(topic, msgs)
            n += batch
    with counter.get_lock():
        counter.value += n


def pct(values, p):
    """Return the p-th percentile of C{values}."""
    if not values:
        return 0
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p / 100))]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="mq-repl-bench-")
    cfg = {"store": {"flushLevel": 1}}
    master = ServerProcess(os.path.join(tmp, "master"), config=cfg)
    slave = None
    try:
        master.start()
        slave = ServerProcess(
            os.path.join(tmp, "slave"), config=cfg,
            extra_args=["--role", "slave", "--master", f"127.0.0.1:{master.smss_port}"],
        )
        slave.start()
        with SmssClient("127.0.0.1", master.smss_port) as c:
            c.create("bench")
        mc = SmssClient("127.0.0.1", master.smss_port)
        sc = SmssClient("127.0.0.1", slave.smss_port)
        counter = mp.Value("q", 0)
        procs = [
            mp.Process(target=publisher, args=(master.smss_port, "bench", args.seconds, args.batch, counter))
            for _ in range(args.connections)
        ]
        start_applied = sc.topic_info("$replication")["appliedEventId"]
        t0 = time.monotonic()
        for p in procs:
            p.start()
        lag_events, lag_ms = [], []
        while any(p.is_alive() for p in procs):
            head = mc.topic_info("$replication")["appliedEventId"]
            st = sc.topic_info("$replication")
            lag_events.append(max(0, head - st["appliedEventId"]))
            lag_ms.append(st["lagMs"])
            time.sleep(0.02)
        for p in procs:
            p.join()
        t_pub = time.monotonic() - t0
        head = mc.topic_info("$replication")["appliedEventId"]
        while sc.topic_info("$replication")["appliedEventId"] < head:
            time.sleep(0.01)
        t_all = time.monotonic() - t0
        applied = sc.topic_info("$replication")["appliedEventId"] - start_applied
        mc.close()
        sc.close()
        print(f"connections={args.connections} batch={args.batch} seconds={args.seconds}")
        print(f"master publish rate   {counter.value / t_pub:10.0f} msgs/s ({counter.value} messages)")
        print(f"slave apply rate      {applied / t_all:10.0f} records/s (until caught up, {t_all - t_pub:.2f}s after the load)")
        print(f"lag in eventIds       p50 {pct(lag_events, 50):6d}  p99 {pct(lag_events, 99):6d}  max {max(lag_events or [0]):6d}  ({len(lag_events)} samples)")
        print(f"lag in ms             p50 {pct(lag_ms, 50):6d}  p99 {pct(lag_ms, 99):6d}  max {max(lag_ms or [0]):6d}")
    finally:
        if slave is not None:
            slave.stop()
            slave.close()
        master.stop()
        master.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
