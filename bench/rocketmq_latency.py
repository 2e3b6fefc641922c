#!/usr/bin/env python
"""Send-to-receive latency of the RocketMQ C++ push consumer for values of
``rocketmq.longPollBatchMs``, alternating A B A B.

Per run: a fresh broker with that batch, the C++ producer (``bench/rocketmq_bench.py``'s
worker) sending ``--count`` messages by sync sends, sleeping ``--gap`` seconds between
them, each with its send time, and the C++ push consumer reporting p50 and p99 of
receive time minus send time. Prints one JSON line per run. Asserts nothing.

``--raw`` measures the broker alone: a raw remoting producer (one SEND_MESSAGE at a time,
``--gap`` apart) and a raw consumer that long-polls one queue at its tail as the push
consumer does (PULL of 32, suspended up to 15 s), in threads of this process; it adds
p999 and the maximum. Tails the C++ run shows and this one does not are the client's.

    PYTHONPATH=. python bench/rocketmq_latency.py [--batches 1,0] [--gap 0.0003]
                                                  [--count 3000] [--rounds 2] [--raw]
"""

import argparse
import json
import os
import struct
import threading
import time

from harness import LOOPBACK, RemotingClient, broker, broker_port, namesrv_addr, records

from rocketmq_bench import read_json, spawn
from protocols.remoting import codes

_STAMP = struct.Struct(">d")


def one_run(batch_ms, gap, count):
    config = {"rocketmq": {"longPollBatchMs": batch_ms}}
    with broker({"namesrv": LOOPBACK, "broker": LOOPBACK}, config, prefix="rmqlat-") as server:
        # the clients' home, in the directory the broker's data goes with
        home = os.path.join(os.path.dirname(server.data), "home")
        os.makedirs(home)
        ns = namesrv_addr(server)
        # the producer's warm-up creates the topic, so the consumer finds its route
        p = spawn(home, "worker-produce", "--namesrv", ns, "--topic", "Lat", "--count", count,
                  "--latency", gap, "--index", 9)
        read_json(p, 60)
        c = spawn(home, "worker-consume", "--namesrv", ns, "--topic", "Lat", "--group", "LatG",
                  "--count", count + 20, "--latency", 1, "--timeout", 120)
        read_json(c, 60)
        time.sleep(5)  # the consumer's first rebalance and offset lookup
        p.stdin.write("go\n")
        p.stdin.flush()
        sent = read_json(p, 300)
        got = read_json(c, 130)
        p.kill()
        c.kill()
        return {"batch_ms": batch_ms, "gap_s": gap, "msgs_per_s": round(count / sent["elapsed"]),
                "received": got["count"], "p50_ms": round(got.get("p50", -1), 2),
                "p99_ms": round(got.get("p99", -1), 2)}


def _send_fields():
    return {"producerGroup": "LatP", "topic": "Lat", "defaultTopic": "TBW102",
            "defaultTopicQueueNums": 1, "queueId": 0, "sysFlag": 0, "bornTimestamp": 0,
            "flag": 0, "reconsumeTimes": 0}


def raw_run(batch_ms, gap, count):
    """L{one_run} with raw remoting clients: the broker's latency without the C++ client's."""
    with broker(batch_ms) as (server, _):
        port = broker_port(server)
        producer = RemotingClient("127.0.0.1", port)
        first = producer.call(codes.SEND_MESSAGE, _send_fields(), _STAMP.pack(0.0))
        offset = int(first.ext_fields["queueOffset"]) + 1
        pad = b"x" * (200 - _STAMP.size)

        def produce():
            t0 = time.monotonic()
            for i in range(count):
                wait = t0 + i * gap - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                producer.call(codes.SEND_MESSAGE, _send_fields(), _STAMP.pack(time.monotonic()) + pad)

        consumer = RemotingClient("127.0.0.1", port)
        sender = threading.Thread(target=produce, daemon=True)
        t0 = time.monotonic()
        sender.start()
        lat, deadline = [], t0 + count * gap + 60
        while len(lat) < count and time.monotonic() < deadline:
            r = consumer.call(codes.PULL_MESSAGE, {
                "consumerGroup": "LatG", "topic": "Lat", "queueId": 0, "queueOffset": offset,
                "maxMsgNums": 32, "sysFlag": 6, "commitOffset": 0,
                "suspendTimeoutMillis": 15000, "subscription": "*", "subVersion": 0},
                timeout=30)
            now = time.monotonic()
            if r.code == codes.SUCCESS:
                lat += [now - _STAMP.unpack_from(bytes(v.body))[0] for v in records(r.body)]
            offset = int(r.ext_fields.get("nextBeginOffset", offset))
        elapsed = time.monotonic() - t0
        sender.join(30)
        producer.close()
        consumer.close()
        lat.sort()
        if not lat:
            raise RuntimeError("the consumer received nothing")
        ms = lambda q: round(1000 * lat[min(len(lat) - 1, int(q * len(lat)))], 2)  # noqa: E731
        return {"batch_ms": batch_ms, "gap_s": gap, "client": "raw",
                "msgs_per_s": round(count / elapsed), "received": len(lat),
                "p50_ms": ms(0.5), "p99_ms": ms(0.99), "p999_ms": ms(0.999),
                "max_ms": round(1000 * lat[-1], 2)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,0", help="longPollBatchMs values, alternated")
    ap.add_argument("--gap", type=float, default=0.0003, help="seconds between sends")
    ap.add_argument("--count", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--raw", action="store_true",
                    help="raw remoting clients instead of the C++ ones: the broker alone")
    a = ap.parse_args()
    run = raw_run if a.raw else one_run
    batches = [int(x) for x in a.batches.split(",") if x]
    for _ in range(a.rounds):
        for b in batches:
            print(json.dumps(run(b, a.gap, a.count)), flush=True)


if __name__ == "__main__":
    main()
