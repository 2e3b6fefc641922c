"""Run the real broker (``twistd -n mqserver``) in a subprocess on loopback ports."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_STARTED = re.compile(r"(\w+)(?: \(TLS\))? starting on (\d+)")

#: The name tests use for each front door's port: its factory's class, which the port's
#: start-up line named before doors were named by their own (and still do in the trees
#: benchmarks compare, read from their logs).
FACTORY_NAMES = {
    "smss": "SmssFactory", "namesrv": "NamesrvFactory", "broker": "BrokerDoor",
    "nsqd_tcp": "NsqdFactory", "nsqd_http": "NsqdHttpSite", "lookupd_tcp": "LookupdFactory",
    "lookupd_http": "LookupdHttpSite", "msgout": "MsgoutSite", "console": "ConsoleFactory",
    "metrics": "MetricsSite", "admin": "AdminSite",
}


def has_ready_file(root=None):
    """Whether the broker of source tree C{root} (default L{ROOT}) takes --ready-file."""
    try:
        with open(os.path.join(root or ROOT, "mqserver", "tap.py")) as f:
            return '"ready-file"' in f.read()
    except OSError:
        return False


def terminate(proc, log=None):
    """Stop a process started by a test: SIGTERM, then SIGKILL if it outlives 10 s;
    close its log file C{log} if given."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    if log is not None:
        log.close()


def read_log_file(path):
    """The text of the log file C{path} ("" when there is none yet)."""
    try:
        with open(path, "rb") as f:
            return f.read().decode("latin-1")
    except FileNotFoundError:
        return ""


def twistd_command(root=None):
    """The command starting twistd from source tree C{root} (default L{ROOT}):
    C{python -m mqserver}, as the broker's own C{make run} starts it, or, for a tree from
    before it (benchmarks compare trees), twistd as its script starts."""
    if os.path.exists(os.path.join(root or ROOT, "mqserver", "__main__.py")):
        return [sys.executable, "-m", "mqserver"]
    return [sys.executable, "-c", "from twisted.scripts.twistd import run; run()"]


class Standalone:
    """A standalone server of this tree, C{twistd -n PLUGIN ARGS} (C{mqnamesrv},
    C{mqlookupd}), logging to C{log_path}.

    @ivar ports: door (e.g. C{namesrv}, C{lookupd_tcp}) -> the port it listens on, from
        its ready file (C{--ready-file}).
    """

    def __init__(self, plugin, args, log_path):
        self.plugin, self.args = plugin, list(args)
        self.log_path = str(log_path)
        self.ready_path = self.log_path + ".ready.json"
        self.proc = None
        self.ports = {}

    def start(self, timeout=20.0):
        """Start the process and wait until its ready file says where it listens."""
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [*twistd_command(), "-n", "--pidfile=", "-l", "-", self.plugin, *self.args,
             "--ready-file", self.ready_path],
            cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), stdout=self._log,
            stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with open(self.ready_path) as f:
                    ready = json.load(f)
            except FileNotFoundError:
                time.sleep(0.05)
                continue
            if ready["pid"] == self.proc.pid:
                self.ports = {door: where["port"] for door, where in ready["doors"].items()}
                return self
            time.sleep(0.05)
        self.close()
        raise RuntimeError(f"{self.plugin} did not start:\n{read_log_file(self.log_path)}")

    def close(self):
        """Stop the process (L{terminate}) and close its log."""
        if self.proc is not None and self.proc.poll() is None:
            terminate(self.proc)
        if getattr(self, "_log", None):
            self._log.close()
            self._log = None


def _door_names():
    from mqserver.frontdoor import front_doors

    return list(front_doors())


