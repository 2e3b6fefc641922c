"""RocketMQ across processes: committed offsets and pending delays survive a broker
restart; two brokers registered in one standalone nameserver serve one topic."""

import collections
import json

import pytest

from protocols.remoting import codes
from tests.support.remoting_client import RemotingClient
from tests.support.rmq import (
    ClientProc, NamesrvProcess, broker_port, messages, namesrv_addr, rocket_server, run_client, sends,
    wait_members, wait_split,
)
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(240)


def produce(home, ns, topic, *args):
    lines = run_client(home, "produce", ns, topic, *args, timeout=60)
    assert lines[-1] == {"done": True}
    return sends(lines)


def test_committed_offsets_survive_restart(tmp_path):
    """A group that consumed and committed is not redelivered those messages after the
    broker restarts; it gets only the new ones."""
    home = tmp_path / "home"
    s = rocket_server(tmp_path / "b")
    try:
        s.start()
        ns = namesrv_addr(s)
        produce(home, ns, "RsT", "--count", 10, "--group", "RsP")
        # linger past the client's 5 s offset commit
        got = messages(run_client(home, "consume", ns, "RsT", "--group", "RsG", "--expect", 10, "--linger", 7,
                                  timeout=60))
        assert sorted(m["body"] for m in got) == sorted(f"msg-{i}" for i in range(10))
        assert s.stop() in (0, -15)  # twistd re-raises SIGTERM after a clean shutdown
        offsets = json.load(open(tmp_path / "b" / "consumerOffset.json"))["offsetTable"]
        assert sum(offsets["RsT@RsG"].values()) == 10
        s.start()
        ns = namesrv_addr(s)
        produce(home, ns, "RsT", "--count", 5, "--group", "RsP", "--body", "new-{i}")
        got = messages(run_client(home, "consume", ns, "RsT", "--group", "RsG", "--expect", 5, "--linger", 3,
                                  timeout=60))
        assert sorted(m["body"] for m in got) == sorted(f"new-{i}" for i in range(5))
    finally:
        s.stop()
        s.close()


def test_pending_delay_fires_after_restart(tmp_path):
    """A message with a 5 s delay level is still delivered when the broker restarted meanwhile."""
    s = rocket_server(tmp_path / "b")
    try:
        s.start()
        br = RemotingClient("127.0.0.1", broker_port(s))
        r = br.call(codes.SEND_MESSAGE, {
            "producerGroup": "P", "topic": "DlT", "defaultTopic": "TBW102", "defaultTopicQueueNums": 1,
            "queueId": 0, "sysFlag": 0, "bornTimestamp": 0, "flag": 0,
            "properties": "DELAY\x012\x02UNIQ_KEY\x01X\x02", "reconsumeTimes": 0}, b"later")
        assert r.code == codes.SUCCESS
        br.close()
        assert s.stop() in (0, -15)  # twistd re-raises SIGTERM after a clean shutdown
        s.start()
        br = RemotingClient("127.0.0.1", broker_port(s))
        try:
            wait_until(lambda: br.call(codes.GET_MAX_OFFSET, {"topic": "DlT", "queueId": 0})
                       .ext_fields.get("offset") == "1", 20, "the delayed message", interval=0.2)
        finally:
            br.close()
    finally:
        s.stop()
        s.close()


def test_two_brokers_one_nameserver(tmp_path):
    """Two broker processes register in one standalone nameserver; producers spread over
    both; a consumer group gets every message exactly once."""
    home = tmp_path / "home"
    ns = NamesrvProcess(tmp_path / "ns.log").start()
    brokers = []
    try:
        for name in ("broker-a", "broker-b"):
            s = rocket_server(tmp_path / name, namesrv=False, smss=False,
                              config={"rocketmq": {"brokerName": name, "namesrvAddr": ns.addr}})
            s.start()
            brokers.append(s)
        nc = RemotingClient("127.0.0.1", ns.port)
        try:
            def both():
                info = json.loads(nc.call(codes.GET_BROKER_CLUSTER_INFO).body)
                return info if len(info["brokerAddrTable"]) == 2 else None

            info = wait_until(both, 15, "both brokers registered", interval=0.2)
            assert sorted(info["clusterAddrTable"]["DefaultCluster"]) == ["broker-a", "broker-b"]
        finally:
            nc.close()
        # the topic exists on both brokers (4 queues each) before producers look it up
        for s in brokers:
            c = RemotingClient("127.0.0.1", broker_port(s))
            assert c.call(codes.UPDATE_AND_CREATE_TOPIC, {"topic": "ClT", "defaultTopic": "TBW102",
                                                          "readQueueNums": 4, "writeQueueNums": 4, "perm": 6,
                                                          "topicFilterType": "SINGLE_TAG", "order": "false"}).code == 0
            c.close()
        # ... and the nameserver knows it on both once they answered (as 4.9's brokers
        # answer after registering): clients looking it up now see all 8 queues
        nc = RemotingClient("127.0.0.1", ns.port)
        try:
            route = nc.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "ClT"})
            assert route.code == codes.SUCCESS, route.remark
            assert sorted(q["brokerName"] for q in json.loads(route.body)["queueDatas"]) == ["broker-a", "broker-b"]
        finally:
            nc.close()
        # Consumers join first: with a backlog, a consumer that starts alone would take
        # every queue before the other joins (RocketMQ rebalancing is at-least-once).
        c1 = ClientProc(home, "consume", ns.addr, "ClT", "--group", "ClG", "--instance", "c1", "--expect", 1000,
                        "--timeout", 30, timeout=60)
        c2 = ClientProc(home, "consume", ns.addr, "ClT", "--group", "ClG", "--instance", "c2", "--expect", 1000,
                        "--timeout", 30, timeout=60)
        try:
            for s in brokers:
                wait_members(s, "ClG", 2)
            # NOTIFY_CONSUMER_IDS_CHANGED makes both rebalance: send once they split the queues
            wait_split([c1, c2], "ClT", {(b, q) for b in ("broker-a", "broker-b") for q in range(4)})
            r = produce(home, ns.addr, "ClT", "--count", 40, "--group", "ClP")
            assert all(x["status"] == 0 for x in r)
            per_broker = []
            for s in brokers:
                c = RemotingClient("127.0.0.1", broker_port(s))
                per_broker.append(sum(int(c.call(codes.GET_MAX_OFFSET, {"topic": "ClT", "queueId": q})
                                          .ext_fields["offset"]) for q in range(4)))
                c.close()
            assert sum(per_broker) == 40 and all(n > 0 for n in per_broker)
            got1, got2 = messages(c1.result()), messages(c2.result())
        finally:
            c1.kill()
            c2.kill()
        assert got1 and got2
        got = got1 + got2
        counts = collections.Counter(m["body"] for m in got)
        assert sorted(counts) == sorted(f"msg-{i}" for i in range(40))
        assert set(counts.values()) == {1}
    finally:
        for s in brokers:
            try:
                s.stop()
            finally:
                s.close()
        ns.close()


