"""Run a real single-node etcd on loopback ports for the replica-group tests.

The binary is C{etcd} on PATH or C{/usr/bin/etcd} (Debian's C{etcd-server}, which
C{make test} installs); L{etcd_binary} returns None when there is none, and tests skip
with L{SKIP_REASON}.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

from tests.support.server import read_log_file, terminate

SKIP_REASON = (
    "no etcd binary (Debian: apt-get install etcd-server; `make etcd` installs it when "
    "run as root)"
)


def etcd_binary():
    """Return the path of the etcd binary, or None when there is none."""
    found = shutil.which("etcd")
    if found:
        return found
    return "/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK) else None


#: every port free_port handed out in this process
_GIVEN = set()


def free_port():
    """A loopback port nothing listens on right now, and one this process has not handed
    out before: a port is only probed (bound, then closed), so two probes in a row can
    get the same one from the kernel, and a member of a group was once given one port
    for two of its doors (it could not start)."""
    for _ in range(1000):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port
    raise RuntimeError("the kernel keeps handing out ports this process already used")


class EtcdProcess:
    """One etcd process with its own data directory and loopback ports.

    L{start} may be called again after L{kill} or L{stop}: the same data directory and
    ports, so the restarted etcd holds what it held (leases included: etcd restores
    them with their full TTL).

    @ivar endpoint: the client URL, C{http://HOST:PORT} (C{host}: 127.0.0.1 unless
        given).
    """

    def __init__(self, data, host="127.0.0.1"):
        self.data = str(data)
        self.binary = etcd_binary()
        self.client_port = free_port()
        self.peer_port = free_port()
        self.endpoint = f"http://{host}:{self.client_port}"
        self.proc = None
        self._log = None
        self.log_path = self.data + ".log"

    def command(self):
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [
            self.binary, "--name", "default", "--data-dir", self.data,
            "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"default={peer}",
            # no metrics or debug listeners beyond the client port
            "--log-level", "warn",
        ]

    def start(self, timeout=20.0):
        """Start etcd and wait until /health says it serves."""
        os.makedirs(self.data, exist_ok=True)
        if self._log is not None:
            self._log.close()
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}:\n{self.read_log()}")
            if self.healthy():
                return self
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"etcd did not become healthy in {timeout}s:\n{self.read_log()}")

    def healthy(self):
        """True when etcd answers /health with health true."""
        try:
            with urllib.request.urlopen(self.endpoint + "/health", timeout=2) as r:
                return json.loads(r.read()).get("health") == "true"
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def read_log(self):
        return read_log_file(self.log_path)

    def kill(self):
        """SIGKILL and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def pause(self):
        """SIGSTOP: etcd holds its connections but answers nothing."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self):
        """SIGCONT after L{pause}."""
        self.proc.send_signal(signal.SIGCONT)

    def stop(self):
        """SIGTERM (SIGKILL if it lingers) and close the log."""
        if self.proc is not None and self.proc.poll() is None:
            self.resume()
            terminate(self.proc)
        if self._log is not None:
            self._log.close()
            self._log = None
