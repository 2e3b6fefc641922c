"""Optional tokens on the doors without authentication of their own (issue 16.4):
msgout's HTTP API asks for a bearer token (refused from the request head, before any
body is read) and the console for an AUTH line, on the real server."""

import json
import socket

import pytest

from tests.support.msgout import LOOPBACK, Console
from tests.support.nsq import http
from tests.support.server import ServerProcess

TOKEN = "t0ken-for-tests"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = ServerProcess(tmp_path_factory.mktemp("tokens") / "broker",
                      listen={"msgout": LOOPBACK, "console": LOOPBACK},
                      config={"msgout": {"token": TOKEN}, "console": {"token": TOKEN}}).start()
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
