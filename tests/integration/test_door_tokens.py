"""Optional tokens on the doors without authentication of their own:
msgout's HTTP API and the admin API ask for a bearer token (msgout refuses from the
request head, before any body is read), mqctl sends it, and the console asks for an
AUTH line, on the real server."""

import json
import socket
import subprocess
import sys

import pytest

from tests.support.msgout import LOOPBACK, Console
from tests.support.nsq import http
from tests.support.server import ROOT, ServerProcess

TOKEN = "t0ken-for-tests"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = ServerProcess(tmp_path_factory.mktemp("tokens") / "broker",
                      listen={"msgout": LOOPBACK, "console": LOOPBACK, "admin": LOOPBACK},
                      config={"msgout": {"token": TOKEN}, "console": {"token": TOKEN},
                              "admin": {"token": TOKEN}}).start()
    try:
        yield s
    finally:
        s.stop()
        s.close()


def test_msgout_wants_the_bearer_token(srv):
    port = srv.ports["MsgoutSite"]
    good = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    status, _, body = http(port, "GET", "/v1/queues")
    assert status == 401 and json.loads(body) == {"error": "unauthorized"}
    assert http(port, "GET", "/v1/queues", headers={"Authorization": "Bearer nope"})[0] == 401
    assert http(port, "PUT", "/v1/queues/tq", b"{}", headers=good)[0] == 200
    assert http(port, "GET", "/v1/queues", headers=good)[0] == 200
    # a body announced without the token is refused from the head, never read
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /v1/queues/tq/messages HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Length: 100000000\r\n\r\n")
        assert s.recv(65536).startswith(b"HTTP/1.1 401 ")


def test_console_wants_auth_first(srv):
    port = srv.ports["ConsoleFactory"]
    c = Console(port)
    c.send(b"TOPICS")
    assert c.line() == b"ERR AUTH <token> required"
    c.close()
    c = Console(port)
    c.send(b"AUTH wrong")
    assert c.line() == b"ERR wrong token"
    c.close()
    c = Console(port)
    c.send(b"AUTH " + TOKEN.encode())
    assert c.line() == b"OK"
    c.send(b"QUIT")
    assert c.line() == b"OK bye"
    c.close()


def test_admin_api_and_mqctl_want_the_bearer_token(srv):
    """The admin API refuses requests without admin.token; mqctl passes it with --token
    (or MQCTL_TOKEN) and says the broker refused without it."""
    port = srv.ports["AdminSite"]
    assert http(port, "GET", "/topics")[0] == 401
    assert http(port, "GET", "/topics", headers={"Authorization": "Bearer nope"})[0] == 401
    assert http(port, "GET", "/topics", headers={"Authorization": f"Bearer {TOKEN}"})[0] == 200

    def mqctl(*args, env=None):
        cmd = [sys.executable, "-m", "protocols.admin.ctl", "--url", f"http://127.0.0.1:{port}", *args]
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60,
                              env=dict({"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin"}, **(env or {})))

    refused = mqctl("topics")
    assert refused.returncode == 1 and "unauthorized (HTTP 401)" in refused.stderr
    assert mqctl("--token", TOKEN, "topics").returncode == 0
    assert mqctl("topics", env={"MQCTL_TOKEN": TOKEN}).returncode == 0
