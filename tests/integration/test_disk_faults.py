"""A full disk with a real broker process (issue #13.5): the test-only fault injection
(MQSERVER_FAULT_INJECT, mqserver/store/fileio.py) makes every commit-log write fail with
ENOSPC while a control file exists. Each protocol answers a publish with its own error
(smss error response, NSQ E_PUB_FAILED, RocketMQ SERVICE_NOT_AVAILABLE), reads go on,
writes resume when the file is gone, and after a restart every acknowledged message is
there and no refused one."""

import os
import time

import pytest

from protocols.remoting import codes
from protocols.smss.client import SmssClient, SmssError
from tests.support.nsq import NSQ_DOORS, V2
from tests.support.remoting_client import RemotingClient
from tests.support.server import ServerProcess
from tests.support.smss import read_topic

pytestmark = pytest.mark.timeout(120)
LOOP = "tcp:0:interface=127.0.0.1"


def rocket_send(c, topic, body):
    return c.call(codes.SEND_MESSAGE_V2, {
        "a": "PG", "b": topic, "c": "TBW102", "d": "1", "e": "0", "f": "0",
        "g": str(int(time.time() * 1000)), "h": "0", "i": "", "j": "0", "k": "false",
        "m": "false"}, body)


def nsq_pub(conn, topic, body):
    conn.send(b"PUB %s\n" % topic.encode() + len(body).to_bytes(4, "big") + body)
    return conn.frame()


@pytest.mark.parametrize("level", [1, 2])
def test_full_disk_fails_publishes_of_every_protocol_and_recovers(tmp_path, level):
    control = tmp_path / "faults"
    control.mkdir()
    listen = {"smss": LOOP, "broker": LOOP, "namesrv": LOOP, "nsqd_tcp": LOOP}
    server = ServerProcess(tmp_path / "broker", listen=listen,
                           config={"store": {"flushLevel": level}},
                           env={"MQSERVER_FAULT_INJECT": str(control)})
    server.start()
    try:
        smss = SmssClient("127.0.0.1", server.smss_port)
        rmq = RemotingClient("127.0.0.1", server.ports["BrokerDoor"])
        nsq = V2(server.ports["NsqdFactory"])
        smss.create("s")
        smss.create("r")
        smss.publish("s", [b"s-before"])
        assert rocket_send(rmq, "r", b"r-before").code == codes.SUCCESS
        assert nsq_pub(nsq, "n", b"n-before") == (0, b"OK")

        (control / "enospc").touch()
        with pytest.raises(SmssError, match="disk full"):
            smss.publish("s", [b"s-refused"])
        r = rocket_send(rmq, "r", b"r-refused")
        assert r.code == codes.SERVICE_NOT_AVAILABLE and "disk is full" in r.remark
        t, data = nsq_pub(nsq, "n", b"n-refused")
        assert t == 1 and data.startswith(b"E_PUB_FAILED"), data
        assert b"disk full" in data
        nsq.close()  # E_PUB_FAILED is fatal in nsqd: the connection is closed
        nsq = V2(server.ports["NsqdFactory"])
        # reads go on while the disk is full
        assert [m.body for m in read_topic(server, "s", count=1)] == [b"s-before"]

        os.remove(control / "enospc")
        smss.publish("s", [b"s-after"])
        assert rocket_send(rmq, "r", b"r-after").code == codes.SUCCESS
        assert nsq_pub(nsq, "n", b"n-after") == (0, b"OK")
        deadline = time.monotonic() + 10
        while "disk writes work again" not in server.current_log():
            assert time.monotonic() < deadline, server.current_log()
            time.sleep(0.05)
        log = server.current_log()
        assert log.count("disk trouble:") == 1, log
        assert "Traceback" not in log
        smss.close()
        rmq.close()
        nsq.close()
    finally:
        server.stop()
    server.start()
    try:
        assert [m.body for m in read_topic(server, "s", count=2)] == [b"s-before", b"s-after"]
        assert [m.body for m in read_topic(server, "r", count=2)] == [b"r-before", b"r-after"]
        assert [m.body for m in read_topic(server, "n", count=2)] == [b"n-before", b"n-after"]
    finally:
        server.stop()
        server.close()
