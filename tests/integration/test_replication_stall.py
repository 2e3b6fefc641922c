"""A slave process whose master keeps the replication connection alive but sends no
records while it says it is far ahead: the slave reports itself stalled (one log line,
its $replication status, its metrics) and reconnects.

The master here is a minimal smss peer on a loopback socket: it answers REPLICA with
ALIVE only and TOPIC INFO $replication with an appliedEventId of 500. A real master
that stops serving its log (as one did at a zero-filled region of its commit log) did
the same; the slave under test is the real broker process."""

import json
import socket
import threading

from protocols.smss import codec, wire
from tests.integration.test_ops_metrics import LOOP, scrape
from tests.integration.test_replication import status
from tests.support.wait import wait_until

MASTER_AT = 500


class StalledMaster(threading.Thread):
    """Accepts smss connections on 127.0.0.1: REPLICA gets an ALIVE every 0.1 s and
    nothing else; TOPIC INFO gets the replication status of a master at MASTER_AT.

    @ivar replicas: REPLICA connections accepted so far.
    """

    def __init__(self):
        super().__init__(daemon=True, name="stalled-master")
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.replicas = 0
        self.stopping = threading.Event()

    def run(self):
        self.sock.settimeout(0.1)
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        with conn:
            try:
                head = self._read(conn, wire.REQUEST_HEADER_SIZE)
                code, topic_len, body_len, trace_len = wire.REQUEST_HEADER_STRUCT.unpack(head)
                if code == wire.CMD_REPLICA:
                    self._read(conn, topic_len + trace_len + 8)
                    self.replicas += 1
                    conn.settimeout(0.1)
                    while not self.stopping.is_set():
                        conn.sendall(codec.alive())
                        try:
                            if not conn.recv(64):
                                return  # the slave closed it
                        except socket.timeout:
                            pass
                elif code == wire.CMD_TOPIC_INFO:
                    self._read(conn, topic_len + trace_len)
                    body = {"role": "master", "appliedEventId": MASTER_AT, "slaves": 1}
                    conn.sendall(codec.ok_json(json.dumps(body).encode()))
            except OSError:
                return

    @staticmethod
    def _read(conn, n):
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                raise OSError("closed")
            data += chunk
        return data

    def stop(self):
        self.stopping.set()
        self.join(5)
        self.sock.close()


def test_a_stalled_slave_says_so_and_reconnects(server_factory):
    master = StalledMaster()
    master.start()
    try:
        slave = server_factory(
            "slave", listen={"smss": LOOP, "metrics": LOOP},
            config={"timeout": {"server": {"alive": 500}}},  # stall limit: 1 s
            extra_args=["--role", "slave", "--master", f"127.0.0.1:{master.port}"])

        def stalled():
            s = status(slave.smss_port)
            return s if s["stalled"] else None

        s = wait_until(stalled, 30, "the slave to report itself stalled", interval=0.1)
        assert s["masterEventId"] == MASTER_AT and s["appliedEventId"] == 0, s
        assert s["sinceProgressMs"] >= 1000, s
        metrics = scrape(slave)
        assert metrics[("mqserver_replication_stalled", ())] == 1
        assert metrics[("mqserver_replication_seconds_since_progress", ())] >= 1.0
        wait_until(lambda: master.replicas >= 3, 30, "the slave to reconnect twice", interval=0.1)
        log = slave.current_log()
        lines = [x for x in log.splitlines() if "replication stalled" in x]
        assert len(lines) == 1, log
        assert "applied eventId 0 " in lines[0] and f"master is at {MASTER_AT}" in lines[0]
    finally:
        master.stop()
