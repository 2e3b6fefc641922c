"""The wheel ships our plugin file and never a copy of twisted's package."""

import os
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_wheel_contains_plugin(tmp_path):
    """Building a wheel puts twisted/plugins/mqserver_plugin.py in it, without twisted/__init__.py."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "-q", "-w", str(tmp_path), ROOT],
        check=True, cwd=tmp_path, capture_output=True,
    )
    (wheel,) = [p for p in os.listdir(tmp_path) if p.endswith(".whl")]
    names = zipfile.ZipFile(tmp_path / wheel).namelist()
    assert "twisted/plugins/mqserver_plugin.py" in names
    assert "twisted/__init__.py" not in names
    assert "twisted/plugins/__init__.py" not in names
    assert "mqserver/store/format.py" in names
    assert "protocols/smss/codec.py" in names
    assert "spark/audit/job.py" in names
