"""The broker's version, the package's, in every place an operator or a tool looks: the
start-up log, the admin API, /metrics, nsqd's /info (beside the nsqd version clients
expect) and mqctl --version."""

import json
import subprocess
import sys
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mqserver.version import version
from protocols.nsq.version import VERSION as NSQD_VERSION
from tests.support.server import ROOT, ServerProcess

pytestmark = pytest.mark.timeout(120)
LOOP = "tcp:0:interface=127.0.0.1"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    listen = {"smss": LOOP, "admin": LOOP, "metrics": LOOP, "nsqd_tcp": LOOP,
              "nsqd_http": LOOP}
    s = ServerProcess(tmp_path_factory.mktemp("version") / "broker", listen=listen).start()
    try:
        yield s
    finally:
        s.stop()
        s.close()


def get_json(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return json.loads(r.read())


def test_start_up_log_names_the_version(srv):
    assert f"mqserver {version()} starting: master, data " in srv.current_log()


def test_admin_api_answers_the_version(srv):
    info = get_json(srv.ports["AdminSite"], "/info")
    assert info["version"] == version()
    assert info["role"] == "master" and info["pid"] == srv.proc.pid
    assert get_json(srv.ports["AdminSite"], "/stats")["version"] == version()


def test_metrics_has_build_info(srv):
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.ports['MetricsSite']}/metrics",
                                timeout=10) as r:
        text = r.read().decode()
    (family,) = [f for f in text_string_to_metric_families(text)
                 if f.name == "mqserver_build_info"]
    assert [(s.labels, s.value) for s in family.samples] == [({"version": version()}, 1.0)]


def test_nsqd_info_keeps_the_nsqd_version_and_adds_ours(srv):
    info = get_json(srv.ports["NsqdHttpSite"], "/info")
    assert info["version"] == NSQD_VERSION
    assert info["mqserver_version"] == version()


def test_mqctl_version():
    p = subprocess.run([sys.executable, "-m", "protocols.admin.ctl", "--version"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60,
                       env={"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"mqctl (mqserver) {version()}"
