"""Statistics counted once in the core and read the same through every protocol: NSQ's
/stats, RocketMQ's VIEW_BROKER_STATS_DATA and runtime info, smss TOPIC INFO $stats;
against the real broker with smss, NSQ and RocketMQ doors."""

import json
import time

import pytest

from mqserver.store import format as fmt
from protocols.remoting import codes
from protocols.smss.client import SmssClient
from tests.support.nsq import V2, http, http_json, nsq_listen
from tests.support.remoting_client import RemotingClient, heartbeat_body
from tests.support.server import ServerProcess

pytestmark = pytest.mark.timeout(120)
LOOP = "tcp:0:interface=127.0.0.1"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    listen = dict(nsq_listen(), smss=LOOP, namesrv=LOOP, broker=LOOP)
    s = ServerProcess(tmp_path_factory.mktemp("ops") / "broker", listen=listen).start()
    try:
        yield s
    finally:
        s.stop()
        s.close()


@pytest.fixture
def smss(srv):
    c = SmssClient("127.0.0.1", srv.smss_port)
    yield c
    c.close()


@pytest.fixture
def rmq(srv):
    c = RemotingClient("127.0.0.1", srv.ports["BrokerDoor"])
    yield c
    c.close()


def nsq_topic(srv, topic):
    status, body = http_json(srv.ports["NsqdHttpSite"], "GET", f"/stats?format=json&topic={topic}")
    assert status == 200
    return body["topics"][0]


def rmq_send(c, topic, body, props="TAGS\x01A\x02"):
    r = c.call(codes.SEND_MESSAGE, {
        "producerGroup": "PG", "topic": topic, "defaultTopic": "TBW102",
        "defaultTopicQueueNums": 1, "queueId": 0, "sysFlag": 0,
        "bornTimestamp": int(time.time() * 1000), "flag": 0, "properties": props,
        "reconsumeTimes": 0, "unitMode": "false", "batch": "false"}, body)
    assert r.code == codes.SUCCESS, r.remark
    return r


def broker_stats(c, name, key):
    r = c.call(codes.VIEW_BROKER_STATS_DATA, {"statsName": name, "statsKey": key})
    assert r.code == codes.SUCCESS, r.remark
    return json.loads(r.body)


def test_messages_in_counted_once_whatever_the_protocol(srv, smss, rmq):
    """2 smss, 3 NSQ and 1 RocketMQ messages on one topic count 6 everywhere, with their
    bytes, in NSQ /stats, RocketMQ 315 and smss TOPIC INFO $stats."""
    smss.create("mix")
    smss.publish("mix", [b"s1", b"s22"])
    nsq = V2(srv.ports["NsqdFactory"])
    nsq.send(b"PUB mix\n" + (4).to_bytes(4, "big") + b"n333")
    nsq.send(b"MPUB mix\n" + (4 + 8 + 5 + 8 + 6).to_bytes(4, "big") + (2).to_bytes(4, "big")
             + (5).to_bytes(4, "big") + b"n4444" + (6).to_bytes(4, "big") + b"n55555")
    assert nsq.frames(2) == [(0, b"OK"), (0, b"OK")]
    nsq.sock.close()
    rmq_send(rmq, "mix", b"r666666")
    t = nsq_topic(srv, "mix")
    assert t["message_count"] == 6
    bodies = 2 + 3 + 4 + 5 + 6 + 7
    # NSQ counts body bytes; the RocketMQ message's properties are in its payload
    assert t["message_bytes"] == bodies + len("TAGS\x01A\x02")
    put = broker_stats(rmq, "TOPIC_PUT_NUMS", "mix")
    assert put["statsMinute"]["sum"] == put["statsDay"]["sum"] == 6
    size = broker_stats(rmq, "TOPIC_PUT_SIZE", "mix")["statsMinute"]["sum"]
    overhead = fmt.HEADER_SIZE + 3 + len(b"mix")
    assert size == t["message_bytes"] + 6 * overhead
    info = smss.topic_info("$stats:mix")
    topic = info["topics"][0]
    assert (topic["in_msgs"], topic["in_bytes"]) == (6, size)
    assert topic["in_payload_bytes"] == t["message_bytes"]


def test_channel_message_count_counts_entries_not_deliveries(srv):
    """#19.5: a channel's message_count is what entered it (a REQ does not add to it) and
    the topic's message_bytes counts the bytes published."""
    c = V2(srv.ports["NsqdFactory"])
    c.send(b"SUB req_t ch\n")
    assert c.frame() == (0, b"OK")
    for body in (b"a", b"bb", b"ccc"):
        c.send(b"PUB req_t\n" + len(body).to_bytes(4, "big") + body)
    assert c.frames(3) == [(0, b"OK")] * 3
    c.send(b"RDY 10\n")
    msgs = c.messages(3)
    c.send(b"REQ " + msgs[0].msg_id + b" 0\n")
    again = c.messages(1)[0]
    assert again.attempts == 2
    t = nsq_topic(srv, "req_t")
    ch = t["channels"][0]
    assert (ch["message_count"], ch["requeue_count"]) == (3, 1)
    assert (t["message_count"], t["message_bytes"]) == (3, 6)
    assert ch["clients"][0]["message_count"] == 4  # a client counts its deliveries
    c.sock.close()


