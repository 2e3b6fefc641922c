"""The ``mqserver`` command (mqserver/cli.py): ``run`` serves as ``python -m mqserver -n
mqserver`` does and exits 0 when stopped by SIGTERM or SIGINT, also under ``make run``;
``config`` prints the effective configuration; ``config --check`` validates a file;
``--version``."""

import json
import os
import signal
import subprocess
import sys

import pytest
import yaml

from mqserver.version import version
from protocols.smss import client_codec as cc
from protocols.smss.client import SmssClient
from protocols.smss.messages import AliveResponse
from tests.support.server import ROOT
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(120)
LOOP = "tcp:0:interface=127.0.0.1"
CLI = [sys.executable, "-m", "mqserver.cli"]


def cli(*args, cwd=ROOT):
    """Run ``mqserver ARGS``; return the finished process (text output)."""
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=ROOT))


def only_smss_config(tmp_path):
    """A config file: data under tmp_path, smss on an ephemeral port, every other door
    off (no fixed port is bound)."""
    from mqserver.frontdoor import front_doors

    path = tmp_path / "config.yaml"
    listen = {name: "off" for name in front_doors()}
    listen["smss"] = LOOP
    path.write_text(yaml.safe_dump({"store": {"path": str(tmp_path / "data")},
                                    "listen": listen}))
    return path


def test_version():
    p = cli("--version")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"mqserver {version()}"


def test_run_version_is_mqserver_s():
    """``mqserver run --version`` (the plugin's option, as ``twistd mqserver --version``)
    names mqserver's version, with Twisted's beside it."""
    from twisted import __version__ as twisted_version

    p = cli("run", "--version")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"mqserver {version()} (Twisted {twisted_version})"


def test_config_prints_defaults_then_file_then_command_line(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"store": {"maxDays": 3, "path": "from-file"},
                                    "nsq": {"msgTimeout": 30000}}))
    p = cli("config", "--config", str(path), "--data", "from-cli", "--listen", "smss=off",
            "--listen", "console=tcp:12399:interface=127.0.0.1")
    assert p.returncode == 0, p.stderr
    shown = yaml.safe_load(p.stdout)
    assert shown["store"]["path"] == "from-cli"  # the command line beats the file
    assert shown["store"]["maxDays"] == 3  # the file beats the default
    assert shown["store"]["flushLevel"] == 1  # a default
    assert shown["nsq"]["msgTimeout"] == 30000  # a door's key
    assert shown["listen"]["smss"] == "off"
    assert shown["listen"]["console"] == "tcp:12399:interface=127.0.0.1"
    assert shown["listen"]["admin"] == "tcp:9465:interface=127.0.0.1"
    # what it prints is a valid config file that gives the same configuration
    again = tmp_path / "effective.yaml"
    again.write_text(p.stdout)
    checked = cli("config", "--check", str(again))
    assert (checked.returncode, checked.stdout.strip()) == (0, f"{again}: valid")
    assert cli("config", "--config", str(again)).stdout == p.stdout


