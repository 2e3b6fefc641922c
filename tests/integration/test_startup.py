"""Start-up is all or nothing, with real broker processes.

A second broker on a data directory another live broker holds refuses to start, names the
directory and the holder's pid, exits non-zero and changes nothing in the directory; a
SIGKILLed holder does not block a restart. A front door that cannot listen (port in use,
an endpoint string that does not parse, an address this host does not have) or a slave
whose master address is malformed stops start-up with one line naming what failed, a
non-zero exit status, and the data directory as it was.
"""

import os
import signal
import socket

import pytest

from protocols.smss.client import SmssClient
from protocols.smss.messages import Batch
from tests.support.server import ServerProcess
from tests.support.wait import wait_until

LOOPBACK = "tcp:0:interface=127.0.0.1"


def snapshot(path):
    """Every file and directory under C{path} with its size and mtime (ns)."""
    out = {}
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            p = os.path.join(root, name)
            st = os.stat(p)
            out[os.path.relpath(p, path)] = (st.st_size, st.st_mtime_ns)
    st = os.stat(path)
    out["."] = (None, st.st_mtime_ns)
    return out


def stopped(pid):
    """Whether process C{pid} is stopped (state C{T} in C{/proc/PID/stat})."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def read_bodies(server, topic, count):
    with SmssClient("127.0.0.1", server.smss_port, timeout=10) as c:
        sub = c.subscribe(topic, 0, batch=100, who=b"startup-test")
        got = []
        while len(got) < count:
            ev = sub.next_batch(10)
            assert isinstance(ev, Batch), ev
            got += [m.body for m in ev.messages]
            sub.ack()
        return got


@pytest.fixture
def procs():
    started = []
    yield started.append
    for p in started:
        try:
            p.stop()
        finally:
            p.close()


def second(first, tmp_path, **kw):
    """A broker process on C{first}'s data directory with its own config and log file."""
    s = ServerProcess(first.data, **kw)
    s.log_path = str(tmp_path / "second.log")
    return s


def running_with(tmp_path, procs, body):
    """A broker on tmp_path/data holding one message, C{body}, in topic t."""
    s = ServerProcess(tmp_path / "data")
    procs(s)
    s.start()
    with SmssClient("127.0.0.1", s.smss_port, timeout=10) as c:
        c.create("t")
        c.publish("t", [body])
    return s


def test_second_broker_on_a_directory_refuses_and_touches_nothing(tmp_path, procs):
    first = running_with(tmp_path, procs, b"one")
    # Freeze the holder (its flock stays held) so that its own timers cannot change the
    # directory while we look for changes made by the second process.
    first.proc.send_signal(signal.SIGSTOP)
    try:
        # The signal is delivered asynchronously: a checkpoint being written when it was
        # sent may still be renamed into place unless the process is seen stopped first.
        wait_until(lambda: stopped(first.proc.pid), 10, "the holder stopped")
        before = snapshot(first.data)
        # more doors than the holder: RocketMQ's keeps files of its own in the directory
        other = second(first, tmp_path, listen={
            "smss": LOOPBACK, "broker": LOOPBACK, "nsqd_tcp": LOOPBACK})
        procs(other)
        code = other.start_and_wait_exit()
        after = snapshot(first.data)
    finally:
        first.proc.send_signal(signal.SIGCONT)
    log = other.current_log()
    assert code != 0, log
    line = f"data directory {first.data} is in use by process {first.proc.pid}"
    assert line in log, log
    assert "Traceback" not in log, log
    assert after == before

    # the holder is unharmed and still the only writer
    with SmssClient("127.0.0.1", first.smss_port, timeout=10) as c:
        c.publish("t", [b"two"])
    assert read_bodies(first, "t", 2) == [b"one", b"two"]


