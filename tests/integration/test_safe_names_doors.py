"""Names that cannot be directory names are refused by every front door with that
protocol's own error, through raw frames and requests; nothing appears outside the data
directory's consume-queue tree."""

import json
import os
import urllib.parse

import pytest

from protocols.nsq.codec import encode_command, encode_mpub, is_valid_name
from protocols.remoting import codes
from protocols.smss.client import SmssClient, SmssError
from mqserver.store.store import safe_dir_name
from tests.support.nsq import V2, http
from tests.support.remoting_client import RemotingClient
from tests.support.server import ServerProcess
from tests.support.smss import NAME_RULE

L = "tcp:0:interface=127.0.0.1"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    root = tmp_path_factory.mktemp("names")
    s = ServerProcess(root / "data", listen={
        "smss": L, "broker": L, "nsqd_tcp": L, "nsqd_http": L, "lookupd_http": L,
    }).start()
    try:
        yield s
    finally:
        s.stop()
        s.close()


def entries_outside_queues(srv):
    """Directories that are outside the data dir, or under consumequeue/ with a name
    that is not a safe topic directory name."""
    parent, data = os.path.dirname(srv.data), os.path.basename(srv.data)
    out = []
    for d, dirs, _ in os.walk(parent):
        for n in dirs:
            rel = os.path.relpath(os.path.join(d, n), parent)
            if rel != data and not rel.startswith(data + os.sep):
                out.append(rel)
    cq = os.path.join(srv.data, "consumequeue")
    out += [n for n in os.listdir(cq) if n != ".trash" and not safe_dir_name(n)]
    return out


def test_smss_refuses_nul_and_long_names(srv):
    with SmssClient("127.0.0.1", srv.ports["SmssFactory"]) as c:
        for name in (b"a\0b", b"x" * 300, b"../up"):
            with pytest.raises(SmssError) as e:
                c.create(name, 0)
            assert str(e.value) == NAME_RULE
        with pytest.raises(SmssError) as e:
            c.publish(b"../up", [b"m"])
        assert str(e.value) == "topic not exist"
    assert entries_outside_queues(srv) == []


@pytest.mark.parametrize("topic", [b".", b"..", b".hidden"])
def test_nsq_tcp_pub_refuses_dot_topics_as_bad_topic(srv, topic):
    """nsqd's name rule lets a leading dot through; ours refuses it with nsqd's own
    E_BAD_TOPIC (fatal), for PUB, MPUB, DPUB and SUB alike."""
    for verb, frame in [
        ("PUB", encode_command("PUB", topic.decode(), body=b"m")),
        ("MPUB", encode_mpub(topic.decode(), [b"m"])),
        ("DPUB", encode_command("DPUB", topic.decode(), 10, body=b"m")),
        ("SUB", b"SUB " + topic + b" ch\n"),
    ]:
        c = V2(srv.ports["NsqdFactory"])
        try:
            c.send(frame)
            code = b"E_BAD_TOPIC "
            prefix = code + (code if verb == "MPUB" else b"")
            assert c.frame() == (1, prefix + verb.encode() + b' topic name "' + topic + b'" is not valid')
            assert c.closed()
        finally:
            c.close()
    assert entries_outside_queues(srv) == []


@pytest.mark.parametrize("topic", ["..", ".x", "../x", "a/b", "a\0b"])
def test_nsq_http_refuses_unsafe_topics(srv, topic):
    q = urllib.parse.quote(topic, safe="")
    port = srv.ports["NsqdHttpSite"]
    status, _, body = http(port, "POST", f"/pub?topic={q}", b"m")
    assert (status, json.loads(body)) == (400, {"message": "INVALID_TOPIC"})
    status, _, body = http(port, "POST", f"/topic/create?topic={q}")
    assert status == 400 and json.loads(body)["message"].startswith("INVALID")
    status, _, _ = http(srv.ports["LookupdHttpSite"], "POST", f"/topic/create?topic={q}")
    if is_valid_name(topic):
        assert status == 200  # lookupd keeps names in memory only, with nsqd's rule
    else:
        assert status == 400
    assert entries_outside_queues(srv) == []


def test_rocketmq_refuses_unsafe_topics_and_groups(srv):
    c = RemotingClient("127.0.0.1", srv.ports["BrokerDoor"])
    try:
        for topic in ("..", "../x", "a/b", "a\0b", "t" * 128):
            r = c.call(codes.SEND_MESSAGE, {"producerGroup": "pg", "topic": topic, "defaultTopic": "TBW102",
                                            "defaultTopicQueueNums": 4, "queueId": 0, "sysFlag": 0,
                                            "bornTimestamp": 0, "flag": 0, "properties": ""}, b"m")
            assert r.code == codes.MESSAGE_ILLEGAL, (topic, r.remark)
            r = c.call(codes.UPDATE_AND_CREATE_TOPIC, {"topic": topic, "readQueueNums": 1,
                                                       "writeQueueNums": 1, "perm": 6})
            assert r.code == codes.SYSTEM_ERROR and "illegal" in r.remark, (topic, r.remark)
        for group in ("../../g", "a/b", "g\0", "g" * 256):
            # A group's retry topic %RETRY%<group> would be a directory.
            r = c.call(codes.CONSUMER_SEND_MSG_BACK, {"group": group, "offset": 0, "delayLevel": 0,
                                                      "originMsgId": "x", "originTopic": "t"})
            assert r.code == codes.SUBSCRIPTION_GROUP_NOT_EXIST, (group, r.remark)
            r = c.call(codes.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {},
                       json.dumps({"groupName": group}).encode())
            assert r.code == codes.SYSTEM_ERROR and "illegal" in r.remark, (group, r.remark)
            hb = {"clientID": "c1", "producerDataSet": [], "consumerDataSet": [{
                "groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
                "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "subscriptionDataSet": [],
                "unitMode": False}]}
            r = c.call(codes.HEART_BEAT, {}, json.dumps(hb).encode())
            assert r.code == codes.SUCCESS
    finally:
        c.close()
    assert entries_outside_queues(srv) == []
    assert not any(n.startswith("%RETRY%") for n in os.listdir(os.path.join(srv.data, "consumequeue")))
