#!/usr/bin/env python
"""The broker's own CPU cost of one small request, without the machine's wake-ups.

The broker (the real service tree from ``mqserver.tap``, its real store on disk, its
reactor and sockets) and one client socket share this process: the client sends one
request, the reactor runs one non-blocking iteration that reads, handles and answers
it, and the client reads the answer, which is already there. Nobody ever sleeps, so a
round trip costs only the work both sides do: the figure the one-request-at-a-time rows
of smss_bench and nsq_bench would approach on a machine where waking a process were
free, and the server CPU that bounds their many-connection rows.

Requests: smss PUB and NSQ PUB, one 200-byte message each, as the benchmarks send;
the NSQ PUB with a consumer attached (``nsqsub``: one more reactor turn for the channel's
pump per PUB, and the consumer FINs what the broker flushes to it, as the steady rows);
RocketMQ SEND_MESSAGE (code 10, JSON header as the C++ client writes it) of one 200-byte
message, the same as SEND_MESSAGE_V2 (``rmqsend2``: code 310, the Java client's header
and short field names), RocketMQ PULL_MESSAGE of one stored message, and of 32 (these
with ``--only rmqsend,rmqsend2,rmqpull,rmqpull32``), and the steady cycle of a RocketMQ
push consumer keeping up (``rmqpoll``: a PULL at the queue's tail is parked, a SEND arrives on a second
connection and is answered, and the parked PULL is answered with the new message; the
broker then runs with ``rocketmq.longPollBatchMs: 0``, one message per pull).
Prints µs per round trip (process CPU time, which leaves out time stolen by the host,
and wall time), best of ``--repeat`` runs; ``--profile FILE`` writes a cProfile of one
more run. ``--opcodes N`` also traces N more round trips and prints the Python bytecodes
executed per round trip, in all and by function: a count that, unlike time, does not move
with the load of a shared machine, for comparing two versions of the request path.
Asserts nothing.

    python bench/request_cost.py [--requests 20000] [--repeat 5]
                                 [--only smss,nsq,nsqsub,rmqsend,rmqsend2,rmqpull,rmqpull32,rmqpoll]
                                 [--also broker] [--opcodes 500] [--top 25]
"""

import argparse
import collections
import json
import os
import shutil
import socket
import struct
import sys
import tempfile
import time

import yaml

import harness  # the source tree on the import path

from mqserver.runtime.reactor import install

reactor = install(spin=0)

from mqserver import tap
from mqserver.frontdoor import front_doors
from protocols.remoting import codes
from protocols.remoting.wire import pack_frame_prefix
from protocols.smss import client_codec as cc

BODY = b"x" * 200
SMSS_OK = b"\xc8\x00" + b"\x00" * 8
SMSS_RECORD = struct.pack("<II", len(BODY), 0) + BODY
NSQ_OK = struct.pack(">ii", 6, 0) + b"OK"


