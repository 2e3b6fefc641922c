"""Compressed input that inflates to gigabytes, sent to the real broker process: every
door stops inflating at its size limit, answers with its protocol's error, and the
broker's peak RSS (VmHWM) stays under 200 MB."""

import json
import struct
import time
import zlib

import cramjam
import pytest

from protocols.nsq.codec import FrameReader
from protocols.nsq.compress import SNAPPY_STREAM_IDENTIFIER
from protocols.remoting import codes
from protocols.remoting.props import encode_batch_body
from tests.support.nsq import LOOPBACK, V2
from tests.support.remoting_client import RemotingClient
from tests.support.rmq import broker_port
from tests.support.server import ServerProcess

pytestmark = pytest.mark.timeout(180)

BOMB_SIZE = (16 << 20) - 4096  # compressed bytes: a little under the 16 MiB frame limit
RSS_LIMIT = 200 << 20
# What an NSQ stream bomb may add to the idle broker's peak: a few inflated pieces and
# one maximum-size message, not the 64 MiB one socket read of zeros inflates to. (A
# RocketMQ request is a whole 16 MiB frame, held while it is decoded.)
GROWTH_LIMIT = 48 << 20


def vm_hwm(pid):
    """Peak resident set size of process C{pid} in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def deflate_bomb(size, wbits, payload=b""):
    """Return about C{size} bytes of a DEFLATE stream (raw for C{wbits} -15, zlib for
    15) that inflates to C{payload} and then about 1000 times C{size} zero bytes.

    After a full flush the compressor starts afresh, so the bytes for one more MiB of
    zeros are the same every time: the stream is built by repetition, not by
    compressing gigabytes."""
    c = zlib.compressobj(9, zlib.DEFLATED, wbits)
    head = c.compress(payload + bytes(1 << 20)) + c.flush(zlib.Z_FULL_FLUSH)
    unit = c.compress(bytes(1 << 20)) + c.flush(zlib.Z_FULL_FLUSH)
    return head + unit * max(1, (size - len(head)) // len(unit))


def snappy_bomb(size):
    """Return about C{size} bytes of snappy framing chunks (no stream identifier), each
    inflating to 64 KiB of zeros."""
    chunk = bytes(cramjam.snappy.compress(bytes(65536)))[len(SNAPPY_STREAM_IDENTIFIER):]
    return chunk * (size // len(chunk))


@pytest.fixture
def srv(tmp_path):
    """A broker of its own for each test: VmHWM is the peak over the process's life.

    Only the doors these tests use are open."""
    listen = {name: LOOPBACK for name in ("smss", "namesrv", "broker", "nsqd_tcp")}
    s = ServerProcess(tmp_path / "data", listen=listen)
    with s.start():
        s.idle_peak = vm_hwm(s.proc.pid)
        yield s


def assert_alive_and_small(srv, growth_limit=None):
    """The broker still answers a normal request and its peak RSS is under the limit
    (and grew by less than C{growth_limit} over the idle broker's, if given)."""
    c = RemotingClient("127.0.0.1", broker_port(srv))
    try:
        r = c.call(codes.SEND_MESSAGE, {"producerGroup": "PG", "topic": "Alive", "defaultTopic": "TBW102",
                                        "defaultTopicQueueNums": 4, "queueId": 0, "sysFlag": 0,
                                        "bornTimestamp": 0, "flag": 0, "properties": "", "reconsumeTimes": 0,
                                        "unitMode": "false", "batch": "false"}, b"still here")
        assert r.code == codes.SUCCESS
    finally:
        c.close()
    peak = vm_hwm(srv.proc.pid)
    print(f"peak RSS {peak >> 20} MiB, idle {srv.idle_peak >> 20} MiB")
    assert peak < RSS_LIMIT, f"broker peak RSS {peak >> 20} MiB"
    if growth_limit is not None:
        assert peak - srv.idle_peak < growth_limit, f"peak RSS grew by {(peak - srv.idle_peak) >> 20} MiB"
    assert "Traceback" not in srv.current_log()


def send_header(batch, sys_flag=1):
    return {"producerGroup": "PG", "topic": "Bomb", "defaultTopic": "TBW102", "defaultTopicQueueNums": 4,
            "queueId": 0, "sysFlag": sys_flag, "bornTimestamp": 0, "flag": 0, "properties": "",
            "reconsumeTimes": 0, "unitMode": "false", "batch": "true" if batch else "false"}


def test_rocketmq_compressed_batch_stops_at_max_message_size(srv):
    """A compressed SEND_BATCH_MESSAGE whose body inflates past store.maxMessageSize
    (4 MiB) is refused with MESSAGE_ILLEGAL after inflating no more than that."""
    batch = encode_batch_body([(0, bytes(64), {"UNIQ_KEY": "U1"})])
    c = RemotingClient("127.0.0.1", broker_port(srv), timeout=60)
    try:
        r = c.call(codes.SEND_BATCH_MESSAGE, send_header(True), deflate_bomb(BOMB_SIZE, 15, batch), timeout=60)
        assert r.code == codes.MESSAGE_ILLEGAL
        assert "max" in r.remark
        # the connection is kept, as for any refused send
        ok = c.call(codes.SEND_BATCH_MESSAGE, send_header(True),
                    zlib.compress(encode_batch_body([(0, b"small", {"UNIQ_KEY": "U2"})])))
        assert ok.code == codes.SUCCESS
    finally:
        c.close()
    assert_alive_and_small(srv)


def test_rocketmq_compressed_single_send_is_not_inflated(srv):
    """A single message keeps its compressed body (the consumer inflates it, as with
    RocketMQ): a 16 MiB one is refused by its size before anything is inflated."""
    c = RemotingClient("127.0.0.1", broker_port(srv), timeout=60)
    try:
        r = c.call(codes.SEND_MESSAGE, send_header(False), deflate_bomb(BOMB_SIZE, 15), timeout=60)
        assert r.code == codes.MESSAGE_ILLEGAL
    finally:
        c.close()
    assert_alive_and_small(srv)


def test_namesrv_compressed_register_body_is_bounded(srv):
    """A compressed REGISTER_BROKER body that inflates to gigabytes is refused."""
    c = RemotingClient("127.0.0.1", srv.ports["NamesrvFactory"], timeout=60)
    try:
        r = c.call(codes.REGISTER_BROKER, {"brokerName": "b", "brokerAddr": "127.0.0.1:1", "clusterName": "C",
                                           "haServerAddr": "", "brokerId": 0, "compressed": "true",
                                           "bodyCrc32": 0}, deflate_bomb(BOMB_SIZE, 15), timeout=60)
        assert r.code == codes.SYSTEM_ERROR
    finally:
        c.close()
    assert_alive_and_small(srv)


def identify(port, **features):
    """Return a raw V2 socket that negotiated C{features}, and the bytes read after
    the IDENTIFY response (already compressed)."""
    conn = V2(port, timeout=60)
    body = json.dumps(dict(feature_negotiation=True, **features)).encode()
    conn.send(b"IDENTIFY\n" + struct.pack(">I", len(body)) + body)
    raw = b""
    while len(raw) < 4 or len(raw) < 4 + struct.unpack(">I", raw[:4])[0]:
        raw += conn.sock.recv(1 << 16)
    size = 4 + struct.unpack(">I", raw[:4])[0]
    assert json.loads(raw[8:size])[next(iter(features))]
    return conn, raw[size:]


def read_until_closed(conn, raw, inflate):
    """Read every byte until the broker closes; return the frames it sent (inflated)."""
    conn.sock.settimeout(60)
    while True:
        try:
            data = conn.sock.recv(1 << 16)
        except ConnectionResetError:
            break
        if not data:
            break
        raw += data
    return FrameReader().feed(inflate(raw))


def send_all(conn, data):
    try:
        conn.sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the broker may close before reading everything: that is the point


@pytest.mark.parametrize("payload", [b"", b"PUB t\n" + struct.pack(">I", 1 << 20)])
def test_nsq_deflate_bomb(srv, payload):
    """After IDENTIFY with deflate, a stream inflating to gigabytes of zeros (a line
    that never ends, or a PUB whose size word is 0) ends in an error frame and a
    closed connection, not in gigabytes held in memory."""
    conn, raw = identify(srv.ports["NsqdFactory"], deflate=True, deflate_level=6)
    d = zlib.decompressobj(-15)
    # the OK that ends the upgrade is already deflated
    frames = []
    try:
        send_all(conn, deflate_bomb(BOMB_SIZE, -15, payload))
        frames = read_until_closed(conn, raw, d.decompress)
    finally:
        conn.close()
    # a close with unread input resets the connection, which may drop the error frame
    assert frames[0] == (0, b"OK")
    assert all(f == (0, b"OK") or f[0] == 1 and f[1].startswith(b"E_") for f in frames[1:])
    assert_alive_and_small(srv, GROWTH_LIMIT)


def test_nsq_snappy_bomb(srv):
    """The same with snappy: chunks of zeros, 21 times their size once inflated."""
    conn, raw = identify(srv.ports["NsqdFactory"], snappy=True)
    frames = []
    try:
        send_all(conn, SNAPPY_STREAM_IDENTIFIER + snappy_bomb(BOMB_SIZE))
        frames = read_until_closed(conn, raw, lambda raw: bytes(cramjam.snappy.decompress(raw)))
    finally:
        conn.close()
    # a close with unread input resets the connection, which may drop the error frame
    assert frames[0] == (0, b"OK")
    assert all(f == (0, b"OK") or f[0] == 1 and f[1].startswith(b"E_") for f in frames[1:])
    assert_alive_and_small(srv, GROWTH_LIMIT)


@pytest.mark.parametrize("door", ["BrokerDoor", "NamesrvFactory"])
def test_remoting_deeply_nested_header_closes_without_traceback(srv, door):
    """A frame whose JSON header is 100,000 "[" closes that connection with a log line
    (a malformed frame, as RocketMQ's decoder treats one), never a RecursionError."""
    header = b"[" * 100_000
    c = RemotingClient("127.0.0.1", srv.ports[door])
    try:
        c.send_raw(struct.pack(">II", 4 + len(header), len(header)) + header)
        with pytest.raises((ConnectionError, OSError)):
            c.recv(timeout=10)
    finally:
        c.close()
    assert "nested too deeply" in srv.current_log()
    assert_alive_and_small(srv)


def test_remoting_deeply_nested_body_is_refused(srv):
    """A HEARTBEAT whose JSON body nests 100,000 deep gets SYSTEM_ERROR back."""
    c = RemotingClient("127.0.0.1", broker_port(srv))
    try:
        r = c.call(codes.HEART_BEAT, {}, b"[" * 100_000)
        assert r.code == codes.SYSTEM_ERROR
        r = c.call(codes.HEART_BEAT, {}, b"[1, 2]")
        assert r.code == codes.SYSTEM_ERROR
    finally:
        c.close()
    assert_alive_and_small(srv)


# -- idle connections ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def idle_srv(tmp_path_factory):
    """A broker whose doors close connections silent for 1 s."""
    listen = {name: LOOPBACK for name in ("smss", "namesrv", "broker", "nsqd_tcp", "lookupd_tcp")}
    config = {"timeout": {"net": {"idle": 1000}, "server": {"alive": 300}},
              "rocketmq": {"serverChannelMaxIdleTimeSeconds": 1}, "nsq": {"lookupdIdleTimeout": 1000}}
    s = ServerProcess(tmp_path_factory.mktemp("idle") / "data", listen=listen, config=config)
    with s.start():
        yield s


def wait_closed(sock, timeout):
    """Read until the peer closes; return the seconds it took (None: still open)."""
    start = time.monotonic()
    sock.settimeout(timeout)
    try:
        while sock.recv(1 << 16):
            pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - start


@pytest.mark.parametrize("door", ["SmssFactory", "BrokerDoor", "NamesrvFactory", "LookupdFactory"])
def test_silent_connection_is_closed_after_the_idle_time(idle_srv, door):
    import socket

    sock = socket.create_connection(("127.0.0.1", idle_srv.ports[door]))
    try:
        took = wait_closed(sock, 10)
    finally:
        sock.close()
    assert took is not None and 0.9 < took < 5
    assert "closing idle" in idle_srv.current_log()


def test_smss_subscriber_outlives_the_idle_time(idle_srv):
    """A SUB stream that only receives ALIVE is not idle: after three idle timeouts it
    still gets the message published then."""
    from protocols.smss.client import SmssClient
    from protocols.smss.messages import AliveResponse, Batch

    port = idle_srv.ports["SmssFactory"]
    admin = SmssClient("127.0.0.1", port)
    admin.create("idle-t")
    admin.close()  # silent for 3 s it would be closed: a new one publishes later
    sub_client = SmssClient("127.0.0.1", port)
    try:
        sub = sub_client.subscribe("idle-t", 0, who=b"w")
        alive = 0
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert isinstance(sub.next_batch(timeout=2), AliveResponse)
            alive += 1
        assert alive >= 5
        admin = SmssClient("127.0.0.1", port)
        admin.publish("idle-t", [b"late"])
        assert isinstance(next(e for e in iter(lambda: sub.next_batch(timeout=5), None)
                               if not isinstance(e, AliveResponse)), Batch)
    finally:
        sub_client.close()
        admin.close()


@pytest.mark.parametrize("read, write", [(2 ** 64, 16), (16, 1_000_000), (-5, 16)])
def test_rocketmq_topic_queue_counts_out_of_range_are_refused(srv, read, write):
    """UPDATE_AND_CREATE_TOPIC with a queue count outside 0..1024 gets SYSTEM_ERROR and
    changes nothing. (2**64 read queues were taken: the first NSQ SUB to that topic then
    walked 2**64 queues, and the broker stopped answering and grew past 6 GB.)"""
    c = RemotingClient("127.0.0.1", broker_port(srv))
    try:
        r = c.call(codes.UPDATE_AND_CREATE_TOPIC, {
            "topic": "Huge", "defaultTopic": "TBW102", "readQueueNums": read,
            "writeQueueNums": write, "perm": 6, "topicFilterType": "SINGLE_TAG",
            "order": "false"})
        assert r.code == codes.SYSTEM_ERROR
        assert "0..1024" in r.remark
        r = c.call(codes.GET_ALL_TOPIC_CONFIG, {})
        assert b'"Huge"' not in r.body
    finally:
        c.close()
    conn = V2(srv.ports["NsqdFactory"], timeout=20)
    try:
        conn.send(b"SUB Huge ch\n")  # the NSQ door creates the topic: one queue
        assert conn.frame() == (0, b"OK")
    finally:
        conn.sock.close()
    assert_alive_and_small(srv)
