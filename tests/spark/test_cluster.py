"""The audit on a real Spark standalone cluster (a master and a worker started from
pyspark's own distribution on 127.0.0.1), submitted as a user would, with
``spark-submit --master spark://... --py-files <zip>``: the same summary as the local run.
(It is also the test that the zip alone carries the job: spark-submit runs without
PYTHONPATH, from a directory outside the source tree.)

The driver runs in its own directory and is given the data directory as a path relative
to it; the worker runs elsewhere (its own cwd and work directory), so an executor that
resolved a path against its own working directory would find nothing there. One
cluster serves the module."""

import json
import os
import shutil
import subprocess

import pytest

from spark.audit import job, package
from tests.spark import datadirs as dd
from tests.spark.cluster import StandaloneCluster

#: The record whose body is flipped: one CRC failure.
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


def submit_audit(cluster, cwd, zip_path, *args, timeout=600):
    """Run the audit's main file with C{spark-submit} on C{cluster} from C{cwd}, with
    C{--py-files zip_path}; returns the CompletedProcess."""
    main = os.path.join(cwd, "audit_main.py")
    shutil.copy(os.path.join(os.path.dirname(package.__file__), "__main__.py"), main)
    cmd = [
        cluster.submit, "--master", cluster.url, "--driver-memory", "512m", "--executor-memory", "768m",
        "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
        "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=2",
        "--py-files", zip_path, main, *args, "--quiet",
    ]  # fmt: skip
    return subprocess.run(cmd, cwd=cwd, env=cluster.env(), capture_output=True, text=True, timeout=timeout)


def apps(cluster):
    """The applications the worker has run executors for (their work directories)."""
    return {name for name in os.listdir(cluster.work_dir) if name.startswith("app-")}


# Under a load of 20 on two cores the submit alone took 4 minutes (idle: about one): the
# bound of the other Spark tests (600 s, fixture included) is too close.
@pytest.mark.timeout(900)
def test_cluster_audit_matches_local(cluster, spark, broker_dir, tmp_path):
    """On the cluster, a CRC failure is found (exit 1), and summary.json is the local
    run's but for how the data directory was named. The driver is given the data
    directory relative to its cwd and the output directory as a C{file://} URI; the
    executor ran in the worker's work directory."""
    driver = tmp_path / "driver"
    driver.mkdir()
    data = dd.copy_dir(broker_dir[0], str(driver / "data"))
    dd.flip_body_byte(data, FLIPPED)
    zip_path = package.build_pyfiles(str(tmp_path / "mqserver-audit.zip"))
    out = tmp_path / "cluster-out"

    before = apps(cluster)
    proc = submit_audit(cluster, str(driver), zip_path, "data", "--out", out.as_uri(), "--tables", "queue_stats")
    assert proc.returncode == 1, proc.stderr[-3000:] + cluster.logs()
    ran = apps(cluster) - before
    assert len(ran) == 1, ("the job did not run on the cluster", ran, cluster.logs())
    assert os.listdir(os.path.join(cluster.work_dir, ran.pop())), "no executor ran in the worker's work directory"
    printed = json.loads(proc.stdout[: proc.stdout.rindex("}") + 1])
    assert printed["verdict"] == "INTEGRITY FINDINGS"
    assert printed["findings"] == {"integrity.crc_failures": 1}
    with open(out / "summary.json") as f:
        on_cluster = json.load(f)
    assert on_cluster["data_dir"] == "data"
    assert [(p["problem"], p["event_id"]) for p in on_cluster["integrity_examples"]["problems"]] == [("crc", FLIPPED)]
    assert on_cluster["log"]["records"] == dd.RECORDS
    assert (out / "tables" / "queue_stats").is_dir() and (out / "report.html").exists()

    local, code = job.run(spark, job.parse_args([data, "--out", str(tmp_path / "local"), "--quiet"]))
    assert code == 1
    assert dict(on_cluster, data_dir=None) == dict(json.loads(json.dumps(local)), data_dir=None)
