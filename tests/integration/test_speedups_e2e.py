"""Both builds of the hot paths, end to end: the real broker with its C speedups and with
MQSERVER_PURE_PYTHON=1 publishes through smss and NSQ and delivers the same messages to
an smss subscriber and an NSQ channel (the unit tests compare the functions byte for
byte; this proves each build is the one running and serves real connections).

Each build runs on both reactor paths: the fast one (SpinningEPollReactor and send_now,
which read Twisted internals) and Twisted's standard epoll reactor with plain
transport.write (C{server.reactor: standard}, what a Twisted without those internals
gets), so a Twisted upgrade that takes the fallback is covered end to end."""

import socket
import time

import pytest

from protocols.nsq.frames import FrameReader, decode_message, encode_command, encode_mpub
from protocols.nsq.wire import FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE
from protocols.smss.client import SmssClient
from protocols.smss.messages import Batch
from protocols.smss.views import message_record
from tests.support.server import ServerProcess

TOPIC = "e2e"
SMSS_MESSAGES = [([(b"k", b"v")], b"with a header"), b"plain", ([(b"bin", b"\x01\xff")], b"framed")]
NSQ_BODIES = [b"nsq-%d" % i for i in range(40)]


@pytest.fixture(params=[(False, "spinning"), (False, "standard"), (True, "spinning"),
                        (True, "standard")],
                ids=["c-speedups", "c-speedups-standard-reactor", "pure-python",
                     "pure-python-standard-reactor"])
def broker(request, tmp_path):
    pure, reactor = request.param
    server = ServerProcess(
        tmp_path / "data", env={"MQSERVER_PURE_PYTHON": "1" if pure else "0"},
        config={"server": {"reactor": reactor}},
        listen={"smss": "tcp:0:interface=127.0.0.1", "nsqd_tcp": "tcp:0:interface=127.0.0.1"})
    server.start()
    try:
        yield server, pure, reactor
    finally:
        server.stop()
        server.close()


def _nsq_frames(sock, reader, want_messages, until=0):
    """Read frames until C{want_messages} message frames (and at least C{until} frames)
    came; the socket's timeout bounds each read."""
    got = []
    while (len([f for f in got if f[0] == FRAME_TYPE_MESSAGE]) < want_messages
           or len(got) < until):
        data = sock.recv(65536)
        assert data, "nsqd closed the connection"
        got += reader.feed(data)
    return got


def test_both_builds_deliver_alike(broker):
    server, pure, reactor = broker
    log = server.read_log()
    if reactor == "standard":
        assert "standard Twisted paths in use (epoll reactor, transport.write): " \
               "server.reactor is standard" in log, log
        assert "EPollReactor" in log and "SpinningEPollReactor" not in log, log
    else:
        assert "fast paths in use: SpinningEPollReactor and send_now" in log, log
    if pure:
        assert "pure Python for" in log and "MQSERVER_PURE_PYTHON is set" in log, log
    else:
        assert ("C speedups in use: mqserver.broker._inflight, mqserver.store._check, "
                "mqserver.store._hash, mqserver.store._index, mqserver.store._pack, "
                "protocols.nsq._frames, protocols.smss._feed, protocols.smss._pub, "
                "protocols.smss._push") in log, log

    with SmssClient("127.0.0.1", server.smss_port, timeout=10) as c:
        c.create(TOPIC)
        c.publish(TOPIC, SMSS_MESSAGES)

    nsq = socket.create_connection(("127.0.0.1", server.ports["NsqdFactory"]), timeout=10)
    try:
        nsq.sendall(b"  V2" + encode_mpub(TOPIC, NSQ_BODIES))
        reader = FrameReader()
        assert _nsq_frames(nsq, reader, 0, until=1) == [(FRAME_TYPE_RESPONSE, b"OK")]

        # smss: every message, with headers, in eventId order (records of both doors)
        with SmssClient("127.0.0.1", server.smss_port, timeout=10) as c:
            sub = c.subscribe(TOPIC, 0, batch=100, who=b"e2e")
            got = []
            total = len(SMSS_MESSAGES) + len(NSQ_BODIES)
            while len(got) < total:
                ev = sub.next_batch(10)
                assert isinstance(ev, Batch), ev
                got += ev.messages
                sub.ack() if len(got) < total else sub.ack_end()
        assert [(m.headers, m.body) for m in got] == [
            ([(b"k", b"v")], b"with a header"), ([], b"plain"),
            ([(b"bin", b"\x01\xff")], b"framed"),
        ] + [([], b) for b in NSQ_BODIES]
        event_ids = [m.event_id for m in got]
        assert event_ids == sorted(event_ids) and len(set(event_ids)) == len(event_ids)

        # NSQ: the first channel gets the whole backlog; FIN all, then nothing comes again
        nsq.sendall(encode_command("SUB", TOPIC, "ch") + encode_command("RDY", 100))
        frames = _nsq_frames(nsq, reader, len(got))
        messages = [decode_message(d) for t, d in frames if t == FRAME_TYPE_MESSAGE]
        # an smss message whose headers a properties string cannot carry is stored as
        # its whole smss record, and that is what other protocols see as the body
        framed = message_record([(b"bin", b"\x01\xff")], b"framed")
        assert [m.body for m in messages] == [b"with a header", b"plain", framed] + NSQ_BODIES
        assert [int(m.msg_id, 16) for m in messages] == event_ids
        assert all(m.attempts == 1 for m in messages)
        assert all(abs(m.timestamp / 1e9 - time.time()) < 60 for m in messages)  # ns
        nsq.sendall(b"".join(encode_command("FIN", m.msg_id) for m in messages) + b"NOP\n")
        nsq.settimeout(1.0)
        with pytest.raises(socket.timeout):  # FIN and NOP succeed silently
            data = nsq.recv(65536)
            pytest.fail(f"frames after the FINs: {reader.feed(data)}")
    finally:
        nsq.close()
