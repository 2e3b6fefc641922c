"""The RocketMQ door with the binary (ROCKETMQ) header the Java clients send when asked
(C{rocketmq.serialize.type=ROCKETMQ}, as RocketMQ's benchmark Producer does), through a
real socket to the broker process: sends and pulls answered in the same header type, and
a malformed header closing only its connection."""

import struct

import pytest

from protocols.remoting import codes
from protocols.remoting.codec import encode
from protocols.remoting.messages import RemotingCommand
from tests.support.nsq import LOOPBACK
from tests.support.remoting_client import RemotingClient, records
from tests.support.rmq import broker_port
from tests.support.server import ServerProcess


@pytest.fixture
def srv(tmp_path):
    listen = {name: LOOPBACK for name in ("namesrv", "broker")}
    s = ServerProcess(tmp_path / "data", listen=listen)
    with s.start():
        yield s


def _binary(code, ext, body=b"", opaque=1):
    return encode(RemotingCommand(code=code, language="JAVA", version=395, opaque=opaque,
                                  ext_fields=ext, body=body,
                                  serialize_type=codes.SERIALIZE_ROCKETMQ))


def _send_v2(topic, body, opaque):
    # SendMessageRequestHeaderV2's one-letter keys, as the Java client writes them
    ext = {"a": "PG", "b": topic, "c": "TBW102", "d": "4", "e": "0", "f": "0",
           "g": "1795881724177", "h": "0", "i": f"UNIQ_KEY\x01U{opaque}\x02WAIT\x01true\x02",
           "j": "0", "k": "false", "l": "16", "m": "false"}
    return _binary(codes.SEND_MESSAGE_V2, ext, body, opaque)


def _pull_binary(c, topic, opaque):
    """Pull up to 32 messages of queue 0 of C{topic} from offset 0 with a binary-header
    PULL_MESSAGE, as the Java client in ROCKETMQ serialization sends it; the answer."""
    pull = {"consumerGroup": "CG", "topic": topic, "queueId": "0", "queueOffset": "0",
            "maxMsgNums": "32", "sysFlag": "4", "commitOffset": "0",
            "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0",
            "expressionType": "TAG"}
    c.send_raw(_binary(codes.PULL_MESSAGE, pull, opaque=opaque))
    return c.recv(opaque)


def test_java_binary_sends_and_pull_are_answered_in_binary(srv):
    c = RemotingClient("127.0.0.1", broker_port(srv))
    try:
        c.send_raw(_send_v2("BinT", b"first", 1))  # alone: it creates the topic
        first = c.recv(1)
        c.send_raw(_send_v2("BinT", b"second", 2) + _send_v2("BinT", b"third", 5))
        answers = [first, c.recv(2), c.recv(5)]
        for r in answers:
            assert r.code == codes.SUCCESS, r.remark
            assert r.serialize_type == codes.SERIALIZE_ROCKETMQ
        assert [int(r.ext_fields["queueOffset"]) for r in answers] == [0, 1, 2]
        r = _pull_binary(c, "BinT", opaque=3)
        assert r.code == codes.SUCCESS and r.serialize_type == codes.SERIALIZE_ROCKETMQ
        assert [bytes(v.body) for v in records(r.body)] == [b"first", b"second", b"third"]
    finally:
        c.close()


def test_a_malformed_binary_header_closes_its_connection_only(srv):
    # the extFields length says 6 bytes, and 5 follow
    header = struct.pack(">hBhiii", codes.SEND_MESSAGE_V2, 0, 395, 9, 0, 0) + struct.pack(
        ">i", 6) + b"\x00\x01a\x00\x00"
    frame = struct.pack(">II", 4 + len(header), (codes.SERIALIZE_ROCKETMQ << 24) | len(header))
    bad = RemotingClient("127.0.0.1", broker_port(srv))
    try:
        bad.send_raw(frame + header)
        with pytest.raises((ConnectionError, OSError)):
            bad.recv(timeout=10)
    finally:
        bad.close()
    good = RemotingClient("127.0.0.1", broker_port(srv))
    try:
        good.send_raw(_send_v2("BinT", b"after", 4))
        assert good.recv(4).code == codes.SUCCESS
    finally:
        good.close()
    assert "extFields" in srv.current_log()
    assert "Traceback" not in srv.current_log()


def test_pipelined_sends_to_a_new_topic_are_stored_in_their_order(srv):
    # The first send creates the topic and waits for that; the ones behind it on the same
    # connection wait too, as the 4.9.4 broker's send thread takes them one by one.
    c = RemotingClient("127.0.0.1", broker_port(srv))
    try:
        c.send_raw(b"".join(_send_v2("NewT", b"m%d" % i, i) for i in range(1, 6)))
        answers = [c.recv(i) for i in range(1, 6)]
        assert [r.code for r in answers] == [codes.SUCCESS] * 5
        assert [int(r.ext_fields["queueOffset"]) for r in answers] == [0, 1, 2, 3, 4]
        r = _pull_binary(c, "NewT", opaque=9)
        assert [bytes(v.body) for v in records(r.body)] == [b"m1", b"m2", b"m3", b"m4", b"m5"]
    finally:
        c.close()
