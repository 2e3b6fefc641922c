"""A full disk with a real broker process: the test-only fault injection
(MQSERVER_FAULT_INJECT, mqserver/store/fileio.py) makes every commit-log write fail with
ENOSPC while a control file exists. Each protocol answers a publish with its own error
(smss error response, NSQ E_PUB_FAILED, RocketMQ SERVICE_NOT_AVAILABLE), reads go on,
writes resume when the file is gone, and after a restart every acknowledged message is
there and no refused one."""

import contextlib
import os
import time

import pytest

from protocols.remoting import codes
from protocols.smss.client import SmssClient, SmssError
from tests.support.nsq import V2
from tests.support.remoting_client import RemotingClient
from tests.support.server import ServerProcess
from tests.support.smss import read_topic
from tests.support.wait import wait_until

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


def _metric(server, name):
    """The value of a metric the broker's metrics door shows."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{server.ports['MetricsSite']}/metrics",
                                timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def _topic_json(server):
    import json

    with open(os.path.join(server.data, "topic.json")) as f:
        return json.load(f)["topicConfigTable"]


@contextlib.contextmanager
def _state_server(tmp_path):
    """A broker with fault injection and a RocketMQ client that created topic r_old
    (topic.json holds it): yields (server, control directory, client)."""
    control = tmp_path / "faults"
    control.mkdir()
    listen = {"smss": LOOP, "broker": LOOP, "namesrv": LOOP, "nsqd_tcp": LOOP, "nsqd_http": LOOP,
              "metrics": LOOP}
    server = ServerProcess(tmp_path / "broker", listen=listen,
                           env={"MQSERVER_FAULT_INJECT": str(control)}).start()
    try:
        rmq = RemotingClient("127.0.0.1", server.ports["BrokerDoor"])
        assert rocket_send(rmq, "r_old", b"before").code == codes.SUCCESS
        wait_until(lambda: "r_old" in _topic_json(server), 20, "topic.json holding r_old")
        yield server, control, rmq
        rmq.close()
    finally:
        server.stop()
        server.close()


def _one_quiet_trouble(server, trouble):
    """topic.json comes to hold r_new once the disk has room; the log has the one line
    C{trouble} of the disk trouble and neither a traceback nor a critical line."""
    wait_until(lambda: "r_new" in _topic_json(server), 20, "topic.json holding r_new")
    log = server.current_log()
    assert log.count(trouble) == 1 and log.count("disk trouble:") == 1, log
    assert "Traceback" not in log and "#critical]" not in log, log


def test_topic_creates_on_a_full_disk_fail_with_each_protocols_error(tmp_path):
    """On a full disk a topic create fails however it comes (smss CREATE, NSQ's HTTP
    /topic/create and PUB, a RocketMQ send that auto-creates): each with its protocol's
    error, one log line, counted; the broker goes on serving and topic.json stays whole."""
    from tests.support.nsq import http

    with _state_server(tmp_path) as (server, control, rmq):
        before = _topic_json(server)
        errors = _metric(server, "mqserver_store_disk_errors_total")

        (control / "enospc").touch()
        with SmssClient("127.0.0.1", server.smss_port) as smss:
            with pytest.raises(SmssError, match="disk full"):
                smss.create("s_new")
        status, _, body = http(server.ports["NsqdHttpSite"], "POST", "/topic/create?topic=n_new")
        assert (status, body) == (500, b'{"message": "INTERNAL_ERROR"}')
        nsq = V2(server.ports["NsqdFactory"])
        t, data = nsq_pub(nsq, "n_new", b"m")
        assert t == 1 and data.startswith(b"E_PUB_FAILED") and b"disk full" in data, data
        nsq.close()
        r = rocket_send(rmq, "r_new", b"refused")
        assert r.code == codes.SERVICE_NOT_AVAILABLE and "disk is full" in r.remark, r.remark
        assert _metric(server, "mqserver_store_disk_errors_total") >= errors + 4
        assert _topic_json(server) == before

        os.remove(control / "enospc")
        assert rocket_send(rmq, "r_new", b"after").code == codes.SUCCESS
        with SmssClient("127.0.0.1", server.smss_port) as smss:
            smss.create("s_new")
        assert http(server.ports["NsqdHttpSite"], "POST", "/topic/create?topic=n_new")[0] == 200
        _one_quiet_trouble(server, "disk trouble: write failed: [Errno 28] No space left on device")


def test_topic_json_that_cannot_be_written_fails_the_send_that_created_the_topic(tmp_path):
    """The disk takes commit-log writes (into a segment already there) but no new file:
    a RocketMQ send that auto-creates a topic fails with the full-disk answer because
    topic.json cannot hold it; that is one log line (no traceback), counted; the old
    topic.json stays whole, the broker goes on serving, and topic.json is written once
    the disk has room."""
    with _state_server(tmp_path) as (server, control, rmq):
        before = _topic_json(server)
        errors = _metric(server, "mqserver_store_disk_errors_total")

        (control / "json-enospc").touch()
        r = rocket_send(rmq, "r_new", b"refused")
        assert r.code == codes.SERVICE_NOT_AVAILABLE and "disk is full" in r.remark, r.remark
        assert _metric(server, "mqserver_store_disk_errors_total") >= errors + 1
        assert _topic_json(server) == before
        with SmssClient("127.0.0.1", server.smss_port) as smss:  # the broker serves on
            smss.create("s_new")
            smss.publish("s_new", [b"still serving"])
        assert rocket_send(rmq, "r_old", b"still serving").code == codes.SUCCESS

        os.remove(control / "json-enospc")
        _one_quiet_trouble(server, "disk trouble: writing topic.json failed: [Errno 28] No space left on device")


def test_consumer_offsets_that_cannot_be_saved_are_saved_later(tmp_path):
    """The 5-second save of consumer offsets on a disk that takes no new file: one log
    line (no traceback), counted, and the saves go on: the offset is in the file once the
    disk has room."""
    import json

    def saved():
        try:
            with open(os.path.join(server.data, "consumerOffset.json")) as f:
                return json.load(f)["offsetTable"].get("r_old@G", {}).get("0") == 1
        except FileNotFoundError:
            return False

    with _state_server(tmp_path) as (server, control, rmq):
        errors = _metric(server, "mqserver_store_disk_errors_total")
        (control / "json-enospc").touch()
        r = rmq.call(codes.UPDATE_CONSUMER_OFFSET, {"topic": "r_old", "consumerGroup": "G", "queueId": 0,
                                                    "commitOffset": 1})
        assert r.code == codes.SUCCESS
        wait_until(lambda: _metric(server, "mqserver_store_disk_errors_total") > errors, 20,
                   "the failed save counted")
        assert not saved()
        os.remove(control / "json-enospc")
        wait_until(saved, 20, "the offset saved")
        log = server.current_log()
        assert log.count("disk trouble: writing consumer offsets failed: [Errno 28]") == 1, log
        assert "Traceback" not in log and "#critical]" not in log, log
