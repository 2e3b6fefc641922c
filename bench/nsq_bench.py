"""NSQ benchmark mirroring NSQ's own bench_writer / bench_reader against mqserver.

* writer: N connections, each sends MPUB batches of 200 messages (200-byte bodies) with
  one batch outstanding, for --seconds;
* reader: N connections on one channel at RDY 2500 drain that backlog, FINing in batches;
* round trip: --conns-rt connections (default --conns) each PUB one message and wait for
  its OK, for --seconds.

--client-poll US makes the clients poll for up to US microseconds before they sleep
waiting for a reply (see bench/clientwait.py); the default 0 blocks in recv().

Prints msgs/s per scenario and the broker's peak RSS. The broker runs as the real
``twistd mqserver`` process on loopback (flush level 1, the default).

    PYTHONPATH=. .venv/bin/python bench/nsq_bench.py [--seconds 10] [--conns 2] [--quick]
        [--conns-rt 1] [--client-poll 200]
"""

import argparse
import json
import multiprocessing as mp
import socket
import struct
import time

from harness import LOOPBACK, Machine, broker, report_rate, run_workers

from clientwait import Waiter, add_argument, describe
from procstat import cpu_seconds

_HDR = struct.Struct(">II")
_U32 = struct.Struct(">I")


def _connect(port, poll_us):
    """Connect, send the protocol magic and return a L{Waiter} for the connection."""
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(b"  V2")
    return Waiter(s, poll_us)


def _read_frame(sock, buf):
    while True:
        if len(buf) >= 8:
            size, ftype = _HDR.unpack_from(buf, 0)
            if len(buf) >= size + 4:
                data = bytes(buf[8:size + 4])
                del buf[:size + 4]
                if ftype == 0 and data == b"_heartbeat_":
                    sock.sendall(b"NOP\n")
                    continue
                return ftype, data
        chunk = sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk


def _writer(port, topic, seconds, batch, size, poll_us, out):
    sock = _connect(port, poll_us)
    body = b"x" * size
    parts = [_U32.pack(batch)]
    for _ in range(batch):
        parts += [_U32.pack(size), body]
    inner = b"".join(parts)
    cmd = b"MPUB " + topic.encode() + b"\n" + _U32.pack(len(inner)) + inner
    buf = bytearray()
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sock.sendall(cmd)
        ftype, data = _read_frame(sock, buf)
        if data != b"OK":
            raise RuntimeError(data)
        n += batch
    out.put(n)
    sock.close()


def _pub_one(port, topic, seconds, size, poll_us, out):
    sock = _connect(port, poll_us)
    cmd = b"PUB " + topic.encode() + b"\n" + _U32.pack(size) + b"x" * size
    buf = bytearray()
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(100):
            sock.sendall(cmd)
            _read_frame(sock, buf)
        n += 100
    out.put(n)
    sock.close()


def identify(settings):
    """The IDENTIFY command sending C{settings} (a dict, JSON-encoded)."""
    body = json.dumps(settings).encode()
    return b"IDENTIFY\n" + _U32.pack(len(body)) + body


def subscribe(port, topic, rdy, poll_us=0, settings=None):
    """Connect a consumer of channel "ch" of C{topic} at RDY C{rdy}, having sent
    C{settings} in an IDENTIFY first when given; return the connection and its buffer."""
    sock = _connect(port, poll_us)
    buf = bytearray()
    if settings:
        sock.sendall(identify(settings))
        ftype, data = _read_frame(sock, buf)
        if data != b"OK":
            raise RuntimeError(f"IDENTIFY {settings}: {data!r}")
    sock.sendall(b"SUB %s ch\nRDY %d\n" % (topic.encode(), rdy))
    _read_frame(sock, buf)  # OK
    return sock, buf


def _reader(port, topic, seconds, rdy, total, counter, poll_us, out, settings=None):
    """Read and FIN C{total} messages (together with any other readers on C{counter});
    C{settings}: sent in an IDENTIFY first, when given."""
    sock, buf = subscribe(port, topic, rdy, poll_us, settings)
    n = 0
    unpack = _HDR.unpack_from
    end = time.monotonic() + seconds
    sock.settimeout(0.5)
    while time.monotonic() < end:
        try:
            chunk = sock.recv(1 << 20)
        except socket.timeout:
            with counter.get_lock():
                if counter.value >= total:
                    break
            continue
        if not chunk:
            break
        buf += chunk
        pos, blen = 0, len(buf)
        fins = []
        while blen - pos >= 8:
            size, ftype = unpack(buf, pos)
            if blen - pos - 4 < size:
                break
            if ftype == 2:
                fins.append(b"FIN " + bytes(buf[pos + 18:pos + 34]) + b"\n")
            elif ftype == 0 and buf[pos + 8:pos + 4 + size] == b"_heartbeat_":
                fins.append(b"NOP\n")
            pos += 4 + size
        del buf[:pos]
        if fins:
            sock.sendall(b"".join(fins))
            n += len(fins)
            with counter.get_lock():
                counter.value += len(fins)
                if counter.value >= total:
                    break
    out.put(n)
    sock.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--conns", type=int, default=2)
    ap.add_argument("--conns-rt", type=int, metavar="N",
                    help="connections for the one-message-per-round-trip scenario "
                         "(default: --conns)")
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--quick", action="store_true", help="3 s per scenario")
    add_argument(ap)
    args = ap.parse_args()
    conns_rt = args.conns if args.conns_rt is None else args.conns_rt
    poll = args.client_poll
    print(describe(poll), flush=True)
    seconds = 3.0 if args.quick else args.seconds
    with broker({"nsqd_tcp": LOOPBACK}, prefix="nsqbench-") as server:
        port = server.ports["NsqdFactory"]
        pid = server.proc.pid
        machine = Machine()
        c0 = cpu_seconds(pid)
        n, t = run_workers(_writer, args.conns,
                           (port, "bench", seconds, args.batch, args.size, poll))
        c1 = cpu_seconds(pid)
        report_rate(f"writer  MPUB x{args.batch} ({args.size} B), {args.conns} conns",
                    n, t, c1 - c0)
        counter = mp.Value("q", 0)
        rn, rt = run_workers(_reader, args.conns,
                             (port, "bench", max(seconds, 6.0) * 4, 2500, n, counter, poll))
        c2 = cpu_seconds(pid)
        report_rate(f"reader  RDY 2500, batched FIN, {args.conns} conns", rn, rt, c2 - c1)
        n, t = run_workers(_pub_one, conns_rt, (port, "bench_rt", seconds, args.size, poll))
        c3 = cpu_seconds(pid)
        report_rate(f"1 msg per round trip, {conns_rt} conn{'s' if conns_rt != 1 else ''}",
                    n, t, c3 - c2)
        machine.report(pid)


if __name__ == "__main__":
    main()
