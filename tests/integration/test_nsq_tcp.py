"""nsqd V2 TCP protocol against the real broker, with raw sockets: frames, the message
header, RDY/FIN/REQ/TOUCH semantics, and error frames / close behaviour (as nsqd 1.3.0)."""

import json
import socket
import time

import pytest

from protocols.nsq.codec import encode_command, encode_mpub
from tests.support.nsq import nsq_broker, v2_connections


@pytest.fixture(scope="module")
def nsq(tmp_path_factory):
    with nsq_broker(tmp_path_factory.mktemp("nsqtcp") / "broker") as ports:
        yield ports


@pytest.fixture
def conns(nsq):
    with v2_connections(nsq.tcp) as connect:
        yield connect


def identify(c, **fields):
    c.send(encode_command("IDENTIFY", body=json.dumps(fields).encode()))
    return c.frame()


def backlog_and_consumer(conns, topic, bodies, rdy):
    """Publish C{bodies} to C{topic} with one MPUB, then subscribe a new connection to
    its channel "ch" at C{rdy}; returns (producer, consumer)."""
    p = conns()
    p.send(encode_mpub(topic, bodies))
    assert p.frame() == (0, b"OK")
    c = conns()
    c.send(b"SUB %s ch\nRDY %d\n" % (topic.encode(), rdy))
    assert c.frame() == (0, b"OK")
    return p, c


def test_publish_commands_answer_ok(conns):
    p = conns()
    p.send(encode_command("PUB", "t_ok", body=b"hello") + encode_mpub("t_ok", [b"a", b"bc"])
           + encode_command("DPUB", "t_ok", 10, body=b"later") + b"NOP\n")
    assert p.frames(3) == [(0, b"OK")] * 3


def test_message_frame_header_and_fin(conns):
    p = conns()
    p.send(encode_command("PUB", "t_hdr", body=b"hello"))
    assert p.frame() == (0, b"OK")
    c = conns()
    c.send(b"SUB t_hdr ch\n")
    assert c.frame() == (0, b"OK")
    before = time.time_ns()
    c.send(b"RDY 1\n")
    (m,) = c.messages(1)
    assert m.body == b"hello" and m.attempts == 1
    assert len(m.msg_id) == 16 and int(m.msg_id, 16) > 0  # hex of the eventId
    assert 0 < m.timestamp <= before  # store timestamp in ns
    c.send(b"FIN " + m.msg_id + b"\n")
    c.send(b"FIN " + m.msg_id + b"\n")  # a second FIN: not in flight, not fatal
    assert c.frame() == (1, b"E_FIN_FAILED FIN " + m.msg_id + b" failed ID not in flight")
    c.send(b"NOP\n")
    c.sock.settimeout(0.3)
    assert c.closed() is False


def test_a_run_of_fins_in_one_write_stops_only_for_the_failing_ones(conns):
    """Readers FIN in runs: good ids around a repeated one, an unknown one and one in
    another spelling (uppercase hex) are each handled in order, in one write."""
    p, c = backlog_and_consumer(conns, "t_finrun", [b"m%d" % i for i in range(6)], rdy=6)
    ms = c.messages(6)
    ids = [m.msg_id for m in ms]
    unknown = b"%016x" % (int(ids[-1], 16) + 1000)
    lines = [ids[0], ids[1], ids[1], ids[2], unknown, ids[3], ids[4].upper(), ids[4], ids[5]]
    c.send(b"".join(b"FIN " + i + b"\n" for i in lines) + b"NOP\n")
    assert c.frames(3) == [
        (1, b"E_FIN_FAILED FIN " + ids[1] + b" failed ID not in flight"),
        (1, b"E_FIN_FAILED FIN " + unknown + b" failed ID not in flight"),
        (1, b"E_FIN_FAILED FIN " + ids[4].upper() + b" failed ID not in flight"),
    ]
    # every message was finished exactly once: nothing comes back, the channel is empty
    p.send(encode_command("PUB", "t_finrun", body=b"after"))
    assert p.frame() == (0, b"OK")
    (after,) = c.messages(1)
    assert after.body == b"after"


def test_identify_feature_negotiation(conns):
    c = conns()
    t, data = identify(c, feature_negotiation=True, client_id="x", heartbeat_interval=5000,
                       msg_timeout=2000, output_buffer_timeout=50)
    reply = json.loads(data)
    assert t == 0
    assert reply["max_rdy_count"] == 2500 and reply["version"] == "1.3.0"
    assert reply["msg_timeout"] == 2000 and reply["output_buffer_timeout"] == 50
    assert reply["auth_required"] is False and reply["snappy"] is False
    c2 = conns()
    assert identify(c2, client_id="plain") == (0, b"OK")