def test_auto_create_disabled(tmp_path):
    """With rocketmq.autoCreateTopicEnable off there is no TBW102 and sends to unknown
    topics get TOPIC_NOT_EXIST; created topics work."""
    s = rocket_server(tmp_path / "b", smss=False, config={"rocketmq": {"autoCreateTopicEnable": False}})
    try:
        s.start()
        ns = RemotingClient("127.0.0.1", s.ports["NamesrvFactory"])
        br = RemotingClient("127.0.0.1", broker_port(s))
        try:
            assert ns.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"}).code == codes.TOPIC_NOT_EXIST
            ext = {"producerGroup": "P", "topic": "NoAuto", "defaultTopic": "TBW102", "defaultTopicQueueNums": 4,
                   "queueId": 0, "sysFlag": 0, "bornTimestamp": 0, "flag": 0, "properties": ""}
            r = br.call(codes.SEND_MESSAGE, ext, b"x")
            assert r.code == codes.TOPIC_NOT_EXIST and r.remark == "topic[NoAuto] not exist, apply first please!"
            assert br.call(codes.UPDATE_AND_CREATE_TOPIC, {"topic": "NoAuto", "readQueueNums": 2, "writeQueueNums": 2,
                                                           "perm": 6, "order": "false"}).code == codes.SUCCESS
            assert br.call(codes.SEND_MESSAGE, ext, b"x").code == codes.SUCCESS
            # UPDATE_AND_CREATE_TOPIC was answered once the nameserver had the topic
            route = json.loads(ns.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "NoAuto"}).body)
            assert route["queueDatas"][0]["writeQueueNums"] == 2
        finally:
            ns.close()
            br.close()
    finally:
        s.stop()
        s.close()


def test_standalone_nameserver_logs_brokers_coming_and_going(tmp_path):
    """``twistd mqnamesrv`` logs a broker's first registration, its UNREGISTER_BROKER and
    the drop of a broker whose registering connection closed."""
    ns = NamesrvProcess(tmp_path / "ns.log").start()
    try:
        body = json.dumps({"topicConfigSerializeWrapper": {"topicConfigTable": {},
                           "dataVersion": {"counter": 1, "timestamp": 1}}, "filterServerList": []}).encode()
        for name, addr, leave in (("bx", "127.0.0.1:10999", True), ("by", "127.0.0.1:10998", False)):
            ext = {"brokerName": name, "brokerAddr": addr, "clusterName": "CX", "haServerAddr": "",
                   "brokerId": 0, "compressed": "false"}
            c = RemotingClient("127.0.0.1", ns.port)
            assert c.call(codes.REGISTER_BROKER, ext, body).code == codes.SUCCESS
            assert c.call(codes.REGISTER_BROKER, ext, body).code == codes.SUCCESS
            if leave:
                assert c.call(codes.UNREGISTER_BROKER, ext).code == codes.SUCCESS
            c.close()
        want = ["broker bx (127.0.0.1:10999, id 0) registered in cluster CX",
                "broker bx (127.0.0.1:10999, id 0) of cluster CX unregistered",
                "broker by (127.0.0.1:10998, id 0) registered in cluster CX",
                "broker by (127.0.0.1:10998, id 0) of cluster CX dropped: its connection closed"]
        def logged():
            text = open(tmp_path / "ns.log", encoding="utf-8", errors="replace").read()
            return text if want[-1] in text else None

        text = wait_until(logged, 10, "the nameserver's log of the dropped broker", interval=0.05)
        got = [line.split("] ", 1)[1] for line in text.splitlines() if "RouteTable" in line]
        assert got == want
    finally:
        ns.close()
