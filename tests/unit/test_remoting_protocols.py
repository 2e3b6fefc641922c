"""The RocketMQ broker and nameserver protocols in process (StringTransport, a Clock, a
real store): partial frames, multiplexed pipelining, a bad frame mid-stream, one-way
requests, connection loss with work in flight, client expiry and parked pulls on the
clock. Frames follow rocketmq-remoting.md §1."""

import json
import struct

import pytest
from twisted.internet.address import IPv4Address

from protocols.remoting import codes
from protocols.remoting.broker_door import make_factory as broker_factory
from protocols.remoting.codec import encode
from protocols.remoting.framing import FrameDecoder
from protocols.remoting.messages import RemotingCommand
from protocols.remoting.namesrv import NamesrvFactory, make_table
from tests.support.inprocess import Connection, door_fixtures, running

# rocketmq-remoting.md §1.3: a C++ client's GET_ROUTEINFO_BY_TOPIC header, newline included
CPP_ROUTE_HEADER = (b'{"code":105,"extFields":{"AccessKey":"","OnsChannel":"ALIYUN","Signature":'
                    b'"r2KscApgmp4mTbXF2/WzOmrUVqw=","topic":"ProbeTopic"},"flag":0,"language":'
                    b'"CPP","opaque":0,"remark":"","version":63}\n')
CPP_ROUTE_FRAME = struct.pack(">II", 4 + len(CPP_ROUTE_HEADER), len(CPP_ROUTE_HEADER)) \
    + CPP_ROUTE_HEADER


def request(code, opaque, ext=None, body=b"", flag=0):
    return encode(RemotingCommand(code=code, language="JAVA", version=401, opaque=opaque,
                                  flag=flag, ext_fields={k: str(v) for k, v in (ext or {}).items()},
                                  body=body))


def commands(data):
    return FrameDecoder().feed(data)


def send_fields(topic, queue=0, props="TAGS\x01A\x02"):
    return {"producerGroup": "PG", "topic": topic, "defaultTopic": "TBW102",
            "defaultTopicQueueNums": 4, "queueId": queue, "sysFlag": 0, "bornTimestamp": 1,
            "flag": 0, "properties": props, "reconsumeTimes": 0}


def pull_fields(topic, offset, suspend_ms):
    return {"consumerGroup": "G", "topic": topic, "queueId": 0, "queueOffset": offset,
            "maxMsgNums": 32, "sysFlag": 6, "commitOffset": 0,
            "suspendTimeoutMillis": suspend_ms, "subscription": "*", "subVersion": 0}


node, held = door_fixtures(broker_factory)


def test_send_fed_one_byte_at_a_time(node):
    c = node.connect(node.factory)
    c.send_bytewise(request(codes.SEND_MESSAGE, 7, send_fields("T"), b"hello"))
    (r,) = commands(c.take())
    assert (r.code, r.opaque, r.flag) == (codes.SUCCESS, 7, 1)
    assert r.ext_fields["queueId"] == "0" and r.ext_fields["queueOffset"] == "0"
    assert c.connected


def test_a_read_shaped_like_a_frame_is_the_rest_of_the_one_begun(node):
    """A request alone in its read is handled at once (FrameDecoder.whole), but only
    when no frame is begun: here the second read is a whole GET_MAX_OFFSET request by
    itself, and the body of the SEND the first read began."""
    inner = request(codes.GET_MAX_OFFSET, 2, {"topic": "T", "queueId": 0})
    outer = request(codes.SEND_MESSAGE, 1, send_fields("T"), inner)
    c = node.connect(node.factory)
    c.send(outer[:-len(inner)])
    assert c.take() == b""
    c.send(outer[-len(inner):])
    (r,) = commands(c.take())
    assert (r.code, r.opaque) == (codes.SUCCESS, 1)
    assert node.store.queue("T", 0).max_offset == 1
    c.send(inner)  # alone in its read this time: answered at once
    (r,) = commands(c.take())
    assert (r.opaque, r.ext_fields["offset"]) == (2, "1")


def test_pipelined_requests_each_answered_by_opaque(node):
    c = node.connect(node.factory)
    c.send(request(codes.SEND_MESSAGE, 1, send_fields("T"), b"a")
           + request(codes.SEND_MESSAGE, 2, send_fields("T"), b"b")
           + request(9999, 3)
           + request(codes.GET_MAX_OFFSET, 4, {"topic": "T", "queueId": 0}))
    got = {r.opaque: r for r in commands(c.take())}
    assert sorted(got) == [1, 2, 3, 4]
    assert [got[i].code for i in (1, 2)] == [codes.SUCCESS] * 2
    assert (got[3].code, got[3].remark) == (codes.REQUEST_CODE_NOT_SUPPORTED,
                                            " request type 9999 not supported")
    assert got[4].ext_fields["offset"] == "2"
    assert c.connected


