#!/usr/bin/env python
"""What the spinning reactor's probes measure, against three kinds of peer.

An echo server on the real L{mqserver.runtime.reactor.SpinningEPollReactor} with its probes on,
and a client in another process that sends 200-byte requests over loopback:
- C{wait}: one request per round trip, the next sent as soon as the answer came;
- C{slow}: the same, but the client works C{--turnaround} µs (busy) before each request
  (as the RocketMQ C++ client's synchronous send does);
- C{paced}: C{--rate} requests a second at evenly spaced times, answers read by a thread.

For each probe it prints the two windows' CPU per KiB read (with the spin, without), their
ratio and the verdict, then the run's rate and the server's CPU per request. Shows why the
spin is kept or dropped on this machine; asserts nothing.

    python bench/spin_probe.py [--peers wait,slow,paced] [--seconds 4] [--rate 10000]
                               [--turnaround 150] [--window 0.05] [--every 0.5]
"""

import argparse
import multiprocessing as mp
import socket
import threading
import time

import harness  # noqa: F401 (the source tree on the import path)

MP = mp.get_context("fork")
SIZE = 200


def _client(port, kind, seconds, rate, turnaround, out):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    msg = b"r" * SIZE
    sent = 0
    end = time.perf_counter() + seconds
    if kind == "paced":
        def drain():
            got = 0
            while got < want[0] * SIZE:
                data = s.recv(1 << 16)
                if not data:
                    return
                got += len(data)
        want = [int(rate * seconds)]
        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        t0 = time.perf_counter()
        for i in range(want[0]):
            due = t0 + i / rate
            now = time.perf_counter()
            if due > now:
                time.sleep(due - now)
            s.sendall(msg)
            sent += 1
        reader.join(30)
    else:
        while time.perf_counter() < end:
            if kind == "slow":
                until = time.perf_counter() + turnaround
                while time.perf_counter() < until:
                    pass
            s.sendall(msg)
            got = 0
            while got < SIZE:
                data = s.recv(SIZE - got)
                if not data:
                    raise ConnectionError("closed")
                got += len(data)
            sent += 1
    s.close()
    out.put(sent)


def _server(kind, a, out):
    import mqserver.runtime.reactor as mr
    from twisted.internet import protocol

    reactor = mr.SpinningEPollReactor(probe=True)
    reactor.probe_window, reactor.probe_every = a.window, a.every
    verdicts = []
    # record each probe's two windows and verdict
    orig_spin_pays = mr.spin_pays

    def spin_pays(with_spin, without):
        v = orig_spin_pays(with_spin, without)
        verdicts.append((with_spin, without, v))
        return v
    mr.spin_pays = spin_pays

    class Echo(protocol.Protocol):
        def dataReceived(self, data):
            self.transport.write(data)

    port = reactor.listenTCP(0, protocol.Factory.forProtocol(Echo), interface="127.0.0.1")
    q = MP.Queue()
    client = MP.Process(target=_client, daemon=True,
                        args=(port.getHost().port, kind, a.seconds, a.rate, a.turnaround / 1e6, q))
    cpu0, t0 = time.thread_time(), time.monotonic()
    client.start()

    def check():
        if not client.is_alive():
            reactor.stop()
        else:
            reactor.callLater(0.05, check)
    reactor.callLater(0.05, check)
    reactor.run(installSignalHandlers=False)
    sent = q.get(timeout=30)
    client.join(5)
    cpu, wall = time.thread_time() - cpu0, time.monotonic() - t0
    out.put((sent, cpu, wall, verdicts))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peers", default="wait,slow,paced")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rate", type=float, default=10_000)
    ap.add_argument("--turnaround", type=float, default=150.0, help="µs, the slow peer")
    ap.add_argument("--window", type=float, default=0.05)
    ap.add_argument("--every", type=float, default=0.5)
    a = ap.parse_args()
    for kind in a.peers.split(","):
        out = MP.Queue()
        p = MP.Process(target=_server, args=(kind, a, out))
        p.start()
        sent, cpu, wall, verdicts = out.get(timeout=a.seconds + 60)
        p.join(10)
        print(f"{kind}: {sent / wall:,.0f} requests/s, server thread CPU "
              f"{1e6 * cpu / max(sent, 1):.1f} µs/request")
        for (c1, b1, s1), (c2, b2, s2), v in verdicts:
            k1 = 1e6 * c1 / max(b1 / 1024, 1e-9)
            k2 = 1e6 * c2 / max(b2 / 1024, 1e-9)
            print(f"  spin: {k1:7.1f} µs CPU/KiB ({b1 / s1 / 1024:7.0f} KiB/s)   "
                  f"none: {k2:7.1f} ({b2 / s2 / 1024:7.0f} KiB/s)   ratio {k1 / max(k2, 1e-9):5.2f}"
                  f"   -> {v}")


if __name__ == "__main__":
    main()
