"""Helpers for NSQ integration tests: a broker with every NSQ door, raw V2 sockets, HTTP
calls, and client-library scripts run in bounded subprocesses."""

import contextlib
import json
import os
import socket
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request

from protocols.nsq.codec import FrameReader, decode_message
from tests.support.server import ServerProcess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NSQ_DOORS = ("nsqd_tcp", "nsqd_http", "lookupd_tcp", "lookupd_http")
LOOPBACK = "tcp:0:interface=127.0.0.1"


def nsq_listen(*extra):
    """listen: mapping with every NSQ door (and C{extra} doors) on ephemeral ports."""
    return {name: LOOPBACK for name in NSQ_DOORS + extra}


class NsqPorts:
    """The ports of a running broker's NSQ doors."""

    def __init__(self, server):
        p = server.ports
        self.tcp = p["NsqdFactory"]
        self.http = p.get("NsqdHttpSite")
        self.lookupd_tcp = p.get("LookupdFactory")
        self.lookupd_http = p.get("LookupdHttpSite")


@contextlib.contextmanager
def nsq_broker(data, config=None):
    """A started broker (its data in C{data}, C{config} its settings) with every NSQ door,
    as its L{NsqPorts}; stopped on leaving."""
    s = ServerProcess(data, config=config, listen=nsq_listen()).start()
    try:
        yield NsqPorts(s)
    finally:
        s.stop()
        s.close()


@contextlib.contextmanager
def v2_connections(port):
    """A maker of raw L{V2} connections to C{port}; every one made is closed on leaving."""
    made = []

    def connect():
        c = V2(port)
        made.append(c)
        return c

    try:
        yield connect
    finally:
        for c in made:
            c.close()


class V2:
    """A raw nsqd V2 connection (magic sent) with a frame reader."""

    def __init__(self, port, timeout=10.0, ssl_context=None, host="127.0.0.1"):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        if ssl_context is not None:  # an ssl: listener
            self.sock = ssl_context.wrap_socket(self.sock, server_hostname="127.0.0.1")
        self.sock.sendall(b"  V2")
        self.reader = FrameReader()
        self.pending = []

    def send(self, data):
        self.sock.sendall(data)

    def frames(self, n, skip_heartbeats=True):
        """Read the next C{n} frames (type, data)."""
        while len(self.pending) < n:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError(f"closed after {self.pending!r}")
            for f in self.reader.feed(data):
                if skip_heartbeats and f == (0, b"_heartbeat_"):
                    continue
                self.pending.append(f)
        out, self.pending = self.pending[:n], self.pending[n:]
        return out

    def frame(self):
        return self.frames(1)[0]

    def messages(self, n):
        out = []
        for t, d in self.frames(n):
            assert t == 2, (t, d)
            out.append(decode_message(d))
        return out

    def closed(self):
        """True when the server closed the socket (reads to EOF)."""
        try:
            while True:
                data = self.sock.recv(1 << 16)
                if not data:
                    return True
                self.pending += self.reader.feed(data)
        except socket.timeout:
            return False

    def close(self):
        self.sock.close()


def http(port, method, path, body=None, timeout=10.0, ssl_context=None, headers=None):
    """Return (status, headers, body bytes) of one HTTP request (HTTPS with an
    C{ssl_context})."""
    scheme = "https" if ssl_context is not None else "http"
    req = urllib.request.Request(f"{scheme}://127.0.0.1:{port}{path}", data=body, method=method,
                                 headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ssl_context) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def http_json(port, method, path, body=None):
    status, headers, data = http(port, method, path, body)
    return status, json.loads(data) if data else None


def run_client(code, timeout=60.0, **params):
    """Run C{code} (a script; C{params} are given as JSON in PARAMS) in a subprocess and
    return what it printed as JSON on its last line. Client libraries retry and can hang:
    the subprocess is bounded and killed on timeout."""
    script = "import json, sys\nPARAMS = json.loads(sys.argv[1])\n" + textwrap.dedent(code)
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(params)], cwd=ROOT, env=env,
                          capture_output=True, timeout=timeout)
    out = proc.stdout.decode("utf-8", "replace").strip().splitlines()
    if proc.returncode != 0 or not out:
        raise AssertionError(f"client failed ({proc.returncode}):\n{proc.stdout.decode()}\n"
                             f"{proc.stderr.decode()[-4000:]}")
    return json.loads(out[-1])
