"""An operator's failover with real processes: the master dies, `mqctl promote` makes its
follower the master in place (a new term; the RocketMQ door registers as brokerId 0), and
the old master, restarted as its follower, follows it; no acknowledged message is lost."""

import json

import pytest

from protocols.remoting import codes
from protocols.smss.client import SmssClient, SmssError
from tests.integration.test_ops_mqctl import mqctl
from tests.integration.test_replication_sync import free_port, master_config, status
from tests.support.remoting_client import RemotingClient
from tests.support.server import ServerProcess
from tests.support.smss import read_topic
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(180)

LOOP = "tcp:0:interface=127.0.0.1"


def test_mqctl_promote_makes_the_follower_the_master(tmp_path):
    pa, pb = free_port(), free_port()
    config = master_config(timeout_ms=2000)
    a = ServerProcess(tmp_path / "a", config=config,
                      listen={"smss": f"tcp:{pa}:interface=127.0.0.1"}).start()
    b = ServerProcess(tmp_path / "b", config=config, extra_args=[
        "--role", "slave", "--master", f"127.0.0.1:{pa}"], listen={
        "smss": f"tcp:{pb}:interface=127.0.0.1", "admin": LOOP, "namesrv": LOOP,
        "broker": LOOP}).start()
    try:
        wait_until(lambda: status(pa)["sync"]["confirming"], 30, "b confirming to a")
        with SmssClient("127.0.0.1", pa) as c:
            c.create("t")
            for i in range(10):
                c.publish("t", [b"acked-%d" % i])
        a.kill()

        _, out, _ = mqctl(b, "promote")
        assert "promoted: this broker is the master, term 2" in out
        assert status(pb)["role"] == "master"
        code, _, err = mqctl(b, "promote", check=False)
        assert code != 0 and "the master already" in err
        ns = RemotingClient("127.0.0.1", b.ports["NamesrvFactory"])
        try:  # the RocketMQ door registers again, as the master
            route = ns.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "t"})
            assert list(json.loads(route.body)["brokerDatas"][0]["brokerAddrs"]) == ["0"]
        finally:
            ns.close()
        with SmssClient("127.0.0.1", pb) as c:  # no follower confirms yet
            with pytest.raises(SmssError, match="0 of 1 replicas"):
                c.publish("t", [b"waits-for-a"])

        a = ServerProcess(tmp_path / "a", config=config, extra_args=[
            "--role", "slave", "--master", f"127.0.0.1:{pb}"],
            listen={"smss": f"tcp:{pa}:interface=127.0.0.1"}).start()
        wait_until(lambda: status(pb)["sync"]["confirming"], 30, "a confirming to b")
        with SmssClient("127.0.0.1", pb) as c:
            c.publish("t", [b"after"])
        want = [b"acked-%d" % i for i in range(10)] + [b"waits-for-a", b"after"]
        for server in (a, b):
            assert [m.body for m in read_topic(server, "t", until_alive=True)] == want
    finally:
        a.close()
        b.close()
