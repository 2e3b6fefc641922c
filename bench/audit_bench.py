"""Benchmark of the Spark audit job: wall time and records per second on local[2].

Writes data directories of 0.5, 1 and 2 GiB (200-byte bodies, one topic with 4 queues,
batches of 1,000 to one queue in turn, consume queues and a checkpoint) by packing records
with numpy (L{tests.spark.biglog}; the layout the store writes, which the audit checks:
every run must come out clean), then runs ``python -m spark.audit`` on each as a separate
process and prints records/s, MiB/s and how the time grows with the size.

    PYTHONPATH=. python bench/audit_bench.py [--sizes 0.5,1,2] [--master local[2]]
        [--segment-mb 128] [--work /tmp/audit-bench] [--keep] [--incremental]

With C{--incremental} the full run keeps a state (C{--since-state}), the log is then
written again with 5% more messages (the same bytes first: the generator is
deterministic), and a second run with the state audits only what is new; both rows print.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mqserver.store import format as fmt  # noqa: E402
from tests.spark.biglog import write_data_dir  # noqa: E402

BODY = 200
TOPIC = "bench"
QUEUES = 4
BATCH = 1000


def generate(path, target_bytes, segment_size):
    """Write a data directory whose commit log holds at least C{target_bytes}; returns
    C{(records, log bytes, seconds)}."""
    shutil.rmtree(path, ignore_errors=True)
    size = fmt.record_size(BODY, len(TOPIC), 0)
    messages = -(-target_bytes // (size * BATCH)) * BATCH
    t0 = time.monotonic()
    records, end = write_data_dir(path, messages, segment_size=segment_size, body=BODY, topic=TOPIC,
                                  queues=QUEUES, batch=BATCH)  # fmt: skip
    return records, end, time.monotonic() - t0


def audit(path, out, master, *extra):
    """Run the audit in its own process; returns C{(seconds, exit code, summary)}."""
    env = dict(os.environ, PYTHONPATH=ROOT, SPARK_LOCAL_IP="127.0.0.1")
    cmd = [sys.executable, "-m", "spark.audit", path, "--out", out, "--master", master, "--quiet", *extra]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    took = time.monotonic() - t0
    if proc.returncode not in (0, 1):
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"audit failed with {proc.returncode}")
    with open(os.path.join(out, "summary.json")) as f:
        return took, proc.returncode, json.load(f)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="0.5,1,2", help="log sizes in GiB, comma-separated")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--segment-mb", type=int, default=128, help="segment size in MiB")
    p.add_argument("--work", default="/tmp/audit-bench", help="scratch directory (removed unless --keep)")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--incremental", action="store_true", help="also audit 5%% more with --since-state")
    args = p.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    rows = []
    try:
        for gib in [float(s) for s in args.sizes.split(",")]:
            data = os.path.join(args.work, f"data-{gib}g")
            records, nbytes, gen_s = generate(data, int(gib * (1 << 30)), args.segment_mb << 20)
            print(f"generated {nbytes / (1 << 30):.2f} GiB, {records} records in {gen_s:.1f}s", flush=True)
            st = ["--since-state", os.path.join(args.work, f"state-{gib}g")] if args.incremental else []
            runs = [("full", int(gib * (1 << 30)))] + ([("incr", int(gib * 1.05 * (1 << 30)))] if st else [])
            for kind, target in runs:
                if kind == "incr":
                    records, nbytes, _ = generate(data, target, args.segment_mb << 20)
                took, code, summary = audit(data, os.path.join(args.work, f"out-{gib}g-{kind}"), args.master, *st)
                assert summary["log"]["records"] == records, summary["log"]
                assert code == 0, summary["integrity"]
                inc = summary.get("incremental") or {}
                row = {
                    "run": kind, "gib": round(nbytes / (1 << 30), 3), "records": records,
                    "segments": summary["log"]["segments"], "wall_s": round(took, 1),
                    "records_per_s": round(records / took), "exit_code": code,
                    "mib_per_s": round(nbytes / (1 << 20) / took, 1),
                    "mib_read": round(inc.get("bytes_read", nbytes) / (1 << 20), 1),
                    "mib_carried": round(inc.get("bytes_carried", 0) / (1 << 20), 1),
                }  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
            if not args.keep:
                shutil.rmtree(data, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(args.work, ignore_errors=True)
    print(f"\naudit on {args.master}, {args.segment_mb} MiB segments, {BODY}-byte bodies; load {os.getloadavg()}")
    print(f"{'run':>4} {'GiB':>6} {'records':>10} {'wall s':>8} {'records/s':>10} {'MiB/s':>7} {'x time':>7}"
          f" {'MiB read':>9} {'carried':>8}")  # fmt: skip
    for r in rows:
        grow = r["wall_s"] / rows[0]["wall_s"]
        print(f"{r['run']:>4} {r['gib']:>6} {r['records']:>10} {r['wall_s']:>8} {r['records_per_s']:>10}"
              f" {r['mib_per_s']:>7} {grow:>7.2f} {r['mib_read']:>9} {r['mib_carried']:>8}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