def test_one_way_request_is_never_answered(node):
    c = node.connect(node.factory)
    c.send(request(codes.SEND_MESSAGE, 1, send_fields("T"), b"a", flag=codes.FLAG_ONEWAY)
           + request(codes.GET_MAX_OFFSET, 2, {"topic": "T", "queueId": 0}))
    (r,) = commands(c.take())
    assert (r.opaque, r.ext_fields["offset"]) == (2, "1"), "the one-way send was stored"


@pytest.mark.parametrize("bad", [
    struct.pack(">II", 4 + 3, 3) + b"{x}",  # undecodable JSON header
    struct.pack(">I", 16 << 20),  # over the 16 MiB frame limit, refused before its bytes
], ids=["bad-json-header", "over-16MiB"])
def test_bad_frame_after_good_ones_answers_them_then_closes(node, bad):
    c = node.connect(node.factory)
    c.send(request(codes.SEND_MESSAGE, 1, send_fields("T"), b"a") + bad
           + request(codes.SEND_MESSAGE, 2, send_fields("T"), b"b"))
    assert [r.opaque for r in commands(c.take())] == [1]
    assert not c.connected
    assert node.store.queue("T", 0).max_offset == 1


def test_send_answered_after_fsync_and_lost_connection_keeps_the_message(held):
    c = held.connect(held.factory)
    c.send(request(codes.SEND_MESSAGE, 1, send_fields("T"), b"a"))
    held.runner.release()  # the topic's creation, then the message
    held.runner.release()
    assert [r.code for r in commands(c.take())] == [codes.SUCCESS]
    c.send(request(codes.SEND_MESSAGE, 2, send_fields("T"), b"b")
           + request(codes.GET_MAX_OFFSET, 3, {"topic": "T", "queueId": 0}))
    (r,) = commands(c.take())
    assert r.opaque == 3, "responses go out when ready, matched by opaque"
    c.lose()
    held.runner.release()
    assert c.take() == b""
    d = held.connect(held.factory)
    d.send(request(codes.GET_MAX_OFFSET, 4, {"topic": "T", "queueId": 0}))
    (r,) = commands(d.take())
    assert r.ext_fields["offset"] == "2"


def test_parked_pull_of_a_lost_connection_is_dropped(node):
    c = node.connect(node.factory)
    c.send(request(codes.SEND_MESSAGE, 1, send_fields("T"), b"a"))
    c.take()
    c.send(request(codes.PULL_MESSAGE, 2, pull_fields("T", 1, 20000)))
    assert c.take() == b"", "parked: nothing new to pull"
    c.lose()
    p = node.connect(node.factory)
    p.send(request(codes.SEND_MESSAGE, 3, send_fields("T"), b"b"))
    assert [r.code for r in commands(p.take())] == [codes.SUCCESS]
    node.clock.advance(21)
    assert c.take() == b""


def heartbeat(opaque, client_id, group="G"):
    body = json.dumps({"clientID": client_id, "producerDataSet": [], "consumerDataSet": [{
        "groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
        "subscriptionDataSet": [{"topic": "T", "subString": "*", "tagsSet": [],
                                 "codeSet": [], "subVersion": 0}]}]}).encode()
    return request(codes.HEART_BEAT, opaque, body=body)


def consumer_ids(node):
    q = node.connect(node.factory)
    q.send(request(codes.GET_CONSUMER_LIST_BY_GROUP, 99, {"consumerGroup": "G"}))
    (r,) = commands(q.take())
    q.lose()
    return json.loads(r.body)["consumerIdList"] if r.code == codes.SUCCESS else []


def notified(conn):
    return [(r.code, r.ext_fields.get("consumerGroup"), r.flag) for r in commands(conn.take())
            if not r.is_response()]


def test_consumer_lost_or_silent_is_dropped_and_the_group_told(node):
    a, b = node.connect(node.factory), node.connect(node.factory)
    a.send(heartbeat(1, "A"))
    b.send(heartbeat(1, "B"))
    a.take(), b.take()
    assert consumer_ids(node) == ["A", "B"]
    note = (codes.NOTIFY_CONSUMER_IDS_CHANGED, "G", codes.FLAG_ONEWAY)
    # silent for over 120 s: the 30 s expiry scan drops it
    node.clock.advance(100)
    b.send(heartbeat(2, "B"))
    b.take()
    node.clock.advance(59)
    assert consumer_ids(node) == ["B"]
    assert notified(b) == [note]
    assert a.connected, "expiry drops the client, not its connection"
    # heartbeat again, then the connection goes: dropped at once
    a.send(heartbeat(3, "A"))
    a.take(), b.take()
    a.lose()
    assert consumer_ids(node) == ["B"]
    assert notified(b) == [note]


# -- nameserver ------------------------------------------------------------------------------

REGISTER_BODY = json.dumps({"topicConfigSerializeWrapper": {"topicConfigTable": {
    "ProbeTopic": {"topicName": "ProbeTopic", "readQueueNums": 4, "writeQueueNums": 4,
                   "perm": 6}}, "dataVersion": {"counter": 1, "timestamp": 1}},
    "filterServerList": []}).encode()
