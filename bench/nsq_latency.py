#!/usr/bin/env python
"""Publish-to-receive latency of one NSQ consumer for the output buffers it may ask for,
on mqserver and (with NSQD_BIN) nsqd, alternating A B A B: what the buffer of the
"nsq steady" rows of bench/compare.py (``--nsq-buffers``) costs in delay.

Per run: a fresh server, a consumer that IDENTIFYs with that buffer (see
``compare.nsq_buffer``: default, none or N ms), and a producer that PUBs ``--count``
200-byte messages at ``--rate`` a second, each carrying its send time (CLOCK_MONOTONIC,
which both processes read alike). The consumer FINs each message and records receive time
minus send time. Prints one line per run with p50 and p99 in ms. Asserts nothing.

    PYTHONPATH=. .venv/bin/python bench/nsq_latency.py [--buffers default,25,none]
        [--rate 2000] [--count 6000] [--rounds 2] [--nsqd-bin PATH]
"""

import argparse
import multiprocessing as mp
import struct
import tempfile
import time

import harness  # noqa: F401 (the source tree on the import path)

import compare
import nsq_bench

_STAMP = struct.Struct(">d")
_HDR = struct.Struct(">II")
#: Where a message frame's body starts: size, frame type, timestamp, attempts, id.
_BODY = 4 + 4 + 8 + 2 + 16


def consume(port, topic, count, settings, ready, out):
    """Receive C{count} messages; put the sorted latencies in seconds of those sent after
    the subscription."""
    sock, buf = nsq_bench.subscribe(port, topic, 200, settings=settings)
    since = time.monotonic()  # what was published before (the topic's first) is left out
    ready.set()
    lat, got = [], 0
    while got < count:
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        now = time.monotonic()
        buf += chunk
        pos, fins = 0, []
        while len(buf) - pos >= 8:
            size, ftype = _HDR.unpack_from(buf, pos)
            if len(buf) - pos - 4 < size:
                break
            if ftype == 2:
                got += 1
                sent = _STAMP.unpack_from(buf, pos + _BODY)[0]
                if sent >= since:
                    lat.append(now - sent)
                fins.append(b"FIN " + bytes(buf[pos + 18:pos + 34]) + b"\n")
            elif buf[pos + 8:pos + 4 + size] == b"_heartbeat_":
                fins.append(b"NOP\n")
            pos += 4 + size
        del buf[:pos]
        if fins:
            sock.sendall(b"".join(fins))
    sock.close()
    out.put(sorted(lat))


def publish(port, topic, count, rate):
    """PUB C{count} messages at C{rate} a second, each waiting for its OK."""
    sock = nsq_bench._connect(port, 0)
    buf, pad = bytearray(), b"x" * (200 - _STAMP.size)
    head = b"PUB " + topic.encode() + b"\n" + struct.pack(">I", 200)
    t0 = time.monotonic()
    for i in range(count):
        due = t0 + i / rate
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        sock.sendall(head + _STAMP.pack(time.monotonic()) + pad)
        nsq_bench._read_frame(sock, buf)
    sock.close()


def one_run(make, spec, a):
    settings, _ = compare.nsq_buffer(spec)
    sysm = make().start()
    try:
        topic = "lat"
        publish(sysm.nsq_port, topic, 1, 1000)  # the topic exists before the consumer
        ready, out = mp.Event(), mp.Queue()
        c = mp.Process(target=consume, daemon=True,
                       args=(sysm.nsq_port, topic, a.count + 1, settings, ready, out))
        c.start()
        ready.wait(30)
        publish(sysm.nsq_port, topic, a.count, a.rate)
        lat = out.get(timeout=a.count / a.rate + 60) or [0.0]
        c.join(10)
        pick = lambda q: 1000 * lat[min(len(lat) - 1, int(q * len(lat)))]  # noqa: E731
        print(f"{sysm.name:<10} buffer {spec:<8} {a.rate}/s: received {len(lat)}, "
              f"p50 {pick(0.5):.2f} ms, p99 {pick(0.99):.2f} ms", flush=True)
    finally:
        sysm.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--buffers", type=lambda t: t.split(","), default=["default", "25", "none"])
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--count", type=int, default=6000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--nsqd-bin")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="nsqlat-")
    floor_over, nsqd_args = compare.nsq_flush_floor(a.buffers)
    systems = [lambda: compare.Mq("mqserver", tmp, floor_over)]
    nsqd = compare.binary(a.nsqd_bin, "NSQD_BIN")
    if nsqd:
        systems.append(lambda: compare.Ref("nsqd 1.3", "nsqd", nsqd, tmp, nsqd_args))
    for _ in range(a.rounds):
        for spec in a.buffers:
            for make in systems:
                one_run(make, spec, a)


if __name__ == "__main__":
    main()