def test_rocketmq_pull_counts_group_gets_and_connections(srv, rmq):
    """A pull that returns messages counts GROUP_GET_NUMS/SIZE for topic@group, and the
    broker's runtime info carries clusterList's fields."""
    for i in range(3):
        rmq_send(rmq, "pullT", b"m%d" % i)
    assert rmq.call(codes.HEART_BEAT, {}, heartbeat_body("c1", "G1", ["pullT"])).code == codes.SUCCESS
    r = rmq.call(codes.PULL_MESSAGE, {
        "consumerGroup": "G1", "topic": "pullT", "queueId": 0, "queueOffset": 0,
        "maxMsgNums": 32, "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 0,
        "subscription": "*", "subVersion": 1})
    assert r.code == codes.SUCCESS
    got = broker_stats(rmq, "GROUP_GET_NUMS", "pullT@G1")
    assert got["statsMinute"]["sum"] == 3
    size = broker_stats(rmq, "GROUP_GET_SIZE", "pullT@G1")["statsMinute"]["sum"]
    assert size == len(r.body)
    info = json.loads(rmq.call(codes.GET_BROKER_RUNTIME_INFO).body)["table"]
    for key in ("putTps", "getTransferedTps", "msgPutTotalTodayNow", "msgGetTotalTodayNow",
                "msgPutTotalTodayMorning", "msgPutTotalYesterdayMorning",
                "msgGetTotalTodayMorning", "msgGetTotalYesterdayMorning",
                "sendThreadPoolQueueSize", "pullThreadPoolQueueSize",
                "sendThreadPoolQueueHeadWaitTimeMills", "pullThreadPoolQueueHeadWaitTimeMills",
                "pageCacheLockTimeMills", "earliestMessageTimeStamp", "commitLogDiskRatio",
                "brokerVersionDesc"):
        assert key in info, key
    assert len(info["putTps"].split(" ")) == 3
    assert int(info["msgGetTotalTodayNow"]) >= 3
    assert int(info["msgPutTotalTodayNow"]) >= 3
    float(info["commitLogDiskRatio"])
    with SmssClient("127.0.0.1", srv.smss_port) as smss:
        stats = smss.topic_info("$stats")
    addrs = stats["connections"]["broker"]
    port = rmq.sock.getsockname()[1]
    assert f"127.0.0.1:{port}" in addrs


def test_smss_who_is_a_consumer(srv, smss):
    """An smss subscription shows as a consumer with what it was sent and its lag."""
    smss.create("whoT")
    smss.publish("whoT", [b"x", b"y", b"z"])
    sub = smss.subscribe("whoT", event_id=0, batch=2, who="w1")
    batch = sub.next_batch(5)
    assert len(batch.messages) == 2
    other = SmssClient("127.0.0.1", srv.smss_port)
    topic = other.topic_info("$stats:whoT")["topics"][0]
    (c,) = topic["consumers"]
    assert (c["kind"], c["name"], c["out_msgs"], c["in_flight"], c["lag"]) == ("smss", "w1", 2, 2, 1)
    sub.ack()
    other.close()


def test_unknown_stats_and_http_stats_text(srv):
    """The text /stats still reads (from the same counters)."""
    status, _, body = http(srv.ports["NsqdHttpSite"], "GET", "/stats")
    assert status == 200 and b"Topics:" in body


def _pub_apart(c, topic, bodies):
    """PUB each body in a later millisecond than the one before (distinct store times)."""
    for body in bodies:
        now = int(time.time() * 1000)
        while int(time.time() * 1000) <= now + 1:
            time.sleep(0.001)
        c.send(b"PUB " + topic + b"\n" + len(body).to_bytes(4, "big") + body)
        assert c.frame() == (0, b"OK")


def test_nsq_channel_rewind_by_time_and_event(srv):
    """POST /channel/rewind: in-flight messages are dropped, the live consumer gets every
    message from the point again (first attempt), none before it."""
    port = srv.ports["NsqdHttpSite"]
    pub = V2(srv.ports["NsqdFactory"])
    sub = V2(srv.ports["NsqdFactory"])
    sub.send(b"SUB rw_t ch\nRDY 10\n")
    assert sub.frame() == (0, b"OK")
    _pub_apart(pub, b"rw_t", [b"a", b"b", b"c"])
    a, b, c = sub.messages(3)
    sub.send(b"FIN " + a.msg_id + b"\n")
    status, body = http_json(port, "POST", f"/channel/rewind?topic=rw_t&channel=ch"
                                           f"&timestamp_ms={b.timestamp // 1_000_000}")
    assert status == 200, body
    again = sub.messages(2)
    assert [(m.body, m.attempts) for m in again] == [(b"b", 1), (b"c", 1)]
    ch = nsq_topic(srv, "rw_t")["channels"][0]
    assert ch["in_flight_count"] == 2 and ch["depth"] == 0
    status, _ = http_json(port, "POST", f"/channel/rewind?topic=rw_t&channel=ch"
                                        f"&event_id={int(a.msg_id, 16)}")
    assert status == 200
    assert [m.body for m in sub.messages(3)] == [b"a", b"b", b"c"]
    status, body = http_json(port, "POST", "/channel/rewind?topic=rw_t&channel=ch")
    assert (status, body) == (400, {"message": "MISSING_ARG_TIMESTAMP_MS_OR_EVENT_ID"})
    status, body = http_json(port, "POST", "/channel/rewind?topic=rw_t&channel=no&event_id=1")
    assert (status, body) == (404, {"message": "CHANNEL_NOT_FOUND"})
    pub.sock.close()
    sub.sock.close()
