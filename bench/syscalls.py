#!/usr/bin/env python
"""System calls per round trip of one-message-at-a-time publishing, for mqserver and the
reference servers.

One client process sends smss PUBs or NSQ PUBs of one 200-byte message on one
connection, each after the reply to the one before (as the one-connection rows of
``bench/compare.py`` do), while ``strace -c -f`` counts the server's system calls (every
thread). Prints, per round trip, the calls of each kind, and the round trips per second
of a run without strace just before it (strace slows the server several times over, so
the traced run shows what a round trip does, not how long it takes; a spinning reactor
catches the next request more often when it is slowed, which lowers its epoll_wait and
sched_yield counts). The reference servers are measured too when their binaries are
given (``SMSS_BIN``, ``NSQD_BIN`` or the options, as for ``bench/compare.py``).
Asserts nothing.

    python bench/syscalls.py [--only smss,nsq] [--requests 20000] [--conns 1] [--tree NAME:PATH]
"""

import argparse
import multiprocessing as MP
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time

from harness import ROOT, ServerProcess

from refservers import RefServer, binary
from protocols.smss import client_codec as cc

BODY = b"x" * 200
TOPIC = "syscalls"


def requests(proto):
    """Return (handshake, request, reply size) for C{proto}."""
    if proto == "smss":
        return (cc.encode_create(TOPIC.encode(), 0),
                cc.encode_pub(TOPIC.encode(), struct.pack("<II", len(BODY), 0) + BODY), 10)
    return b"  V2", b"PUB %s\n" % TOPIC.encode() + struct.pack(">I", len(BODY)) + BODY, 10


def client(port, proto, counts, q, go):
    """Run the round trips of each count in C{counts}, each when C{go} says so, telling
    C{q} how long it took."""
    try:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        handshake, request, size = requests(proto)
        sock.sendall(handshake)
        if proto == "smss":
            sock.recv(10)  # the CREATE's answer (OK, or the topic exists)
        send, recv = sock.sendall, sock.recv
        for n in counts:
            go.get(timeout=600)
            t0 = time.perf_counter()
            for _ in range(n):
                send(request)
                got = 0
                while got < size:
                    k = len(recv(size - got))
                    if not k:
                        raise ConnectionError("the server closed the connection")
                    got += k
            q.put(("done", time.perf_counter() - t0))
        sock.close()
    except BaseException as e:  # noqa: BLE001 - reported by the parent
        q.put(("error", repr(e)))


def _next(q):
    kind, value = q.get(timeout=600)
    if kind == "error":
        raise RuntimeError(value)
    return value


def parse_strace(path):
    """Return {syscall: calls} from an C{strace -c} summary."""
    calls = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
                calls[parts[-1]] = int(parts[3])
    return calls


def measure(pid, port, proto, n, tmp, conns=1):
    """Warm up, time C{n} round trips on each of C{conns} connections at once, then
    count the calls of C{n} more each under strace. Returns (round trips/s, {syscall:
    calls per round trip})."""
    q, go = MP.Queue(), MP.Queue()
    procs = [MP.Process(target=client, args=(port, proto, [2000, n, n], q, go), daemon=True)
             for _ in range(conns)]
    for p in procs:
        p.start()

    def run_all():
        for _ in procs:
            go.put(1)
        return max(_next(q) for _ in procs)

    try:
        run_all()  # warm-up
        rate = n * conns / run_all()
        out = os.path.join(tmp, f"strace-{pid}.txt")
        st = subprocess.Popen(["strace", "-c", "-f", "-o", out, "-p", str(pid)],
                              stderr=subprocess.DEVNULL)
        try:
            time.sleep(1.0)  # strace attaches to every thread before the traced run
            run_all()
            time.sleep(0.5)  # the last replies' calls are counted
        finally:
            st.terminate()
            st.wait(30)
        return rate, {k: v / (n * conns) for k, v in parse_strace(out).items()}
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()


def start_mq(name, tree, tmp):
    data = os.path.join(tmp, f"{name}-{time.monotonic_ns()}")
    srv = ServerProcess(data, config={"store": {"flushLevel": 1}}, root=tree,
                        listen={"smss": "tcp:0:interface=127.0.0.1",
                                "nsqd_tcp": "tcp:0:interface=127.0.0.1"})
    srv.start(timeout=60)
    ports = {"smss": srv.smss_port, "nsq": srv.ports["NsqdFactory"]}

    def stop():
        try:
            srv.stop(timeout=60)
        finally:
            srv.close()
            shutil.rmtree(data, ignore_errors=True)
    return srv.proc.pid, ports, stop


def start_ref(kind, path, tmp):
    ref = RefServer(kind, path, tmp).start()
    port = ref.port
    return ref.pid, {"smss": port, "nsq": port}, ref.stop


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="smss,nsq", help="comma-separated: smss, nsq")
    p.add_argument("--requests", type=int, default=20000, help="round trips per run")
    p.add_argument("--tree", action="append", default=[], metavar="NAME:PATH",
                   help="also measure mqserver run from another source tree")
    p.add_argument("--conns", type=int, default=1,
                   help="connections publishing at once, each one message per round trip")
    p.add_argument("--smss-bin", default=None)
    p.add_argument("--nsqd-bin", default=None)
    a = p.parse_args()
    if not shutil.which("strace"):
        raise SystemExit("strace is needed")
    smss_bin = binary(a.smss_bin, "SMSS_BIN")
    nsqd_bin = binary(a.nsqd_bin, "NSQD_BIN")
    tmp = tempfile.mkdtemp(prefix="mq-syscalls-")
    try:
        for proto in a.only.split(","):
            systems = [("mqserver", lambda: start_mq("mq", ROOT, tmp))]
            for spec in a.tree:
                name, path = spec.split(":", 1)
                systems.append((name, lambda path=path, name=name: start_mq(name, path, tmp)))
            ref = smss_bin if proto == "smss" else nsqd_bin
            if ref:
                kind = "smss" if proto == "smss" else "nsqd"
                systems.append((f"{kind} (Go)", lambda kind=kind, ref=ref: start_ref(kind, ref, tmp)))
            rows = []
            for name, start in systems:
                pid, ports, stop = start()
                try:
                    rows.append((name, *measure(pid, ports[proto], proto, a.requests, tmp,
                                                a.conns)))
                finally:
                    stop()
            report(proto, rows, a.requests, a.conns)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def report(proto, rows, n, conns=1):
    names = sorted({k for _, _, calls in rows for k, v in calls.items() if v >= 0.01},
                   key=lambda k: -max(calls.get(k, 0) for _, _, calls in rows))
    print(f"\n{proto} PUB, one message per round trip, {conns} connection(s) ({n} round trips"
          " each); system calls per round trip (strace -c -f)")
    print(f"{'system':14s} {'rt/s':>8s} {'total':>7s}  " + " ".join(f"{k[:12]:>12s}" for k in names))
    for name, rate, calls in rows:
        total = sum(calls.values())
        print(f"{name:14s} {rate:8.0f} {total:7.2f}  "
              + " ".join(f"{calls.get(k, 0):12.2f}" for k in names))


if __name__ == "__main__":
    main()
