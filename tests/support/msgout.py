"""Test support for msgout: an HTTP/JSON client on one keep-alive connection, a raw
console socket, and the push receiver process."""

import json
import os
import socket
import subprocess
import sys
import time
import http.client

from tests.support.server import ROOT

LOOPBACK = "tcp:0:interface=127.0.0.1"


class Api:
    """msgout's HTTP API over one persistent connection (http.client)."""

    def __init__(self, port, timeout=15.0):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)

    def call(self, method, path, body=None, raw=None):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None
                                            else None)
        self.conn.request(method, path, body=data,
                          headers={"Content-Type": "application/json"})
        r = self.conn.getresponse()
        out = r.read()
        return r.status, json.loads(out) if out else None

    def ok(self, method, path, body=None):
        status, data = self.call(method, path, body)
        assert status == 200, (status, data)
        return data

    def put_queue(self, name, **attrs):
        return self.ok("PUT", f"/v1/queues/{name}", attrs)

    def publish(self, name, *bodies):
        return self.ok("POST", f"/v1/queues/{name}/messages",
                       {"messages": [{"body": b} for b in bodies]})["ids"]

    def fetch(self, name, **kw):
        return self.ok("POST", f"/v1/queues/{name}/fetch", kw)["messages"]

    def ack(self, receipts):
        return self.ok("POST", "/v1/ack", {"receipts": receipts})

    def close(self):
        self.conn.close()


class Console:
    """A raw console socket."""

    def __init__(self, port, timeout=10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def send(self, line):
        self.sock.sendall(line + b"\r\n")

    def _fill(self):
        data = self.sock.recv(1 << 16)
        if not data:
            raise ConnectionError("console closed")
        self.buf += data

    def line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def message(self):
        """Read one MSG frame: (queue, id, receipt, attempts, body)."""
        head = self.line()
        assert head.startswith(b"MSG "), head
        _, q, eid, receipt, attempts, n = head.split(b" ")
        n = int(n)
        while len(self.buf) < n + 2:
            self._fill()
        body, self.buf = self.buf[:n], self.buf[n + 2:]
        return q.decode(), int(eid), receipt.decode(), int(attempts), body

    def close(self):
        self.sock.close()


class Receiver:
    """tests/support/push_receiver.py in a subprocess."""

    def __init__(self, path, fail_every):
        self.path = str(path)
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "tests", "support", "push_receiver.py"),
             self.path, str(fail_every)],
            stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=ROOT))
        line = self.proc.stdout.readline().split()
        assert line and line[0] == b"PORT", line
        self.port = int(line[1])
        self.url = f"http://127.0.0.1:{self.port}/in"

    def batches(self):
        try:
            with open(self.path) as f:
                return [json.loads(x) for x in f if x.strip()]
        except FileNotFoundError:
            return []

    def bodies(self):
        return [m["body"] for b in self.batches() for m in b["batch"]["messages"]]

    def wait_bodies(self, n, timeout=30.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.bodies()
            if len(got) >= n:
                return got
            time.sleep(0.05)
        raise AssertionError(f"push receiver got {len(self.bodies())} of {n}")

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self.proc.stdout.close()
