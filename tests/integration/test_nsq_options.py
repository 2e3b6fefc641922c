"""nsqd's client-overridable options as config keys (nsqd's --max-heartbeat-interval,
--output-buffer-timeout, --min/max-output-buffer-timeout, --max-output-buffer-size,
--max-msg-timeout, --max-req-timeout, --deflate, --max-deflate-level, --snappy,
--max-channel-consumers), against the real broker with raw sockets and HTTP: what IDENTIFY grants and refuses, what DPUB
and REQ allow, and what /info and /config report."""

import json
import time

import pytest

from protocols.nsq.codec import encode_command
from tests.support.nsq import http_json, nsq_broker, run_client, v2_connections

OPTIONS = {
    "nsq": {
        "maxHeartbeatInterval": 10000,
        "outputBufferTimeout": 100,
        "minOutputBufferTimeout": 1,
        "maxOutputBufferTimeout": 500,
        "maxOutputBufferSize": 1024,
        "maxMsgTimeout": 5000,
        "msgTimeout": 4000,
        "maxReqTimeout": 2000,
        "maxDeflateLevel": 3,
        "snappy": False,
        "maxChannelConsumers": 2,
    }
}


@pytest.fixture(scope="module")
def nsq(tmp_path_factory):
    with nsq_broker(tmp_path_factory.mktemp("nsqopts") / "broker", OPTIONS) as ports:
        yield ports


@pytest.fixture
def conn(nsq):
    with v2_connections(nsq.tcp) as connect:
        yield connect


def identify(c, **fields):
    c.send(encode_command("IDENTIFY", body=json.dumps(fields).encode()))
    return c.frame()


def test_identify_grants_within_the_configured_bounds(conn):
    t, data = identify(conn(), feature_negotiation=True, output_buffer_timeout=1,
                       heartbeat_interval=10000, msg_timeout=5000, output_buffer_size=1024,
                       snappy=True, deflate=True, deflate_level=9)
    assert t == 0
    reply = json.loads(data)
    assert reply["output_buffer_timeout"] == 1 and reply["output_buffer_size"] == 1024
    assert reply["msg_timeout"] == 5000 and reply["max_msg_timeout"] == 5000
    # --snappy=false: not granted even when asked; deflate is, at most at level 3
    assert reply["snappy"] is False
    assert reply["deflate"] is True and reply["deflate_level"] == 3
    assert reply["max_deflate_level"] == 3


def test_identify_defaults_come_from_the_config(conn):
    t, data = identify(conn(), feature_negotiation=True)
    reply = json.loads(data)
    assert reply["output_buffer_timeout"] == 100 and reply["msg_timeout"] == 4000


@pytest.mark.parametrize("field, value, setting", [
    ("output_buffer_timeout", 501, "output buffer timeout"),
    ("output_buffer_size", 1025, "output buffer size"),
    ("heartbeat_interval", 10001, "heartbeat interval"),
    ("msg_timeout", 5001, "msg timeout"),
])
def test_identify_refuses_beyond_the_configured_bounds(conn, field, value, setting):
    c = conn()
    t, data = identify(c, **{field: value})
    assert (t, data) == (1, b"E_BAD_BODY IDENTIFY %s (%d) is invalid" % (setting.encode(), value))
    assert c.closed()


def test_dpub_and_req_use_max_req_timeout(conn):
    c = conn()
    c.send(encode_command("DPUB", "t_opts", 2001, body=b"x"))
    t, data = c.frame()
    assert t == 1 and data.startswith(b"E_INVALID DPUB timeout 2001 out of range 0-2000")
    p = conn()
    p.send(encode_command("DPUB", "t_opts", 2000, body=b"x"))
    assert p.frame() == (0, b"OK")


