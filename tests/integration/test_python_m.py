"""``python -m mqserver`` (what ``make run`` and the test harness start): twistd as its
script runs it."""

import os
import signal
import socket

from protocols.smss.client import SmssClient
from protocols.smss.messages import Batch
from tests.support.server import ServerProcess, twistd_command


def test_python_m_mqserver_serves_and_stops(tmp_path):
    """Started as ``make run`` starts it, a broker with the smss and nsqd doors serves a
    publish and a subscription (smss) and an NSQ PUB, and stops cleanly on SIGTERM."""
    assert twistd_command()[1:] == ["-m", "mqserver"]
    s = ServerProcess(tmp_path / "data", listen={"smss": "tcp:0:interface=127.0.0.1",
                                                 "nsqd_tcp": "tcp:0:interface=127.0.0.1"})
    s.start(timeout=60)
    try:
        with SmssClient("127.0.0.1", s.smss_port, timeout=10) as c:
            c.create("lean")
            c.publish("lean", [b"one", b"two"])
            sub = c.subscribe("lean", 0, batch=10, who=b"lean")
            batch = sub.next_batch(10)
            assert isinstance(batch, Batch)
            assert [m.body for m in batch.messages] == [b"one", b"two"]
            sub.ack_end()
        with socket.create_connection(("127.0.0.1", s.ports["NsqdFactory"]), timeout=10) as n:
            n.sendall(b"  V2PUB lean\n" + (5).to_bytes(4, "big") + b"hello")
            reply = b""
            while len(reply) < 10:
                chunk = n.recv(10 - len(reply))
                assert chunk, reply
                reply += chunk
            assert reply == (6).to_bytes(4, "big") + (0).to_bytes(4, "big") + b"OK"
        assert s.stop(timeout=20) in (0, -signal.SIGTERM)
    finally:
        s.close()
    log = s.read_log()
    assert "Traceback" not in log, log
    assert os.path.isfile(tmp_path / "data" / "metadata.json")
