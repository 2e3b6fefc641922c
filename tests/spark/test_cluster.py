"""The audit on a real Spark standalone cluster (a master and a worker started from
pyspark's own distribution on 127.0.0.1), submitted as a user would, with
``spark-submit --master spark://... --py-files <zip>``: the same summary as the local run.

The driver runs in its own directory and is given the data directory as a path relative
to it; the worker runs elsewhere (its own cwd and work directory), so an executor that
resolved a path against its own working directory would find nothing there. The
directory compared with is given as a C{file://} URI. One cluster serves the module."""

import json
import os
import shutil
import subprocess

import pytest

from spark.audit import job, package
from tests.spark import datadirs as dd
from tests.spark.cluster import StandaloneCluster

#: The record whose body is flipped: one CRC failure, and a difference with the copy.
FLIPPED = 42


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One master and one worker (2 cores, 1 GiB), stopped after the module's tests."""
    c = StandaloneCluster(str(tmp_path_factory.mktemp("spark-cluster")), cores=2, memory="1g")
    c.start()
    try:
        yield c
    finally:
        c.stop()


def submit_audit(cluster, cwd, zip_path, *args, timeout=300):
    """Run the audit's main file with C{spark-submit} on C{cluster} from C{cwd}, with
    C{--py-files zip_path}; returns the CompletedProcess."""
    main = os.path.join(cwd, "audit_main.py")
    shutil.copy(os.path.join(os.path.dirname(package.__file__), "__main__.py"), main)
    cmd = [
        cluster.submit, "--master", cluster.url, "--driver-memory", "512m", "--executor-memory", "768m",
        "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
        "--conf", "spark.ui.enabled=false", "--py-files", zip_path, main, *args, "--quiet",
    ]  # fmt: skip
    return subprocess.run(cmd, cwd=cwd, env=cluster.env(), capture_output=True, text=True, timeout=timeout)


def apps(cluster):
    """The applications the worker has run executors for (their work directories)."""
    return {name for name in os.listdir(cluster.work_dir) if name.startswith("app-")}


def without_dirs(summary):
    """The summary without the directory names as given on the command line."""
    out = dict(summary, data_dir=None)
    if "compare" in out:
        out["compare"] = dict(out["compare"], other_dir=None)
    return out


def test_cluster_audit_matches_local(cluster, spark, broker_dir, tmp_path):
    """On the cluster, a CRC failure is found (exit 1) and the copy it is compared with
    differs by that record; summary.json is the local run's, apart from how the
    directories were named; the executor ran in the worker's work directory."""
    driver = tmp_path / "driver"
    driver.mkdir()
    data = dd.copy_dir(broker_dir[0], str(driver / "data"))
    dd.flip_body_byte(data, FLIPPED)
    slave = dd.copy_dir(broker_dir[0], str(tmp_path / "slave"))
    zip_path = package.build_pyfiles(str(tmp_path / "mqserver-audit.zip"))

    before = apps(cluster)
    proc = submit_audit(cluster, str(driver), zip_path, "data", "--compare", "file://" + slave, "--out", "out")
    assert proc.returncode == 1, proc.stderr[-3000:] + cluster.logs()
    ran = apps(cluster) - before
    assert len(ran) == 1, ("the job did not run on the cluster", ran, cluster.logs())
    assert os.listdir(os.path.join(cluster.work_dir, ran.pop())), "no executor ran in the worker's work directory"
    printed = json.loads(proc.stdout[: proc.stdout.rindex("}") + 1])
    assert printed["findings"] == {"integrity.crc_failures": 1, "compare.different": 1}
    with open(driver / "out" / "summary.json") as f:
        on_cluster = json.load(f)
    assert (on_cluster["data_dir"], on_cluster["compare"]["other_dir"]) == ("data", "file://" + slave)
    assert on_cluster["compare"]["first_divergent_event_id"] == FLIPPED
    assert on_cluster["log"]["records"] == dd.RECORDS

    args = job.parse_args([data, "--compare", slave, "--out", str(tmp_path / "local"), "--quiet"])
    local, code = job.run(spark, args)
    assert code == 1
    assert without_dirs(on_cluster) == without_dirs(json.loads(json.dumps(local)))