def test_rdy_flow_control_and_fin_frees_slots(conns):
    p, c = backlog_and_consumer(conns, "t_rdy", [b"m%d" % i for i in range(5)], rdy=2)
    first = c.messages(2)
    c.sock.settimeout(0.5)
    assert c.closed() is False and c.pending == []  # window full: nothing more
    c.sock.settimeout(10)
    c.send(b"FIN " + first[0].msg_id + b"\n")
    (third,) = c.messages(1)
    c.send(b"FIN " + first[1].msg_id + b"\nFIN " + third.msg_id + b"\n")
    rest = c.messages(2)
    assert [m.body for m in first + [third] + rest] == [b"m0", b"m1", b"m2", b"m3", b"m4"]


def test_req_redelivers_with_attempts(conns):
    p = conns()
    p.send(encode_command("PUB", "t_req", body=b"again"))
    p.frame()
    c = conns()
    c.send(b"SUB t_req ch\nRDY 1\n")
    assert c.frame() == (0, b"OK")
    (m1,) = c.messages(1)
    c.send(b"REQ " + m1.msg_id + b" 0\n")
    (m2,) = c.messages(1)
    assert (m2.msg_id, m2.attempts, m2.body) == (m1.msg_id, 2, b"again")
    start = time.monotonic()
    c.send(b"REQ " + m2.msg_id + b" 300\n")
    (m3,) = c.messages(1)
    assert time.monotonic() - start >= 0.29
    assert m3.attempts == 3
    c.send(b"FIN " + m3.msg_id + b"\n")


def test_timeout_redelivery_and_touch(conns):
    p = conns()
    p.send(encode_mpub("t_to", [b"slow", b"touched"]))
    p.frame()
    c = conns()
    identify(c, msg_timeout=1000)
    c.send(b"SUB t_to ch\nRDY 2\n")
    assert c.frame() == (0, b"OK")
    slow, touched = c.messages(2)
    start = time.monotonic()
    # TOUCH one of them until the other comes back: each TOUCH restarts its 1 s timeout,
    # so it outlives the timeout both started with (a failed TOUCH would be an error frame)
    c.sock.settimeout(0.2)
    again = None
    while again is None:
        assert time.monotonic() - start < 10, "the untouched message never came back"
        c.send(b"TOUCH " + touched.msg_id + b"\n")
        try:
            (again,) = c.messages(1)
        except socket.timeout:
            pass
    c.sock.settimeout(10)
    assert again.msg_id == slow.msg_id and again.attempts == 2
    assert time.monotonic() - start >= 0.9
    c.send(b"FIN " + touched.msg_id + b"\nFIN " + again.msg_id + b"\n")
    c.send(b"TOUCH 0000000000000000\n")
    assert c.frame() == (1, b"E_TOUCH_FAILED TOUCH 0000000000000000 failed ID not in flight")


def test_dpub_is_delivered_after_its_delay(conns):
    c = conns()
    c.send(b"SUB t_dpub ch\nRDY 5\n")
    assert c.frame() == (0, b"OK")
    p = conns()
    start = time.monotonic()
    p.send(encode_command("DPUB", "t_dpub", 700, body=b"late") + encode_command("PUB", "t_dpub", body=b"now"))
    assert p.frames(2) == [(0, b"OK"), (0, b"OK")]
    first, second = c.messages(2)
    assert (first.body, second.body) == (b"now", b"late")
    assert time.monotonic() - start >= 0.69


def test_two_consumers_share_a_channel(conns):
    a, b = conns(), conns()
    for c in (a, b):
        c.send(b"SUB t_share ch\nRDY 100\n")
        assert c.frame() == (0, b"OK")
    p = conns()
    p.send(encode_mpub("t_share", [b"%d" % i for i in range(40)]))
    p.frame()
    got = []
    a.sock.settimeout(0.3)
    b.sock.settimeout(0.3)
    deadline = time.monotonic() + 10
    while len(got) < 40 and time.monotonic() < deadline:
        for c in (a, b):
            try:
                while True:
                    (m,) = c.messages(1)
                    got.append(m.body)
                    c.send(b"FIN " + m.msg_id + b"\n")
            except OSError:
                pass  # nothing more for now on this one
    assert sorted(got, key=int) == [b"%d" % i for i in range(40)]


def test_cls_replies_close_wait_and_keeps_socket(conns):
    c = conns()
    c.send(b"SUB t_cls ch\nRDY 1\nCLS\n")
    assert c.frames(2) == [(0, b"OK"), (0, b"CLOSE_WAIT")]
    c.send(b"RDY 5\nNOP\n")  # ignored after CLS
    c.sock.settimeout(0.5)
    assert c.closed() is False


