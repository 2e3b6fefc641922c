"""TLS on every front door: each door listens on an ``ssl:`` endpoint with
certificates made at test time, and a client speaking that door's protocol over TLS
(a CA-checked ``ssl`` socket, or HTTPS) gets through a real round trip."""

import json
import os
import shutil
import socket
import subprocess
import urllib.request

import pytest

from protocols.nsq.codec import encode_command
from protocols.remoting import codes
from protocols.smss.client import SmssClient, SmssError
from protocols.smss.messages import Batch
from tests.support.nsq import V2, http
from tests.support.remoting_client import RemotingClient
from tests.support.server import ServerProcess
from tests.support.tls import Certs

DOORS = ("smss", "namesrv", "broker", "nsqd_tcp", "nsqd_http", "lookupd_tcp", "lookupd_http",
         "msgout", "console", "admin", "metrics")

#: every HTTP door's site (as its port is logged) and a GET route it answers with 200
HTTPS_DOORS = [("NsqdHttpSite", "/ping"), ("LookupdHttpSite", "/ping"), ("MsgoutSite", "/v1/queues"),
               ("AdminSite", "/stats"), ("MetricsSite", "/metrics")]


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return Certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def srv(tmp_path_factory, certs):
    s = ServerProcess(tmp_path_factory.mktemp("tls") / "data",
                      listen={d: certs.endpoint() for d in DOORS}).start()
    try:
        yield s
    finally:
        s.stop()
        s.close()


def test_plain_tcp_client_gets_no_reply(srv):
    """The listener speaks TLS only: a plain smss request gets no smss answer."""
    with socket.create_connection(("127.0.0.1", srv.ports["SmssFactory"]), timeout=5) as s:
        s.sendall(b"\x00" * 40)
        data = s.recv(100)
        assert not data.startswith(b"\xc8\x00") and not data.startswith(b"\xc9\x00")


def test_smss_over_tls(srv, certs):
    with SmssClient("127.0.0.1", srv.ports["SmssFactory"], ssl_context=certs.client_context()) as c:
        c.create("tls_t")
        c.publish("tls_t", [b"secret-1", b"secret-2"])
        batch = c.subscribe("tls_t", 0, batch=10, who="g").next_batch(5)
        assert isinstance(batch, Batch)
        assert [m.body for m in batch.messages] == [b"secret-1", b"secret-2"]


def test_rocketmq_broker_and_namesrv_over_tls(srv, certs):
    ctx = certs.client_context()
    br = RemotingClient("127.0.0.1", srv.ports["BrokerDoor"], ssl_context=ctx)
    ns = RemotingClient("127.0.0.1", srv.ports["NamesrvFactory"], ssl_context=ctx)
    try:
        r = br.call(codes.SEND_MESSAGE, {"producerGroup": "pg", "topic": "TlsT", "defaultTopic": "TBW102",
                                         "defaultTopicQueueNums": 1, "queueId": 0, "sysFlag": 0,
                                         "bornTimestamp": 0, "flag": 0, "properties": ""}, b"over-tls")
        assert r.code == codes.SUCCESS, r.remark
        p = br.call(codes.PULL_MESSAGE, {"consumerGroup": "G", "topic": "TlsT", "queueId": 0,
                                         "queueOffset": 0, "maxMsgNums": 32, "sysFlag": 4,
                                         "commitOffset": 0, "suspendTimeoutMillis": 0,
                                         "subscription": "*", "subVersion": 0})
        assert p.code == codes.SUCCESS and b"over-tls" in p.body
        r = ns.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})
        assert r.code in (codes.SUCCESS, codes.TOPIC_NOT_EXIST)
    finally:
        br.close()
        ns.close()


def test_nsqd_tcp_over_tls(srv, certs):
    ctx = certs.client_context()
    p = V2(srv.ports["NsqdFactory"], ssl_context=ctx)
    c = V2(srv.ports["NsqdFactory"], ssl_context=ctx)
    try:
        p.send(encode_command("PUB", "tls_n", body=b"over-tls"))
        assert p.frame() == (0, b"OK")
        c.send(b"SUB tls_n ch\n")
        assert c.frame() == (0, b"OK")
        c.send(b"RDY 1\n")
        (m,) = c.messages(1)
        assert m.body == b"over-tls"
    finally:
        p.close()
        c.close()


