"""Where an audit run spends its time: Spark's event log of one run, summarised.

Runs ``python -m spark.audit`` once with C{spark.eventLog.enabled} (or reads an event log
given with C{--log}) and prints each Spark job (its call site, stages, tasks, wall time)
and the executors' run time and CPU time per stage, so the costly steps show:

    PYTHONPATH=. python bench/audit_profile.py DATA_DIR [--master local[2]] [--code DIR]
    PYTHONPATH=. python bench/audit_profile.py --log /tmp/eventlog/local-123

C{--code DIR} runs the C{spark.audit} of another checkout (e.g. a worktree of main) on
the same data, to compare where two versions spend their time.
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_events(path):
    """Yield the events (dicts) of a Spark event log file."""
    with open(path) as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def summarize(path):
    """Return C{(jobs, app_ms)}: per job its id, call site, wall ms, stages, tasks, and
    the executors' run and CPU ms; app_ms the application's wall time."""
    jobs, stage_job, app = {}, {}, [None, None]
    for e in read_events(path):
        kind = e["Event"]
        if kind == "SparkListenerApplicationStart":
            app[0] = e["Timestamp"]
        elif kind == "SparkListenerApplicationEnd":
            app[1] = e["Timestamp"]
        elif kind == "SparkListenerJobStart":
            props = e.get("Properties") or {}
            site = props.get("callSite.short") or (e["Stage Infos"][-1].get("Stage Name", "?") if e["Stage Infos"] else "?")
            jobs[e["Job ID"]] = {"job": e["Job ID"], "site": site, "start": e["Submission Time"], "end": None,
                                 "stages": 0, "tasks": 0, "run_ms": 0, "cpu_ms": 0}  # fmt: skip
            for s in e["Stage IDs"]:
                stage_job[s] = e["Job ID"]
        elif kind == "SparkListenerJobEnd":
            jobs[e["Job ID"]]["end"] = e["Completion Time"]
        elif kind == "SparkListenerStageCompleted":
            j = jobs.get(stage_job.get(e["Stage Info"]["Stage ID"]))
            if j is not None and "Completion Time" in e["Stage Info"]:
                j["stages"] += 1
        elif kind == "SparkListenerTaskEnd":
            j = jobs.get(stage_job.get(e["Stage ID"]))
            m = e.get("Task Metrics") or {}
            if j is not None:
                j["tasks"] += 1
                j["run_ms"] += m.get("Executor Run Time", 0)
                j["cpu_ms"] += m.get("Executor CPU Time", 0) // 1_000_000
    out = []
    for j in jobs.values():
        j["wall_ms"] = (j["end"] or j["start"]) - j["start"]
        out.append(j)
    app_ms = (app[1] - app[0]) if app[0] and app[1] else None
    return out, app_ms


def print_summary(jobs, app_ms, stream=sys.stdout):
    """Print the jobs, the busiest call sites and the totals."""
    print(f"{'job':>4} {'wall s':>7} {'stages':>6} {'tasks':>6} {'run s':>7}  call site", file=stream)
    for j in sorted(jobs, key=lambda j: j["job"]):
        print(f"{j['job']:>4} {j['wall_ms'] / 1000:>7.2f} {j['stages']:>6} {j['tasks']:>6} "
              f"{j['run_ms'] / 1000:>7.2f}  {j['site']}", file=stream)  # fmt: skip
    wall = sum(j["wall_ms"] for j in jobs) / 1000
    print(f"\n{len(jobs)} jobs, {sum(j['stages'] for j in jobs)} stages, {sum(j['tasks'] for j in jobs)} tasks; "
          f"jobs' wall {wall:.1f} s (overlapping jobs counted each), executors' run "
          f"{sum(j['run_ms'] for j in jobs) / 1000:.1f} s (JVM CPU {sum(j['cpu_ms'] for j in jobs) / 1000:.1f} s)"
          + (f"; application {app_ms / 1000:.1f} s" if app_ms else ""), file=stream)  # fmt: skip


def run(data, master, code, extra):
    """Run the audit with an event log; returns the log's path."""
    logs = tempfile.mkdtemp(prefix="audit-eventlog-")
    out = tempfile.mkdtemp(prefix="audit-profile-out-")
    env = dict(os.environ, PYTHONPATH=code, SPARK_LOCAL_IP="127.0.0.1")
    cmd = [sys.executable, "-m", "spark.audit", data, "--out", out, "--master", master, "--quiet",
           "--conf", "spark.eventLog.enabled=true", "--conf", f"spark.eventLog.dir=file://{logs}", *extra]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, cwd=code, capture_output=True, text=True, timeout=3600)
    print(f"audit exit {proc.returncode} in {time.monotonic() - t0:.1f} s ({code})")
    if proc.returncode not in (0, 1):
        sys.stderr.write(proc.stderr[-3000:])
    return sorted(glob.glob(os.path.join(logs, "*")))[-1]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", nargs="?", help="data directory to audit")
    p.add_argument("--log", help="summarise this event log instead of running the audit")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--code", default=ROOT, help="checkout whose spark.audit runs (default: this one)")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="more audit arguments after --")
    args = p.parse_args(argv)
    path = args.log or run(args.data, args.master, os.path.abspath(args.code), [a for a in args.extra if a != "--"])
    jobs, app_ms = summarize(path)
    print_summary(jobs, app_ms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
