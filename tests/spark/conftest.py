"""Fixtures for the Spark tests: one SparkSession for the whole run, and one data
directory written by the real broker that the tests copy and damage.

Every test here is marked C{spark}. Without pyspark or a Java runtime they are skipped,
except under CI (C{CI} set), where that is a failure: CI must run them.
"""

import os
import shutil
import subprocess
import sys

import pytest

from tests.spark.datadirs import write_broker_dir


def _java_ok():
    java = shutil.which("java") or (
        os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else None
    )
    if not java:
        return False
    try:
        return subprocess.run([java, "-version"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _missing():
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed"
    if not _java_ok():
        return "no Java runtime"
    return None


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    why = None
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.spark)
            # A first Spark job (JVM start, Python workers) is slow on a busy 2-core box.
            item.add_marker(pytest.mark.timeout(600))
            if why is None:
                why = _missing() or ""
            # Under CI a missing Spark is not skipped: the tests then fail, loudly.
            if why and not os.environ.get("CI"):
                item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(scope="session")
def spark():
    """A local[2] SparkSession shared by every Spark test (UI off, UTC, 2 shuffle
    partitions); stopped at the end of the run."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("mqserver-audit-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def broker_dir(tmp_path_factory):
    """The scenario of L{tests.spark.datadirs}, written once by the real broker.
    Returns C{(path, facts)}; tests copy it before changing anything."""
    return write_broker_dir(str(tmp_path_factory.mktemp("audit-broker")))


@pytest.fixture(scope="session")
def consumers_dir(tmp_path_factory):
    """A directory the real broker wrote with one consumer of every kind at a known
    position (L{tests.spark.datadirs.write_consumers_dir})."""
    from tests.spark.datadirs import write_consumers_dir

    return write_consumers_dir(str(tmp_path_factory.mktemp("audit-consumers")))
