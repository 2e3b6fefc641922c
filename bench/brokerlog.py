"""Write a data directory through a running broker, in the shape a busy broker's log has:
concurrent publishers on every protocol, so topics and queues interleave record by record
and record sizes vary, with real properties, delayed messages and retry/dead-letter
topics. The audit benchmark (C{bench/audit_bench.py --shape broker}) and its profile run
on it; the numpy generator (L{tests.spark.biglog}) writes one topic in batches of 1,000
equal records, which the audit reads far faster than this.

Publishers (each a thread with its own connection), until C{records} messages are stored:

- two smss publishers: batches of 50 to three topics in turn, bodies of 100-400 bytes,
  every fifth message with headers; every 40th batch a delayed one (1 s);
- one NSQ publisher: C{/mpub} batches of 50 to C{clicks} (nsqd HTTP);
- one RocketMQ publisher: C{SEND_BATCH_MESSAGE} batches of 32 to C{trades} (4 queues,
  round robin) with C{UNIQ_KEY}, C{TAGS} and C{KEYS}; every tenth batch to C{%RETRY%G1}
  and every fiftieth to C{%DLQ%G1}.

    PYTHONPATH=. python bench/brokerlog.py DIR [--records 2000000] [--segment-mb 1024]
"""

import argparse
import random
import shutil
import sys
import threading
import time

from harness import http, RemotingClient, ServerProcess

from protocols.remoting import codes
from protocols.remoting.props import encode_batch_body
from protocols.smss.client import SmssClient

LOOPBACK = "tcp:0:interface=127.0.0.1"
SMSS_TOPICS = ("orders", "payments", "audit")


def _body(rng, lo=100, hi=400):
    return rng.randbytes(rng.randint(lo, hi))


def _smss(port, seed, share, stop):
    rng = random.Random(seed)
    c = SmssClient("127.0.0.1", port, timeout=60)
    n = 0
    try:
        while n < share and not stop.is_set():
            topic = SMSS_TOPICS[n // 50 % len(SMSS_TOPICS)]
            batch = [({"trace": f"t{seed}-{n + i}", "src": "bench"}, _body(rng)) if i % 5 == 0 else _body(rng)
                     for i in range(50)]  # fmt: skip
            if n // 50 % 40 == 39:
                c.delay(topic, 1000, [_body(rng) for _ in range(5)])
                n += 5
            else:
                c.publish(topic, batch)
                n += len(batch)
    finally:
        c.close()


def _nsq(port, seed, share, stop):
    rng = random.Random(seed)
    n = 0
    while n < share and not stop.is_set():
        bodies = [rng.randbytes(rng.randint(60, 300)).replace(b"\n", b" ") for _ in range(50)]
        status = http(port, "POST", "/mpub?topic=clicks", b"\n".join(bodies), timeout=60)[0]
        if status != 200:
            raise RuntimeError(f"/mpub answered {status}")
        n += len(bodies)


def _rocketmq(port, seed, share, stop):
    rng = random.Random(seed)
    c = RemotingClient("127.0.0.1", port, timeout=60)
    n = q = 0
    try:
        for topic, queues in (("trades", 4), ("%RETRY%G1", 1), ("%DLQ%G1", 1)):
            r = c.call(codes.UPDATE_AND_CREATE_TOPIC, {
                "topic": topic, "defaultTopic": "TBW102", "readQueueNums": queues, "writeQueueNums": queues,
                "perm": 6, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": "false"})
            if r.code != codes.SUCCESS:
                raise RuntimeError(f"UPDATE_AND_CREATE_TOPIC answered {r.code}: {r.remark}")
        while n < share and not stop.is_set():
            k = n // 32
            topic = "%DLQ%G1" if k % 50 == 49 else "%RETRY%G1" if k % 10 == 9 else "trades"
            msgs = [(0, _body(rng, 80, 600), {"UNIQ_KEY": f"{seed:04X}{n + i:020X}", "TAGS": f"tag{(n + i) % 7}",
                                               "KEYS": f"order-{rng.randint(1, 10**6)}"})
                    for i in range(32)]  # fmt: skip
            queue = q % 4 if topic == "trades" else 0
            ext = {"a": "PG", "b": topic, "c": "TBW102", "d": "4", "e": str(queue), "f": "0",
                   "g": str(int(time.time() * 1000)), "h": "0", "i": "", "j": "0", "k": "false", "m": "true"}
            r = c.call(codes.SEND_BATCH_MESSAGE, ext, encode_batch_body(msgs), timeout=60)
            if r.code != codes.SUCCESS:
                raise RuntimeError(f"SEND_BATCH_MESSAGE answered {r.code}: {r.remark}")
            n += len(msgs)
            q += 1
    finally:
        c.close()


def write(path, records, segment_size=1 << 30):
    """Run a broker on C{path} (removed first) and publish about C{records} messages from
    the publishers above at once; returns C{(messages published, seconds)}."""
    shutil.rmtree(path, ignore_errors=True)
    listen = {n: LOOPBACK for n in ("smss", "broker", "nsqd_tcp", "nsqd_http")}
    server = ServerProcess(path, config={"store": {"maxLogSize": segment_size}}, listen=listen).start(timeout=60)
    t0 = time.monotonic()
    try:
        c = SmssClient("127.0.0.1", server.smss_port)
        for t in SMSS_TOPICS:
            c.create(t)
        c.close()
        shares = {"smss": records * 3 // 5, "nsq": records // 5, "rocketmq": records // 5}
        stop, errors = threading.Event(), []
        work = [(_smss, server.smss_port, 1, shares["smss"] // 2), (_smss, server.smss_port, 2, shares["smss"] // 2),
                (_nsq, server.ports["NsqdHttpSite"], 3, shares["nsq"]),
                (_rocketmq, server.ports["BrokerDoor"], 4, shares["rocketmq"])]  # fmt: skip

        def run(fn, *a):
            try:
                fn(*a, stop)
            except Exception as e:  # stop the others: a benchmark on half a log means nothing
                errors.append(e)
                stop.set()

        threads = [threading.Thread(target=run, args=w) for w in work]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        # Let the 1 s delays fire before the broker stops, so none is left overdue.
        time.sleep(2)
    finally:
        code = server.stop()
        server.close()
    if code not in (0, -15):
        raise RuntimeError(server.read_log()[-4000:])
    return sum(shares.values()), time.monotonic() - t0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir")
    p.add_argument("--records", type=int, default=2_000_000)
    p.add_argument("--segment-mb", type=int, default=1024)
    args = p.parse_args(argv)
    n, took = write(args.dir, args.records, args.segment_mb << 20)
    print(f"published about {n} messages through the broker in {took:.1f}s into {args.dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
