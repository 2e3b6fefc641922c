"""Benchmark of the Spark audit job: wall time and records per second on local[2].

Writes data directories of 0.5, 1 and 2 GiB (200-byte bodies, one topic with 4 queues,
batches of 1,000 to one queue in turn, consume queues and a checkpoint) by packing records
with numpy (L{tests.spark.biglog}; the layout the store writes, which the audit checks:
every run must come out clean), then runs ``python -m spark.audit`` on each as a separate
process and prints records/s, MiB/s, how the time grows with the size, and the CPU
seconds of the whole process tree (driver, JVM, Python workers) per million records: on
a shared machine wall times swing with the load, CPU seconds much less.

    PYTHONPATH=. python bench/audit_bench.py [--sizes 0.5,1,2] [--master local[2]] [--shape broker]
        [--segment-mb 128] [--work /tmp/audit-bench] [--keep] [--vs DIR] [--rounds 2]
        [--audit-args="--full"] [--incremental]
    PYTHONPATH=. python bench/audit_bench.py --cluster [--cluster-memory 2g] [options above]

C{--shape broker} writes the logs through a running broker instead
(L{bench.brokerlog}: concurrent publishers on smss, NSQ and RocketMQ, interleaved topics
and queues, properties, delays, retry and dead-letter topics); the sizes are then about.

C{--vs DIR} runs the C{spark.audit} of another checkout (e.g. C{git worktree add
/tmp/audit-main main}) on the same log, alternating A B A B for C{--rounds} rounds.
C{--master spark://HOST:PORT} runs it on that cluster (the job ships its own code);
C{--cluster} starts a standalone master and one 2-core worker from pyspark's own
distribution on 127.0.0.1 (L{tests.spark.cluster}), runs on it and stops it.

With C{--incremental}, after those runs this checkout audits each log once more keeping a
state (C{--since-state}), the log is then written again with 5% more messages (the same
bytes first: the generator is deterministic), and a run with the state audits only what
is new; rows C{this/state} and C{this/incr}.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

from harness import ROOT, write_data_dir

from mqserver.store import format as fmt

BODY = 200
TOPIC = "bench"
QUEUES = 4
BATCH = 1000


#: Bytes a message of the broker's shape (L{bench.brokerlog}) takes in the log, about.
BROKER_RECORD = 370


def generate(path, target_bytes, segment_size, shape="numpy"):
    """Write a data directory whose commit log holds at least C{target_bytes} (about,
    for the broker's shape); returns C{(records, log bytes, seconds)}."""
    if shape == "broker":
        from brokerlog import write as write_through_broker

        t0 = time.monotonic()
        write_through_broker(path, target_bytes // BROKER_RECORD, segment_size)
        with open(os.path.join(path, "metadata.json")) as f:
            records = json.load(f)["nextEventId"] - 1
        end = sum(os.path.getsize(os.path.join(path, "commitlog", n)) for n in os.listdir(os.path.join(path, "commitlog")))
        return records, end, time.monotonic() - t0
    shutil.rmtree(path, ignore_errors=True)
    size = fmt.record_size(BODY, len(TOPIC), 0)
    messages = -(-target_bytes // (size * BATCH)) * BATCH
    t0 = time.monotonic()
    records, end = write_data_dir(path, messages, segment_size=segment_size, body=BODY, topic=TOPIC,
                                  queues=QUEUES, batch=BATCH)  # fmt: skip
    return records, end, time.monotonic() - t0


class TreeCpu:
    """CPU seconds of a process and all its descendants, sampled while it runs (a
    descendant's time is kept after it exits: its last sample counts)."""

    def __init__(self, pid):
        import psutil

        self.root = psutil.Process(pid)
        self.seen, self.kind = {}, {}

    def sample(self):
        import psutil

        try:
            procs = [self.root] + self.root.children(recursive=True)
        except psutil.Error:
            return
        for p in procs:
            try:
                t = p.cpu_times()
                key = (p.pid, p.create_time())
                if self.kind.get(key) != "jvm":
                    # spark-submit is a shell script that execs the JVM in the same
                    # process: what a process is can change after it is first seen.
                    self.kind[key] = _kind(p)
                self.seen[key] = t.user + t.system  # children are sampled themselves
            except psutil.Error:
                pass

    def total(self):
        return sum(self.seen.values())

    def by_kind(self):
        """CPU seconds of the driver's Python, the JVM and the Python workers."""
        out = {}
        for key, cpu in self.seen.items():
            out[self.kind[key]] = round(out.get(self.kind[key], 0) + cpu, 1)
        return out


def _kind(p):
    cmd = " ".join(p.cmdline())
    if "java" in p.name():
        return "jvm"
    return "workers" if "pyspark.daemon" in cmd or "pyspark.worker" in cmd else "driver"


def audit(path, out, master, code=ROOT, extra=()):
    """Run the audit of checkout C{code} in its own process; returns C{(seconds, exit
    code, summary, cpu seconds of the process tree)}."""
    env = dict(os.environ, PYTHONPATH=code, SPARK_LOCAL_IP="127.0.0.1")
    cmd = [sys.executable, "-m", "spark.audit", path, "--out", out, "--master", master, "--quiet", *extra]
    t0 = time.monotonic()
    with open(os.path.join(out + ".stderr"), "w+") as err:
        proc = subprocess.Popen(cmd, env=env, cwd=code, stdout=subprocess.DEVNULL, stderr=err)
        cpu = TreeCpu(proc.pid)
        while proc.poll() is None:
            cpu.sample()
            time.sleep(0.2)
        took = time.monotonic() - t0
        if proc.returncode not in (0, 1):
            err.seek(0)
            sys.stderr.write(err.read()[-4000:])
            raise SystemExit(f"audit failed with {proc.returncode}")
    with open(os.path.join(out, "summary.json")) as f:
        return took, proc.returncode, json.load(f), cpu


def _row(name, rnd, nbytes, records, summary, took, tree):
    """One printed row: a run's figures (with C{--since-state}, what it read and carried)."""
    cpu, inc = tree.total(), summary.get("incremental") or {}
    return {
        "code": name, "round": rnd, "gib": round(nbytes / (1 << 30), 3), "records": records,
        "segments": summary["log"]["segments"], "wall_s": round(took, 1),
        "records_per_s": round(records / took), "mib_per_s": round(nbytes / (1 << 20) / took, 1),
        "cpu_s": round(cpu, 1), "cpu_s_per_m": round(cpu / records * 1e6, 1),
        "load": round(os.getloadavg()[0], 1), "cpu_by_process": tree.by_kind(),
        "mib_read": round(inc.get("bytes_read", nbytes) / (1 << 20), 1),
        "mib_carried": round(inc.get("bytes_carried", 0) / (1 << 20), 1),
    }  # fmt: skip


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="0.5,1,2", help="log sizes in GiB, comma-separated")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--segment-mb", type=int, default=128, help="segment size in MiB")
    p.add_argument("--work", default="/tmp/audit-bench", help="scratch directory (removed unless --keep)")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--vs", metavar="DIR", help="another checkout to run alternately on the same logs")
    p.add_argument("--rounds", type=int, default=1, help="runs of each checkout per size (alternating)")
    p.add_argument("--audit-args", default="", help="more arguments for the audit, e.g. --full")
    p.add_argument("--incremental", action="store_true", help="also audit 5%% more with --since-state")
    p.add_argument("--shape", choices=("numpy", "broker"), default="numpy",
                   help="numpy: one topic in batches of 1,000 equal records, packed by numpy; broker: written"
                        " through a running broker by concurrent publishers on every protocol (bench/brokerlog.py)")
    args = p.parse_args(argv)
    if args.incremental and args.shape == "broker":
        # The incremental rows need the same log again with 5% more: only the
        # deterministic numpy generator writes that.
        p.error("--incremental needs --shape numpy")
    os.makedirs(args.work, exist_ok=True)
    codes = [("this", ROOT)] + ([("vs", os.path.abspath(args.vs))] if args.vs else [])
    rows = []
    try:
        for gib in [float(s) for s in args.sizes.split(",")]:
            data = os.path.join(args.work, f"data-{gib}g")
            records, nbytes, gen_s = generate(data, int(gib * (1 << 30)), args.segment_mb << 20, args.shape)
            print(f"generated {nbytes / (1 << 30):.2f} GiB, {records} records in {gen_s:.1f}s", flush=True)
            for rnd in range(args.rounds):
                for name, code in codes:
                    out = os.path.join(args.work, f"out-{gib}g-{name}")
                    took, rc, summary, tree = audit(data, out, args.master, code, args.audit_args.split())
                    assert summary["log"]["records"] == records, summary["log"]
                    assert rc == 0, summary["integrity"]
                    rows.append(_row(name, rnd, nbytes, records, summary, took, tree))
                    print(json.dumps(rows[-1]), flush=True)
            if args.incremental:
                st = ["--since-state", os.path.join(args.work, f"state-{gib}g")]
                for kind, target in (("state", None), ("incr", int(gib * 1.05 * (1 << 30)))):
                    if target:
                        records, nbytes, _ = generate(data, target, args.segment_mb << 20)
                    out = os.path.join(args.work, f"out-{gib}g-{kind}")
                    took, rc, summary, tree = audit(data, out, args.master, ROOT, args.audit_args.split() + st)
                    assert summary["log"]["records"] == records, summary["log"]
                    assert rc == 0, summary["integrity"]
                    rows.append(_row(f"this/{kind}", 0, nbytes, records, summary, took, tree))
                    print(json.dumps(rows[-1]), flush=True)
            if not args.keep:
                shutil.rmtree(data, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(args.work, ignore_errors=True)
    shape = "written through the broker" if args.shape == "broker" else f"{BODY}-byte bodies"
    print(f"\naudit on {args.master}, {args.segment_mb} MiB segments, {shape} {args.audit_args}".rstrip())
    print(f"{'code':>10} {'GiB':>6} {'records':>10} {'wall s':>8} {'records/s':>10} {'MiB/s':>7} {'CPU s':>7} "
          f"{'CPU s/M':>8} {'load':>5} {'MiB read':>9} {'carried':>8}")  # fmt: skip
    for r in rows:
        print(f"{r['code']:>10} {r['gib']:>6} {r['records']:>10} {r['wall_s']:>8} {r['records_per_s']:>10} "
              f"{r['mib_per_s']:>7} {r['cpu_s']:>7} {r['cpu_s_per_m']:>8} {r['load']:>5} {r['mib_read']:>9}"
              f" {r['mib_carried']:>8}")  # fmt: skip
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

    from harness import StandaloneCluster

    base = tempfile.mkdtemp(prefix="audit-bench-cluster-")
    with StandaloneCluster(base, cores=2, memory=opts.cluster_memory) as cluster:
        print(f"standalone cluster {cluster.url}: 1 worker, 2 cores, {opts.cluster_memory}", flush=True)
        os.environ["PYSPARK_SUBMIT_ARGS"] = f"--executor-memory {opts.cluster_memory} pyspark-shell"
        code = main(rest + ["--master", cluster.url])
    shutil.rmtree(base, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(cli())
