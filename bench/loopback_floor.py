#!/usr/bin/env python
"""The machine's floor for one-request-at-a-time protocols over loopback.

A client process sends a 260-byte request and waits for a 10-byte reply, like one smss
PUB or one NSQ PUB at a time, against servers that do nothing but answer:

- ``blocking``: the server sleeps in recv() between requests;
- ``spinning``: the server polls a non-blocking socket without sleeping.

No broker can beat the ``blocking`` figure with a server that sleeps between requests,
so it is the yardstick for the "1 connection" rows of the other benchmarks; the gap to
``spinning`` is what waking a sleeping process costs on this machine (large on virtual
machines, where a wake-up is an inter-processor interrupt). Prints figures; asserts
nothing.

    python bench/loopback_floor.py [--rounds 20000] [--repeat 3]
"""

import argparse
import os
import socket
import statistics
import time

REQUEST = b"r" * 260
REPLY = b"a" * 10


def serve(listener, spinning):
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if spinning:
        conn.setblocking(False)
    while True:
        try:
            data = conn.recv(65536)
        except BlockingIOError:
            continue
        if not data:
            return
        conn.sendall(REPLY)


def measure(spinning, rounds):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    address = listener.getsockname()
    pid = os.fork()
    if pid == 0:  # the server
        try:
            serve(listener, spinning)
        finally:
            os._exit(0)
    listener.close()
    try:
        sock = socket.create_connection(address)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t0 = time.perf_counter()
        for _ in range(rounds):
            sock.sendall(REQUEST)
            got = 0
            while got < len(REPLY):
                got += len(sock.recv(64))
        elapsed = time.perf_counter() - t0
        sock.close()
    finally:
        os.waitpid(pid, 0)
    return rounds / elapsed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"loopback floor: {os.cpu_count()} CPUs, {args.rounds} round trips per run, "
          f"median of {args.repeat}")
    for name, spinning in (("blocking", False), ("spinning", True)):
        runs = [measure(spinning, args.rounds) for _ in range(args.repeat)]
        rate = statistics.median(runs)
        print(f"{name:9s} server: {rate:8,.0f} round trips/s  ({1e6 / rate:6.1f} µs each; "
              f"runs {', '.join(f'{r:,.0f}' for r in runs)})")


if __name__ == "__main__":
    main()
