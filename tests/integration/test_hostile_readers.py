"""The broker's memory under clients that ask for much and read little, against the
real broker: what an smss subscription or pipelined RocketMQ PULLs cost is bounded by an
answer and the socket's buffer, not by the topic (the RSS peaks of 225 MB seen under
fuzzing).

Each test resets the broker's peak RSS (VmHWM, through /proc/PID/clear_refs), runs the
hostile pattern, makes sure the broker handled it (the hostile connections get the first
byte of an answer, which the broker sends once it has handled the read), and compares
the peak with a generous bound derived from the data involved. A witness then reads the
topic whole: nothing was lost.
"""

import socket

import pytest

from protocols.remoting import codes
from protocols.smss import client_codec as cc
from tests.support.remoting_client import RemotingClient, heartbeat_body
from tests.support.server import ServerProcess
from tests.support.smss import connect, read_topic

LOOP = "tcp:0:interface=127.0.0.1"
MB = 1 << 20


def status_mb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} for {pid}")


def reset_peak(pid):
    """Start the broker's VmHWM again from its RSS now (skips where not allowed)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError as e:
        pytest.skip(f"cannot reset the peak RSS: {e}")
    return status_mb(pid, "VmRSS")


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    s = ServerProcess(tmp_path_factory.mktemp("hostile-readers") / "broker",
                      listen={"smss": LOOP, "broker": LOOP})
    try:
        s.start()
        yield s
        assert s.stop() is not None
    finally:
        s.close()


def peak_growth(broker, port, requests):
    """Send each of C{requests} on its own connection to C{port}, reading nothing but the
    first byte of an answer (the broker sends it once it has handled the read); return
    how far the broker's peak RSS rose, in MB, while they were open."""
    pid = broker.proc.pid
    base = reset_peak(pid)
    socks = []
    try:
        for data in requests:
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
            s.sendall(data)
            socks.append(s)
        for s in socks:
            assert s.recv(1), "the broker answers"
        return status_mb(pid, "VmHWM") - base
    finally:
        for s in socks:
            s.close()


def test_acks_sent_without_reading_do_not_buffer_the_topic(broker):
    """4 subscribers each send SUB (batch 255) and 10,000 acks ahead, and never read: the
    broker sends each the batches its socket takes and then waits, instead of putting
    the topic's 16 MB into each connection's output buffer (at least 64 MB)."""
    c = connect(broker)
    c.create("deep")
    body = bytes(8 << 10)
    for _ in range(40):
        c.publish("deep", [body] * 50)  # 16 MB in 2,000 messages
    c.close()
    peak = peak_growth(broker, broker.smss_port, [
        cc.encode_sub(b"deep", 0, batch=255, ack_timeout_ns=60 * 10**9, who=b"hostile%d" % i)
        + cc.encode_ack(0) * 10_000 for i in range(4)])
    # a batch is 255 x 8 KB = 2 MB; allow two per subscriber and 16 MB more
    assert peak < 4 * 2 * 2 + 16, f"peak RSS grew {peak:.1f} MB"
    # an ordinary subscriber still reads the topic whole
    assert len(read_topic(broker, "deep", count=2000)) == 2000


def test_a_batch_of_a_many_queue_topic_reads_its_records_only(broker):
    """A 16-queue RocketMQ topic whose messages lie 16 KB apart in the log (filler of
    another topic between them), so each queue's lie 256 KB apart: 2 SUBs of batch 255
    each read about their records, not a MiB window around every few records of every
    queue (about 80 MB per SUB), and get them in eventId order."""
    queues, per_queue = 16, 20
    rmq = RemotingClient("127.0.0.1", broker.ports["BrokerDoor"])
    smss = connect(broker)
    try:
        assert rmq.call(codes.UPDATE_AND_CREATE_TOPIC, {
            "topic": "wide", "defaultTopic": "TBW102", "readQueueNums": queues,
            "writeQueueNums": queues, "perm": 6, "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": 0, "order": "false"}).code == codes.SUCCESS
        smss.create("filler")
        filler = bytes(16 << 10)
        for i in range(queues * per_queue):
            r = rmq.call(codes.SEND_MESSAGE_V2, {
                "a": "PG", "b": "wide", "c": "TBW102", "d": "4", "e": str(i % queues), "f": "0",
                "g": "0", "h": "0", "i": "", "j": "0", "k": "false", "m": "false"}, b"w%05d" % i)
            assert r.code == codes.SUCCESS, r
            smss.publish("filler", [filler])
    finally:
        rmq.close()
        smss.close()
    peak = peak_growth(broker, broker.smss_port,
                       [cc.encode_sub(b"wide", 0, batch=255, who=b"wide%d" % i) for i in range(2)])
    # a batch spans 255 x 16 KB = 4 MB of log: at most that is read
    assert peak < 16, f"peak RSS grew {peak:.1f} MB"
    got = read_topic(broker, "wide", count=queues * per_queue)
    assert [m.body for m in got] == [b"w%05d" % i for i in range(queues * per_queue)]


def test_pipelined_pulls_that_are_never_read_do_not_buffer_their_answers(broker):
    """300 PULLs of a 1 MiB batch (96 KB of requests) from a client that never reads: the
    broker stops reading its requests once the socket's buffer is full, instead of
    holding 300 MiB of answers (100 PULLs peaked at 289 MB more RSS before)."""
    rmq = RemotingClient("127.0.0.1", broker.ports["BrokerDoor"])
    fields = {"consumerGroup": "g", "topic": "pulled", "queueId": 0, "queueOffset": 0,
              "maxMsgNums": 32, "sysFlag": 2, "commitOffset": 0, "suspendTimeoutMillis": 0,
              "subscription": "*", "subVersion": 0, "expressionType": "TAG"}
    try:
        assert rmq.call(codes.UPDATE_AND_CREATE_TOPIC, {
            "topic": "pulled", "defaultTopic": "TBW102", "readQueueNums": 1, "writeQueueNums": 1,
            "perm": 6, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0,
            "order": "false"}).code == codes.SUCCESS
        for i in range(32):
            r = rmq.call(codes.SEND_MESSAGE_V2, {
                "a": "PG", "b": "pulled", "c": "TBW102", "d": "1", "e": "0", "f": "0", "g": "0",
                "h": "0", "i": "", "j": "0", "k": "false", "m": "false"}, bytes(32 << 10))
            assert r.code == codes.SUCCESS, r
        assert rmq.call(codes.HEART_BEAT, {}, heartbeat_body("c1", "g", ["pulled"])).code == codes.SUCCESS
        assert len(rmq.call(codes.PULL_MESSAGE, fields).body) > 1_000_000
        frames = b"".join(rmq.request_frame(codes.PULL_MESSAGE, fields)[1] for _ in range(300))
        peak = peak_growth(broker, broker.ports["BrokerDoor"], [frames])
        assert len(rmq.call(codes.PULL_MESSAGE, fields).body) > 1_000_000, "and pulls go on"
    finally:
        rmq.close()
    # answers of 1 MiB: the read in hand (256 KB of answers gathered) and a few beyond
    assert peak < 16, f"peak RSS grew {peak:.1f} MB"