def test_nsq_http_doors_over_https(srv, certs):
    ctx = certs.client_context()
    port = srv.ports["NsqdHttpSite"]
    assert http(port, "POST", "/pub?topic=tls_h", b"m", ssl_context=ctx)[::2] == (200, b"OK")
    status, _, body = http(port, "GET", "/stats?format=json&topic=tls_h", ssl_context=ctx)
    assert status == 200 and json.loads(body)["topics"][0]["message_count"] == 1
    assert http(srv.ports["LookupdHttpSite"], "GET", "/ping", ssl_context=ctx)[::2] == (200, b"OK")
    # the doors behind TLS still learn their ports (lookupd advertises them)
    info = json.loads(http(port, "GET", "/info", ssl_context=ctx)[2])
    assert (info["tcp_port"], info["http_port"]) == (srv.ports["NsqdFactory"], port)


def test_lookupd_tcp_over_tls(srv, certs):
    ctx = certs.client_context()
    with socket.create_connection(("127.0.0.1", srv.ports["LookupdFactory"]), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            s.sendall(b"  V1PING\n")
            assert s.recv(100) == b"\x00\x00\x00\x02OK"


def test_msgout_over_https_and_console_over_tls(srv, certs):
    ctx = certs.client_context()
    port = srv.ports["MsgoutSite"]
    assert http(port, "PUT", "/v1/queues/tls_q", b"{}", ssl_context=ctx,
                headers={"Content-Type": "application/json"})[0] == 200
    status, _, body = http(port, "GET", "/v1/queues/tls_q", ssl_context=ctx)
    assert status == 200 and json.loads(body)["name"] == "tls_q"
    with socket.create_connection(("127.0.0.1", srv.ports["ConsoleFactory"]), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            s.sendall(b"QUIT\n")
            assert s.recv(100) == b"OK bye\r\n"


def _get(sock, path):
    sock.sendall(b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" % path.encode())
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


@pytest.mark.parametrize("site, path", HTTPS_DOORS)
def test_https_doors_answer_clients_that_offer_alpn(srv, certs, site, path):
    """A client offering h2 and http/1.1 over ALPN (browsers, Go, curl) gets http/1.1
    negotiated and its answer, as does urllib with its default ALPN (http/1.1) and curl
    as it comes."""
    port = srv.ports[site]
    ctx = certs.client_context()
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            assert s.selected_alpn_protocol() == "http/1.1"
            assert _get(s, path).startswith(b"HTTP/1.1 200 ")

    ctx = certs.client_context()
    ctx.set_alpn_protocols(["http/1.1"])  # what urllib's own default context offers
    with urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", timeout=10, context=ctx) as r:
        assert r.status == 200

    curl = shutil.which("curl")
    if curl is not None:
        out = subprocess.run([curl, "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert", certs.ca,
                              f"https://127.0.0.1:{port}{path}"], capture_output=True, text=True, timeout=30)
        assert (out.returncode, out.stdout) == (0, "200"), out.stderr


def wait_for(predicate, timeout=20.0):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_slave_follows_its_master_over_tls(server_factory, certs):
    """--master-tls: the slave checks the master's certificate against masterCa and
    replicates through the master's ssl: smss listener; a CA it does not know fails the
    handshake and nothing is replicated."""
    master = server_factory("master", listen={"smss": certs.endpoint()})
    addr = f"127.0.0.1:{master.smss_port}"
    slave = server_factory("slave", config={"masterCa": certs.ca},
                           extra_args=["--role", "slave", "--master", addr, "--master-tls"])
    other = Certs(os.path.join(os.path.dirname(master.data), "other"))
    stranger = server_factory("stranger", config={"masterCa": other.ca},
                              extra_args=["--role", "slave", "--master", addr, "--master-tls"])
    ctx = certs.client_context()
    with SmssClient("127.0.0.1", master.smss_port, ssl_context=ctx) as c:
        c.create("rep")
        c.publish("rep", [b"replicated over tls"])

    def slave_has():
        with SmssClient("127.0.0.1", slave.smss_port) as c:
            try:
                return c.topic_info("rep") is not None
            except SmssError:
                return False

    assert wait_for(slave_has)
    with SmssClient("127.0.0.1", slave.smss_port) as c:
        batch = c.subscribe("rep", 0, batch=10, who="g").next_batch(5)
        assert [m.body for m in batch.messages] == [b"replicated over tls"]
    assert wait_for(lambda: "certificate verify failed" in stranger.current_log())
    with SmssClient("127.0.0.1", stranger.smss_port) as c:
        with pytest.raises(SmssError):
            c.topic_info("rep")
