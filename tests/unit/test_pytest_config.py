"""The test run's own configuration (setup.cfg [tool:pytest]): the summary says why each
skipped test was skipped, and third-party deprecation warnings are not shown while ours
are."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SAMPLE = '''
import warnings

import pytest


def test_skipped():
    pytest.skip("the reason this one is skipped")


def test_third_party_deprecation():
    from pyspark.sql.pandas.utils import require_minimum_pyarrow_version

    # pyspark compares versions with distutils' LooseVersion: a DeprecationWarning
    require_minimum_pyarrow_version()


def test_our_deprecation():
    warnings.warn("our own deprecation", DeprecationWarning)
'''


def test_skip_reasons_shown_and_only_our_deprecations(tmp_path):
    pytest.importorskip("pyspark")
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
         os.path.join(ROOT, "setup.cfg"), "--rootdir", str(tmp_path), "test_sample.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "SKIPPED [1] test_sample.py:8: the reason this one is skipped" in out
    assert "our own deprecation" in out
    assert "distutils" not in out and "LooseVersion" not in out, out
