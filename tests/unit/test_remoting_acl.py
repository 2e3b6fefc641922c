"""RocketMQ 4.9 plain ACL: signatures as the clients compute them, the file, the checks
and the broker's refusal remarks (issue 16.3)."""

import pytest

from protocols.remoting import codes
from protocols.remoting.acl import (AclConfigError, AclError, PlainAcl, address_matcher,
                                    resources, sign)
from protocols.remoting.codec import decode_json_header
from protocols.remoting.messages import RemotingCommand

# C++ client 2.x frames from the spec (section 10): empty credentials still sign.
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
