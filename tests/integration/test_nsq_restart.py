"""Channels, positions and paused flags survive a restart; a standalone mqlookupd learns
this broker's topics and channels; NSQ and smss share one log."""

import time

from protocols.nsq.codec import encode_mpub
from protocols.smss.client import SmssClient
from tests.support.nsq import V2, NsqPorts, http, http_json, nsq_listen
from tests.support.server import Standalone


def drain(c, n):
    msgs = c.messages(n)
    return msgs


def test_restart_keeps_channels_positions_and_pause(server_factory):
    s = server_factory("r", listen=nsq_listen())
    ports = NsqPorts(s)
    p = V2(ports.tcp)
    p.send(encode_mpub("rs", [b"%d" % i for i in range(10)]))
    assert p.frame() == (0, b"OK")
    c = V2(ports.tcp)
    c.send(b"SUB rs keep\nRDY 6\n")
    assert c.frame() == (0, b"OK")
    got = c.messages(6)
    # FIN 0,1,2 and 4; 3 and 5 stay unfinished (in flight at shutdown)
    for m in got[:3] + got[4:5]:
        c.send(b"FIN " + m.msg_id + b"\n")
    http(ports.http, "POST", "/channel/create?topic=rs&channel=paused")
    http(ports.http, "POST", "/channel/pause?topic=rs&channel=paused")
    http(ports.http, "POST", "/topic/create?topic=rs_paused_topic")
    http(ports.http, "POST", "/topic/pause?topic=rs_paused_topic")
    # a failing FIN is answered after the FINs before it are done: they landed
    # (messages the freed RDY let through may come first)
    c.send(b"FIN 0000000000000000\n")
    frame = c.frame()
    while frame[0] == 2:
        frame = c.frame()
    assert frame == (1, b"E_FIN_FAILED FIN 0000000000000000 failed ID not in flight")
    c.close()
    p.close()
    s.stop()

    s2 = server_factory("r", listen=nsq_listen())
    ports = NsqPorts(s2)
    stats = http_json(ports.http, "GET", "/stats?format=json")[1]
    topics = {t["topic_name"]: t for t in stats["topics"]}
    chans = {ch["channel_name"]: ch for ch in topics["rs"]["channels"]}
    assert set(chans) == {"keep", "paused"}
    assert chans["paused"]["paused"] is True and topics["rs_paused_topic"]["paused"] is True
    c = V2(ports.tcp)
    c.send(b"SUB rs keep\nRDY 10\n")
    assert c.frame() == (0, b"OK")
    bodies = sorted(int(m.body) for m in c.messages(6))
    assert bodies == [3, 5, 6, 7, 8, 9]  # unfinished ones again, finished ones never
    c.sock.settimeout(0.5)
    assert c.closed() is False and c.pending == []
    c.close()


def test_nsq_and_smss_share_one_log(server_factory):
    listen = nsq_listen()
    listen["smss"] = "tcp:0:interface=127.0.0.1"
    s = server_factory("x", listen=listen)
    ports = NsqPorts(s)
    smss = SmssClient("127.0.0.1", s.smss_port)
    try:
        # NSQ -> smss
        p = V2(ports.tcp)
        p.send(encode_mpub("xs", [b"from-nsq-1", b"from-nsq-2"]))
        assert p.frame() == (0, b"OK")
        sub = smss.subscribe("xs", 0, batch=10, who="g")
        batch = sub.next_batch(5)
        assert [m.body for m in batch.messages] == [b"from-nsq-1", b"from-nsq-2"]
    finally:
        smss.close()
    smss = SmssClient("127.0.0.1", s.smss_port)
    try:
        # smss -> NSQ (the first channel gets the topic's backlog)
        smss.create("sx")
        smss.publish("sx", [b"from-smss"])
        c = V2(ports.tcp)
        c.send(b"SUB sx ch\nRDY 5\n")
        assert c.frame() == (0, b"OK")
        (m,) = c.messages(1)
        assert m.body == b"from-smss" and m.attempts == 1
        c.close()
    finally:
        smss.close()


def test_standalone_mqlookupd_learns_this_broker(tmp_path, server_factory):
    lookupd = Standalone("mqlookupd", ["--tcp", "tcp:0:interface=127.0.0.1",
                                       "--http", "tcp:0:interface=127.0.0.1"],
                         tmp_path / "lookupd.log").start()
    try:
        lk_tcp, lk_http = lookupd.ports["lookupd_tcp"], lookupd.ports["lookupd_http"]
        s = server_factory("lk", listen={"nsqd_tcp": "tcp:0:interface=127.0.0.1",
                                         "nsqd_http": "tcp:0:interface=127.0.0.1"},
                           config={"nsq": {"lookupdTcpAddresses": [f"127.0.0.1:{lk_tcp}"]}})
        nsq = NsqPorts(s)
        http(nsq.http, "POST", "/topic/create?topic=lk_t")
        http(nsq.http, "POST", "/channel/create?topic=lk_t&channel=c")
        body = None
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            status, body = http_json(lk_http, "GET", "/lookup?topic=lk_t")
            if status == 200 and body["channels"] == ["c"]:
                break
            time.sleep(0.1)
        assert body["channels"] == ["c"]
        assert [(p["tcp_port"], p["http_port"]) for p in body["producers"]] == [(nsq.tcp, nsq.http)]
        # when the broker goes, its registrations go with its connection
        s.stop()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if http_json(lk_http, "GET", "/lookup?topic=lk_t")[1]["producers"] == []:
                break
            time.sleep(0.1)
        assert http_json(lk_http, "GET", "/lookup?topic=lk_t")[1]["producers"] == []
    finally:
        lookupd.close()


def test_lookupd_v1_protocol(tmp_path, server_factory):
    import json
    import socket
    import struct
    s = server_factory("v1", listen=nsq_listen())
    ports = NsqPorts(s)
    sock = socket.create_connection(("127.0.0.1", ports.lookupd_tcp), timeout=5)

    def reply():
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack(">I", data[:4])[0]:
            chunk = sock.recv(4096)
            if not chunk:
                return None
            data += chunk
        return data[4:]

    body = json.dumps({"broadcast_address": "10.1.1.1", "tcp_port": 5150, "http_port": 5151,
                       "version": "1.3.0", "hostname": "fake"}).encode()
    sock.sendall(b"  V1IDENTIFY\n" + struct.pack(">I", len(body)) + body)
    assert json.loads(reply())["version"] == "1.3.0"
    sock.sendall(b"REGISTER v1t v1c\n")
    assert reply() == b"OK"
    sock.sendall(b"PING\n")
    assert reply() == b"OK"
    status, found = http_json(ports.lookupd_http, "GET", "/lookup?topic=v1t")
    assert found["channels"] == ["v1c"]
    assert [p["broadcast_address"] for p in found["producers"]] == ["10.1.1.1"]
    sock.sendall(b"BOGUS\n")
    assert reply() == b"E_INVALID invalid command BOGUS"
    assert sock.recv(10) == b""
    status, found = http_json(ports.lookupd_http, "GET", "/lookup?topic=v1t")
    assert found["producers"] == []  # a dropped producer's registrations go
