#!/usr/bin/env python
"""A null smss server: the floor a Python broker's smss publish rows stand on.

It answers every smss request (PUB, CREATE and the other fixed-size ones) with OK and
does nothing else but the system calls mqserver makes for one PUB: one C{epoll_wait},
one C{recv}, one C{pwrite} of the request's payload to a file (C{--no-pwrite} leaves it
out) and one C{send}. Like mqserver's reactor it keeps polling without sleeping (with
C{sched_yield} between polls) for 200 µs after each event before it blocks. Measured
with the same client as mqserver and Go smss (C{bench/compare.py --floor}), the gap
between its round trip and mqserver's is the broker's own work per request, and its
round trip is what the client, the kernel's loopback and the wake-ups cost.

    python bench/null_smss.py [--port 0] [--no-pwrite] [--dir DIR]

Prints C{listening PORT} once it listens; runs until SIGTERM or SIGINT.
"""

import argparse
import os
import select
import signal
import socket
import struct
import sys
import tempfile
import time

#: code (u8), topic length (u16), 16 argument bytes (a PUB's payload length first),
#: trace length (u8), as smss's request header has it.
HEADER = struct.Struct("<BHI12xB")
OK = b"\xc8" + b"\x00" * 9
#: Commands whose body after topic and trace is 8 bytes (CREATE, VALID LIST, REPLICA).
EIGHT_BYTE_BODY = {2, 99, 64}
PUB, DELAY = 1, 16
SPIN = 0.0002


def request_size(buf, off):
    """Return (size of the request at C{off}, payload start, payload end) or None while
    C{buf} does not hold all of it."""
    if len(buf) - off < HEADER.size:
        return None
    code, topic_len, arg, trace_len = HEADER.unpack_from(buf, off)
    body = off + HEADER.size + topic_len + trace_len
    if code == PUB:
        stop = body + arg
    elif code == DELAY:
        stop = body + 8 + arg
    elif code in EIGHT_BYTE_BODY:
        stop = body + 8
    else:
        stop = body
    if len(buf) < stop:
        return None
    return stop - off, body, stop


def serve(listener, log_fd):
    ep = select.epoll()
    ep.register(listener.fileno(), select.EPOLLIN)
    conns = {}  # fd -> (socket, pending bytes)
    offset = 0
    last = 0.0
    while True:
        if time.monotonic() - last < SPIN:
            events = ep.poll(0)
            if not events:
                os.sched_yield()
                continue
        else:
            events = ep.poll(-1)
        last = time.monotonic()
        for fd, _ in events:
            if fd == listener.fileno():
                s, _ = listener.accept()
                s.setblocking(False)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conns[s.fileno()] = [s, b""]
                ep.register(s.fileno(), select.EPOLLIN)
                continue
            entry = conns[fd]
            s = entry[0]
            try:
                data = s.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                ep.unregister(fd)
                s.close()
                del conns[fd]
                continue
            buf = entry[1] + data if entry[1] else data
            off, answers = 0, 0
            while True:
                framed = request_size(buf, off)
                if framed is None:
                    break
                size, start, stop = framed
                if log_fd is not None and stop > start:
                    os.pwrite(log_fd, buf[start:stop], offset)
                    offset += stop - start
                off += size
                answers += 1
            entry[1] = buf[off:]
            if answers:
                s.sendall(OK * answers)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--no-pwrite", action="store_true", help="answer without writing")
    ap.add_argument("--dir", default=None, help="where the written file goes")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", a.port))
    listener.listen(64)
    log_fd = None
    if not a.no_pwrite:
        fd, path = tempfile.mkstemp(prefix="null-smss-", dir=a.dir)
        os.unlink(path)  # the file lives as long as the descriptor
        log_fd = fd
    print(f"listening {listener.getsockname()[1]}", flush=True)
    try:
        serve(listener, log_fd)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
