"""Start-up tells where each front door listens: one line per door naming it and its
endpoint, one ``ready`` line listing them all, and with ``--ready-file PATH`` a JSON file
(version, pid, each door's endpoint and bound address) once every door listens."""

import json
import os
import re
import socket

import pytest

from mqserver.version import version
from tests.support.server import ServerProcess

pytestmark = pytest.mark.timeout(120)
LOOP = "tcp:0:interface=127.0.0.1"


def test_doors_are_named_with_their_endpoints_and_one_line_says_ready(tmp_path):
    sock = str(tmp_path / "console.sock")
    listen = {"smss": LOOP, "namesrv": LOOP, "nsqd_http": LOOP, "console": f"unix:{sock}",
              "admin": LOOP}
    with ServerProcess(tmp_path / "data", listen=listen) as s:
        s.start()
        ready = s.ready
        assert (ready["version"], ready["pid"]) == (version(), s.proc.pid)
        assert list(ready["doors"]) == ["smss", "namesrv", "nsqd_http", "console", "admin"]
        for name, where in ready["doors"].items():
            assert where["endpoint"] == listen[name]
            if name == "console":
                assert where == {"path": sock, "endpoint": listen[name]}
                continue
            assert where["host"] == "127.0.0.1" and where["port"] > 0
            # the door really listens there
            socket.create_connection(("127.0.0.1", where["port"]), timeout=10).close()
        log = s.current_log()
    ports = {name: where.get("port") for name, where in ready["doors"].items()}
    for name in ("smss", "namesrv", "nsqd_http", "admin"):
        assert (f"door {name} listening on {LOOP} (tcp:127.0.0.1:{ports[name]})" in log), log
    assert f"door console listening on unix:{sock} (unix:{sock})" in log
    (line,) = [ln for ln in log.splitlines() if " ready: " in ln]
    assert line.endswith(
        f"mqserver {version()} ready: smss tcp:127.0.0.1:{ports['smss']}, "
        f"namesrv tcp:127.0.0.1:{ports['namesrv']}, nsqd_http tcp:127.0.0.1:{ports['nsqd_http']}, "
        f"console unix:{sock}, admin tcp:127.0.0.1:{ports['admin']}")
    # the ready line comes once the store is open, after every door's line
    assert log.index("store open at") < log.index(line) and log.index("door admin") < log.index(line)
    # no internal class names for the doors
    assert not re.search(r"(SmssFactory|NamesrvFactory|NsqdHttpSite|AdminSite|ConsoleFactory)"
                         r" starting on", log), log


def test_ready_file_is_replaced_whole(tmp_path):
    """A ready file left by an earlier run is replaced (atomically: no temporary file is
    left beside it), and it names the new process."""
    with ServerProcess(tmp_path / "data") as s:
        with open(s.ready_path, "w") as f:
            f.write('{"pid": 1, "stale": true}')
        s.start()
        with open(s.ready_path) as f:
            ready = json.load(f)
        assert ready["pid"] == s.proc.pid and "stale" not in ready
        assert [n for n in os.listdir(tmp_path) if n.endswith(".tmp")] == []
