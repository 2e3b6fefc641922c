"""Request bodies on every HTTP door of the real broker (nsqd's and lookupd's HTTP APIs,
msgout, admin, metrics), with raw sockets: a Content-Length over the door's limit is
answered 413 from the request head, without the body being sent; a chunked body is
answered 413 as soon as it passes the limit; and no body is ever written to a temporary
file (the broker's TMPDIR stays empty and the process holds no file there, also while a
large allowed body comes in)."""

import json
import os
import socket

import pytest

from tests.support.server import ServerProcess

LOOP = "tcp:0:interface=127.0.0.1"
KIB = 1024

#: (site, request line target, body limit, error text in the 413 body) per door
DOORS = [
    ("NsqdHttpSite", b"POST /pub?topic=big", 1024 * KIB, b'{"message": "MSG_TOO_BIG"}'),
    ("NsqdHttpSite", b"POST /mpub?topic=big", 5120 * KIB, b'{"message": "BODY_TOO_BIG"}'),
    ("LookupdHttpSite", b"POST /topic/create?topic=big", 64 * KIB, b'{"message": "BODY_TOO_BIG"}'),
    ("MsgoutSite", b"POST /v1/queues/big/messages", 5120 * KIB, b'"error"'),
    ("AdminSite", b"POST /topics", 1024 * KIB, b'"error"'),
    ("MetricsSite", b"POST /metrics", 64 * KIB, b"request body larger than 65536 bytes"),
]
IDS = [d[1].split(b"?")[0].decode() for d in DOORS]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    base = tmp_path_factory.mktemp("bodies")
    tmpdir = base / "tmp"
    tmpdir.mkdir()
    s = ServerProcess(base / "data", env={"TMPDIR": str(tmpdir)},
                      listen={d: LOOP for d in ("smss", "nsqd_tcp", "nsqd_http", "lookupd_http",
                                                "msgout", "admin", "metrics")}).start()
    s.tmpdir = str(tmpdir)
    try:
        status = _exchange(s.ports["MsgoutSite"], b"PUT /v1/queues/big", b"{}")
        assert status.startswith(b"HTTP/1.1 200 "), status
        yield s
    finally:
        s.stop()
        s.close()


def _read_all(sock):
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _exchange(port, target, body):
    with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
        s.sendall(target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
                  % len(body) + body)
        return _read_all(s)


def _temp_files(srv):
    """What the broker holds open or has created in its TMPDIR."""
    held = []
    fds = f"/proc/{srv.proc.pid}/fd"
    for fd in os.listdir(fds):
        try:
            target = os.readlink(os.path.join(fds, fd))
        except OSError:
            continue  # closed meanwhile
        if target.startswith(srv.tmpdir):
            held.append(target)
    return held + os.listdir(srv.tmpdir)


@pytest.mark.parametrize("site, target, limit, error", DOORS, ids=IDS)
def test_a_huge_content_length_is_refused_from_the_head(srv, site, target, limit, error):
    with socket.create_connection(("127.0.0.1", srv.ports[site]), timeout=15) as s:
        s.sendall(target + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 2147483648\r\n\r\n")
        answer = _read_all(s)  # the body is never sent: the answer comes from the head
    assert answer.startswith(b"HTTP/1.1 413 "), answer
    assert answer.endswith(error) or error in answer.partition(b"\r\n\r\n")[2], answer
    assert b"Connection: close" in answer
    assert _temp_files(srv) == []


@pytest.mark.parametrize("site, target, limit, error", DOORS, ids=IDS)
def test_a_chunked_body_is_refused_as_it_passes_the_limit(srv, site, target, limit, error):
    with socket.create_connection(("127.0.0.1", srv.ports[site]), timeout=15) as s:
        s.sendall(target + b" HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = 64 * KIB
        sent = 0
        while sent + chunk <= limit:
            s.sendall(b"%x\r\n" % chunk + b"x" * chunk + b"\r\n")
            sent += chunk
        # the byte past the limit, and no more: the broker reads all that was sent
        rest = limit - sent + 1
        s.sendall(b"%x\r\n" % rest + b"x" * rest)
        answer = _read_all(s)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert error in answer.partition(b"\r\n\r\n")[2], answer[:300]
    assert _temp_files(srv) == []


def _allowed_body(site, size):
    if site == "NsqdHttpSite":
        return b"m" * size
    if site == "MsgoutSite":
        return json.dumps({"messages": [{"body": "m" * (size - 40)}]}).encode()
    if site == "AdminSite":
        return json.dumps({"name": "big_admin", "pad": "p" * (size - 40)}).encode()
    return b"x" * size


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "content-length"])
@pytest.mark.parametrize("site, target, limit, error", DOORS, ids=IDS)
def test_an_allowed_body_is_kept_in_memory(srv, site, target, limit, error, chunked):
    """twisted.web's own request spools a chunked body, or one of 100 kB and more, to a
    temporary file; the doors keep it in memory (up to their limit). The check is made
    once the broker has read the head (it answers "100 Continue") and again after the
    answer."""
    body = _allowed_body(site, min(limit, 300 * KIB) - 16)
    if chunked:
        head, data = b"Transfer-Encoding: chunked", b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    else:
        head, data = b"Content-Length: %d" % len(body), body
    with socket.create_connection(("127.0.0.1", srv.ports[site]), timeout=15) as s:
        s.sendall(target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\nExpect: 100-continue\r\n"
                  + head + b"\r\n\r\n")
        interim = b""
        while not interim.endswith(b"\r\n\r\n"):
            interim += s.recv(1)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        assert _temp_files(srv) == []
        half = len(data) // 2
        s.sendall(data[:half])
        s.sendall(data[half:])
        answer = _read_all(s)
    status = int(answer.split(b" ", 2)[1])
    assert status != 413 and status < 500, answer[:300]
    assert _temp_files(srv) == []