def test_http_reports_the_options(nsq):
    status, info = http_json(nsq.http, "GET", "/info")
    assert status == 200
    assert info["max_heartbeat_interval"] == 10_000_000_000
    assert info["max_output_buffer_size"] == 1024
    assert info["max_output_buffer_timeout"] == 500_000_000
    assert info["max_deflate_level"] == 3
    for opt, value in [("max_req_timeout", 2_000_000_000), ("max_msg_timeout", 5_000_000_000),
                       ("msg_timeout", 4_000_000_000), ("output_buffer_timeout", 100_000_000),
                       ("min_output_buffer_timeout", 1_000_000),
                       ("max_output_buffer_timeout", 500_000_000),
                       ("max_output_buffer_size", 1024),
                       ("max_heartbeat_interval", 10_000_000_000),
                       ("max_deflate_level", 3), ("deflate", True), ("snappy", False),
                       ("max_channel_consumers", 2)]:
        assert http_json(nsq.http, "GET", f"/config/{opt}") == (200, value), opt


def test_a_one_ms_buffer_delivers(conn):
    # the least flush interval the config allows is what a consumer may ask for (the
    # default floor, 25 ms, refuses it), and a connection granted it gets its deliveries
    c = conn()
    assert identify(c, output_buffer_timeout=1) == (0, b"OK")
    c.send(b"SUB t_buf ch\nRDY 5\n")
    assert c.frame() == (0, b"OK")
    p = conn()
    p.send(encode_command("PUB", "t_buf", body=b"soon"))
    assert p.frame() == (0, b"OK")
    (m,) = c.messages(1)
    assert m.body == b"soon"


def test_max_channel_consumers(conn):
    """A SUB past nsq.maxChannelConsumers (nsqd's --max-channel-consumers) fails as nsqd
    fails it; a consumer that leaves makes room, and other channels have their own count."""
    first, second = conn(), conn()
    for c in (first, second):
        c.send(b"SUB t_max ch\n")
        assert c.frame() == (0, b"OK")
    third = conn()
    third.send(b"SUB t_max ch\n")
    assert third.frame() == (1, b"E_SUB_FAILED SUB failed consumers for t_max:ch exceeds limit of 2")
    assert third.closed()
    other = conn()
    other.send(b"SUB t_max other\n")
    assert other.frame() == (0, b"OK")
    first.send(b"CLS\n")
    assert first.frame() == (0, b"CLOSE_WAIT")
    first.close()
    for _ in range(50):  # the broker sees the close on its next read
        fourth = conn()
        fourth.send(b"SUB t_max ch\n")
        t, data = fourth.frame()
        if t == 0:
            break
        time.sleep(0.05)
    assert (t, data) == (0, b"OK")


def test_pynsq_reader_with_a_one_ms_buffer_and_capped_deflate(nsq):
    """pynsq's Reader asks for a 1 ms flush and deflate level 9; the broker's options grant
    the flush and level 3 (the raw test above reads the grant), and every message arrives
    through the deflated stream. (Its
    default heartbeat, 30 s, and buffer size, 16 KB, are above this broker's bounds: nsqd
    refuses them too, so both clients ask for what the bounds allow.)"""
    got = run_client("""
import nsq, tornado.ioloop
loop = tornado.ioloop.IOLoop.current()
addr = ["127.0.0.1:%d" % PARAMS["port"]]
loop.call_later(20, loop.stop)
seen = []
def handler(m):
    seen.append(m.body.decode())
    return True
r = nsq.Reader(topic="py_opts", channel="c", nsqd_tcp_addresses=addr, message_handler=handler,
               max_in_flight=50, output_buffer_timeout=1, deflate=True, deflate_level=9,
               heartbeat_interval=10, output_buffer_size=1024)
w = nsq.Writer(addr, heartbeat_interval=10, output_buffer_size=1024)
loop.call_later(1.0, lambda: w.mpub("py_opts", [b"m%d" % i for i in range(100)]))
def check():
    if len(seen) >= 100:
        loop.stop()
    else:
        loop.call_later(0.05, check)
loop.call_later(0.05, check)
loop.start()
conn = list(r.conns.values())[0]
print(json.dumps({"seen": sorted(seen), "deflate": conn.deflate}))
""", port=nsq.tcp)
    assert got["seen"] == sorted("m%d" % i for i in range(100))
    assert got["deflate"] is True