def test_a_sigkilled_holder_does_not_block_a_restart(tmp_path, procs):
    first = running_with(tmp_path, procs, b"kept")
    pid = first.proc.pid
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(10)
    with open(os.path.join(first.data, "lock")) as f:
        assert f.read().split() == [str(pid)]  # the stale lock file is still there

    again = second(first, tmp_path)
    procs(again)
    again.start()
    assert read_bodies(again, "t", 1) == [b"kept"]
    with open(os.path.join(first.data, "lock")) as f:
        assert f.read().split() == [str(again.proc.pid)]


def _maps(pid):
    with open(f"/proc/{pid}/maps") as f:
        return f.read()


def test_a_broker_using_no_tls_runs_without_the_tls_stack(tmp_path, procs):
    """A broker whose doors listen on plain TCP says at start that it left the TLS stack
    out, maps none of cryptography's or pyOpenSSL's code, and serves; one with an
    C{ssl:} door (tests/integration/test_tls_doors.py serves through them) loads it."""
    plain = running_with(tmp_path, procs, b"plain")
    assert read_bodies(plain, "t", 1) == [b"plain"]
    assert "TLS stack left out (the configuration uses no TLS)" in plain.current_log()
    assert "cryptography" not in _maps(plain.proc.pid)
    plain.stop()
    tls = second(plain, tmp_path, config={"server": {"tlsStack": "always"}})
    procs(tls)
    tls.start()
    assert read_bodies(tls, "t", 1) == [b"plain"]
    assert "TLS stack loaded (server.tlsStack: always)" in tls.current_log()
    assert "cryptography" in _maps(tls.proc.pid)


def _prepared(tmp_path, procs):
    """A data directory a broker ran on and stopped cleanly; returns (server, snapshot)."""
    s = running_with(tmp_path, procs, b"before")
    s.stop()
    return s, snapshot(s.data)


def _refused(tmp_path, procs, listen, expect, config=None):
    first, before = _prepared(tmp_path, procs)
    bad = second(first, tmp_path, listen=listen, config=config)
    procs(bad)
    code = bad.start_and_wait_exit()
    log = bad.current_log()
    assert code != 0, log
    assert expect in log, log
    assert "Traceback" not in log, log
    assert snapshot(first.data) == before  # the store was never opened: nothing changed
    # nothing was left locked or half-done: the directory starts normally
    good = second(first, tmp_path)
    procs(good)
    good.start()
    assert read_bodies(good, "t", 1) == [b"before"]
    return log


def test_a_door_whose_port_is_in_use_stops_start_up(tmp_path, procs, used_port):
    desc = f"tcp:{used_port}:interface=127.0.0.1"
    # smss binds first and is given up too: no broker runs with a door missing
    log = _refused(tmp_path, procs, {"smss": LOOPBACK, "nsqd_tcp": desc},
                   f"front door nsqd_tcp cannot listen on {desc}: ")
    assert "Address already in use" in log, log


def test_a_door_with_a_garbage_endpoint_stops_start_up(tmp_path, procs):
    log = _refused(tmp_path, procs, {"smss": "tcp:notaport"},
                   "front door smss cannot listen on 'tcp:notaport': not a valid endpoint string")
    assert "Traceback" not in log


def test_a_door_on_an_address_this_host_lacks_stops_start_up(tmp_path, procs):
    desc = "tcp:0:interface=192.0.2.1"  # TEST-NET-1: never a local address
    _refused(tmp_path, procs, {"smss": desc}, f"front door smss cannot listen on {desc}: ")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may bind port 1")
def test_a_door_on_a_privileged_port_stops_start_up(tmp_path, procs):
    desc = "tcp:1:interface=127.0.0.1"
    log = _refused(tmp_path, procs, {"smss": desc}, f"front door smss cannot listen on {desc}: ")
    assert "Permission denied" in log, log


@pytest.mark.parametrize("master", ["no-port", "host:0", "host:70000", "bad host:12301",
                                    "a:b:12301", "999.1.1.1:12301", ":12301"])
def test_a_slave_with_a_malformed_master_stops_start_up(tmp_path, procs, master):
    _refused(tmp_path, procs, {"smss": LOOPBACK}, "config key 'master' must be HOST:PORT",
             config={"role": "slave", "master": master})