@pytest.mark.parametrize("data, frame", [
    (b"FIN 0000000000000000\n", b"E_INVALID cannot FIN in current state"),
    (b"BOGUS\n", b"E_INVALID invalid command BOGUS"),
    (b"RDY 1\n", b"E_INVALID cannot RDY in current state"),
    (b"CLS\n", b"E_INVALID cannot CLS in current state"),
    (b"PUB bad!topic\n", b'E_BAD_TOPIC PUB topic name "bad!topic" is not valid'),
    (b"SUB t bad!ch\n", b'E_BAD_CHANNEL SUB channel name "bad!ch" is not valid'),
    (b"PUB t\n\x00\x00\x00\x00", b"E_BAD_MESSAGE PUB invalid message body size 0"),
    (b"AUTH\n\x00\x00\x00\x03abc", b"E_AUTH_DISABLED AUTH disabled"),
    (b"SUB t\n", b"E_INVALID SUB insufficient number of parameters"),
    (b'IDENTIFY\n\x00\x00\x00\x02{]', b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
    (b'IDENTIFY\n\x00\x00\x00\x1a{"heartbeat_interval":500}',
     b"E_BAD_BODY IDENTIFY heartbeat interval (500) is invalid"),
    (b"DPUB t 3600001\n", b"E_INVALID DPUB timeout 3600001 out of range 0-3600000"),
])
def test_fatal_errors_close_the_connection(conns, data, frame):
    c = conns()
    c.send(data)
    assert c.frame() == (1, frame)
    assert c.closed()


def test_fatal_rdy_out_of_range_after_sub(conns):
    c = conns()
    c.send(b"SUB t_rdyr ch\nRDY 2501\n")
    assert c.frames(2) == [(0, b"OK"), (1, b"E_INVALID RDY count 2501 out of range 0-2500")]
    assert c.closed()


def test_second_sub_is_fatal(conns):
    c = conns()
    c.send(b"SUB t_two a\nSUB t_two b\n")
    assert c.frames(2) == [(0, b"OK"), (1, b"E_INVALID cannot SUB in current state")]
    assert c.closed()


def test_bad_magic(nsq):
    import socket
    s = socket.create_connection(("127.0.0.1", nsq.tcp), timeout=5)
    s.sendall(b"  V1")
    data = b""
    while True:
        chunk = s.recv(100)
        if not chunk:
            break
        data += chunk
    assert data == b"\x00\x00\x00\x12\x00\x00\x00\x01E_BAD_PROTOCOL"


def test_heartbeats_and_idle_close(conns):
    c = conns()
    identify(c, heartbeat_interval=1000)
    start = time.monotonic()
    assert c.frames(1, skip_heartbeats=False) == [(0, b"_heartbeat_")]
    assert c.closed()
    assert time.monotonic() - start >= 1.5


def test_sub_needs_heartbeats(conns):
    c = conns()
    identify(c, heartbeat_interval=-1)
    c.send(b"SUB t_hb ch\n")
    assert c.frame() == (1, b"E_INVALID cannot SUB with heartbeats disabled")
    assert c.closed()


def test_only_the_owner_may_fin_req_touch(conns):
    p = conns()
    p.send(encode_command("PUB", "t_own", body=b"mine"))
    p.frame()
    a, b = conns(), conns()
    a.send(b"SUB t_own ch\nRDY 1\n")
    assert a.frame() == (0, b"OK")
    (m,) = a.messages(1)
    b.send(b"SUB t_own ch\n")
    assert b.frame() == (0, b"OK")
    b.send(b"FIN " + m.msg_id + b"\nREQ " + m.msg_id + b" 0\nTOUCH " + m.msg_id + b"\n")
    assert b.frames(3) == [
        (1, b"E_FIN_FAILED FIN " + m.msg_id + b" failed client does not own message"),
        (1, b"E_REQ_FAILED REQ " + m.msg_id + b" failed client does not own message"),
        (1, b"E_TOUCH_FAILED TOUCH " + m.msg_id + b" failed client does not own message"),
    ]
    b.send(b"NOP\n")
    b.sock.settimeout(0.3)
    assert b.closed() is False  # non-fatal
    a.send(b"FIN " + m.msg_id + b"\n")
    a.send(b"FIN " + m.msg_id + b"\n")
    assert a.frame() == (1, b"E_FIN_FAILED FIN " + m.msg_id + b" failed ID not in flight")


def test_messages_published_one_by_one_reach_a_buffering_consumer_in_one_flush(conns):
    """A consumer with RDY to spare and a 1 s output buffer timeout gets messages
    published one at a time in one flush, in order, after the timeout (the broker leaves
    them in the store until that flush, as nsqd's buffered writer holds them); the one
    that fills its RDY goes at once."""
    p = conns()
    p.send(encode_command("PUB", "t_buffered", body=b"first"))
    assert p.frame() == (0, b"OK")
    c = conns()
    identify(c, output_buffer_timeout=1000)
    c.send(b"SUB t_buffered ch\nRDY 5\n")
    assert c.frame() == (0, b"OK")
    t0 = time.monotonic()
    for body in (b"a", b"b", b"c"):
        p.send(encode_command("PUB", "t_buffered", body=body))
        assert p.frame() == (0, b"OK")
    got = c.messages(4)
    assert [m.body for m in got] == [b"first", b"a", b"b", b"c"]
    assert time.monotonic() - t0 >= 0.8  # held for the buffer's timeout, not sent one by one
    p.send(encode_command("PUB", "t_buffered", body=b"d"))
    assert p.frame() == (0, b"OK")
    t1 = time.monotonic()
    (m,) = c.messages(1)  # in flight 5 = RDY 5: flushed at once
    assert m.body == b"d" and time.monotonic() - t1 < 0.5
