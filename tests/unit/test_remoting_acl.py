"""RocketMQ 4.9 plain ACL: signatures as the clients compute them, the file, the checks
and the broker's refusal remarks; the broker door's requests checked in process."""

import pytest
from twisted.internet.address import IPv4Address

from protocols.remoting import codes
from protocols.remoting.acl import (AclConfigError, AclError, PlainAcl, address_matcher,
                                    resources, sign)
from protocols.remoting.broker_door import make_factory
from protocols.remoting.codec import decode_json_header, encode
from protocols.remoting.framing import FrameDecoder
from protocols.remoting.messages import RemotingCommand
from protocols.remoting.server import RemotingProtocol, error
from tests.support.inprocess import Connection, running

# C++ client frames: empty credentials still sign.
SEND_HEADER = (
    '{"code":10,"extFields":{"AccessKey":"","OnsChannel":"ALIYUN","Signature":"Rwo1VMtUh7Uja96UGKQ1zzxnyqk=",'
    '"batch":"0","bornTimestamp":"1795267749004","defaultTopic":"TBW102","defaultTopicQueueNums":4,"flag":0,'
    '"producerGroup":"PID_PROBE","properties":"KEYS\\u0001k1\\u0002TAGS\\u0001TagA\\u0002UNIQ_KEY\\u0001'
    '0100007F0000799700000C47416F0100\\u0002WAIT\\u0001true\\u0002","queueId":0,"reconsumeTimes":"0",'
    '"sysFlag":0,"topic":"ProbeTopic","unitMode":"0"},"flag":0,"language":"CPP","opaque":1,"remark":"",'
    '"version":63}\n')

ACL = """
globalWhiteRemoteAddresses:
  - 10.10.103.*
accounts:
  - accessKey: RocketMQ
    secretKey: 12345678
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - topicA=DENY
      - topicB=PUB|SUB
      - topicC=SUB
    groupPerms:
      - groupA=DENY
      - groupB=PUB|SUB
  - accessKey: rocketmq2
    secretKey: 87654321
    whiteRemoteAddress: 192.168.1.*
    admin: true
"""


def test_signatures_of_the_cpp_client_frames():
    assert sign(b"", {"AccessKey": "", "OnsChannel": "ALIYUN", "topic": "ProbeTopic",
                      "Signature": "ignored"}, b"") == "r2KscApgmp4mTbXF2/WzOmrUVqw="
    cmd = decode_json_header(SEND_HEADER.encode(), b"hello")
    assert sign(b"", cmd.ext_fields, cmd.body) == "Rwo1VMtUh7Uja96UGKQ1zzxnyqk="


@pytest.mark.parametrize("pattern, yes, no", [
    ("*", ["1.2.3.4"], []),
    ("", [], ["127.0.0.1"]),
    ("192.168.1.*", ["192.168.1.7"], ["192.168.2.7"]),
    ("192.168.*", ["192.168.9.9"], ["192.169.0.1"]),
    ("10.0.0.1-5", ["10.0.0.5"], ["10.0.0.6"]),
    ("10.0.0.{1,3}", ["10.0.0.3"], ["10.0.0.2"]),
    ("1.1.1.1,2.2.2.2", ["2.2.2.2"], ["3.3.3.3"]),
    ("127.0.0.1", ["127.0.0.1"], ["127.0.0.2"]),
])
def test_white_addresses(pattern, yes, no):
    m = address_matcher(pattern)
    assert all(m(ip) for ip in yes) and not any(m(ip) for ip in no)


def acl_in(tmp_path, text=ACL):
    path = tmp_path / "plain_acl.yml"
    path.write_text(text)
    now = [0.0]
    return PlainAcl(str(path), lambda: now[0], check_interval=1.0), path, now


def signed(code, ext, body=b"", ak="RocketMQ", sk=b"12345678"):
    ext = dict(ext, AccessKey=ak)
    ext["Signature"] = sign(sk, ext, body)
    return RemotingCommand(code=code, ext_fields=ext, body=body)


def refusal(acl, cmd, ip="127.0.0.1"):
    with pytest.raises(AclError) as e:
        acl.validate(cmd, ip)
    return e.value.remark()


def test_unsigned_unknown_and_badly_signed(tmp_path):
    acl, _, _ = acl_in(tmp_path)
    send = {"topic": "topicB", "producerGroup": "pg"}
    assert refusal(acl, RemotingCommand(code=10, ext_fields=send)) == (
        "org.apache.rocketmq.acl.common.AclException: No accessKey is configured, "
        "org.apache.rocketmq.acl.plain.PlainPermissionManager.validate(PlainPermissionManager.java:663)")
    assert "No acl config for nobody" in refusal(acl, signed(10, send, ak="nobody"))
    bad = signed(10, send, b"body")
    bad.body = b"other body"
    assert "Check signature failed for accessKey=RocketMQ" in refusal(acl, bad)
    odd = signed(10, send)
    odd.ext_fields["Signature"] = "sïgnature"  # not ASCII: refused, not a crash
    assert "Check signature failed" in refusal(acl, odd)
    acl.validate(signed(10, send, b"body"), "127.0.0.1")
    acl.validate(RemotingCommand(code=10, ext_fields=send), "10.10.103.9")  # global white
    acl.validate(RemotingCommand(code=17, ext_fields={"AccessKey": "rocketmq2"}), "192.168.1.4")


