"""Two publishes in flight on one connection: how long until both are answered.

A producer that pipelines (RocketMQ's async send, several producer threads sharing one
connection, an NSQ or smss client that does not wait between PUBs) often has a second
request in flight when the first is answered. At flush level 2 the two answers leave in
different group commits, so the second is written while the first may still be
unacknowledged by the client's TCP: with Nagle's algorithm on the server's socket it then
waits for the client's delayed ACK (about 40 ms on Linux). Each door must answer at once.

Per door (smss PUB, NSQ PUB, RocketMQ SEND_MESSAGE, console PUB), one broker at C{--flush-level}: send
a publish, 0.3 ms later a second, wait for both answers; C{--pairs} times. Prints the
time per pair (p50, p90, max) and how many pairs took over 30 ms.

    PYTHONPATH=. python bench/pipelined.py [--pairs 300] [--flush-level 2]
"""

import argparse
import shutil
import socket
import tempfile
import time

from harness import RemotingClient, ServerProcess, V2

from protocols.remoting import codes
from protocols.smss import client_codec as cc
from protocols.smss.client import SmssClient
from protocols.smss.payload import encode_payload

LOOPBACK = "tcp:0:interface=127.0.0.1"
GAP = 0.0003
BODY = b"x" * 200
ROCKETMQ_SEND = {"producerGroup": "PG", "topic": "p", "defaultTopic": "TBW102",
                 "defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": "0",
                 "bornTimestamp": "0", "flag": "0", "properties": "", "reconsumeTimes": "0",
                 "unitMode": "false", "batch": "false"}
SMSS_OK = 10  # bytes of an smss OK answer


def _raw_pairs(port, request, answered, pairs):
    # pairs of `request` on a plain socket, each until answered(bytes received) says both
    # answers are in
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(pairs):
            t = time.perf_counter()
            s.sendall(request)
            time.sleep(GAP)
            s.sendall(request)
            got = b""
            while not answered(got):
                data = s.recv(64)
                if not data:
                    raise ConnectionError(f"the broker closed the connection after {got!r}")
                got += data
            yield time.perf_counter() - t


def _smss(server, pairs):
    pub = cc.encode_pub(b"p", encode_payload([BODY]))
    return _raw_pairs(server.smss_port, pub, lambda got: len(got) >= 2 * SMSS_OK, pairs)


def _nsq(server, pairs):
    pub = b"PUB p\n" + len(BODY).to_bytes(4, "big") + BODY
    conn = V2(server.ports["NsqdFactory"])
    try:
        for _ in range(pairs):
            t = time.perf_counter()
            conn.send(pub)
            time.sleep(GAP)
            conn.send(pub)
            assert conn.frame() == (0, b"OK") and conn.frame() == (0, b"OK")
            yield time.perf_counter() - t
    finally:
        conn.close()


def _rocketmq(server, pairs):
    c = RemotingClient("127.0.0.1", server.ports["BrokerDoor"])
    try:
        for _ in range(pairs):
            t = time.perf_counter()
            a = c.send(codes.SEND_MESSAGE, ROCKETMQ_SEND, BODY)
            time.sleep(GAP)
            b = c.send(codes.SEND_MESSAGE, ROCKETMQ_SEND, BODY)
            assert c.recv(a).code == codes.SUCCESS and c.recv(b).code == codes.SUCCESS
            yield time.perf_counter() - t
    finally:
        c.close()


def _console(server, pairs):
    def answered(got):
        assert not got or got.startswith(b"OK"), got
        return got.count(b"\n") >= 2

    return _raw_pairs(server.ports["ConsoleFactory"], b"PUB p " + BODY + b"\n", answered, pairs)


DOORS = {"smss PUB": _smss, "NSQ PUB": _nsq, "RocketMQ SEND_MESSAGE": _rocketmq,
         "console PUB": _console}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=300)
    ap.add_argument("--flush-level", type=int, default=2, choices=(0, 1, 2))
    args = ap.parse_args(argv)
    work = tempfile.mkdtemp(prefix="mq-pipelined-")
    server = ServerProcess(work, config={"store": {"flushLevel": args.flush_level}},
                           listen={"smss": LOOPBACK, "broker": LOOPBACK, "nsqd_tcp": LOOPBACK,
                                   "console": LOOPBACK})
    try:
        server.start()
        with SmssClient("127.0.0.1", server.smss_port) as c:
            c.create("p")
        print(f"two publishes in flight, {args.pairs} pairs, flush level {args.flush_level}:"
              f" ms until both are answered")
        for name, fn in DOORS.items():
            took = sorted(fn(server, args.pairs))
            n = len(took)
            print(f"{name:22s} p50 {took[n // 2] * 1e3:6.2f}  p90 {took[n * 9 // 10] * 1e3:6.2f}"
                  f"  max {took[-1] * 1e3:6.2f}  over 30 ms: {sum(t > 0.03 for t in took)}",
                  flush=True)
    finally:
        server.stop()
        server.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
