"""What the wire trace and fault rules cost: publish throughput on one broker with
nothing watching, with a fault rule set that matches none of the traffic (every door
then takes its looking path), and with a trace of the door attached (a client reading
``GET /trace`` on the admin API, as ``mqctl trace`` does).

One real ``twistd mqserver`` process on loopback (flush level 1, ``admin.faults:
true``); one client, one connection, a request at a time (smss PUB of 50 messages,
RocketMQ SEND, nsqd PUB), 200-byte bodies, the publishers of bench/security_bench.py.
The three settings alternate within each round, so a busy (shared) machine hits them
alike; each throughput is the range over the rounds, and the broker's own CPU time per
message (user + system, from /proc) the lowest over the rounds: on a shared machine the
CPU per message moves less than the throughput.

Then the same three settings in process (no sockets: each door's protocol over a
StringTransport on a real store, tests/support/inprocess.py), where only the broker's
own work is timed: µs per request, the best of the rounds.

    PYTHONPATH=. .venv/bin/python bench/faults_cost.py [--seconds 2] [--rounds 3]
"""

import argparse
import http.client
import json
import os
import shutil
import tempfile
import threading
import urllib.request

import harness  # the source tree on the import path

from procstat import cpu_seconds
from security_bench import nsq_tcp, rocketmq, smss, start

L = "tcp:0:interface=127.0.0.1"
#: A rule for a command none of the publishers sends: the doors look, nothing applies.
IDLE_RULE = {"door": "smss", "command": "REPLICA", "drop": True}


def admin(srv, method, path, body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{srv.ports['AdminSite']}{path}",
                                 data=None if body is None else json.dumps(body).encode(),
                                 method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


class TraceReader:
    """A client of C{GET /trace?door=DOOR} reading (and counting) every line."""

    def __init__(self, srv, door):
        self.conn = http.client.HTTPConnection("127.0.0.1", srv.ports["AdminSite"])
        self.conn.request("GET", f"/trace?door={door}")
        self.response = self.conn.getresponse()
        self.response.readline()  # {"tracing": door}: the broker subscribed it
        self.lines = 0
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        try:
            while self.response.readline():
                self.lines += 1
        except (OSError, ValueError):
            pass  # closed by stop()

    def stop(self):
        self.conn.sock.close()
        self.thread.join(5)
        return self.lines


def costed(srv, run, seconds):
    """Return (messages/s, broker CPU µs per message) of C{run()}."""
    before = cpu_seconds(srv.proc.pid)
    rate = run()
    return rate, (cpu_seconds(srv.proc.pid) - before) / (rate * seconds) * 1e6


def measure(srv, door, run):
    """Return what L{costed} gives of C{run()} in each setting: off, idle rule, traced."""
    off = run()
    rule = admin(srv, "POST", "/faults", IDLE_RULE)
    try:
        idle = run()
    finally:
        admin(srv, "DELETE", f"/faults/{rule['id']}")
    reader = TraceReader(srv, door)
    try:
        traced = run()
    finally:
        frames = reader.stop()
    assert frames > 0, "the trace saw nothing"
    return off, idle, traced


def inprocess(rounds, n=5000):
    """Print µs per request of each door's protocol in process, in the three settings."""
    import struct
    import timeit

    from protocols.nsq.factory import make_factory as nsqd_factory
    from protocols.remoting import codes
    from protocols.remoting.broker_door import make_factory as broker_factory
    from protocols.remoting.codec import encode
    from protocols.remoting.messages import RemotingCommand
    from protocols.smss import client_codec
    from protocols.smss.factory import make_factory as smss_factory

    body = b"x" * 200
    send = encode(RemotingCommand(code=codes.SEND_MESSAGE, opaque=1, ext_fields={
        "producerGroup": "pg", "topic": "BenchFault", "defaultTopic": "TBW102",
        "defaultTopicQueueNums": "1", "queueId": "0", "sysFlag": "0", "bornTimestamp": "0",
        "flag": "0", "properties": ""}, body=body))
    doors = (("smss PUB x1", smss_factory, "smss", b"",
              client_codec.encode_pub("bench", struct.pack("<II", len(body), 0) + body),
              client_codec.encode_create("bench")),
             ("RocketMQ SEND", broker_factory, "broker", b"", send, send),
             ("nsqd TCP PUB", nsqd_factory, "nsqd_tcp", b"  V2",
              b"PUB bench\n" + struct.pack(">I", len(body)) + body, b""))
    print(f"\nin process, µs per request (best of {rounds} x {n}):")
    print(f"{'door':<16} {'off':>8} {'idle rule':>10} {'traced':>8}")
    base = tempfile.mkdtemp(prefix="faultsbench-ip")
    try:
        for label, factory, door, hello, request, first in doors:
            with harness.running(os.path.join(base, door), factory, flush_level=0) as node:
                c = node.connect(node.factory)
                c.send(hello + first)
                tap = node.broker.wiretap

                def one():
                    c.protocol.dataReceived(request)
                    c.transport.clear()

                def best():
                    return min(timeit.repeat(one, number=n, repeat=rounds)) / n * 1e6

                off = best()
                rule = tap.faults.add({"door": door, "command": "UNUSED", "drop": True})
                idle = best()
                tap.faults.clear(rule.id)
                sub = tap.trace.subscribe(lambda e: json.dumps(e), door)
                traced = best()
                sub.cancel()
                c.lose()
            print(f"{label:<16} {off:>8.1f} {idle:>10.1f} {traced:>8.1f}", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    base = tempfile.mkdtemp(prefix="faultsbench")
    srv = start(base, "broker", {d: L for d in ("smss", "broker", "nsqd_tcp", "admin")},
                {"admin": {"faults": True}})
    s = a.seconds
    try:
        print(f"{a.rounds} rounds of {s:g} s per setting; the machine is shared, so compare "
              "within a row", flush=True)
        print(f"{'door':<16} {'messages/s: off':>21}   {'idle rule':>21}   {'traced':>21}"
              f"   {'broker CPU µs/message: off, idle rule, traced':>46}")
        for label, door, run in (
                ("smss PUB x50", "smss", lambda: costed(srv, lambda: smss(srv, None, s), s)),
                ("RocketMQ SEND", "broker", lambda: costed(srv, lambda: rocketmq(srv, None, s), s)),
                ("nsqd TCP PUB", "nsqd_tcp",
                 lambda: costed(srv, lambda: nsq_tcp(srv, False, None, s, 1), s))):
            rows = [measure(srv, door, run) for _ in range(a.rounds)]
            rates = [[r[i][0] for r in rows] for i in range(3)]
            cpus = [min(r[i][1] for r in rows) for i in range(3)]
            print(f"{label:<16} " + "   ".join(f"{min(c):>9,.0f} - {max(c):>9,.0f}" for c in rates)
                  + "   " + "  ".join(f"{c:>14.1f}" for c in cpus), flush=True)
    finally:
        srv.stop()
        srv.close()
        shutil.rmtree(base, ignore_errors=True)
    inprocess(a.rounds)


if __name__ == "__main__":
    main()
