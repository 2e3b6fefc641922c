"""The deployment files under contrib/ and the LICENSE: the systemd unit verifies and
runs the broker with options it accepts; every metric the Grafana dashboard and the
Prometheus alert rules use is one a live master and slave expose on /metrics."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import urllib.request

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from protocols.smss.client import SmssClient
from tests.support.nsq import V2
from tests.support.server import ROOT
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(120)
LOOP = "tcp:0:interface=127.0.0.1"
UNIT = os.path.join(ROOT, "contrib", "systemd", "mqserver.service")
DASHBOARD = os.path.join(ROOT, "contrib", "grafana", "mqserver.json")
ALERTS = os.path.join(ROOT, "contrib", "prometheus", "alerts.yml")
METRIC = re.compile(r"\bmqserver_[a-z_]+\b")


def test_license_is_mit_as_setup_cfg_says():
    with open(os.path.join(ROOT, "LICENSE")) as f:
        text = f.read()
    assert text.startswith("MIT License\n")
    assert "Copyright (c) 2026 the mqserver authors" in text
    assert 'THE SOFTWARE IS PROVIDED "AS IS"' in text
    with open(os.path.join(ROOT, "setup.cfg")) as f:
        assert "\nlicense = MIT\n" in f.read()


def _exec_start():
    with open(UNIT) as f:
        (line,) = [ln for ln in f.read().splitlines() if ln.startswith("ExecStart=")]
    return shlex.split(line[len("ExecStart="):])


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze not installed")
def test_systemd_unit_verifies(tmp_path):
    """``systemd-analyze verify`` finds nothing to say about the unit. It checks that
    ExecStart's program exists, so the copy verified names a stand-in for the installed
    command (the only line changed)."""
    program = _exec_start()[0]
    assert program == "/opt/mqserver/bin/mqserver"
    stand_in = tmp_path / "mqserver"
    stand_in.write_text("#!/bin/sh\n")
    stand_in.chmod(0o755)
    with open(UNIT) as f:
        text = f.read()
    unit = tmp_path / "mqserver.service"
    unit.write_text(text.replace(f"ExecStart={program} ", f"ExecStart={stand_in} "))
    p = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                       text=True, timeout=60, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout + p.stderr == ""


def test_systemd_unit_runs_mqserver_with_options_it_accepts(tmp_path):
    """ExecStart is ``mqserver run`` with options the broker accepts: ``mqserver config``
    with the same options (the config file given a stand-in) gives them back."""
    program, command, *args = _exec_start()
    assert command == "run"
    config = tmp_path / "config.yaml"
    config.write_text("store:\n  maxDays: 3\n")
    args = [str(config) if a == "/etc/mqserver/config.yaml" else a for a in args]
    p = subprocess.run([sys.executable, "-m", "mqserver.cli", "config", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.returncode == 0, p.stderr
    shown = yaml.safe_load(p.stdout)
    assert shown["store"]["path"] == "/var/lib/mqserver" and shown["store"]["maxDays"] == 3


def dashboard_exprs():
    with open(DASHBOARD) as f:
        dash = json.load(f)
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for what in ("per topic", "lag per consumer", "latency", "disk", "replication"):
        assert what in titles, what
    return exprs


def alert_exprs():
    with open(ALERTS) as f:
        rules = [r for g in yaml.safe_load(f)["groups"] for r in g["rules"]]
    for r in rules:
        assert set(r) >= {"alert", "expr", "labels", "annotations"}, r
        assert r["labels"]["severity"] in ("warning", "critical")
    names = " ".join(r["alert"] for r in rules)
    for what in ("Lag", "Disk", "Replication", "Damaged"):
        assert what in names, what
    return [r["expr"] for r in rules]


def scrape_names(server):
    with urllib.request.urlopen(f"http://127.0.0.1:{server.ports['metrics']}/metrics",
                                timeout=10) as r:
        text = r.read().decode()
    return {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_dashboard_and_alerts_use_only_metrics_a_live_broker_exposes(server_factory):
    """A master (smss, NSQ, metrics) and a slave following it, each protocol exercised so
    that per-topic and per-consumer series exist, the slave caught up: the sample names
    of their /metrics hold every metric the dashboard's queries and the alert rules
    name."""
    master = server_factory("m", listen={"smss": LOOP, "nsqd_tcp": LOOP, "metrics": LOOP})
    slave = server_factory("s", listen={"smss": LOOP, "metrics": LOOP}, extra_args=[
        "--role", "slave", "--master", f"127.0.0.1:{master.smss_port}"])
    with SmssClient("127.0.0.1", master.smss_port) as c:
        c.create("dash")
        c.publish("dash", [b"a", b"b", b"c"])
        nsq = V2(master.ports["nsqd_tcp"])
        nsq.send(b"PUB dash\n" + (1).to_bytes(4, "big") + b"d")
        assert nsq.frame() == (0, b"OK")
        head = c.topic_info("$replication")["appliedEventId"]
        sub = c.subscribe("dash", 0, batch=1, who=b"board")
        sub.next_batch(1)
        nsq.send(b"SUB dash ch\nRDY 1\n")
        assert nsq.frame() == (0, b"OK")
        nsq.messages(1)
    seen = {}

    def caught_up():
        seen["m"], seen["s"] = scrape_names(master), scrape_names(slave)
        with urllib.request.urlopen(f"http://127.0.0.1:{slave.ports['metrics']}/metrics",
                                    timeout=10) as r:
            applied = re.search(r"^mqserver_replication_applied_event_id (\S+)$",
                                r.read().decode(), re.M)
        return (applied and float(applied.group(1)) == head
                and "mqserver_replication_slave_lag_events" in seen["m"])

    wait_until(caught_up, 30, "the slave caught up", interval=0.1)
    nsq.sock.close()
    exposed = seen["m"] | seen["s"]
    used = {name for expr in dashboard_exprs() + alert_exprs() for name in METRIC.findall(expr)}
    assert used, "no metric found in the queries"
    assert not used - exposed, sorted(used - exposed)


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool not installed (Debian: prometheus); the rules' "
                           "structure and metrics are checked by the tests above")
def test_promtool_checks_the_alert_rules():
    p = subprocess.run(["promtool", "check", "rules", ALERTS], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
