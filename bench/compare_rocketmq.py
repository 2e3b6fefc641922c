"""The RocketMQ rows of bench/compare.py: mqserver alone, no reference broker.

- C{client_rows}: the PyPI C++ client (C{rocketmq}) sends C{--rmq-sends} messages with one
  synchronous producer, then a C++ push consumer reads a C{--backlog} filled by pipelined
  SEND_BATCH_MESSAGE frames; for each the broker's and the client's CPU per message and
  their ratio (the aim: the broker at most half the client). Then a raw client reads the
  same backlog with pipelined PULL_MESSAGE, 8 requests of 32 in flight per queue (the
  aim: above 300k msgs/s).
- C{steady}: one connection sends one SEND_MESSAGE_V2 every 1/rate seconds while a C++
  push consumer is attached; the broker's CPU per message from the first send until the
  consumer has every message.

The C++ client runs in subprocesses of bench/rocketmq_bench.py (it can hang at shutdown).
"""

import os
import time

from harness import RemotingClient

import rocketmq_bench as rb
from procstat import cpu_seconds
from protocols.remoting import codes
from protocols.remoting.codec import encode
from protocols.remoting.messages import RemotingCommand


def _home(sysm):
    """A HOME for the C++ client (it writes its logs under C{~/logs})."""
    home = os.path.join(sysm.tmp, f"rmq-home-{time.monotonic_ns()}")
    os.makedirs(home)
    return home


def _per_msg(cpu, n):
    return 1e6 * cpu / max(n, 1)


def _own_cpu():
    t = os.times()
    return t.user + t.system


def client_rows(sysm, a):
    """Send with the C++ producer, catch up with the C++ push consumer, then the raw pull
    catch-up; return C{{figure: result}}."""
    home, ns, pid = _home(sysm), sysm.namesrv, sysm.pid
    s = rb.send_throughput(home, ns, pid, 1, a.rmq_sends, "CmpSend")
    send_broker = _per_msg(s["broker_cpu_s"], s["messages"])
    send_client = _per_msg(s["clients_cpu_s"], s["messages"])
    rb.fill_backlog(sysm.rmq_port, "CmpBacklog", a.backlog)
    b0 = cpu_seconds(pid)
    c = rb.spawn(home, "worker-consume", "--namesrv", ns, "--topic", "CmpBacklog",
                 "--group", "CmpCatchUp", "--count", a.backlog, "--timeout", 300)
    try:
        rb.read_json(c, 60)
        r = rb.read_json(c, 320)
    finally:
        c.kill()
        c.wait()
    pull_broker = _per_msg(cpu_seconds(pid) - b0, r["count"])
    pull_client = _per_msg(r["cpu_run"], r["count"])
    t0, c0 = time.monotonic(), _own_cpu()
    raw = rb.raw_pull_catch_up(sysm.rmq_port, pid, "CmpBacklog", a.backlog)
    raw_client = 100 * (_own_cpu() - c0) / (time.monotonic() - t0)
    return {
        "rocketmq C++ sync send 1 producer": {
            "rate": s["msgs_per_s"], "cpu_us": send_broker, "client_us": send_client,
            "broker_client": send_broker / send_client},
        "rocketmq C++ push consumer catch-up": {
            "rate": r["count"] / max(r["elapsed"], 1e-9), "cpu_us": pull_broker,
            "client_us": pull_client, "broker_client": pull_broker / pull_client,
            "note": "" if r["count"] >= a.backlog else f"got {r['count']} of {a.backlog}"},
        "rocketmq raw pipelined pull catch-up": {
            "rate": raw["msgs_per_s"], "cpu_us": _per_msg(raw["broker_cpu_s"], raw["messages"]),
            "note": f"the Python client used {raw_client:.0f}% of a core"
                    + ("" if raw["messages"] >= a.backlog else
                       f"; got {raw['messages']} of {a.backlog}")},
    }


def _send_frame(topic):
    """One SEND_MESSAGE_V2 request (queue 0, 200-byte body), sent again and again."""
    ext = {"a": "CmpSteadyP", "b": topic, "c": "TBW102", "d": "4", "e": "0", "f": "0",
           "g": "0", "h": "0", "i": "", "j": "0", "k": "false", "m": "false"}
    return encode(RemotingCommand(code=codes.SEND_MESSAGE_V2, language="JAVA", version=401,
                                  opaque=1, flag=0, ext_fields=ext, body=rb.BODY))


def remoting_frames(data):
    """How many whole remoting frames C{data} starts with, and the bytes they take."""
    n = at = 0
    while len(data) - at >= 4:
        size = 4 + int.from_bytes(data[at:at + 4], "big")
        if len(data) - at < size:
            break
        n, at = n + 1, at + size
    return n, at


def steady(sysm, a, rate, paced):
    """The broker's CPU per message at a steady C{rate} with a C++ push consumer attached.

    C{paced} is compare.paced_pipelined (passed in: this module does not import compare)."""
    topic, total = "CmpSteady", int(rate * a.steady_seconds)
    admin = RemotingClient("127.0.0.1", sysm.rmq_port, timeout=30)
    r = admin.call(codes.UPDATE_AND_CREATE_TOPIC, {
        "topic": topic, "defaultTopic": "TBW102", "readQueueNums": 1, "writeQueueNums": 1,
        "perm": 6, "topicFilterType": "SINGLE_TAG", "order": "false"})
    admin.close()
    if r.code != codes.SUCCESS:
        raise RuntimeError(f"topic not created: {r.remark}")
    home = _home(sysm)
    c = rb.spawn(home, "worker-consume", "--namesrv", sysm.namesrv, "--topic", topic,
                 "--group", "CmpSteadyG", "--count", total, "--timeout", a.steady_seconds + 120)
    try:
        rb.read_json(c, 60)
        time.sleep(3)  # the consumer's first rebalance and offset lookup, as rocketmq_bench
        c0, t0 = cpu_seconds(sysm.pid), time.monotonic()
        sent = paced(sysm.rmq_port, _send_frame(topic), remoting_frames, rate, a.steady_seconds)
        got = rb.read_json(c, 130)
    finally:
        c.kill()
        c.wait()
    cpu, wall = cpu_seconds(sysm.pid) - c0, time.monotonic() - t0
    note = f"server CPU {100 * cpu / wall:.0f}% of a core"
    if got["count"] < sent:
        note += f"; the consumer got {got['count']} of {sent}"
    return {"rate": sent / a.steady_seconds, "cpu_us": _per_msg(cpu, sent), "note": note}