def _free_privileged_port():
    for port in range(1000, 1024):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
            return port
        except OSError:
            continue
        finally:
            s.close()
    pytest.skip("no free port below 1024")


@pytest.mark.skipif(os.geteuid() != 0, reason="twistd --uid needs root")
def test_twistd_uid_binds_privileged_and_leaves_data_to_the_service_user(tmp_path):
    """Under ``twistd --uid``, the door binds a port below 1024 as root, and the store
    opens after the switch: every file in the data directory belongs to the service user."""
    import shutil
    import subprocess
    import sys
    import tempfile

    from tests.support.server import ROOT, _door_names
    from tests.support.smss import wait_until

    nobody = 65534
    base = tempfile.mkdtemp(prefix="mq-uid-")  # tmp_path is 0700: the user could not enter
    try:
        os.chmod(base, 0o755)
        data = os.path.join(base, "data")
        os.mkdir(data)
        os.chown(data, nobody, nobody)
        port = _free_privileged_port()
        off = [a for d in _door_names() if d != "smss" for a in ("--listen", f"{d}=off")]
        out_path = tmp_path / "twistd.out"
        with open(out_path, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-c", "from twisted.scripts.twistd import run; run()",
                 "-n", "--pidfile=", "--uid", str(nobody), "--gid", str(nobody), "-l", "-",
                 "mqserver", "--data", data, "--listen",
                 f"smss=tcp:{port}:interface=127.0.0.1", *off],
                cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), stdout=out,
                stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: "store open at" in out_path.read_text() or proc.poll() is not None,
                       20)
            assert proc.poll() is None, out_path.read_text()
            with SmssClient("127.0.0.1", port, timeout=10) as c:
                c.create("t")
                c.publish("t", [b"owned"])
            proc.send_signal(signal.SIGTERM)
            proc.wait(20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        log = out_path.read_text()
        assert "store closed at eventId 2" in log, log
        owners = {}
        for root, dirs, files in os.walk(data):
            for name in dirs + files:
                p = os.path.join(root, name)
                owners[os.path.relpath(p, data)] = os.stat(p).st_uid
        assert {"lock", "metadata.json", "commitlog"} <= set(owners)
        assert any(n.startswith("consumequeue/t/") for n in owners), owners
        assert set(owners.values()) == {nobody}, owners
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _start_output(tmp_path, config_text, *args, command=None):
    """Start a broker as an operator does (``python -m mqserver -n mqserver --config
    ...``: no log file, twistd logs to stdout) and return (exit status, stdout+stderr)."""
    import subprocess
    import sys

    from tests.support.server import ROOT, _door_names

    cfg = tmp_path / "config.yaml"
    cfg.write_text(config_text)
    off = [a for d in _door_names() if d not in config_text for a in ("--listen", f"{d}=off")]
    command = command or [sys.executable, "-m", "mqserver"]
    proc = subprocess.run([*command, "-n", "--pidfile=", "mqserver", "--config", str(cfg), *off, *args],
                          cwd=tmp_path, env=dict(os.environ, PYTHONPATH=ROOT),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    return proc.returncode, proc.stdout.decode("utf-8", "replace")


def _one_line(code, out):
    assert code != 0, out
    lines = out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mqserver cannot start: "), out
    return lines[0]


@pytest.mark.parametrize("case", ["store path is a file", "store path under a file",
                                  "unknown key", "wrong type", "bad YAML", "missing config",
                                  "port in use", "bad TLS files", "bad NSQ TLS files",
                                  "unknown door", "unknown option"])
def test_every_start_up_failure_is_one_line(tmp_path, used_port, case):
    """Whatever stops start-up, the operator sees one line naming the key, file or door
    (no traceback, no usage text) and a non-zero exit status."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    smss = "listen:\n  smss: tcp:0:interface=127.0.0.1\n"
    data = f"store:\n  path: {tmp_path / 'data'}\n"
    bad_pem = tmp_path / "bad.pem"
    bad_pem.write_text("not a certificate\n")
    cases = {
        "store path is a file": (f"store:\n  path: {afile}\n" + smss, (),
                                 f"store.path {afile} cannot be used: it is a file, not a directory"),
        "store path under a file": (f"store:\n  path: {afile}/data\n" + smss, (),
                                    f"store.path {afile}/data cannot be used: {afile} is a file"),
        "unknown key": (data + smss + "bogus: 1\n", (), "unknown config key 'bogus'"),
        "wrong type": (data + smss + "nsq:\n  maxMsgSize: big\n", (), "'nsq.maxMsgSize' must be"),
        "bad YAML": ("store: [\n  x: : :\n", (), "config.yaml is not valid YAML: "),
        "missing config": (data, ("--config", str(tmp_path / "nope.yaml")),
                           f"cannot read config {tmp_path / 'nope.yaml'}: No such file"),
        "port in use": (data + f"listen:\n  smss: tcp:{used_port}:interface=127.0.0.1\n", (),
                        f"front door smss cannot listen on tcp:{used_port}:interface=127.0.0.1: "
                        "[Errno 98] Address already in use"),
        "bad TLS files": (data + f"listen:\n  smss: ssl:0:interface=127.0.0.1:privateKey={bad_pem}:"
                          f"certKey={bad_pem}\n", (), "front door smss cannot listen on 'ssl:0"),
        "bad NSQ TLS files": (data + "listen:\n  nsqd_tcp: tcp:0:interface=127.0.0.1\n"
                              f"nsq:\n  tlsCert: {bad_pem}\n  tlsKey: {tmp_path / 'none.key'}\n", (),
                              f"config keys 'nsq.tlsCert' ({bad_pem}) and 'nsq.tlsKey'"),
        "unknown door": (data + smss, ("--listen", "nope=tcp:1"), "unknown front door 'nope'"),
        "unknown option": (data + smss, ("--bogus",), "option --bogus not recognized"),
    }
    config_text, args, expect = cases[case]
    line = _one_line(*_start_output(tmp_path, config_text, *args))
    assert expect in line, line
    assert not (tmp_path / "data").exists()  # nothing was made


def test_a_held_data_directory_is_one_line(tmp_path):
    from mqserver.store.lock import DirectoryLock

    data = tmp_path / "data"
    data.mkdir()
    holder = DirectoryLock(str(data))
    holder.acquire()
    try:
        code, out = _start_output(tmp_path, f"store:\n  path: {data}\n"
                                  "listen:\n  smss: tcp:0:interface=127.0.0.1\n")
    finally:
        holder.release()
    line = _one_line(code, out)
    assert f"data directory {data} is in use by process {os.getpid()}" in line, line


def test_twistds_own_script_gives_the_same_one_line(tmp_path):
    """``twistd -n mqserver`` (the console script) too: the config error alone, without
    twistd's usage text."""
    import sys

    twistd = os.path.join(os.path.dirname(sys.executable), "twistd")
    line = _one_line(*_start_output(tmp_path, "bogus: 1\n", command=[twistd]))
    assert line == "mqserver cannot start: unknown config key 'bogus'"


def test_help_still_shows_the_usage_text(tmp_path):
    import subprocess
    import sys

    from tests.support.server import ROOT

    proc = subprocess.run([sys.executable, "-m", "mqserver", "mqserver", "--help"], cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, timeout=60)
    assert proc.returncode == 0 and b"--listen" in proc.stdout and b"--config" in proc.stdout
def test_group_refuses_to_start_without_enough_sync_replicas(server_factory):
    """A replica group of three with syncReplicas 0 could elect a member lacking an
    acknowledged write: the broker refuses to start, saying which keys."""
    with pytest.raises(RuntimeError) as e:
        server_factory("grouped", config={
            "cluster": {"etcd": "http://127.0.0.1:2379", "group": "g", "name": "m1",
                        "members": 3},
            "replication": {"syncReplicas": 0}})
    log = str(e.value)
    assert ("config key 'replication.syncReplicas' must be at least 1 in a replica group "
            "of 3 (cluster.members)") in log, log
    assert "Traceback" not in log, log
