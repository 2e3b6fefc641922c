"""SIGKILL loop: four smss publishers, the broker killed at random moments, many times.

Each round restarts the broker on the same data directory, runs four publishing
connections (batches of 1-5 messages with headers, 64 KiB segments so writes roll over)
for a random 0.3-1.5 s, and SIGKILLs the broker. After the last round it restarts once
more and reads both topics from eventId 0: every acknowledged message must be there,
intact and once, nothing that was never sent, eventIds dense and never reused, each
connection's order kept. Prints the counts per flush level and exits non-zero on a loss.

    python bench/crash_loop.py [--kills 50] [--flush-levels 1,2] [--seed 1]
"""

import argparse
import os
import random
import sys
import tempfile
import time

from harness import (
    THREADS, TOPICS, Publisher, ServerProcess, connect, read_back_and_check)
from harness import crash_config as config


def run(flush_level, kills, rng, work):
    """Kill a broker at flush level C{flush_level} C{kills} times; return the figures."""
    server = ServerProcess(os.path.join(work, f"flush{flush_level}"), config=config(flush_level))
    pubs = []
    try:
        server.start()
        with connect(server) as c:
            for t in TOPICS:
                c.create(t)
        for k in range(kills):
            if k:
                server.start()
            round_pubs = [Publisher(server, k * THREADS + t) for t in range(THREADS)]
            for p in round_pubs:
                p.start()
            time.sleep(rng.uniform(0.3, 1.5))
            server.kill()
            for p in round_pubs:
                p.join(15)
                if p.is_alive():
                    raise SystemExit(f"publisher {p.tid} still running after the kill")
            pubs += round_pubs
        server.start()
        try:
            got = read_back_and_check(server, pubs)  # raises AssertionError on any loss
        except Exception:
            print(server.current_log()[-4000:], file=sys.stderr)  # the broker's side of it
            raise
        return {
            "kills": kills,
            "sent": sum(len(p.sent) for p in pubs),
            "acknowledged": sum(len(p.acked) for p in pubs),
            "read back": sum(len(v) for v in got.values()),
        }
    finally:
        try:
            server.stop()
        finally:
            server.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=50)
    ap.add_argument("--flush-levels", default="1,2")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    failed = False
    with tempfile.TemporaryDirectory(prefix="mq-crash-loop-") as work:
        for level in (int(x) for x in args.flush_levels.split(",")):
            start = time.monotonic()
            try:
                r = run(level, args.kills, rng, work)
            except AssertionError as e:
                failed = True
                print(f"flush level {level}: FAILED: {e}", flush=True)
                continue
            print(f"flush level {level}: {r['kills']} SIGKILLs, {r['sent']:,} sent, "
                  f"{r['acknowledged']:,} acknowledged, {r['read back']:,} read back, "
                  f"0 acknowledged lost ({time.monotonic() - start:.0f} s)", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
