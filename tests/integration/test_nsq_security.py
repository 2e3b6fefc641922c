"""nsqd's TLS inside the connection (IDENTIFY tls_v1, --tls-required) and AUTH against a
real auth server, with pynsq and raw frames."""

import json
import os
import socket
import struct
import subprocess
import sys

import pytest

from protocols.nsq.codec import encode_command, encode_mpub
from tests.support.nsq import V2, http, nsq_listen, run_client
from tests.support.server import ROOT, ServerProcess
from tests.support.tls import Certs

OK_FRAME = b"\x00\x00\x00\x06\x00\x00\x00\x00OK"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return Certs(tmp_path_factory.mktemp("nsqcerts"))


@pytest.fixture(scope="module")
def authd():
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.nsq_authd"], cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=ROOT),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        port = int(proc.stdout.readline())
        yield port
    finally:
        proc.kill()
        proc.wait(10)


def authd_log(port):
    return json.loads(http(port, "GET", "/log")[2])


def running(tmp_path_factory, name, listen=None, **nsq):
    """A broker with every NSQ door and the C{nsq.*} settings C{nsq}, for a fixture."""
    s = ServerProcess(tmp_path_factory.mktemp(name) / "data", config={"nsq": nsq},
                      listen=dict(nsq_listen(), **(listen or {}))).start()
    try:
        yield s
    finally:
        s.stop()
        s.close()


@pytest.fixture(scope="module")
def tls_srv(tmp_path_factory, certs):
    yield from running(tmp_path_factory, "nsqtls", tlsCert=certs.cert, tlsKey=certs.key)


@pytest.fixture(scope="module")
def required_srv(tmp_path_factory, certs):
    yield from running(tmp_path_factory, "nsqtlsreq", tlsCert=certs.cert, tlsKey=certs.key,
                       tlsRequired=True)


@pytest.fixture(scope="module")
def auth_srv(tmp_path_factory, certs, authd):
    yield from running(tmp_path_factory, "nsqauth", tlsCert=certs.cert, tlsKey=certs.key,
                       authHttpAddresses=[f"127.0.0.1:{authd}"])


def read_frame(sock):
    head = b""
    while len(head) < 4:
        head += sock.recv(4 - len(head))
    (size,) = struct.unpack(">I", head)
    body = b""
    while len(body) < size:
        body += sock.recv(size - len(body))
    return struct.unpack(">i", body[:4])[0], body[4:]


def upgraded(port, certs, **identify):
    """A raw connection that negotiated tls_v1: (TLS socket, IDENTIFY reply)."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    body = json.dumps(dict(feature_negotiation=True, tls_v1=True, **identify)).encode()
    raw.sendall(b"  V2" + encode_command("IDENTIFY", body=body))
    kind, data = read_frame(raw)  # in the clear
    reply = json.loads(data)
    assert kind == 0 and reply["tls_v1"] is True
    tls = certs.client_context().wrap_socket(raw, server_hostname="127.0.0.1")
    assert tls.recv(10) == OK_FRAME  # the first bytes through TLS, as nsqd sends them
    return tls, reply


def test_identify_tls_v1_upgrades_the_connection(tls_srv, certs):
    port = tls_srv.ports["NsqdFactory"]
    s, reply = upgraded(port, certs)
    try:
        assert reply["auth_required"] is False
        s.sendall(encode_command("PUB", "tls_in", body=b"secret"))
        assert read_frame(s) == (0, b"OK")
    finally:
        s.close()
    # without tls_v1 the same server stays in the clear
    c = V2(port)
    c.send(encode_command("IDENTIFY", body=b'{"feature_negotiation":true}'))
    assert json.loads(c.frame()[1])["tls_v1"] is False
    c.send(encode_command("PUB", "tls_in", body=b"plain"))
    assert c.frame() == (0, b"OK")
    c.close()


def test_tls_v1_is_not_granted_without_a_certificate(tmp_path_factory):
    for s in running(tmp_path_factory, "nsqnotls"):
        c = V2(s.ports["NsqdFactory"])
        c.send(encode_command("IDENTIFY", body=b'{"feature_negotiation":true,"tls_v1":true}'))
        assert json.loads(c.frame()[1])["tls_v1"] is False
        c.send(b"AUTH\n" + struct.pack(">I", 1) + b"x")
        assert c.frame() == (1, b"E_AUTH_DISABLED AUTH disabled")
        c.close()


def test_no_second_tls_layer_on_an_ssl_listener(tmp_path_factory, certs):
    """On an ssl: nsqd_tcp listener the connection is TLS already: tls_v1 is answered
    false and, with tlsRequired, commands are accepted at once."""
    for s in running(tmp_path_factory, "nsqssl", {"nsqd_tcp": certs.endpoint()},
                     tlsCert=certs.cert, tlsKey=certs.key, tlsRequired=True):
        c = V2(s.ports["NsqdFactory"], ssl_context=certs.client_context())
        c.send(encode_command("IDENTIFY", body=b'{"feature_negotiation":true,"tls_v1":true}'))
        assert json.loads(c.frame()[1])["tls_v1"] is False
        c.send(encode_command("PUB", "t_ssl", body=b"m"))
        assert c.frame() == (0, b"OK")
        c.close()


def test_pynsq_tls_v1_publish_and_consume(tls_srv, certs):
    got = run_client("""
