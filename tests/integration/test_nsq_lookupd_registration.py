"""Registering with lookupds, with real processes: a broker that
names its own embedded lookupd is listed once, and topics NSQ cannot name (RocketMQ's
%RETRY%group) are never sent, so a standalone mqlookupd learns every other topic; and
deleting a channel as nsqadmin does (the lookupd first, then the nsqd)."""

import time

import pytest

from protocols.remoting import codes
from tests.support.etcd import free_port
from tests.support.nsq import NsqPorts, http, http_json, nsq_broker
from tests.support.remoting_client import RemotingClient
from tests.support.server import Standalone

pytestmark = pytest.mark.timeout(120)
LOOPBACK = "tcp:0:interface=127.0.0.1"


@pytest.fixture
def mqlookupd(tmp_path):
    """A standalone C{twistd mqlookupd}; yields (tcp port, http port, log path)."""
    lookupd = Standalone("mqlookupd", ["--tcp", LOOPBACK, "--http", LOOPBACK],
                         tmp_path / "lookupd.log").start()
    try:
        yield lookupd.ports["lookupd_tcp"], lookupd.ports["lookupd_http"], tmp_path / "lookupd.log"
    finally:
        lookupd.close()


def wait_for(check, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    return check()


def test_retry_topics_are_not_registered_and_do_not_block_the_others(mqlookupd, server_factory):
    """Once a RocketMQ consumer group exists, its %RETRY% topic is a broker topic; the
    broker must not REGISTER it (lookupd refuses it with E_BAD_TOPIC and closes), and
    every NSQ-valid topic reaches the standalone lookupd."""
    lk_tcp, lk_http, _ = mqlookupd
    s = server_factory("b", listen={"nsqd_tcp": LOOPBACK, "nsqd_http": LOOPBACK, "broker": LOOPBACK},
                       config={"nsq": {"lookupdTcpAddresses": [f"127.0.0.1:{lk_tcp}"]}})
    c = RemotingClient("127.0.0.1", s.ports["BrokerDoor"])
    try:
        r = c.call(codes.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, b'{"groupName": "lkg"}')
        assert r.code == codes.SUCCESS
    finally:
        c.close()
    nsq = NsqPorts(s)
    http(nsq.http, "POST", "/topic/create?topic=lk_a")
    http(nsq.http, "POST", "/topic/create?topic=zz_b")

    def topics():
        status, body = http_json(lk_http, "GET", "/topics")
        return status == 200 and {"lk_a", "zz_b"} <= set(body["topics"]) and body["topics"]

    names = wait_for(topics)
    assert names and not [t for t in names if "%" in t]
    assert "E_BAD_TOPIC" not in s.current_log()


def test_registering_with_its_own_embedded_lookupd_lists_the_broker_once(server_factory):
    lk_port = free_port()
    s = server_factory("self", listen={"nsqd_tcp": LOOPBACK, "nsqd_http": LOOPBACK,
                                       "lookupd_tcp": f"tcp:{lk_port}:interface=127.0.0.1",
                                       "lookupd_http": LOOPBACK},
                       config={"nsq": {"lookupdTcpAddresses": [f"127.0.0.1:{lk_port}"]}})
    nsq = NsqPorts(s)
    http(nsq.http, "POST", "/topic/create?topic=self_t")

    # /debug shows what arrived over TCP: wait for the broker's own REGISTER
    assert wait_for(lambda: http_json(nsq.lookupd_http, "GET", "/debug")[1].get("topic:self_t:"))
    producers = http_json(nsq.lookupd_http, "GET", "/lookup?topic=self_t")[1]["producers"]
    nodes = http_json(nsq.lookupd_http, "GET", "/nodes")[1]["producers"]
    assert [p["tcp_port"] for p in producers] == [nsq.tcp]
    assert [p["tcp_port"] for p in nodes] == [nsq.tcp]


def test_deleting_a_channel_as_nsqadmin_does(tmp_path):
    """nsqadmin's channel delete posts /channel/delete to the lookupd, then to the nsqd:
    the embedded lookupd answers 200 and drops the broker's channel registration, as
    nsqlookupd does for the channel its nsqd registered; a channel or topic it does not
    have is 404 CHANNEL_NOT_FOUND."""
    with nsq_broker(tmp_path / "data") as nsq:
        assert http(nsq.http, "POST", "/topic/create?topic=adm_t")[0] == 200
        assert http(nsq.http, "POST", "/channel/create?topic=adm_t&channel=adm_c")[0] == 200
        assert http_json(nsq.lookupd_http, "GET", "/channels?topic=adm_t") == (200, {"channels": ["adm_c"]})

        assert http(nsq.lookupd_http, "POST", "/channel/delete?topic=adm_t&channel=adm_c")[:1] == (200,)
        assert http_json(nsq.lookupd_http, "GET", "/channels?topic=adm_t") == (200, {"channels": []})
        assert http(nsq.http, "POST", "/channel/delete?topic=adm_t&channel=adm_c")[0] == 200
        stats = http_json(nsq.http, "GET", "/stats?format=json")[1]
        assert [t["channels"] for t in stats["topics"] if t["topic_name"] == "adm_t"] == [[]]

        not_found = (404, {"message": "CHANNEL_NOT_FOUND"})
        assert http_json(nsq.lookupd_http, "POST", "/channel/delete?topic=adm_t&channel=adm_c") == not_found
        assert http_json(nsq.lookupd_http, "POST", "/channel/delete?topic=nope&channel=adm_c") == not_found
