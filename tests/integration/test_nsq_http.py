"""nsqd HTTP API and the embedded nsqlookupd HTTP API: shapes, errors, admin actions,
pause/unpause and ephemeral channels, against the real broker."""

import json
import struct
import time

import pytest

from tests.support.nsq import V2, http, http_json, nsq_broker


@pytest.fixture(scope="module")
def nsq(tmp_path_factory):
    with nsq_broker(tmp_path_factory.mktemp("nsqhttp") / "broker") as ports:
        yield ports


def topic_stats(nsq, topic):
    status, body = http_json(nsq.http, "GET", f"/stats?format=json&topic={topic}")
    assert status == 200
    return body["topics"][0]


def test_ping_info_and_headers(nsq):
    status, headers, body = http(nsq.http, "GET", "/ping")
    assert (status, body) == (200, b"OK")
    status, headers, body = http(nsq.http, "GET", "/info")
    info = json.loads(body)
    assert headers["x-nsq-content-type"] == "nsq; version=1.0"
    assert info["tcp_port"] == nsq.tcp and info["http_port"] == nsq.http
    assert info["max_heartbeat_interval"] == 60_000_000_000


def test_pub_and_mpub_text_and_binary(nsq):
    assert http(nsq.http, "POST", "/pub?topic=h_pub", b"one")[::2] == (200, b"OK")
    assert http(nsq.http, "POST", "/mpub?topic=h_pub", b"two\nthree\n\nfour\n")[::2] == (200, b"OK")
    binary = struct.pack(">I", 2) + struct.pack(">I", 4) + b"fi\nv" + struct.pack(">I", 3) + b"six"
    assert http(nsq.http, "POST", "/mpub?topic=h_pub&binary=true", binary)[::2] == (200, b"OK")
    assert topic_stats(nsq, "h_pub")["depth"] == 6
    c = V2(nsq.tcp)
    c.send(b"SUB h_pub ch\nRDY 10\n")
    assert c.frame() == (0, b"OK")
    assert [m.body for m in c.messages(6)] == [b"one", b"two", b"three", b"four", b"fi\nv", b"six"]
    c.close()


@pytest.mark.parametrize("method, path, body, status, code", [
    ("POST", "/pub", b"x", 400, "MISSING_ARG_TOPIC"),
    ("POST", "/pub?topic=bad!", b"x", 400, "INVALID_TOPIC"),
    ("POST", "/pub?topic=t", b"", 400, "MSG_EMPTY"),
    ("POST", "/pub?topic=t&defer=3600001", b"x", 400, "INVALID_DEFER"),
    # (a /pub body over the limit is refused from its head: test_http_bodies.py)
    ("POST", "/mpub?topic=t", b"x" * 1048577, 413, "MSG_TOO_BIG"),
    ("GET", "/pub?topic=t", None, 405, "METHOD_NOT_ALLOWED"),
    ("GET", "/nope", None, 404, "NOT_FOUND"),
    ("POST", "/mpub?topic=t&binary=true", b"\x00\x00", 413, "BAD_BODY"),
    ("POST", "/topic/delete?topic=never_made", None, 404, "TOPIC_NOT_FOUND"),
    ("POST", "/channel/create?topic=never_made&channel=c", None, 404, "TOPIC_NOT_FOUND"),
    ("POST", "/channel/create?topic=t", None, 400, "MISSING_ARG_CHANNEL"),
    ("GET", "/config/no_such_option", None, 400, "INVALID_OPTION"),
])
def test_http_errors_are_json(nsq, method, path, body, status, code):
    got_status, headers, data = http(nsq.http, method, path, body)
    assert (got_status, json.loads(data)) == (status, {"message": code})
    assert headers["x-nsq-content-type"] == "nsq; version=1.0"


def test_stats_shapes(nsq):
    http(nsq.http, "POST", "/topic/create?topic=h_stats")
    http(nsq.http, "POST", "/channel/create?topic=h_stats&channel=c1")
    status, body = http_json(nsq.http, "GET", "/stats?format=json")
    # nsqd's keys, plus mqserver's "replication" (role, applied eventId, lag).
    assert set(body) == {"version", "health", "start_time", "topics", "memory", "producers",
                         "replication"}
    assert body["replication"]["role"] == "master"
    t = [t for t in body["topics"] if t["topic_name"] == "h_stats"][0]
    assert set(t) >= {"topic_name", "channels", "depth", "backend_depth", "message_count",
                      "message_bytes", "paused", "e2e_processing_latency"}
    ch = t["channels"][0]
    assert set(ch) >= {"channel_name", "depth", "backend_depth", "in_flight_count",
                       "deferred_count", "message_count", "requeue_count", "timeout_count",
                       "client_count", "clients", "paused", "e2e_processing_latency"}
    assert http_json(nsq.http, "GET", "/stats?format=json&topic=absent")[1]["topics"] is None
    body = http_json(nsq.http, "GET", "/stats?format=json&include_clients=false")[1]
    assert body["producers"] is None
    assert all(c["clients"] is None for t in body["topics"] for c in t["channels"])
    text = http(nsq.http, "GET", "/stats")[2].decode()
    assert "Health: OK" in text and "[h_stats" in text and "[c1" in text