def test_topic_and_group_permissions(tmp_path):
    acl, _, _ = acl_in(tmp_path)
    ok = lambda cmd: acl.validate(cmd, "127.0.0.1")  # noqa: E731
    ok(signed(10, {"topic": "topicB"}))
    assert refusal(acl, signed(10, {"topic": "topicC"})).startswith(
        "org.apache.rocketmq.acl.common.AclException: No default permission for topic:topicC, ")
    assert "for topic:topicA" in refusal(acl, signed(310, {"b": "topicA", "a": "pg"}))
    assert "for topic:other" in refusal(acl, signed(10, {"topic": "other"}))  # default DENY
    pull = {"topic": "topicC", "consumerGroup": "groupX"}
    ok(signed(11, pull))  # topicC=SUB, groups default SUB
    assert "for group:groupA" in refusal(acl, signed(11, dict(pull, consumerGroup="groupA")))
    assert "Need admin permission for request code=17" in refusal(acl, signed(17, {"topic": "t"}))
    ok(signed(17, {"topic": "t"}, ak="rocketmq2", sk=b"87654321"))


def test_heartbeat_resources():
    body = b'{"clientID":"c","consumerDataSet":[{"groupName":"g","subscriptionDataSet":[{"topic":"t"}]}]}'
    assert resources(RemotingCommand(code=codes.HEART_BEAT, body=body)) == {"%RETRY%g": 8, "t": 8}


def test_file_is_reloaded_when_it_changes_and_a_broken_one_is_ignored(tmp_path):
    acl, path, now = acl_in(tmp_path)
    cmd = signed(10, {"topic": "topicC"})
    refusal(acl, cmd)
    path.write_text(ACL.replace("topicC=SUB", "topicC=PUB"))
    refusal(acl, cmd)  # within the check interval: the old rules
    now[0] = 1.0
    acl.validate(cmd, "127.0.0.1")
    path.write_text("accounts: [{accessKey: short, secretKey: x}]")
    now[0] = 2.0
    acl.validate(cmd, "127.0.0.1")  # broken file: the last good rules stay


def test_broken_files_are_refused(tmp_path):
    for text in ("accounts: [{accessKey: RocketMQ, secretKey: short}]", "accounts: [{", "- a list"):
        with pytest.raises(AclConfigError):
            acl_in(tmp_path, text)
    with pytest.raises(AclConfigError):
        acl_in(tmp_path, ACL.replace("topicA=DENY", "topicA"))


class _Counting(RemotingProtocol):
    """A remoting server whose one handler counts the requests it ran."""

    handlers = {codes.GET_BROKER_CLUSTER_INFO: "info"}

    def __init__(self):
        super().__init__()
        self.ran = []

    def info(self, cmd):
        self.ran.append(cmd.opaque)
        return error(cmd, codes.SUCCESS, "ran")


def test_admit_answers_a_refused_request_instead_of_its_handler():
    """The protocol's C{admit} check runs before every request's handler; its answer
    replaces the handler's. Answers to this side's own requests are not checked."""
    p = _Counting()
    seen = []

    def admit(cmd):
        seen.append(cmd.opaque)
        return error(cmd, codes.NO_PERMISSION, "no") if cmd.opaque % 2 else None

    p.admit = admit
    c = Connection(p)
    frames = b"".join(encode(RemotingCommand(code=codes.GET_BROKER_CLUSTER_INFO, opaque=n))
                      for n in (1, 2, 3))
    c.send(frames)
    answers = FrameDecoder().feed(c.take())
    assert [(a.opaque, a.code, a.remark) for a in answers] == [
        (1, codes.NO_PERMISSION, "no"), (2, codes.SUCCESS, "ran"), (3, codes.NO_PERMISSION, "no")]
    assert p.ran == [2] and seen == [1, 2, 3]
    d = p.request(codes.GET_BROKER_CLUSTER_INFO)
    (sent,) = FrameDecoder().feed(c.take())
    got = []
    d.addCallback(got.append)
    c.send(encode(RemotingCommand(code=codes.SUCCESS, opaque=sent.opaque, flag=1)))
    assert [g.opaque for g in got] == [sent.opaque] and seen == [1, 2, 3]


def test_broker_door_with_acl_checks_each_request_from_its_peer_address(tmp_path):
    """With C{rocketmq.aclEnable} the broker door answers an unsigned request with the
    broker's refusal, serves a signed one, and lets a globally white address through."""
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL)
    config = {"rocketmq": {"aclEnable": True, "aclFile": str(path)}}
    with running(tmp_path / "data", make_factory, config=config) as node:
        send = {"producerGroup": "pg", "topic": "topicB", "defaultTopic": "TBW102",
                "defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": "0",
                "bornTimestamp": "1", "flag": "0", "reconsumeTimes": "0"}

        def ask(peer, cmd):
            c = node.connect(node.factory, IPv4Address("TCP", peer, 5000))
            cmd.opaque = 9
            c.send(encode(cmd))
            (answer,) = FrameDecoder().feed(c.take())
            return answer

        refused = ask("127.0.0.1", RemotingCommand(code=codes.SEND_MESSAGE, ext_fields=dict(send), body=b"m"))
        assert (refused.code, refused.opaque) == (codes.SYSTEM_ERROR, 9)
        assert refused.remark.startswith(
            "org.apache.rocketmq.acl.common.AclException: No accessKey is configured, ")
        assert ask("127.0.0.1", signed(codes.SEND_MESSAGE, send, b"m")).code == codes.SUCCESS
        white = ask("10.10.103.7", RemotingCommand(code=codes.SEND_MESSAGE, ext_fields=dict(send), body=b"m"))
        assert white.code == codes.SUCCESS
        node.clock.advance(0)  # the new topic's registration with nameservers (none)
