"""The cluster path, run locally: ``spark-submit --py-files`` with the zip from
L{spark.audit.package}, from a directory where only the zip provides our code."""

import json
import os
import shutil
import subprocess
import sys

import pyspark

from spark.audit import package
from tests.spark import datadirs as dd


def test_spark_submit_with_py_files(broker_dir, tmp_path):
    """spark-submit runs the job from the zip alone and exits 1 on a CRC failure."""
    data = dd.copy_dir(broker_dir[0], str(tmp_path / "data"))
    dd.flip_body_byte(data, 42)
    zip_path = package.build_pyfiles(str(tmp_path / "mqserver-audit.zip"))
    main = tmp_path / "audit_main.py"
    shutil.copy(os.path.join(os.path.dirname(package.__file__), "__main__.py"), main)
    submit = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    out = tmp_path / "out"
    proc = subprocess.run(
        [submit, "--master", "local[1]", "--conf", "spark.ui.enabled=false", "--py-files", zip_path,
         str(main), data, "--out", str(out), "--quiet"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=500,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    printed = json.loads(proc.stdout[: proc.stdout.rindex("}") + 1])
    assert printed["verdict"] == "INTEGRITY FINDINGS"
    with open(out / "summary.json") as f:
        summary = json.load(f)
    assert {k: v for k, v in summary["integrity"].items() if v} == {"crc_failures": 1}
    assert summary["log"]["records"] == dd.RECORDS
    assert (out / "report.html").exists()