class ServerProcess:
    """One broker process.

    @ivar ports: front door (by its name, e.g. C{smss}, and by L{FACTORY_NAMES}) -> the
        port it listens on, from the broker's ready file (C{--ready-file}), or for a tree
        without one from its log.
    @ivar ready: what the ready file says (version, pid, doors), or None.
    @ivar data: the data directory.
    """

    def __init__(self, data, config=None, listen=None, extra_args=(), env=None,
                 command_prefix=(), root=None):
        self.data = str(data)
        #: the source tree the broker runs from (benchmarks compare trees)
        self.root = root or ROOT
        self.env = dict(env or {})
        self.config = dict(config or {})
        self.listen = dict(listen or {"smss": "tcp:0:interface=127.0.0.1"})
        self.extra_args = list(extra_args)
        #: what the broker's command runs under (e.g. C{ip netns exec NAME})
        self.command_prefix = list(command_prefix)
        #: the address its doors are reached at
        self.host = "127.0.0.1"
        self.proc = None
        self.ports = {}
        self.log_path = os.path.join(self.data + ".log")
        self.ready_path = self.data + ".ready.json"
        self.ready = None

    @property
    def smss_port(self):
        return self.ports["SmssFactory"]

    def start(self, timeout=20.0):
        """Start the process and wait until every listener reports its port."""
        self._spawn()
        want = sum(1 for v in self.listen.values() if v and v != "off")
        deadline = time.monotonic() + timeout
        self.ports = {}
        self.ready = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.read_log()}")
            if self._ready_file:
                if self._read_ready():
                    return self
                time.sleep(0.05)
                continue
            found = {}
            for name, port in _STARTED.findall(self._current_run_log()):
                found[name] = int(port)
            if len(found) >= want and "store open at" in self._current_run_log():
                self.ports = found
                return self
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"broker did not start in {timeout}s:\n{self.read_log()}")

    def _read_ready(self):
        try:
            with open(self.ready_path) as f:
                ready = json.load(f)
        except FileNotFoundError:
            return False
        if ready["pid"] != self.proc.pid:
            return False  # a file left by an earlier process
        self.ready = ready
        for door, where in ready["doors"].items():
            if "port" in where:
                self.ports[door] = where["port"]
                self.ports[FACTORY_NAMES.get(door, door)] = where["port"]
        return True

    def _spawn(self):
        os.makedirs(self.data, exist_ok=True)
        cfg_path = self.data + ".yaml"
        cfg = dict(self.config)
        cfg.setdefault("store", {})
        cfg["store"] = dict(cfg["store"], path=self.data)
        # every front door not asked for is off, so tests never bind default ports
        cfg["listen"] = dict({name: "off" for name in _door_names()}, **self.listen)
        with open(cfg_path, "w") as f:
            yaml.safe_dump(cfg, f)
        env = dict(os.environ, PYTHONPATH=self.root, **self.env)
        if getattr(self, "_log", None):
            self._log.close()  # a restart of the same object: one handle per run
        self._log = open(self.log_path, "ab")
        self._log_start = os.path.getsize(self.log_path)
        self._ready_file = has_ready_file(self.root)
        ready = ["--ready-file", self.ready_path] if self._ready_file else []
        self.proc = subprocess.Popen(
            [*self.command_prefix, *twistd_command(self.root), "-n", "--pidfile=", "-l", "-", "mqserver", "--config", cfg_path,
             *ready, *self.extra_args],
            cwd=self.root, env=env, stdout=self._log, stderr=subprocess.STDOUT,
        )

    def start_and_wait_exit(self, timeout=20.0):
        """Start the process expecting it to refuse to start: wait for it to exit and
        return its exit status (it is killed and an error raised if it runs on)."""
        self._spawn()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"broker still running after {timeout}s:\n{self.current_log()}")

    def _current_run_log(self):
        return self.read_log()[self._log_start :]

    def current_log(self):
        """Return what the process logged since its last start()."""
        return self._current_run_log()

    def read_log(self):
        """Return everything the process logged (all runs)."""
        return read_log_file(self.log_path)

    def stop(self, timeout=20.0):
        """SIGTERM and wait for a clean exit; returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self):
        """SIGKILL and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        """Stop the server (L{stop}), and in any case L{close}."""
        try:
            self.stop()
        finally:
            self.close()

    def close(self):
        """Make sure the process is gone and the log file closed."""
        self.kill()
        if getattr(self, "_log", None):
            self._log.close()
            self._log = None
