"""Replication carries every field of a record: after smss, NSQ and
RocketMQ writes (born hosts, batches, queue ids, flags, properties as the clients send
them), a slave's records equal its master's field for field, physical offset and store
host aside (docs/replication.md)."""

import os
import time

import pytest

from mqserver.store import format as fmt
from protocols.remoting import codes
from protocols.remoting.props import encode_batch_body
from protocols.smss.client import SmssClient
from tests.integration.test_replication import status, wait_caught_up
from tests.support.nsq import V2
from tests.support.remoting_client import RemotingClient
from tests.support.server import ServerProcess

pytestmark = pytest.mark.timeout(120)
LOOP = "tcp:0:interface=127.0.0.1"
CONFIG = {"store": {"maxLogSize": 1 << 20}, "timeout": {"server": {"alive": 500}}}
FIELDS = [f for f in fmt.RecordView.__slots__ if f not in ("offset", "store_host")]


def records(data):
    """Every record of a data directory as a dict of its fields (physical offset and
    store host left out), in log order."""
    d = os.path.join(data, "commitlog")
    out = []
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            buf = f.read()
        for _, v in fmt.scan_buffer(memoryview(buf), int(name)):
            out.append({f: bytes(getattr(v, f)) if f == "body" else getattr(v, f) for f in FIELDS})
    return out


def rocket_send(c, topic, body, props, qid=0, code=codes.SEND_MESSAGE_V2, flag=0):
    return c.call(code, {
        "a": "PG", "b": topic, "c": "TBW102", "d": "4", "e": str(qid), "f": "0",
        "g": str(int(time.time() * 1000) - 5000), "h": str(flag), "i": props, "j": "0",
        "k": "false", "m": "true" if code == codes.SEND_BATCH_MESSAGE else "false"}, body)


def write_pair(tmp_path):
    """Run a master and a slave through smss, RocketMQ and NSQ writes; return their data
    directories once the slave has caught up and both are stopped."""
    listen = {"smss": LOOP, "broker": LOOP, "namesrv": LOOP, "nsqd_tcp": LOOP}
    master = ServerProcess(tmp_path / "master", config=CONFIG, listen=listen).start()
    slave = None
    try:
        slave = ServerProcess(tmp_path / "slave", config=CONFIG, listen={"smss": LOOP},
                              extra_args=["--role", "slave", "--master",
                                          f"127.0.0.1:{master.smss_port}"]).start()
        with SmssClient("127.0.0.1", master.smss_port) as c:
            c.create("s")
            c.publish("s", [([(b"h", b"1")], b"one"), b"two", ([(b"bin", b"\x01\x02")], b"framed")])
        rmq = RemotingClient("127.0.0.1", master.ports["BrokerDoor"])
        assert rmq.call(codes.UPDATE_AND_CREATE_TOPIC, {
            "topic": "R", "defaultTopic": "TBW102", "readQueueNums": 4, "writeQueueNums": 4,
            "perm": 6, "topicFilterType": "SINGLE_TAG", "order": "false"}).code == codes.SUCCESS
        assert rocket_send(rmq, "R", b"java", "KEYS\x01k1\x02TAGS\x01TagA\x02WAIT\x01true\x02",
                           qid=2, flag=7).code == codes.SUCCESS
        assert rocket_send(rmq, "R", b"go", "TAGS\x01TagB\x02UNIQ_KEY\x01U9",
                           qid=1).code == codes.SUCCESS  # no trailing separator
        batch = encode_batch_body([(0, b"b1", {"UNIQ_KEY": "U1", "TAGS": "T"}),
                                   (0, b"b2", {"UNIQ_KEY": "U2"})])
        assert rocket_send(rmq, "R", batch, "", qid=3,
                           code=codes.SEND_BATCH_MESSAGE).code == codes.SUCCESS
        rmq.close()
        with SmssClient("127.0.0.1", master.smss_port) as c:
            # whole smss records (headers no properties string holds) into R's queues in
            # turn: 0, 1, 2
            for i in range(3):
                c.publish("R", [([(b"bin", b"\x01%d" % i)], b"framed-r")])
        nsq = V2(master.ports["NsqdFactory"])
        nsq.send(b"PUB n\n" + (3).to_bytes(4, "big") + b"one")
        assert nsq.frame() == (0, b"OK")
        bodies = [b"m1", b"m22"]
        mpub = len(bodies).to_bytes(4, "big") + b"".join(len(b).to_bytes(4, "big") + b for b in bodies)
        nsq.send(b"MPUB n\n" + len(mpub).to_bytes(4, "big") + mpub)
        assert nsq.frame() == (0, b"OK")
        nsq.close()
        wait_caught_up(master.smss_port, slave.smss_port)
        assert status(slave.smss_port)["appliedEventId"] == status(master.smss_port)["appliedEventId"]
    finally:
        if slave is not None:
            slave.stop()
            slave.close()
        master.stop()
        master.close()
    return master.data, slave.data


def test_slave_records_equal_the_masters_after_every_protocol(tmp_path):
    master, slave = write_pair(tmp_path)
    mine, theirs = records(master), records(slave)
    rocket = [r for r in mine if r["topic"] == "R" and r["magic"] == fmt.MESSAGE_MAGIC
              and not r["sys_flag"] & fmt.SYSFLAG_SMSS_FRAMED]
    assert rocket and all(r["born_host"] != fmt.NO_HOST for r in rocket)
    framed = [r["queue_id"] for r in mine if r["topic"] == "R" and r["sys_flag"] & fmt.SYSFLAG_SMSS_FRAMED]
    assert framed == [0, 1, 2]
    assert len(mine) == len(theirs)
    for a, b in zip(mine, theirs):
        assert a == b, {k: (a[k], b[k]) for k in FIELDS if a[k] != b[k]}