def test_config_durations_in_ns(nsq):
    assert http_json(nsq.http, "GET", "/config/msg_timeout") == (200, 60_000_000_000)
    assert http_json(nsq.http, "GET", "/config/nsqlookupd_tcp_addresses") == (200, [])


def test_topic_and_channel_admin(nsq):
    assert http(nsq.http, "POST", "/topic/create?topic=h_adm")[0] == 200
    assert http(nsq.http, "POST", "/channel/create?topic=h_adm&channel=a")[0] == 200
    http(nsq.http, "POST", "/mpub?topic=h_adm", b"1\n2\n3")
    assert topic_stats(nsq, "h_adm")["channels"][0]["depth"] == 3
    assert http(nsq.http, "POST", "/channel/empty?topic=h_adm&channel=a")[0] == 200
    assert topic_stats(nsq, "h_adm")["channels"][0]["depth"] == 0
    assert http(nsq.http, "POST", "/channel/delete?topic=h_adm&channel=a")[0] == 200
    assert topic_stats(nsq, "h_adm")["channels"] == []
    assert http(nsq.http, "POST", "/topic/delete?topic=h_adm")[0] == 200
    assert http_json(nsq.http, "GET", "/stats?format=json&topic=h_adm")[1]["topics"] is None


def test_topic_without_channel_keeps_backlog_for_first_channel(nsq):
    http(nsq.http, "POST", "/mpub?topic=h_backlog", b"a\nb")
    assert topic_stats(nsq, "h_backlog")["depth"] == 2
    first = V2(nsq.tcp)
    first.send(b"SUB h_backlog first\nRDY 5\n")
    assert first.frame() == (0, b"OK")
    assert [m.body for m in first.messages(2)] == [b"a", b"b"]
    later = V2(nsq.tcp)
    later.send(b"SUB h_backlog later\nRDY 5\n")  # a later channel gets messages from now on
    assert later.frame() == (0, b"OK")
    http(nsq.http, "POST", "/pub?topic=h_backlog", b"c")
    assert [m.body for m in later.messages(1)] == [b"c"]
    first.close()
    later.close()


def test_pause_and_unpause_channel_and_topic(nsq):
    c = V2(nsq.tcp)
    c.send(b"SUB h_pause ch\nRDY 5\n")
    assert c.frame() == (0, b"OK")
    assert http(nsq.http, "POST", "/channel/pause?topic=h_pause&channel=ch")[0] == 200
    http(nsq.http, "POST", "/pub?topic=h_pause", b"held")
    assert topic_stats(nsq, "h_pause")["channels"][0]["paused"] is True
    c.sock.settimeout(0.5)
    assert c.closed() is False and c.pending == []
    assert http(nsq.http, "POST", "/channel/unpause?topic=h_pause&channel=ch")[0] == 200
    c.sock.settimeout(10)
    (m,) = c.messages(1)
    assert m.body == b"held"
    c.send(b"FIN " + m.msg_id + b"\n")
    assert http(nsq.http, "POST", "/topic/pause?topic=h_pause")[0] == 200
    assert topic_stats(nsq, "h_pause")["paused"] is True
    http(nsq.http, "POST", "/pub?topic=h_pause", b"held2")
    c.sock.settimeout(0.5)
    assert c.closed() is False and c.pending == []
    assert http(nsq.http, "POST", "/topic/unpause?topic=h_pause")[0] == 200
    c.sock.settimeout(10)
    assert c.messages(1)[0].body == b"held2"
    c.close()


