"""The fallback of C{server.reactor}: with C{standard} the broker runs on Twisted's own
epoll reactor and writes with C{transport.write} only (what a Twisted release without
the internals the tuned paths read also gets), and every door still publishes and
delivers: smss, RocketMQ remoting, nsqd TCP and HTTP, nsqlookupd, msgout and the console."""

import json
import socket

import pytest

from protocols.nsq.codec import encode_command
from protocols.remoting import codes
from protocols.smss.client import SmssClient
from protocols.smss.messages import Batch
from tests.support.msgout import Api, Console
from tests.support.nsq import V2, http
from tests.support.remoting_client import RemotingClient
from tests.support.server import ServerProcess

LOOPBACK = "tcp:0:interface=127.0.0.1"
DOORS = ("smss", "namesrv", "broker", "nsqd_tcp", "nsqd_http", "lookupd_tcp",
         "lookupd_http", "msgout", "console")


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = ServerProcess(tmp_path_factory.mktemp("standard") / "data",
                      config={"server": {"reactor": "standard"}},
                      listen={d: LOOPBACK for d in DOORS}).start()
    try:
        yield s
    finally:
        s.stop()
        s.close()


def test_the_broker_says_it_runs_on_plain_twisted(srv):
    """The start-up log names the standard paths and Twisted's own reactor class."""
    log = srv.read_log()
    assert ("standard Twisted paths in use (epoll reactor, transport.write): "
            "server.reactor is standard") in log, log
    assert "EPollReactor" in log and "SpinningEPollReactor" not in log, log


def test_smss_publishes_and_subscribes(srv):
    with SmssClient("127.0.0.1", srv.smss_port, timeout=10) as c:
        c.create("std_s")
        c.publish("std_s", [b"one", b"two"])
        c.publish("std_s", [b"three"])
        batch = c.subscribe("std_s", 0, batch=10, who=b"std").next_batch(10)
        assert isinstance(batch, Batch)
        assert [m.body for m in batch.messages] == [b"one", b"two", b"three"]


def test_rocketmq_sends_and_pulls(srv):
    br = RemotingClient("127.0.0.1", srv.ports["BrokerDoor"])
    ns = RemotingClient("127.0.0.1", srv.ports["NamesrvFactory"])
    try:
        for body in (b"rm-1", b"rm-2"):
            r = br.call(codes.SEND_MESSAGE, {
                "producerGroup": "pg", "topic": "StdT", "defaultTopic": "TBW102",
                "defaultTopicQueueNums": 1, "queueId": 0, "sysFlag": 0,
                "bornTimestamp": 0, "flag": 0, "properties": ""}, body)
            assert r.code == codes.SUCCESS, r.remark
        p = br.call(codes.PULL_MESSAGE, {
            "consumerGroup": "G", "topic": "StdT", "queueId": 0, "queueOffset": 0,
            "maxMsgNums": 32, "sysFlag": 4, "commitOffset": 0, "suspendTimeoutMillis": 0,
            "subscription": "*", "subVersion": 0})
        assert p.code == codes.SUCCESS and b"rm-1" in p.body and b"rm-2" in p.body
        r = ns.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "StdT"})
        assert r.code in (codes.SUCCESS, codes.TOPIC_NOT_EXIST), r.remark
    finally:
        br.close()
        ns.close()


def test_nsq_publishes_and_delivers_over_tcp_and_http(srv):
    p = V2(srv.ports["NsqdFactory"])
    c = V2(srv.ports["NsqdFactory"])
    try:
        p.send(encode_command("PUB", "std_n", body=b"over-tcp"))
        assert p.frame() == (0, b"OK")
        status, _, body = http(srv.ports["NsqdHttpSite"], "POST", "/pub?topic=std_n", b"over-http")
        assert (status, body) == (200, b"OK")
        c.send(b"SUB std_n ch\n")
        assert c.frame() == (0, b"OK")
        c.send(b"RDY 2\n")
        got = c.messages(2)
        assert [m.body for m in got] == [b"over-tcp", b"over-http"]
        c.send(b"".join(encode_command("FIN", m.msg_id) for m in got))
        c.send(b"NOP\n")
    finally:
        p.close()
        c.close()
    assert http(srv.ports["LookupdHttpSite"], "GET", "/ping")[::2] == (200, b"OK")
    lookups = json.loads(http(srv.ports["LookupdHttpSite"], "GET", "/topics")[2])
    assert "topics" in lookups


def test_nsqlookupd_tcp_answers(srv):
    with socket.create_connection(("127.0.0.1", srv.ports["LookupdFactory"]), timeout=10) as s:
        s.sendall(b"  V1PING\n")
        assert s.recv(100) == b"\x00\x00\x00\x02OK"


def test_msgout_and_console_publish_and_consume(srv):
    """What msgout's HTTP API publishes the console fetches, and the other way round."""
    api = Api(srv.ports["MsgoutSite"])
    c = Console(srv.ports["ConsoleFactory"])
    try:
        api.put_queue("std_q")
        api.publish("std_q", "over-http")
        c.send(b"FETCH std_q 5")
        assert c.line() == b"OK 1"
        queue, _, receipt, attempts, body = c.message()
        assert (queue, attempts, body) == ("std_q", 1, b"over-http")
        assert api.ack([receipt])["acked"] == 1
        c.send(b"PUB std_q over the console")
        assert c.line().startswith(b"OK ")
        got = api.fetch("std_q", max=5, wait_ms=5000)
        assert [m["body"] for m in got] == ["over the console"]
    finally:
        api.close()
        c.close()