import nsq, ssl, tornado.ioloop
loop = tornado.ioloop.IOLoop.current()
addr = ["127.0.0.1:%d" % PARAMS["port"]]
tls = {"ca_certs": PARAMS["ca"], "cert_reqs": ssl.CERT_REQUIRED}
loop.call_later(20, loop.stop)
got, acks, tls_seen = [], [], []
def h(m):
    got.append(m.body.decode())
    return True
r = nsq.Reader(topic="py_tls", channel="c", nsqd_tcp_addresses=addr, message_handler=h,
               tls_v1=True, tls_options=tls, max_in_flight=5)
w = nsq.Writer(addr, tls_v1=True, tls_options=tls)
def pub():
    for c in w.conns.values():
        tls_seen.append(type(c.stream).__name__)
    w.mpub("py_tls", [b"a", b"b"], callback=lambda conn, data: acks.append(str(data)))
loop.call_later(1.0, pub)
def check():
    if len(got) == 2:
        loop.stop()
    else:
        loop.call_later(0.05, check)
loop.call_later(0.05, check)
loop.start()
print(json.dumps({"got": sorted(got), "acks": acks, "streams": tls_seen}))
""", port=tls_srv.ports["NsqdFactory"], ca=certs.ca)
    assert got == {"got": ["a", "b"], "acks": ["b'OK'"], "streams": ["SSLIOStream"]}


def test_tls_required_refuses_commands_before_the_upgrade(required_srv, certs):
    port = required_srv.ports["NsqdFactory"]
    c = V2(port)
    c.send(encode_command("PUB", "t", body=b"m"))
    assert c.frame() == (1, b"E_INVALID cannot PUB in current state (TLS required)")
    assert c.closed()
    c.close()
    c = V2(port)
    c.send(b"NOP\n")
    assert c.frame() == (1, b"E_INVALID cannot NOP in current state (TLS required)")
    c.close()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.sendall(b"  V3")  # a wrong magic is still E_BAD_PROTOCOL
        assert read_frame(raw) == (1, b"E_BAD_PROTOCOL")
    s, _ = upgraded(port, certs)
    try:
        s.sendall(encode_mpub("t_req", [b"x"]))
        assert read_frame(s) == (0, b"OK")
    finally:
        s.close()
    # the plain nsqd HTTP door answers as nsqd's does with --tls-required
    status, headers, body = http(required_srv.ports["NsqdHttpSite"], "POST", "/pub?topic=t", b"m")
    assert status == 403 and json.loads(body) == {"message": "TLS_REQUIRED", "https_port": 0}


def auth(c, secret):
    c.send(b"AUTH\n" + struct.pack(">I", len(secret)) + secret)
    return c.frame()


def test_auth_required_and_checked(auth_srv, authd):
    port = auth_srv.ports["NsqdFactory"]
    c = V2(port)
    c.send(encode_command("IDENTIFY", body=b'{"feature_negotiation":true}'))
    assert json.loads(c.frame()[1])["auth_required"] is True
    c.send(encode_command("PUB", "auth_t", body=b"m"))
    assert c.frame() == (1, b"E_AUTH_FIRST AUTH required before PUB")
    c.close()

    c = V2(port)
    assert auth(c, b"pub-only") == (0, b'{"identity":"pub-user","identity_url":"","permission_count":1}')
    c.send(encode_command("PUB", "auth_t", body=b"m") + encode_mpub("auth_t", [b"a", b"b"]))
    assert c.frames(2) == [(0, b"OK"), (0, b"OK")]
    c.send(encode_command("PUB", "auth_other", body=b"m"))
    assert c.frame() == (1, b'E_UNAUTHORIZED AUTH failed for PUB on "auth_other" ""')
    assert c.closed()
    c.close()

    c = V2(port)
    assert auth(c, b"pub-only")[0] == 0
    c.send(b"SUB auth_t ch\n")
    assert c.frame() == (1, b'E_UNAUTHORIZED AUTH failed for SUB on "auth_t" "ch"')
    c.close()

    c = V2(port)
    assert auth(c, b"sub-ch")[0] == 0
    c.send(b"SUB auth_t ch\n")
    assert c.frame() == (0, b"OK")
    c.send(b"RDY 5\n")
    assert sorted(m.body for m in c.messages(3)) == [b"a", b"b", b"m"]
    c.send(b"AUTH\n" + struct.pack(">I", 1) + b"x")
    assert c.frame() == (1, b"E_INVALID cannot AUTH in current state")
    c.close()

    q = authd_log(authd)[-1]
    assert q["secret"] == "sub-ch" and q["remote_ip"] == "127.0.0.1" and q["tls"] == "false"


@pytest.mark.parametrize("secret, frame", [
    (b"none", b"E_UNAUTHORIZED AUTH no authorizations found"),
    (b"bad-ttl", b"E_AUTH_FAILED AUTH failed"),
    (b"unknown", b"E_AUTH_FAILED AUTH failed"),
    (b"huge", b"E_AUTH_FAILED AUTH failed"),
])
def test_auth_refusals(auth_srv, secret, frame):
    c = V2(auth_srv.ports["NsqdFactory"])
    c.send(b"AUTH\n" + struct.pack(">I", len(secret)) + secret
           + encode_command("PUB", "auth_t", body=b"m"))  # pipelined: never run
    assert c.frame() == (1, frame)
    assert c.closed()
    c.close()


def test_auth_is_fetched_again_when_its_ttl_runs_out(auth_srv, authd):
    """The "short" grant lasts one second; the next PUB after it re-asks the auth
    server, whose second answer no longer allows the topic."""
    import time

    c = V2(auth_srv.ports["NsqdFactory"])
    assert auth(c, b"short")[0] == 0
    c.send(encode_command("PUB", "auth_t", body=b"m"))
    assert c.frame() == (0, b"OK")
    time.sleep(1.1)  # let the TTL run out (a duration under test, not an ordering)
    c.send(encode_command("PUB", "auth_t", body=b"m"))
    assert c.frame() == (1, b'E_UNAUTHORIZED AUTH failed for PUB on "auth_t" ""')
    c.close()
    assert sum(1 for q in authd_log(authd) if q["secret"] == "short") == 2


def test_pynsq_auth_secret_over_tls(auth_srv, authd, certs):
    """pynsq with tls_v1 and auth_secret: TLS first, then AUTH (the auth server is told
    tls=true), then publish and consume."""
    got = run_client("""
import nsq, ssl, tornado.ioloop
loop = tornado.ioloop.IOLoop.current()
addr = ["127.0.0.1:%d" % PARAMS["port"]]
tls = {"ca_certs": PARAMS["ca"], "cert_reqs": ssl.CERT_REQUIRED}
loop.call_later(20, loop.stop)
got, acks = [], []
def h(m):
    got.append(m.body.decode())
    return True
kw = dict(tls_v1=True, tls_options=tls, auth_secret="both")
r = nsq.Reader(topic="auth_py", channel="c", nsqd_tcp_addresses=addr, message_handler=h, **kw)
w = nsq.Writer(addr, **kw)
loop.call_later(1.0, lambda: w.pub("auth_py", b"hello", callback=lambda c, d: acks.append(str(d))))
def check():
    if got:
        loop.stop()
    else:
        loop.call_later(0.05, check)
loop.call_later(0.05, check)
loop.start()
print(json.dumps({"got": got, "acks": acks}))
""", port=auth_srv.ports["NsqdFactory"], ca=certs.ca)
    assert got == {"got": ["hello"], "acks": ["b'OK'"]}
    both = [q for q in authd_log(authd) if q["secret"] == "both"]
    assert both and all(q["tls"] == "true" for q in both)