def start_broker(data, doors=("smss", "nsqd_tcp"), config=None):
    """Start the service tree on C{data} with smss and nsqd on ephemeral ports, and the
    settings of C{config} (a config file's mapping); return (service, {door: port})."""
    opts = tap.Options()
    listen = {name: "off" for name in front_doors()}
    # only the doors measured: another door's timers would run in the counted turns
    for name in doors:
        listen[name] = "tcp:0:interface=127.0.0.1"
    args = ["--data", data]
    if config:
        path = os.path.join(data, "config.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(config, f)
        args += ["--config", path]
    for name, desc in listen.items():
        args += ["--listen", f"{name}={desc}"]
    opts.parseOptions(args)
    svc = tap.makeService(opts, reactor)
    svc.privilegedStartService()
    svc.startService()
    ports = {}
    for name in doors:
        ports[name] = svc.getServiceNamed(f"listen-{name}").port.getHost().port
    return svc, ports


def pump(done, limit=5.0):
    """Run reactor iterations until C{done()} is true."""
    end = time.monotonic() + limit
    while not done():
        if time.monotonic() > end:
            raise SystemExit("the broker did not answer in time")
        reactor.iterate(0)


def connect(port):
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def round_trips(sock, request, reply, count):
    """Send C{request} C{count} times, one at a time, each answered with C{reply}: the
    very bytes, or a L{RemotingReply} for a remoting frame whose size varies."""
    if isinstance(reply, RemotingReply):
        return framed_round_trips(sock, request, reply, count)
    if isinstance(reply, WithConsumer):
        return consumed_round_trips(sock, request, reply, count)
    if isinstance(reply, ParkedPull):
        return polled_round_trips(sock, request, reply, count)
    # the loop the smss and NSQ figures were always counted with: keep it as it is, so
    # their bytecode counts stay comparable with earlier runs
    send, recv, iterate = sock.send, sock.recv, reactor.iterate
    size = len(reply)
    for _ in range(count):
        send(request)
        got = b""
        while len(got) < size:
            iterate(0)
            try:
                got += recv(size - len(got), socket.MSG_DONTWAIT)
            except BlockingIOError:
                pass
        if got != reply:
            raise SystemExit(f"unexpected answer {got!r}")


def framed_round_trips(sock, request, reply, count):
    """L{round_trips} for remoting replies: read the 4-byte length, then the frame."""
    send, recv, iterate = sock.send, sock.recv, reactor.iterate
    for _ in range(count):
        send(request)
        got = b""
        need = 4
        while len(got) < need:
            iterate(0)
            while len(got) < need:
                try:
                    got += recv(need - len(got), socket.MSG_DONTWAIT)
                except BlockingIOError:
                    break
                if need == 4 and len(got) == 4:
                    need += int.from_bytes(got, "big")
        if not reply.matches(got):
            raise SystemExit(f"unexpected answer {got[:200]!r}")


class RemotingReply:
    """A remoting reply frame whose JSON header starts with C{head} (its size varies
    with the offsets it names)."""

    def __init__(self, head):
        self.head = head

    def matches(self, frame):
        return frame.startswith(self.head, 8)


class WithConsumer:
    """An NSQ PUB answered with OK while a consumer is attached to the topic: after each
    OK the reactor runs one more turn (the channel's pump), and the consumer reads what
    the broker flushed to it and FINs it all in one write, as bench/nsq_bench.py's
    reader (and the steady rows' consumer) does."""

    def __init__(self, consumer):
        self.consumer = consumer
        self.buf = bytearray()
        self.received = 0


def consumed_round_trips(sock, request, reply, count):
    """L{round_trips} of a PUB with a consumer attached (see L{WithConsumer})."""
    iterate = reactor.iterate
    consumer, buf = reply.consumer, reply.buf
    for _ in range(count):
        round_trips(sock, request, NSQ_OK, 1)
        iterate(0)  # the pump the PUB scheduled
        try:
            buf += consumer.recv(1 << 20, socket.MSG_DONTWAIT)
        except BlockingIOError:
            continue
        fins, pos = [], 0
        while len(buf) - pos >= 8:
            fsize, ftype = struct.unpack_from(">ii", buf, pos)
            if len(buf) - pos - 4 < fsize:
                break
            if ftype == 2:
                fins.append(b"FIN " + bytes(buf[pos + 18:pos + 34]) + b"\n")
            pos += 4 + fsize
        del buf[:pos]
        if fins:
            consumer.sendall(b"".join(fins))
            reply.received += len(fins)


def nsqsub_session(port):
    """An NSQ PUB with a consumer attached (channel "c", RDY 2500)."""
    consumer = connect(port)
    consumer.sendall(b"  V2SUB cost c\nRDY 2500\n")
    got = b""
    while len(got) < len(NSQ_OK):
        reactor.iterate(0)
        try:
            got += consumer.recv(len(NSQ_OK) - len(got), socket.MSG_DONTWAIT)
        except BlockingIOError:
            pass
    sock, request, _ = nsq_session(port)
    return sock, request, WithConsumer(consumer)


def smss_session(port):
    sock = connect(port)
    round_trips(sock, cc.encode_create(b"cost", 0), SMSS_OK, 1)
    return sock, cc.encode_pub(b"cost", SMSS_RECORD), SMSS_OK


def nsq_session(port):
    sock = connect(port)
    sock.sendall(b"  V2")
    request = b"PUB cost\n" + struct.pack(">I", len(BODY)) + BODY
    return sock, request, NSQ_OK


def remoting_request(code, ext, opaque=1, body=b"", **fields):
    """Return a remoting request frame with a JSON header as the C++ client writes it:
    some extFields values are JSON numbers (as in vectors/rocketmq/cpp-client-sessions.log).
    C{fields} replace header fields (None: left out), for another client's header."""
    header = {"code": code, "extFields": ext, "flag": 0, "language": "CPP",
              "opaque": opaque, "remark": "", "version": 63, **fields}
    header = json.dumps({k: v for k, v in header.items() if v is not None}).encode()
    return pack_frame_prefix(codes.SERIALIZE_JSON, len(header), len(body)) + header + body


RMQ_SIGN = {"AccessKey": "", "OnsChannel": "ALIYUN", "Signature": "r2KscApgmp4mTbXF2/WzOmrUVqw="}
RMQ_SEND = {**RMQ_SIGN, "batch": "0", "bornTimestamp": "1795267749004", "defaultTopic": "TBW102",
            "defaultTopicQueueNums": 4, "flag": 0, "producerGroup": "PID_COST",
            "properties": "TAGS\x01TagA\x02UNIQ_KEY\x010100007F0000799700000C47416F0100\x02"
                          "WAIT\x01true\x02",
            "queueId": 0, "reconsumeTimes": "0", "sysFlag": 0, "topic": "cost",
            "unitMode": "0"}
RMQ_PULL = {**RMQ_SIGN, "commitOffset": "0", "consumerGroup": "GID_COST", "maxMsgNums": 1,
            "queueId": 0, "queueOffset": "0", "subVersion": "0", "subscription": "*",
            "suspendTimeoutMillis": "20000", "sysFlag": 4, "topic": "cost"}


def rmqsend_session(port):
    sock = connect(port)
    return sock, remoting_request(codes.SEND_MESSAGE, RMQ_SEND, body=BODY), RemotingReply(b'{"code":0,')


#: SEND_MESSAGE_V2 as the Java client writes it (vectors/rocketmq/java-go-client-frames.txt):
#: short field names, every value a string; no KEYS (the C++ row's properties).
RMQ_SEND_V2 = {"a": "PID_COST", "b": "cost", "c": "TBW102", "d": "4", "e": "0", "f": "0",
               "g": "1795270508239", "h": "0", "i": RMQ_SEND["properties"], "j": "0",
               "k": "false", "m": "false"}


def rmqsend2_session(port):
    frame = remoting_request(codes.SEND_MESSAGE_V2, RMQ_SEND_V2, body=BODY, language="JAVA",
                             remark=None, serializeTypeCurrentRPC="JSON", version=401)
    return connect(port), frame, RemotingReply(b'{"code":0,')


def rmqpull_session(port):
    sock, send, reply = rmqsend_session(port)
    round_trips(sock, send, reply, 1)  # something to pull, whichever row ran before
    return sock, remoting_request(codes.PULL_MESSAGE, RMQ_PULL), RemotingReply(b'{"code":0,')


def rmqpull32_session(port):
    """A PULL_MESSAGE of 32 stored messages (what the C++ push consumer asks for and
    bench/rocketmq_bench.py's raw catch-up pipelines): the per-message share of a pull."""
    sock, send, reply = rmqsend_session(port)
    round_trips(sock, send, reply, PULL_BATCH)  # enough to pull, whichever row ran before
    pull = remoting_request(codes.PULL_MESSAGE, {**RMQ_PULL, "maxMsgNums": PULL_BATCH})
    return sock, pull, RemotingReply(b'{"code":0,')


class ParkedPull:
    """The steady cycle of a push consumer keeping up (the rmqpoll row): its PULL at the
    queue's tail (C{pull}, with C{offset}) is parked, a SEND on another connection is
    answered with C{send_reply}, and the parked PULL is answered with the new message."""

    def __init__(self, consumer, send_reply, offset, polls):
        self.consumer = consumer
        self.send_reply = send_reply
        self.offset = offset
        self.polls = polls  # the door's LongPolls: says when the PULL is parked


def polled_round_trips(sock, request, reply, count):
    """L{round_trips} of the rmqpoll row (see L{ParkedPull}): C{request} is the SEND."""
    consumer, iterate = reply.consumer, reactor.iterate
    answered = RemotingReply(b'{"code":0,')
    for _ in range(count):
        consumer.send(rmqpoll_pull(reply.offset))
        while not reply.polls.holds:  # read and parked (one turn, as the data is there)
            iterate(0)
        framed_round_trips(sock, request, reply.send_reply, 1)
        framed_round_trips(consumer, b"", answered, 1)  # usually already written
        reply.offset += 1


def rmqpoll_pull(offset):
    """The C++ push consumer's PULL (sysFlag 6: suspend, subscription) at C{offset}, from
    a template (the client's own cost stays out of the counts)."""
    header = _POLL_HEADER.replace(b"QUEUE_OFFSET", b"%d" % offset)
    return pack_frame_prefix(codes.SERIALIZE_JSON, len(header), 0) + header


_POLL_HEADER = remoting_request(codes.PULL_MESSAGE, {
    **RMQ_PULL, "commitOffset": "-1", "maxMsgNums": 32, "queueOffset": "QUEUE_OFFSET",
    "subVersion": "1795267612316", "suspendTimeoutMillis": "15000", "sysFlag": 6})[8:]


def rmqpoll_session(port, door):
    sock, send, reply = rmqsend_session(port)
    round_trips(sock, send, reply, 1)  # the queue exists; its tail is where the cycle starts
    consumer = connect(port)
    tail = door.broker.store.find_queue("cost", 0).max_offset
    return sock, send, ParkedPull(consumer, reply, tail, door.polls)


#: Messages per PULL of the rmqpull32 row.
PULL_BATCH = 32


def measure(name, sock, request, reply, a):
    round_trips(sock, request, reply, min(2000, a.requests))  # warm up
    cpu, wall = [], []
    for _ in range(a.repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        round_trips(sock, request, reply, a.requests)
        cpu.append((time.process_time() - c0) / a.requests * 1e6)
        wall.append((time.perf_counter() - w0) / a.requests * 1e6)
    print(f"{name:10s} {min(cpu):8.2f} {min(wall):8.2f}   (CPU runs: "
          + ", ".join(f"{x:.1f}" for x in cpu) + ")")
    if a.opcodes:
        count_opcodes(sock, request, reply, a.opcodes, a.top)
    if a.profile:
        import cProfile

        prof = cProfile.Profile()
        prof.runcall(round_trips, sock, request, reply, a.requests)
        path = f"{a.profile}.{name}"
        prof.dump_stats(path)
        print(f"           profile written to {path}")


def count_opcodes(sock, request, reply, rounds, top=25):
    """Print the bytecodes run per round trip (client loop included), by function."""
    counts = collections.Counter()

    def trace(frame, event, arg):
        frame.f_trace_lines = False
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            counts[(code.co_filename, code.co_name)] += 1
        return trace

    sys.settrace(trace)
    try:
        round_trips(sock, request, reply, rounds)
    finally:
        sys.settrace(None)
    root = harness.ROOT + os.sep
    print(f"           {sum(counts.values()) / rounds:.0f} bytecodes per round trip; by function:")
    for (path, name), n in counts.most_common(top):
        path = path.split("site-packages" + os.sep)[-1].replace(root, "")
        print(f"           {n / rounds:7.1f}  {path}:{name}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=20000, help="round trips per run")
    p.add_argument("--repeat", type=int, default=5, help="runs; the best is printed")
    p.add_argument("--only", default="smss,nsq",
                   help="comma-separated: smss, nsq, nsqsub, rmqsend, rmqsend2, rmqpull, rmqpull32, rmqpoll "
                        "(default smss,nsq)")
    p.add_argument("--also", default="", metavar="DOORS",
                   help="comma-separated doors to start as well, unmeasured (e.g. broker: the"
                        " RocketMQ door, on in the default configuration, with its dispatch"
                        " listeners on the store)")
    p.add_argument("--opcodes", type=int, default=0, metavar="N",
                   help="count bytecodes over N more round trips and print them")
    p.add_argument("--top", type=int, default=25, metavar="N",
                   help="functions listed with --opcodes (default 25)")
    p.add_argument("--profile", metavar="FILE", help="write cProfile stats to FILE.<name>")
    a = p.parse_args()
    data = tempfile.mkdtemp(prefix="mq-cost-")
    try:
        sessions = {"smss": (smss_session, "smss", "smss PUB"),
                    "nsq": (nsq_session, "nsqd_tcp", "nsq PUB"),
                    "nsqsub": (nsqsub_session, "nsqd_tcp", "nsq PUB+sub"),
                    "rmqsend": (rmqsend_session, "broker", "rmq SEND"),
                    "rmqsend2": (rmqsend2_session, "broker", "rmq SENDv2"),
                    "rmqpull": (rmqpull_session, "broker", "rmq PULL"),
                    "rmqpull32": (rmqpull32_session, "broker", "rmq PULL32"),
                    "rmqpoll": (rmqpoll_session, "broker", "rmq POLL")}
        names = a.only.split(",")
        doors = {sessions[n][1] for n in names} | set(filter(None, a.also.split(",")))
        # The rmqpoll row answers each parked pull at its message's arrival: with the
        # long-poll batch (rocketmq.longPollBatchMs) the cycle would wait out the batch,
        # busy in the loop, and count that wait as CPU.
        config = {"rocketmq": {"longPollBatchMs": 0}} if "rmqpoll" in names else None
        svc, ports = start_broker(data, sorted(doors), config)
        try:
            print(f"{'request':10s} {'CPU µs':>8s} {'wall µs':>8s}   per round trip, best of"
                  f" {a.repeat} x {a.requests}")
            for name in names:
                make, door, label = sessions[name]
                if name == "rmqpoll":  # it looks at the door's parked pulls
                    sock, request, reply = make(ports[door], svc.getServiceNamed("listen-broker").factory)
                else:
                    sock, request, reply = make(ports[door])
                measure(label, sock, request, reply, a)
                sock.close()
        finally:
            # Also on errors (a closed stdout, ^C): the store's disk thread must stop, or
            # the interpreter waits for it forever at exit.
            stop_broker(svc)
    finally:
        shutil.rmtree(data, ignore_errors=True)


def stop_broker(svc):
    """Stop the service tree started by L{start_broker} and wait until it has stopped."""
    d = svc.stopService()
    if d is not None:
        done = []
        d.addBoth(done.append)
        pump(lambda: done)

if __name__ == "__main__":
    main()
