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
    assert "spark/audit/log4j2.properties" in names  # the audit driver's logging
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE")
               for n in names), names
    # mqserver and mqctl are installed as console scripts; prometheus_client is a dependency
    wheel_zip = zipfile.ZipFile(tmp_path / wheel)
    (entry,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "mqctl = protocols.admin.ctl:main" in wheel_zip.read(entry).decode()
    assert "mqserver = mqserver.cli:main" in wheel_zip.read(entry).decode()
    (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    assert "Requires-Dist: prometheus_client" in wheel_zip.read(meta).decode().replace("-client", "_client")
