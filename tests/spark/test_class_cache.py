"""The audit's class-data archive (L{spark.audit.classcache}), through the audit as a
user runs it: the first local run writes the archive, the next one's JVM maps it and
gives the same summary, and a damaged archive is dropped without failing the audit."""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import psutil
import pytest

from spark.audit import classcache
from tests.spark.biglog import write_data_dir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _archives(cache):
    return sorted(n for n in os.listdir(cache) if n.endswith(".jsa")) if os.path.isdir(cache) else []


def _audit(data, out, cache):
    """Run the audit in its own process with C{--class-cache cache}; returns
    C{(CompletedProcess-like, whether a process of its tree mapped an archive of cache)}."""
    tmp = out.parent / "tmp"  # Python's temporary files: the test checks none is left
    tmp.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=ROOT, SPARK_LOCAL_IP="127.0.0.1", TMPDIR=str(tmp))
    cmd = [sys.executable, "-m", "spark.audit", str(data), "--out", str(out), "--quiet",
           "--master", "local[2]", "--class-cache", str(cache)]
    proc = subprocess.Popen(cmd, env=env, cwd=str(out.parent), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    mapped = False
    top = psutil.Process(proc.pid)
    deadline = time.monotonic() + 400
    while proc.poll() is None and not mapped and time.monotonic() < deadline:
        try:
            for p in top.children(recursive=True):
                with open(f"/proc/{p.pid}/maps") as f:
                    if str(cache) in f.read():
                        mapped = True
        except (OSError, psutil.Error):
            pass
        time.sleep(0.2)
    try:
        stdout, stderr = proc.communicate(timeout=max(1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for p in top.children(recursive=True) + [top]:  # the JVM and its Python workers too
            try:
                p.kill()
            except psutil.Error:
                pass
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr), mapped


def _nothing_logged(stderr):
    """With --quiet the driver's JVM logs nothing below an error: none of Spark's
    start-up warnings, nor its notice of the default log level."""
    assert "Setting default log level" not in stderr, stderr[-3000:]
    assert not re.search(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (WARN|INFO) ", stderr, re.M), stderr[-3000:]


def _summary(out):
    with open(out / "summary.json") as f:
        s = json.load(f)
    s.pop("run", None)
    return s


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("cds") / "data"
    write_data_dir(str(d), 2000, segment_size=1 << 20)
    return d


def test_java_here_writes_archives():
    """The Java runtime the Spark tests use can write a dynamic archive (else the tests
    below prove nothing)."""
    home = classcache.java_home()
    assert home is not None
    assert classcache.feature_version(classcache.java_release(home)["JAVA_VERSION"]) >= classcache.MIN_JAVA


def test_feature_version():
    assert classcache.feature_version("17.0.15") == 17
    assert classcache.feature_version("1.8.0_402") == 8
    assert classcache.feature_version("21") == 21
    assert classcache.feature_version("") is None


@pytest.fixture(scope="module")
def written(data, tmp_path_factory):
    """The first run with an empty cache: C{(its cache, its output directory, whether
    its JVM mapped an archive, its CompletedProcess)}."""
    work = tmp_path_factory.mktemp("first")
    proc, mapped = _audit(data, work / "out", work / "cache")
    yield work / "cache", work / "out", mapped, proc
    shutil.rmtree(work / "cache", ignore_errors=True)  # 120 MB pytest would keep


def test_first_run_writes_the_archive_the_next_maps(data, written, tmp_path):
    cache, out1, mapped, first = written
    assert first.returncode == 0, first.stderr[-3000:]
    assert not mapped
    (name,) = _archives(cache)
    assert os.path.getsize(cache / name) == int(name.rsplit("-", 1)[1][:-4]) > 1 << 20
    assert not [n for n in os.listdir(cache) if n.endswith(".tmp")]
    json.loads(first.stdout.split("\nreport:")[0])  # nothing of the JVM's on stdout
    _nothing_logged(first.stderr)

    second, mapped = _audit(data, tmp_path / "out2", cache)
    assert second.returncode == 0, second.stderr[-3000:]
    assert mapped, "the second run's JVM did not map the archive"
    assert _summary(tmp_path / "out2") == _summary(out1)
    json.loads(second.stdout.split("\nreport:")[0])
    _nothing_logged(second.stderr)
    assert _archives(cache) == [name]
    for run in (out1, tmp_path / "out2"):
        left = [n for n in os.listdir(run.parent / "tmp") if n.startswith("mqaudit-")]
        assert not left, f"the audit left its code's zip behind: {left}"


@pytest.mark.parametrize("damage", ["cut", "zeroed"])
def test_damaged_archive(data, written, tmp_path, damage):
    """An archive cut short (a JVM mapping it crashes) is deleted unused and written
    anew; one of the right length whose contents are lost (zeroed) fails the JVM's
    checksums and the JVM runs without it. Either way the audit gives the same summary,
    exit 0, nothing of the JVM's on stdout and no crash report."""
    cache = tmp_path / "cache"
    cache.mkdir()
    try:
        (name,) = _archives(written[0])
        path = cache / name
        shutil.copyfile(written[0] / name, path)
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.truncate(1 << 20)
            if damage == "zeroed":
                f.truncate(size)
        second, mapped = _audit(data, tmp_path / "out2", cache)
        assert second.returncode == 0, second.stderr[-3000:]
        assert _summary(tmp_path / "out2") == _summary(written[1])
        json.loads(second.stdout.split("\nreport:")[0])
        assert not [n for n in os.listdir(tmp_path) if n.startswith("hs_err")]
        assert not [n for n in os.listdir(cache) if n.startswith("hs_err")]
        if damage == "cut":
            assert not mapped
            (again,) = _archives(cache)  # written anew by the second run, whole
            assert os.path.getsize(cache / again) == int(again.rsplit("-", 1)[1][:-4]) > 1 << 20
    finally:
        shutil.rmtree(cache, ignore_errors=True)  # 120 MB pytest would keep


def test_none_turns_it_off(tmp_path):
    archive = classcache.ClassArchive.find("none")
    assert archive.path is None and archive.options() == ""
    assert archive.finish(None) is None
