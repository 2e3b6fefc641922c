"""RocketMQ plain ACL on the real broker: raw frames signed as the Java
client's AclClientRPCHook signs them, and the C++ client with session credentials."""

import base64
import hashlib
import hmac

import pytest

from protocols.remoting import codes
from tests.support.remoting_client import RemotingClient
from tests.support.rmq import ClientProc, broker_port, messages, namesrv_addr, rocket_server, run_client, sends

pytestmark = pytest.mark.timeout(180)

ACL = """
globalWhiteRemoteAddresses:
  - 10.255.255.*
accounts:
  - accessKey: AKproducer
    secretKey: SKproducer
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - AclT=PUB|SUB
      - AclCpp=PUB|SUB
      - ReadOnly=SUB
  - accessKey: AKadmin-1
    secretKey: SKadmin-1
    admin: true
"""
EXC = "org.apache.rocketmq.acl.common.AclException: "


@pytest.fixture(scope="module")
def rmq(tmp_path_factory):
    base = tmp_path_factory.mktemp("rmqacl")
    acl = base / "plain_acl.yml"
    acl.write_text(ACL)
    s = rocket_server(base / "broker", config={"rocketmq": {
        "aclEnable": True, "aclFile": str(acl), "aclCheckIntervalMs": 0}})
    with s.start():
        s.acl, s.home, s.ns = acl, base / "home", namesrv_addr(s)
        yield s


def java_signed(ext, body, ak, sk):
    """AclClientRPCHook: AccessKey joins the fields; HmacSHA1 over the values sorted by
    key (a TreeMap), then the body; base64."""
    fields = dict({k: str(v) for k, v in ext.items()}, AccessKey=ak)
    content = "".join(fields[k] for k in sorted(fields)).encode() + body
    sig = base64.b64encode(hmac.new(sk.encode(), content, hashlib.sha1).digest()).decode()
    return dict(fields, Signature=sig)


def send_ext(topic):
    return {"producerGroup": "pg", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": 1,
            "queueId": 0, "sysFlag": 0, "bornTimestamp": 0, "flag": 0, "properties": ""}


@pytest.fixture
def br(rmq):
    c = RemotingClient("127.0.0.1", broker_port(rmq))
    yield c
    c.close()


def test_unsigned_and_wrongly_signed_requests_are_refused(br):
    r = br.call(codes.SEND_MESSAGE, send_ext("AclT"), b"m")
    assert (r.code, r.remark) == (codes.SYSTEM_ERROR, EXC + "No accessKey is configured, "
                                  "org.apache.rocketmq.acl.plain.PlainPermissionManager.validate"
                                  "(PlainPermissionManager.java:663)")
    r = br.call(codes.SEND_MESSAGE, java_signed(send_ext("AclT"), b"m", "AKproducer", "wrong-secret"), b"m")
    assert r.code == codes.SYSTEM_ERROR and r.remark.startswith(
        EXC + "Check signature failed for accessKey=AKproducer, ")
    r = br.call(codes.SEND_MESSAGE, java_signed(send_ext("AclT"), b"m", "AKnobody", "whatever"), b"m")
    assert r.remark.startswith(EXC + "No acl config for AKnobody, ")
    # signed over one body, sent with another
    r = br.call(codes.SEND_MESSAGE, java_signed(send_ext("AclT"), b"m", "AKproducer", "SKproducer"), b"x")
    assert r.remark.startswith(EXC + "Check signature failed")
    r = br.call(codes.SEND_MESSAGE, java_signed(send_ext("AclT"), b"m", "AKproducer", "SKproducer"), b"m")
    assert r.code == codes.SUCCESS, r.remark


def test_permissions_and_admin_codes(br):
    sk = ("AKproducer", "SKproducer")
    r = br.call(codes.SEND_MESSAGE, java_signed(send_ext("ReadOnly"), b"m", *sk), b"m")
    assert r.remark.startswith(EXC + "No default permission for topic:ReadOnly, ")
    r = br.call(codes.SEND_MESSAGE, java_signed(send_ext("Elsewhere"), b"m", *sk), b"m")
    assert r.remark.startswith(EXC + "No default permission for topic:Elsewhere, ")
    create = {"topic": "AclAdminT", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6}
    r = br.call(codes.UPDATE_AND_CREATE_TOPIC, java_signed(create, b"", *sk))
    assert r.remark.startswith(EXC + "Need admin permission for request code=17, but accessKey=AKproducer is not")
    r = br.call(codes.UPDATE_AND_CREATE_TOPIC, java_signed(create, b"", "AKadmin-1", "SKadmin-1"))
    assert r.code == codes.SUCCESS, r.remark


def test_acl_file_is_reloaded_when_it_changes(rmq, br):
    sk = ("AKproducer", "SKproducer")
    r = br.call(codes.SEND_MESSAGE, java_signed(send_ext("Granted"), b"m", *sk), b"m")
    assert r.remark.startswith(EXC + "No default permission for topic:Granted")
    rmq.acl.write_text(ACL.replace("      - ReadOnly=SUB", "      - ReadOnly=SUB\n      - Granted=PUB"))
    try:
        r = br.call(codes.SEND_MESSAGE, java_signed(send_ext("Granted"), b"m", *sk), b"m")
        assert r.code == codes.SUCCESS, r.remark
    finally:
        rmq.acl.write_text(ACL)
    r = br.call(codes.SEND_MESSAGE, java_signed(send_ext("Granted"), b"m", *sk), b"m")
    assert r.code == codes.SYSTEM_ERROR


def test_cpp_client_with_session_credentials(rmq):
    ok = sends(run_client(rmq.home, "produce", rmq.ns, "AclCpp", "--count", 3, "--group", "PAcl",
                          "--access-key", "AKproducer", "--secret-key", "SKproducer"))
    assert [x.get("status") for x in ok] == [0, 0, 0], ok
    bad = [x for x in run_client(rmq.home, "produce", rmq.ns, "AclCpp", "--count", 1, "--group", "PAcl2",
                                 "--access-key", "AKproducer", "--secret-key", "not-the-key",
                                 "--send-timeout", 3000) if "i" in x]
    # the C++ client retries, then reports its last error text, not the broker's remark
    assert len(bad) == 1 and "error" in bad[0], bad
    assert "ACL refused request 10 from 127.0.0.1: Check signature failed for accessKey=AKproducer" \
        in rmq.current_log()
    got = messages(ClientProc(rmq.home, "consume", rmq.ns, "AclCpp", "--group", "CAcl", "--expect", 3,
                              "--access-key", "AKproducer", "--secret-key", "SKproducer").result())
    assert sorted(m["body"] for m in got) == ["msg-0", "msg-1", "msg-2"]