REGISTER = {"brokerName": "b1", "brokerAddr": "127.0.0.1:10911", "clusterName": "C",
            "haServerAddr": "", "brokerId": 0, "compressed": "false"}


@pytest.fixture
def namesrv(tmp_path):
    def door(broker, config, reactor):
        return NamesrvFactory(make_table(config, reactor))

    with running(tmp_path / "data", door) as n:
        yield n


def test_namesrv_cpp_route_request_fed_one_byte_at_a_time(namesrv):
    c = namesrv.connect(namesrv.factory)
    c.send_bytewise(CPP_ROUTE_FRAME)
    out = c.take()
    (length, w) = struct.unpack_from(">II", out)
    assert length == len(out) - 4 and w >> 24 == 0, "JSON, as the request was"
    header = json.loads(out[8:8 + w])
    assert (header["code"], header["flag"], header["opaque"]) == (codes.TOPIC_NOT_EXIST, 1, 0)
    assert header["remark"] == "No topic route info in name server for the topic: ProbeTopic"


def test_namesrv_pipelined_register_then_route(namesrv):
    c = namesrv.connect(namesrv.factory)
    c.send(request(codes.REGISTER_BROKER, 1, REGISTER, REGISTER_BODY) + CPP_ROUTE_FRAME)
    reg, route = commands(c.take())
    assert (reg.opaque, reg.code, route.opaque, route.code) == (1, codes.SUCCESS, 0, codes.SUCCESS)
    data = json.loads(route.body)
    assert data["brokerDatas"][0]["brokerAddrs"] == {"0": "127.0.0.1:10911"}


def test_namesrv_bad_frame_mid_stream_closes(namesrv):
    c = namesrv.connect(namesrv.factory)
    c.send(CPP_ROUTE_FRAME + struct.pack(">II", 5, 0x05000001) + b"x" + CPP_ROUTE_FRAME)
    assert [r.opaque for r in commands(c.take())] == [0]
    assert not c.connected


def test_namesrv_broker_expires_without_heartbeat_and_goes_with_its_connection(namesrv):
    b = namesrv.connect(namesrv.factory)
    b.send(request(codes.REGISTER_BROKER, 1, REGISTER, REGISTER_BODY))
    b.take()
    q = namesrv.connect(namesrv.factory)

    def route_code():
        q.send(CPP_ROUTE_FRAME)
        (r,) = commands(q.take())
        return r.code

    namesrv.clock.advance(110)
    assert route_code() == codes.SUCCESS
    b.send(request(codes.REGISTER_BROKER, 2, REGISTER, REGISTER_BODY))  # the 30 s refresh
    namesrv.clock.advance(110)
    assert route_code() == codes.SUCCESS
    namesrv.clock.advance(21)
    assert route_code() == codes.TOPIC_NOT_EXIST, "over 120 s silent: expired by the scan"
    b.send(request(codes.REGISTER_BROKER, 3, REGISTER, REGISTER_BODY))
    assert route_code() == codes.SUCCESS
    b.lose()
    assert route_code() == codes.TOPIC_NOT_EXIST


class _Bound:
    """The listening port a broker door is told about (L{BrokerDoor.listening})."""

    def getHost(self):
        return IPv4Address("TCP", "127.0.0.1", 10911)


def test_created_topic_answered_once_the_nameserver_acknowledged_it(tmp_path):
    """UPDATE_AND_CREATE_TOPIC is answered only after the nameserver answered the
    registration carrying the new topic (4.9's registerIncrementBrokerData waits for the
    nameservers): a client that asks the nameserver next finds the route."""
    with running(tmp_path / "data", broker_factory, config={"rocketmq": {"namesrvAddr": "127.0.0.1:9876"}}) as node:
        node.factory.listening(_Bound())
        host, port, factory = node.clock.tcpClients[-1][:3]
        assert (host, port) == ("127.0.0.1", 9876)
        ns = Connection(factory.buildProtocol(IPv4Address("TCP", host, port)))

        def registrations():
            return [c for c in commands(ns.take()) if c.code == codes.REGISTER_BROKER]

        def answer(reg):
            ns.send(encode(RemotingCommand(code=codes.SUCCESS, opaque=reg.opaque, flag=codes.FLAG_RESPONSE)))

        (first,) = registrations()
        answer(first)
        admin = node.connect(node.factory)
        admin.send(request(codes.UPDATE_AND_CREATE_TOPIC, 5, {
            "topic": "NewT", "defaultTopic": "TBW102", "readQueueNums": 2, "writeQueueNums": 2,
            "perm": 6, "topicFilterType": "SINGLE_TAG", "order": "false"}))
        node.clock.advance(0)
        (reg,) = registrations()
        assert "NewT" in json.loads(reg.body)["topicConfigSerializeWrapper"]["topicConfigTable"]
        assert admin.take() == b"", "answered before the nameserver has the topic"
        answer(reg)
        (r,) = commands(admin.take())
        assert (r.opaque, r.code) == (5, codes.SUCCESS)
