#!/usr/bin/env python
"""Send-to-receive latency of the RocketMQ C++ push consumer for values of
``rocketmq.longPollBatchMs``, alternating A B A B.

Per run: a fresh broker with that batch, the C++ producer (``bench/rocketmq_bench.py``'s
worker) sending ``--count`` messages by sync sends, sleeping ``--gap`` seconds between
them, each with its send time, and the C++ push consumer reporting p50 and p99 of
receive time minus send time. Prints one JSON line per run. Asserts nothing.

    PYTHONPATH=. python bench/rocketmq_latency.py [--batches 1,0] [--gap 0.0003]
                                                  [--count 3000] [--rounds 2]
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "bench")]

from rocketmq_bench import read_json, spawn  # noqa: E402
from tests.support.rmq import namesrv_addr, rocket_server  # noqa: E402


def one_run(batch_ms, gap, count):
    tmp = tempfile.mkdtemp(prefix="rmqlat-")
    home = os.path.join(tmp, "home")
    os.makedirs(home)
    server = rocket_server(os.path.join(tmp, "broker"), smss=False,
                           config={"rocketmq": {"longPollBatchMs": batch_ms}})
    server.start()
    try:
        ns = namesrv_addr(server)
        # the producer's warm-up creates the topic, so the consumer finds its route
        p = spawn(home, "worker-produce", "--namesrv", ns, "--topic", "Lat", "--count", count,
                  "--latency", gap, "--index", 9)
        read_json(p, 60)
        c = spawn(home, "worker-consume", "--namesrv", ns, "--topic", "Lat", "--group", "LatG",
                  "--count", count + 20, "--latency", 1, "--timeout", 120)
        read_json(c, 60)
        time.sleep(5)  # the consumer's first rebalance and offset lookup
        p.stdin.write("go\n")
        p.stdin.flush()
        sent = read_json(p, 300)
        got = read_json(c, 130)
        p.kill()
        c.kill()
        return {"batch_ms": batch_ms, "gap_s": gap, "msgs_per_s": round(count / sent["elapsed"]),
                "received": got["count"], "p50_ms": round(got.get("p50", -1), 2),
                "p99_ms": round(got.get("p99", -1), 2)}
    finally:
        try:
            server.stop()
        finally:
            server.close()
            shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,0", help="longPollBatchMs values, alternated")
    ap.add_argument("--gap", type=float, default=0.0003, help="seconds between sends")
    ap.add_argument("--count", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    batches = [int(x) for x in a.batches.split(",") if x]
    for _ in range(a.rounds):
        for b in batches:
            print(json.dumps(one_run(b, a.gap, a.count)), flush=True)


if __name__ == "__main__":
    main()
