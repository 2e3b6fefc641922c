"""The nameserver logs brokers joining, leaving and expiring, as RocketMQ's
RouteInfoManager does: requests over StringTransport, the scan on a Clock, the log
captured."""

import json

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import capturedLogs, formatEvent

from mqserver.cluster.namesrv import RouteTable
from protocols.remoting import codes
from protocols.remoting.codec import encode
from protocols.remoting.messages import RemotingCommand
from protocols.remoting.namesrv import NamesrvFactory

BODY = json.dumps({"topicConfigSerializeWrapper": {"topicConfigTable": {"T": {"readQueueNums": 4,
                   "writeQueueNums": 4, "perm": 6}}, "dataVersion": {"counter": 1, "timestamp": 1}},
                   "filterServerList": []}).encode()


def connect(factory):
    p = factory.buildProtocol(None)
    p.makeConnection(StringTransport())
    return p


def request(p, code, name, addr, cluster="C", body=b""):
    ext = {"brokerName": name, "brokerAddr": addr, "clusterName": cluster, "haServerAddr": "", "brokerId": "0",
           "compressed": "false"}
    p.dataReceived(encode(RemotingCommand(code=code, opaque=1, ext_fields=ext, body=body)))


def lines(logs):
    return [formatEvent(e) for e in logs]


def test_register_unregister_expire_and_close_are_logged():
    clock = Clock()
    table = RouteTable(clock, expire_ms=120_000, scan_interval_ms=10_000)
    f = NamesrvFactory(table)
    f.startFactory()
    try:
        a, b, c = connect(f), connect(f), connect(f)
        with capturedLogs() as logs:
            request(a, codes.REGISTER_BROKER, "broker-a", "10.0.0.1:10911", body=BODY)
            request(a, codes.REGISTER_BROKER, "broker-a", "10.0.0.1:10911", body=BODY)  # refresh: quiet
        assert lines(logs) == ["broker broker-a (10.0.0.1:10911, id 0) registered in cluster C"]

        with capturedLogs() as logs:
            request(a, codes.UNREGISTER_BROKER, "broker-a", "10.0.0.1:10911")
        assert lines(logs) == ["broker broker-a (10.0.0.1:10911, id 0) of cluster C unregistered"]

        request(b, codes.REGISTER_BROKER, "broker-b", "10.0.0.2:10911", cluster="D", body=BODY)
        with capturedLogs() as logs:
            b.connectionLost(None)
        assert lines(logs) == ["broker broker-b (10.0.0.2:10911, id 0) of cluster D dropped: its connection closed"]

        request(c, codes.REGISTER_BROKER, "broker-c", "10.0.0.3:10911", body=BODY)
        with capturedLogs() as logs:
            clock.advance(130)
        assert lines(logs) == ["broker broker-c (10.0.0.3:10911, id 0) of cluster C dropped: expired, silent for"
                               " 130000 ms"]
        assert logs[0]["log_level"].name == "warn"
        assert table.cluster_info() == {"brokerAddrTable": {}, "clusterAddrTable": {}}
    finally:
        f.stopFactory()