def test_config_check_names_what_is_wrong(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("store:\n  maxDays: -1\n")
    p = cli("config", "--check", str(bad))
    assert p.returncode == 1
    assert p.stdout == ""
    assert p.stderr.splitlines() == [
        f"mqserver: {bad}: config key 'store.maxDays' must be >= 0 (0 keeps files "
        "forever), not -1"]
    typo = tmp_path / "typo.yaml"
    typo.write_text("listen:\n  smms: tcp:1\n")
    p = cli("config", "--check", str(typo))
    assert p.returncode == 1 and len(p.stderr.splitlines()) == 1
    assert "unknown config key 'listen.smms'" in p.stderr
    p = cli("config", "--check", str(tmp_path / "missing.yaml"))
    assert p.returncode == 1 and "cannot read config" in p.stderr


def test_config_check_does_not_probe_the_host(tmp_path, used_port):
    """A config is checked, not tried: one whose door's port is in use (as while its
    broker runs) and whose data directory does not exist yet is valid; ``mqserver run``
    with it refuses to start with one line."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "store": {"path": str(tmp_path / "not-yet")},
        "listen": {"smss": f"tcp:{used_port}:interface=127.0.0.1", "namesrv": "off",
                   "broker": "off", "nsqd_tcp": "off", "nsqd_http": "off",
                   "lookupd_tcp": "off", "lookupd_http": "off", "msgout": "off",
                   "console": "off", "metrics": "off", "admin": "off"}}))
    p = cli("config", "--check", str(path))
    assert (p.returncode, p.stdout.strip()) == (0, f"{path}: valid"), p.stderr
    assert not (tmp_path / "not-yet").exists()
    p = cli("run", "--config", str(path))
    assert p.returncode == 1
    assert p.stderr.startswith(f"mqserver cannot start: front door smss cannot listen on "
                               f"tcp:{used_port}:interface=127.0.0.1"), p.stderr


def _port(ready_path):
    try:
        with open(ready_path) as f:
            return json.load(f)["doors"]["smss"]["port"]
    except FileNotFoundError:
        return None


def _default_sigint():
    # A shell without job control starts background commands with SIGINT ignored, and a
    # process that inherits an ignored SIGINT keeps ignoring it (Python, and so Twisted,
    # install no handler then). Ctrl-C at a terminal reaches a broker with SIGINT at its
    # default, whatever ran this suite: give the broker (and make) that.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_broker(tmp_path, command, session=False):
    """Start C{command} (a broker on L{only_smss_config}, writing its ready file to
    C{tmp_path/ready.json}) logging to a file, in a session of its own if C{session};
    return the process and its log's path once it serves smss."""
    log_path = tmp_path / "broker.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                                env=dict(os.environ, PYTHONPATH=ROOT),
                                start_new_session=session, preexec_fn=_default_sigint)
    try:
        port = wait_until(lambda: proc.poll() is None and _port(tmp_path / "ready.json")
                          or (proc.poll() is not None and -1), 60, "the smss door")
        assert port != -1, log_path.read_text("latin-1")
        with SmssClient("127.0.0.1", port, timeout=10) as c:
            c.send_raw(cc.encode_alive())
            assert isinstance(c.read_response(), AliveResponse)
    except BaseException:
        proc.kill()
        proc.wait(10)
        raise
    return proc, log_path


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_run_serves_and_a_signal_is_a_clean_exit(tmp_path, sig):
    """``mqserver run --config FILE`` serves smss; SIGTERM or SIGINT (Ctrl-C) shuts it
    down cleanly with exit status 0, not the signal re-raised."""
    proc, log_path = run_broker(tmp_path, [*CLI, "run", "--config",
                                           str(only_smss_config(tmp_path)),
                                           "--ready-file", "ready.json"])
    proc.send_signal(sig)
    try:
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = log_path.read_text("latin-1")
    assert code == 0, log
    assert f"received {sig.name}, shutting down" in log
    assert "store closed at eventId" in log
    assert "Traceback" not in log
    assert os.path.isfile(tmp_path / "data" / "metadata.json")


def test_run_with_an_unwritable_ready_file_stops_start_up(tmp_path):
    """A ready file that cannot be written is a start-up error: one line saying why, the
    store closed, exit status 1."""
    config = only_smss_config(tmp_path)
    p = subprocess.run([*CLI, "run", "--config", str(config), "--ready-file",
                        str(tmp_path / "no-such-dir" / "ready.json")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert (f"mqserver cannot start: cannot write the ready file "
            f"{tmp_path / 'no-such-dir' / 'ready.json'}: No such file or directory") in out
    assert "store closed at eventId" in out and "Traceback" not in out


def make_run(tmp_path, session=False):
    """Start ``make run`` with a stand-in venv whose ``bin/mqserver`` runs this tree's
    command, marked as installed; return make's process, the log's path and the broker's
    pid (make's only child: exec leaves no shell between them)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    script = venv / "bin" / "mqserver"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} -m mqserver.cli \"$@\"\n")
    script.chmod(0o755)
    (venv / ".broker-stamp").touch()  # as new as the sources or newer: nothing to install
    config = only_smss_config(tmp_path)
    proc, log_path = run_broker(
        tmp_path, ["make", "-s", "-C", ROOT, "run", f"VENV={venv}",
                   f"ARGS=--config {config} --ready-file {tmp_path / 'ready.json'}"],
        session=session)
    (child,) = open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()
    assert "mqserver.cli" in open(f"/proc/{child}/cmdline").read().replace("\0", " ")
    return proc, log_path, int(child)


def _reap(proc, child):
    if proc.poll() is None:  # make still waits: the broker outlived its signal
        os.kill(child, signal.SIGKILL)
        proc.wait(10)


def test_make_run_ends_cleanly_after_sigterm(tmp_path):
    """``make run`` execs the broker, so a SIGTERM to it is a clean exit of make (status 0,
    no ``make: *** ... Error 143``)."""
    proc, log_path, child = make_run(tmp_path)
    try:
        os.kill(child, signal.SIGTERM)
        code = proc.wait(30)
    finally:
        _reap(proc, child)
    log = log_path.read_text("latin-1")
    assert code == 0, log
    assert "Error" not in log and "store closed at eventId" in log


def test_make_run_ends_cleanly_after_ctrl_c(tmp_path):
    """Ctrl-C (SIGINT to the terminal's foreground group: make and the broker) shuts the
    broker down cleanly and make says nothing about an error; make itself then ends by
    the SIGINT it was sent, as any program interrupted from the terminal."""
    proc, log_path, child = make_run(tmp_path, session=True)
    try:
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(30)
    finally:
        _reap(proc, child)
    log = log_path.read_text("latin-1")
    assert code == -signal.SIGINT, log
    assert "received SIGINT, shutting down" in log and "store closed at eventId" in log
    assert not [line for line in log.splitlines() if line.startswith("make")], log
