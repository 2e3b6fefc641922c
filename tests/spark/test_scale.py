"""The audit as a user runs it, in its own process: a log of several hundred MB in one
segment of the default size (1 GiB) with a small driver heap, and a Spark failure that
must end the job with exit status 2 and its cause, never a hang."""

import json
import os
import subprocess
import sys

import pytest

from tests.spark.biglog import write_data_dir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_audit(data, out, *extra, env=None, timeout=400):
    """Run C{python -m spark.audit} on C{data}; returns the CompletedProcess."""
    e = dict(os.environ, PYTHONPATH=ROOT, SPARK_LOCAL_IP="127.0.0.1", **(env or {}))
    cmd = [sys.executable, "-m", "spark.audit", str(data), "--out", str(out), "--quiet", *extra]
    return subprocess.run(cmd, env=e, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_large_segment_with_small_heap(tmp_path):
    """450 MB of records in one 1 GiB segment, audited with a 512 MiB driver heap: the
    segment is decoded as several byte ranges (a whole-segment reader needs the segment
    in one JVM array and ran out of heap), and the directory audits clean."""
    data = tmp_path / "data"
    records, log_bytes = write_data_dir(str(data), 110_000, body=4000)
    assert log_bytes > 400 << 20 and len(os.listdir(data / "commitlog")) == 1
    proc = run_audit(data, tmp_path / "out", "--master", "local[2]", "--driver-memory", "512m")
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / "out" / "summary.json") as f:
        summary = json.load(f)
    assert summary["log"]["records"] == records
    assert summary["log"]["segment_size"] is None  # one unsealed segment: the files cannot tell
    assert not any(summary["integrity"].values())


def test_spark_failure_exits_2_with_the_cause(tmp_path):
    """When every task fails (here: the Python workers cannot start), the job ends
    with exit status 2 and Spark's cause on stderr, not a traceback and exit 1 (which
    would read as "integrity findings")."""
    data = tmp_path / "data"
    write_data_dir(str(data), 1000, segment_size=1 << 20)
    proc = run_audit(data, tmp_path / "out", "--master", "local[1]", env={"PYSPARK_PYTHON": "/bin/false"})
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "error: the audit job failed:" in proc.stderr
    assert "pyspark.daemon" in proc.stderr.split("error: the audit job failed:")[1]
    assert not (tmp_path / "out" / "summary.json").exists()
