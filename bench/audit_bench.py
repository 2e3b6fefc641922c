"""Benchmark of the Spark audit job: wall time and records per second on local[2].

Writes data directories of 0.5, 1 and 2 GiB (200-byte bodies, one topic with 4 queues,
batches of 1,000 to one queue in turn, consume queues and a checkpoint) by packing records
with numpy (L{tests.spark.biglog}; the layout the store writes, which the audit checks:
every run must come out clean), then runs ``python -m spark.audit`` on each as a separate
process and prints records/s, MiB/s and how the time grows with the size.

    PYTHONPATH=. python bench/audit_bench.py [--sizes 0.5,1,2] [--master local[2]]
        [--segment-mb 128] [--work /tmp/audit-bench] [--keep]
    PYTHONPATH=. python bench/audit_bench.py --cluster [--cluster-memory 2g] [options above]

C{--master spark://HOST:PORT} runs it on that cluster (the job ships its own code);
C{--cluster} starts a standalone master and one 2-core worker from pyspark's own
distribution on 127.0.0.1 (L{tests.spark.cluster}), runs on it and stops it.
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


def audit(path, out, master):
    """Run the audit in its own process; returns C{(seconds, exit code, summary)}."""
    env = dict(os.environ, PYTHONPATH=ROOT, SPARK_LOCAL_IP="127.0.0.1")
    cmd = [sys.executable, "-m", "spark.audit", path, "--out", out, "--master", master, "--quiet"]
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
    args = p.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    rows = []
    try:
        for gib in [float(s) for s in args.sizes.split(",")]:
            data = os.path.join(args.work, f"data-{gib}g")
            records, nbytes, gen_s = generate(data, int(gib * (1 << 30)), args.segment_mb << 20)
            print(f"generated {nbytes / (1 << 30):.2f} GiB, {records} records in {gen_s:.1f}s", flush=True)
            took, code, summary = audit(data, os.path.join(args.work, f"out-{gib}g"), args.master)
            assert summary["log"]["records"] == records, summary["log"]
            assert code == 0, summary["integrity"]
            row = {
                "gib": round(nbytes / (1 << 30), 3), "records": records, "segments": summary["log"]["segments"],
                "wall_s": round(took, 1), "records_per_s": round(records / took), "exit_code": code,
                "mib_per_s": round(nbytes / (1 << 20) / took, 1),
            }  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
            if not args.keep:
                shutil.rmtree(data, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(args.work, ignore_errors=True)
    print(f"\naudit on {args.master}, {args.segment_mb} MiB segments, {BODY}-byte bodies; load {os.getloadavg()}")
    print(f"{'GiB':>6} {'records':>10} {'wall s':>8} {'records/s':>10} {'MiB/s':>7} {'x time':>7}")
    for r in rows:
        grow = r["wall_s"] / rows[0]["wall_s"]
        print(f"{r['gib']:>6} {r['records']:>10} {r['wall_s']:>8} {r['records_per_s']:>10} {r['mib_per_s']:>7} {grow:>7.2f}")
    return 0


def cli(argv=None):
    """C{main}, on a standalone cluster started here when C{--cluster} is given."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--cluster", action="store_true")
    p.add_argument("--cluster-memory", default="2g", help="the worker's memory, all given to its executor")
    opts, rest = p.parse_known_args(sys.argv[1:] if argv is None else argv)
    if not opts.cluster:
        return main(rest)
    import tempfile

    from tests.spark.cluster import StandaloneCluster

    base = tempfile.mkdtemp(prefix="audit-bench-cluster-")
    with StandaloneCluster(base, cores=2, memory=opts.cluster_memory) as cluster:
        print(f"standalone cluster {cluster.url}: 1 worker, 2 cores, {opts.cluster_memory}", flush=True)
        os.environ["PYSPARK_SUBMIT_ARGS"] = f"--executor-memory {opts.cluster_memory} pyspark-shell"
        code = main(rest + ["--master", cluster.url])
    shutil.rmtree(base, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(cli())