def test_ephemeral_channel_goes_with_its_last_client(nsq):
    http(nsq.http, "POST", "/topic/create?topic=h_eph")
    c = V2(nsq.tcp)
    c.send(b"SUB h_eph tmp#ephemeral\n")
    assert c.frame() == (0, b"OK")
    names = [ch["channel_name"] for ch in topic_stats(nsq, "h_eph")["channels"]]
    assert names == ["tmp#ephemeral"]
    c.close()
    deadline = time.monotonic() + 10
    while topic_stats(nsq, "h_eph")["channels"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert topic_stats(nsq, "h_eph")["channels"] == []


def test_embedded_lookupd_http(nsq):
    http(nsq.http, "POST", "/topic/create?topic=h_lk")
    http(nsq.http, "POST", "/channel/create?topic=h_lk&channel=c")
    status, body = http_json(nsq.lookupd_http, "GET", "/lookup?topic=h_lk")
    assert status == 200 and body["channels"] == ["c"]
    (p,) = body["producers"]
    assert (p["broadcast_address"], p["tcp_port"], p["http_port"]) == ("127.0.0.1", nsq.tcp, nsq.http)
    assert http_json(nsq.lookupd_http, "GET", "/lookup?topic=nope") == (404, {"message": "TOPIC_NOT_FOUND"})
    assert http_json(nsq.lookupd_http, "GET", "/lookup") == (400, {"message": "MISSING_ARG_TOPIC"})
    assert "h_lk" in http_json(nsq.lookupd_http, "GET", "/topics")[1]["topics"]
    assert http_json(nsq.lookupd_http, "GET", "/channels?topic=h_lk")[1] == {"channels": ["c"]}
    nodes = http_json(nsq.lookupd_http, "GET", "/nodes")[1]["producers"]
    assert nodes[0]["tcp_port"] == nsq.tcp and "h_lk" in nodes[0]["topics"]
    assert http(nsq.lookupd_http, "GET", "/ping")[::2] == (200, b"OK")
    assert http_json(nsq.lookupd_http, "GET", "/info") == (200, {"version": "1.3.0"})


def test_embedded_lookupd_admin_and_tombstone(nsq):
    lk = nsq.lookupd_http
    assert http(lk, "POST", "/topic/create?topic=lk_only")[0] == 200
    assert http(lk, "POST", "/channel/create?topic=lk_only&channel=c")[0] == 200
    assert http_json(lk, "GET", "/lookup?topic=lk_only")[1] == {"channels": ["c"], "producers": []}
    assert http(lk, "POST", "/channel/delete?topic=lk_only&channel=c")[0] == 200
    assert http_json(lk, "POST", "/channel/delete?topic=lk_only&channel=c") == (
        404, {"message": "CHANNEL_NOT_FOUND"})
    assert http(lk, "POST", "/topic/delete?topic=lk_only")[0] == 200
    assert http_json(lk, "GET", "/lookup?topic=lk_only")[0] == 404
    assert http_json(lk, "POST", "/topic/create") == (400, {"message": "MISSING_ARG_TOPIC"})
    # tombstoning this broker hides it from lookups of that topic
    http(nsq.http, "POST", "/topic/create?topic=lk_tomb")
    assert len(http_json(lk, "GET", "/lookup?topic=lk_tomb")[1]["producers"]) == 1
    assert http(lk, "POST", f"/topic/tombstone?topic=lk_tomb&node=127.0.0.1:{nsq.http}")[0] == 200
    assert http_json(lk, "GET", "/lookup?topic=lk_tomb")[1]["producers"] == []
    nodes = http_json(lk, "GET", "/nodes")[1]["producers"]
    flags = dict(zip(nodes[0]["topics"], nodes[0]["tombstones"]))
    assert flags["lk_tomb"] is True


def test_sample_rate_drops_most_messages(nsq):
    http(nsq.http, "POST", "/topic/create?topic=h_sample")
    c = V2(nsq.tcp)
    c.send(b"IDENTIFY\n" + struct.pack(">I", 17) + b'{"sample_rate":1}')
    assert c.frame() == (0, b"OK")
    c.send(b"SUB h_sample ch\nRDY 2500\n")
    assert c.frame() == (0, b"OK")
    http(nsq.http, "POST", "/mpub?topic=h_sample", b"\n".join(b"%d" % i for i in range(300)))
    deadline = time.monotonic() + 10
    ch = None
    while time.monotonic() < deadline:
        ch = topic_stats(nsq, "h_sample")["channels"][0]
        if ch["depth"] == 0:
            break
        time.sleep(0.05)
    assert ch["depth"] == 0 and ch["in_flight_count"] < 300  # sampled out: consumed, not sent
    c.close()


def test_topic_empty_drops_the_backlog_of_a_channel_less_topic(nsq):
    http(nsq.http, "POST", "/mpub?topic=h_tempty", b"old1\nold2")
    assert topic_stats(nsq, "h_tempty")["depth"] == 2
    assert http(nsq.http, "POST", "/topic/empty?topic=h_tempty")[0] == 200
    assert topic_stats(nsq, "h_tempty")["depth"] == 0
    http(nsq.http, "POST", "/pub?topic=h_tempty", b"new")
    c = V2(nsq.tcp)
    c.send(b"SUB h_tempty ch\nRDY 5\n")
    assert c.frame() == (0, b"OK")
    assert [m.body for m in c.messages(1)] == [b"new"]
    c.close()


def test_ephemeral_topic_goes_with_its_last_channel(nsq):
    c = V2(nsq.tcp)
    c.send(b"SUB h_et#ephemeral c#ephemeral\n")
    assert c.frame() == (0, b"OK")
    assert http_json(nsq.http, "GET", "/stats?format=json&topic=h_et%23ephemeral")[1]["topics"]
    c.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if http_json(nsq.http, "GET", "/stats?format=json&topic=h_et%23ephemeral")[1]["topics"] is None:
            break
        time.sleep(0.05)
    assert http_json(nsq.http, "GET", "/stats?format=json&topic=h_et%23ephemeral")[1]["topics"] is None
