"""msgout across a restart of the real broker: queue attributes, a sub_id's progress and
push subscriptions survive; and RocketMQ's C++ client on either side of msgout."""

import time

import pytest

from protocols.remoting import codes
from tests.support.msgout import LOOPBACK, Api, Receiver
from tests.support.remoting_client import RemotingClient
from tests.support.rmq import messages, namesrv_addr, run_client
from tests.support.server import ServerProcess

pytestmark = pytest.mark.timeout(180)


def test_restart_keeps_attributes_progress_and_push_subscriptions(tmp_path):
    s = ServerProcess(tmp_path / "broker", listen={"msgout": LOOPBACK}).start()
    rec = None
    try:
        api = Api(s.ports["MsgoutSite"])
        api.put_queue("rt", mode="topic", ordered=True, ack_timeout_ms=60000)
        api.put_queue("rq", ack_timeout_ms=60000)
        api.fetch("rt", sub_id="keep")
        api.publish("rt", "a", "b", "c")
        got = api.fetch("rt", sub_id="keep", max=1)
        assert [m["body"] for m in got] == ["a"]
        api.ack([got[0]["receipt"]])
        api.ok("POST", "/v1/queues/rq/subscriptions",
               {"url": "http://127.0.0.1:9/nowhere", "sub_id": "later", "batch": 7})
        api.publish("rq", "p1", "p2")
        api.close()
        s.stop()
        rec = Receiver(tmp_path / "push.jsonl", fail_every=0)
        s.listen = {"msgout": LOOPBACK}
        s.start()
        api = Api(s.ports["MsgoutSite"])
        info = api.ok("GET", "/v1/queues/rt")
        assert (info["mode"], info["ordered"], info["ack_timeout_ms"]) == ("topic", True, 60000)
        rest = []
        for _ in range(3):
            got = api.fetch("rt", sub_id="keep", max=5)
            rest += [m["body"] for m in got]
            api.ack([m["receipt"] for m in got])
        assert rest == ["b", "c"]  # "a" was acked before the restart
        (sub,) = api.ok("GET", "/v1/queues/rq/subscriptions")["subscriptions"]
        assert (sub["sub_id"], sub["batch"], sub["url"]) == (
            "later", 7, "http://127.0.0.1:9/nowhere")
        # point it at a live receiver: what waited gets pushed
        api.ok("POST", "/v1/queues/rq/subscriptions",
               {"url": rec.url, "sub_id": "later", "batch": 7})
        assert sorted(rec.wait_bodies(2)) == ["p1", "p2"]
        api.close()
    finally:
        if rec is not None:
            rec.close()
        s.stop()
        s.close()


def wait_route(server, topic, timeout=30.0):
    """Wait until the nameserver has a route for C{topic} (the broker door registers
    topics made by other doors at its next tick)."""
    c = RemotingClient("127.0.0.1", server.ports["NamesrvFactory"])
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if c.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}).code == codes.SUCCESS:
                return
            time.sleep(0.2)
    finally:
        c.close()
    raise AssertionError(f"no route for {topic}")


def test_rocketmq_client_on_either_side(tmp_path):
    listen = {"msgout": LOOPBACK, "namesrv": LOOPBACK, "broker": LOOPBACK}
    s = ServerProcess(tmp_path / "broker", listen=listen).start()
    try:
        api = Api(s.ports["MsgoutSite"])
        ns = namesrv_addr(s)
        api.put_queue("RMsg")
        api.put_queue("RBack")
        wait_route(s, "RMsg")
        wait_route(s, "RBack")
        run_client(tmp_path / "home", "produce", ns, "RMsg", "--count", 3, "--group", "PM",
                   "--body", "rmq-{i}")
        got = []
        for _ in range(5):
            got += api.fetch("RMsg", max=10, wait_ms=500)
            if len(got) >= 3:
                break
        assert sorted(m["body"] for m in got) == ["rmq-0", "rmq-1", "rmq-2"]
        assert all("SENT_MS" in m["headers"] for m in got)  # RocketMQ properties as headers
        api.publish("RBack", "from-msgout-0", "from-msgout-1")
        lines = run_client(tmp_path / "home", "consume", ns, "RBack", "--group", "CM",
                           "--expect", 2)
        assert sorted(m["body"] for m in messages(lines)) == ["from-msgout-0", "from-msgout-1"]
        api.close()
    finally:
        s.stop()
        s.close()


def test_attributes_replicate_to_a_slave(server_factory):
    from tests.integration.test_replication import SMALL, wait_caught_up

    listen = {"smss": LOOPBACK, "msgout": LOOPBACK}
    master = server_factory("master", config=SMALL, listen=listen)
    slave = server_factory("slave", config=SMALL, listen=listen,
                           extra_args=["--role", "slave", "--master",
                                       f"127.0.0.1:{master.smss_port}"])
    m, s = Api(master.ports["MsgoutSite"]), Api(slave.ports["MsgoutSite"])
    try:
        m.put_queue("rep", mode="topic", ordered=True, ack_timeout_ms=1234)
        m.publish("rep", "one")
        wait_caught_up(master.smss_port, slave.smss_port)
        info = s.ok("GET", "/v1/queues/rep")
        assert (info["mode"], info["ordered"], info["ack_timeout_ms"], info["messages"]) == (
            "topic", True, 1234, 1)
        assert s.call("PUT", "/v1/queues/rep2", {})[0] == 503  # a slave takes no writes
    finally:
        m.close()
        s.close()
