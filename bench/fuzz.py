"""Fuzz every front door of a real broker process with random and mutated frames.

    PYTHONPATH=. .venv/bin/python bench/fuzz.py --frames 100000 [--doors smss,broker]
        [--connections 32] [--per-connection 20] [--batch 5000] [--seed 1] [--keep]

Starts ``twistd mqserver`` with every door on a loopback port 0 (``bench/harness.py``),
then per door sends frames from ``tests/support/fuzzframes.py`` on many concurrent
connections: each connection sends its frames, half-closes and reads until the broker
closes it (a connection still open after ``--hang`` seconds counts as a hang). After each
batch a normal client of that door must still get its answer. Prints, per door, frames
and bytes sent, connections, hangs, failed health checks, tracebacks in the broker's log
and RSS before and after; a crash of the broker stops the run. The frames of a run are
fixed by ``--seed``. The temporary data directory and the broker's log are removed at
the end unless ``--keep``.
"""

import argparse
import asyncio
import json
import logging
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time

from harness import DOORS, PORT_NAMES, conversation, healthy, prepare, ServerProcess


_TRACEBACK = re.compile(r"Traceback \(most recent call last\)|Unhandled Error|Unhandled error")


def rss_mb(pid, field="VmRSS"):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


# -- sending --------------------------------------------------------------------------------


async def one_connection(port, frames, hang_after):
    """Send C{frames}, half-close, read until closed; return (bytes sent, hung)."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return 0, False
    sent = 0
    try:
        for frame in frames:
            writer.write(frame)
            sent += len(frame)
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        deadline = time.monotonic() + hang_after
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return sent, True
            data = await asyncio.wait_for(reader.read(1 << 16), left)
            if not data:
                return sent, False
    except (OSError, asyncio.IncompleteReadError):
        return sent, False  # reset by the broker: it closed on bad input
    except asyncio.TimeoutError:
        return sent, True
    finally:
        writer.transport.abort()


async def run_batch(door, port, rng, frames, connections, per_connection, hang_after):
    """Send about C{frames} frames to C{door}; return (frames, bytes, conns, hangs)."""
    totals = [0, 0, 0, 0]
    queue = []
    while sum(len(c) for c in queue) < frames:
        queue.append(conversation(door, rng, per_connection))
    it = iter(queue)

    async def worker():
        for conv in it:
            sent, hung = await one_connection(port, conv, hang_after)
            totals[0] += len(conv)
            totals[1] += sent
            totals[2] += 1
            totals[3] += hung

    await asyncio.gather(*(worker() for _ in range(connections)))
    return totals


def tracebacks(log):
    return len(_TRACEBACK.findall(log))


def first_tracebacks(log, limit=5):
    """The first few distinct tracebacks in C{log}, told apart by their last line."""
    out, seen = [], set()
    for m in _TRACEBACK.finditer(log):
        block = []
        for line in log[m.start():m.start() + 8000].split("\n")[:60]:
            if block and not line.strip():
                break
            block.append(line)
        key = block[-1].strip()[:120] if block else ""
        key = re.sub(r"\d+", "N", key)
        if key not in seen:
            seen.add(key)
            out.append("\n".join(block))
        if len(out) >= limit:
            break
    return out


# -- main ------------------------------------------------------------------------------------


def fuzz_door(server, door, args, rng):
    port = server.ports[PORT_NAMES[door]]
    pid = server.proc.pid
    before = rss_mb(pid)
    log_start = len(server.current_log())
    sent = [0, 0, 0, 0]
    unhealthy = 0
    start = time.monotonic()
    while sent[0] < args.frames:
        n = min(args.batch, args.frames - sent[0])
        totals = asyncio.run(run_batch(door, port, rng, n, args.connections, args.per_connection, args.hang))
        sent = [a + b for a, b in zip(sent, totals)]
        if server.proc.poll() is not None:
            print(f"  {door}: BROKER DIED with {server.proc.returncode}")
            break
        if not healthy(door, port):
            unhealthy += 1
            print(f"  {door}: health check failed after {sent[0]} frames")
        # a run stopped from outside still tells how far it got
        print(f"  {door}: {sent[0]} frames, {sent[1]} bytes, {sent[2]} connections, {sent[3]} hangs, "
              f"{unhealthy} failed health checks, {time.monotonic() - start:.0f} s, RSS {rss_mb(pid):.1f} MB",
              flush=True)
        if args.deadline and time.time() > args.deadline:
            print(f"  {door}: stopped at the deadline")
            break
    took = time.monotonic() - start
    log = server.current_log()[log_start:]
    alive = server.proc.poll() is None
    after = rss_mb(pid) if alive else 0.0
    result = {
        "door": door, "frames": sent[0], "bytes": sent[1], "connections": sent[2], "hangs": sent[3],
        "failed_health_checks": unhealthy, "tracebacks": tracebacks(log), "seconds": round(took, 1),
        "frames_per_s": round(sent[0] / took) if took else 0, "rss_before_mb": round(before, 1),
        "rss_after_mb": round(after, 1), "peak_rss_mb": round(rss_mb(pid, "VmHWM"), 1) if alive else 0.0,
        "alive": alive,
    }
    print(json.dumps(result), flush=True)
    for tb in first_tracebacks(log):
        print("  ---- traceback ----\n" + tb, flush=True)
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=20000, help="frames per door")
    ap.add_argument("--doors", default=",".join(DOORS))
    ap.add_argument("--connections", type=int, default=32, help="concurrent connections")
    ap.add_argument("--per-connection", type=int, default=20, help="frames per connection")
    ap.add_argument("--batch", type=int, default=5000, help="frames between health checks")
    ap.add_argument("--hang", type=float, default=15.0, help="seconds before an open connection is a hang")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--minutes", type=float, default=0, help="stop each door after this long (0: no limit)")
    ap.add_argument("--data", help="data directory (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary data directory and log")
    args = ap.parse_args(argv)
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # resets are expected
    doors = args.doors.split(",")
    tmp = tempfile.mkdtemp(prefix="mqfuzz-")
    data = args.data or os.path.join(tmp, "data")
    server = ServerProcess(data, listen={d: "tcp:0:interface=127.0.0.1" for d in DOORS},
                           config={"rocketmq": {"serverChannelMaxIdleTimeSeconds": 30}})
    server.start()
    # stopped from outside (timeout(1), a CI limit): stop the broker on the way out too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    print(f"broker pid {server.proc.pid}, log {server.log_path}", flush=True)
    prepare({d: server.ports[PORT_NAMES[d]] for d in DOORS})
    results = []
    try:
        for door in doors:
            args.deadline = time.time() + args.minutes * 60 if args.minutes else 0
            results.append(fuzz_door(server, door, args, random.Random(f"{args.seed}-{door}")))
            if server.proc.poll() is not None:
                break
    finally:
        try:
            server.stop()
        finally:
            server.close()
            if not args.keep:
                shutil.rmtree(tmp, ignore_errors=True)
    print("door          frames    MB sent  conns  hangs  unhealthy  tracebacks  frames/s  RSS MB before->after (peak)")
    for r in results:
        print(f"{r['door']:<12} {r['frames']:>8} {r['bytes'] / 1e6:>9.1f} {r['connections']:>6} {r['hangs']:>6} "
              f"{r['failed_health_checks']:>10} {r['tracebacks']:>11} {r['frames_per_s']:>9} "
              f"{r['rss_before_mb']:>7} -> {r['rss_after_mb']} ({r['peak_rss_mb']})")
    return 0 if all(r["alive"] and not r["tracebacks"] and not r["hangs"] and not r["failed_health_checks"]
                    for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
