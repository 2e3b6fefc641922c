"""The RocketMQ view of a slave: it registers under the master's broker name with
brokerId 1, so consumers can read from it when the master is down."""

import json

from protocols.remoting import codes
from protocols.smss.client import SmssClient
from tests.support.remoting_client import RemotingClient
from tests.support.rmq import NamesrvProcess, broker_port
from tests.support.server import ServerProcess
from tests.support.wait import wait_until


def route(ns_port, topic):
    c = RemotingClient("127.0.0.1", ns_port)
    try:
        r = c.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        return json.loads(r.body) if r.code == codes.SUCCESS else None
    finally:
        c.close()


def wait_for(predicate, timeout=20.0, what="condition"):
    return wait_until(predicate, timeout, what, interval=0.2)


def test_slave_registers_as_broker_id_1_and_serves_pulls_when_master_is_down(tmp_path):
    """Master (brokerId 0) and slave (brokerId 1) share one broker name in the route;
    with the master killed, the route keeps the slave and a pull from it returns every
    message."""
    ns = NamesrvProcess(tmp_path / "ns.log").start()
    rocket = {"rocketmq": {"namesrvAddr": ns.addr, "registerIntervalMs": 1000}}
    listen = {"smss": "tcp:0:interface=127.0.0.1", "broker": "tcp:0:interface=127.0.0.1"}
    master = ServerProcess(tmp_path / "master", config=rocket, listen=dict(listen)).start()
    slave = None
    try:
        slave = ServerProcess(
            tmp_path / "slave", config=rocket, listen=dict(listen),
            extra_args=["--role", "slave", "--master", f"127.0.0.1:{master.smss_port}"],
        ).start()
        mb = RemotingClient("127.0.0.1", broker_port(master))
        assert mb.call(codes.UPDATE_AND_CREATE_TOPIC, {
            "topic": "RT", "defaultTopic": "TBW102", "readQueueNums": 2, "writeQueueNums": 2,
            "perm": 6, "topicFilterType": "SINGLE_TAG", "order": "false"}).code == codes.SUCCESS
        mb.close()
        with SmssClient("127.0.0.1", master.smss_port) as c:
            for i in range(8):
                c.publish("RT", [b"m%d" % i])
            head = c.topic_info("$replication")["appliedEventId"]
        with SmssClient("127.0.0.1", slave.smss_port) as s:
            wait_for(lambda: s.topic_info("$replication")["appliedEventId"] == head, what="slave")
        r = wait_for(lambda: (lambda x: x if x and len(x["brokerDatas"][0]["brokerAddrs"]) == 2 else None)(
            route(ns.port, "RT")), what="both brokers in the route")
        (bd,) = r["brokerDatas"]
        assert bd["brokerName"] == "broker-a"
        assert bd["brokerAddrs"]["1"].endswith(f":{broker_port(slave)}")
        assert bd["brokerAddrs"]["0"].endswith(f":{broker_port(master)}")
        master.kill()
        r = wait_for(lambda: (lambda x: x if x and list(x["brokerDatas"][0]["brokerAddrs"]) == ["1"] else None)(
            route(ns.port, "RT")), timeout=30, what="the master to leave the route")
        sb = RemotingClient("127.0.0.1", broker_port(slave))
        bodies = []
        for qid in range(2):
            p = sb.call(codes.PULL_MESSAGE, {
                "consumerGroup": "G", "topic": "RT", "queueId": qid, "queueOffset": 0,
                "maxMsgNums": 32, "sysFlag": 4, "commitOffset": 0, "suspendTimeoutMillis": 0,
                "subscription": "*", "subVersion": 0})
            assert p.code == codes.SUCCESS
            bodies += _bodies(p.body)
        sb.close()
        assert sorted(bodies) == sorted(b"m%d" % i for i in range(8))
    finally:
        for s in (slave, master):
            if s is not None:
                s.kill()
                s.close()
        ns.close()


def _bodies(buf):
    from mqserver.store import format as fmt

    out, pos = [], 0
    while pos < len(buf):
        v = fmt.RecordView(buf, pos)
        out.append(bytes(v.body))
        pos += v.size
    return out
