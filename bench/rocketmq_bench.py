"""RocketMQ benchmark: the real C++ client (PyPI ``rocketmq``) against mqserver.

Figures printed (no pass/fail):
- sync send throughput with 1 and 4 producer processes (200-byte bodies), with the CPU
  seconds used by the broker process and by the client processes during the run;
- push-consumer catch-up on a backlog (default 200k messages);
- p50/p99 send-to-receive latency at a moderate rate;
- the broker's peak RSS (VmHWM).

Usage: PYTHONPATH=. python bench/rocketmq_bench.py [--quick] [--sends N] [--backlog N]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

from harness import ROOT

from procstat import cpu_seconds, peak_rss_mb

BODY = b"x" * 200


# -- workers (run in subprocesses: the C++ client can hang at shutdown) ---------------------


def worker_produce(a):
    from rocketmq.client import Message, Producer

    p = Producer(f"BenchP{a.index}", timeout=10000)
    p.set_namesrv_addr(a.namesrv)
    p.start()
    m = Message(a.topic)
    m.set_body(BODY)
    for _ in range(20):  # warm-up: route lookup, connection
        p.send_sync(m)
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.readline()  # wait for "go" so all producers start together
    t0 = time.monotonic()
    c0 = os.times()
    for i in range(a.count):
        if a.latency:
            m = Message(a.topic)
            m.set_body(BODY)
            m.set_property("SENT_NS", str(time.time_ns()))
            time.sleep(a.latency)
        p.send_sync(m)
    c1 = os.times()
    print(json.dumps({"elapsed": time.monotonic() - t0, "cpu": (c1.user - c0.user) + (c1.system - c0.system)}), flush=True)
    os._exit(0)


def worker_consume(a):
    from rocketmq.client import PushConsumer

    c = PushConsumer(a.group)
    c.set_namesrv_addr(a.namesrv)
    lock = threading.Lock()
    state = {"n": 0, "first": None, "lat": [], "cpu0": 0.0}

    def on_message(msg):
        now = time.time_ns()
        with lock:
            if state["first"] is None:
                state["first"] = time.monotonic()
                t = os.times()
                state["cpu0"] = t.user + t.system
            state["n"] += 1
            if a.latency:
                sent = msg.get_property("SENT_NS")
                if sent:
                    state["lat"].append((now - int(sent)) / 1e6)

    c.subscribe(a.topic, on_message)
    c.start()
    print(json.dumps({"ready": True}), flush=True)
    deadline = time.monotonic() + a.timeout
    while time.monotonic() < deadline:
        with lock:
            if state["n"] >= a.count:
                break
        time.sleep(0.002)
    done = time.monotonic()
    with lock:
        lat = sorted(state["lat"])
        out = {"count": state["n"], "elapsed": done - (state["first"] or done)}
    if lat:
        out["p50"] = lat[len(lat) // 2]
        out["p99"] = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    c0 = os.times()
    out["cpu"] = c0.user + c0.system
    # from the first message on: without the client's start-up and rebalance
    out["cpu_run"] = out["cpu"] - state["cpu0"]
    print(json.dumps(out), flush=True)
    os._exit(0)


# -- driver -------------------------------------------------------------------------------


def spawn(home, *args):
    env = dict(os.environ, HOME=home, PYTHONPATH=ROOT)
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), *map(str, args)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env, cwd=home, text=True)


def read_json(proc, timeout):
    result = {}

    def go():
        line = proc.stdout.readline()
        result["v"] = json.loads(line) if line else None

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(timeout)
    if "v" not in result or result["v"] is None:
        proc.kill()
        raise RuntimeError(f"worker gave no answer in {timeout}s")
    return result["v"]


def send_throughput(home, ns, server_pid, producers, per_producer, topic):
    procs = [spawn(home, "worker-produce", "--namesrv", ns, "--topic", topic, "--count", per_producer,
                   "--index", i) for i in range(producers)]
    try:
        for p in procs:
            read_json(p, 60)
        b0 = cpu_seconds(server_pid)
        t0 = time.monotonic()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [read_json(p, 600) for p in procs]
        wall = time.monotonic() - t0
        b1 = cpu_seconds(server_pid)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    total = producers * per_producer
    return {"producers": producers, "messages": total, "wall_s": round(wall, 2),
            "msgs_per_s": round(total / wall), "broker_cpu_s": round(b1 - b0, 2),
            "clients_cpu_s": round(sum(r["cpu"] for r in results), 2)}


def fill_backlog(port, topic, count, queues=4, batch=100):
    """Fill a backlog fast: pipelined SEND_BATCH_MESSAGE frames from a raw client."""
    from protocols.remoting import codes
    from protocols.remoting.props import encode_batch_body
    from harness import RemotingClient

    c = RemotingClient("127.0.0.1", port, timeout=60)
    r = c.call(codes.UPDATE_AND_CREATE_TOPIC, {"topic": topic, "defaultTopic": "TBW102", "readQueueNums": queues,
                                              "writeQueueNums": queues, "perm": 6, "topicFilterType": "SINGLE_TAG",
                                              "order": "false"})
    assert r.code == 0, r.remark
    body = encode_batch_body([(0, BODY, {"UNIQ_KEY": f"B{i}"}) for i in range(batch)])
    sent = 0
    pending = 0
    q = 0
    while sent < count:
        c.send(codes.SEND_BATCH_MESSAGE, {"a": "BenchFill", "b": topic, "c": "TBW102", "d": "4", "e": q % queues,
                                          "f": "0", "g": "0", "h": "0", "i": "", "j": "0", "k": "false",
                                          "m": "true"}, body)
        q += 1
        sent += batch
        pending += 1
        if pending >= 50:
            r = c.recv(None, 60)
            assert r.code == 0, r.remark
            pending -= 1
    while pending:
        assert c.recv(None, 60).code == 0
        pending -= 1
    c.close()


def raw_pull_catch_up(port, server_pid, topic, count, queues=4, window=8, batch=32):
    """Read the backlog with a raw remoting client: C{window} PULL_MESSAGE requests of
    C{batch} messages in flight per queue at consecutive offsets (the C++ push consumer
    asks for 32 at a time, one request per queue): what the broker itself can serve.
    A queue is done at its first answer with fewer than C{batch} messages (or none).
    The requests that the answers of one read free up go out in one write, as a
    pipelining client's event loop flushes them."""
    from protocols.remoting import codes
    from harness import RemotingClient

    c = RemotingClient("127.0.0.1", port, timeout=60)
    ahead = {q: 0 for q in range(queues)}  # the next offset to ask for
    open_queues = set(ahead)
    inflight = {}  # opaque -> (queue, offset asked)
    got = 0
    b0 = cpu_seconds(server_pid)
    t0 = time.monotonic()

    def ask(q):
        op, frame = c.request_frame(codes.PULL_MESSAGE, {
            "consumerGroup": "RawG", "topic": topic, "queueId": q, "queueOffset": ahead[q],
            "maxMsgNums": batch, "sysFlag": 4, "commitOffset": 0, "suspendTimeoutMillis": 0,
            "subscription": "*", "subVersion": 0})
        inflight[op] = (q, ahead[q])
        ahead[q] += batch
        return frame

    c.send_raw(b"".join(ask(q) for q in range(queues) for _ in range(window)))
    while inflight:
        frames = []
        for r in [c.recv(None, 60), *c.received_responses()]:
            q, asked = inflight.pop(r.opaque)
            n = int(r.ext_fields["nextBeginOffset"]) - asked if r.code == codes.SUCCESS else 0
            got += max(n, 0)
            if n < batch:
                open_queues.discard(q)
            elif q in open_queues:
                frames.append(ask(q))
        if frames:
            c.send_raw(b"".join(frames))
    wall = time.monotonic() - t0
    c.close()
    return {"messages": got, "seconds": round(wall, 2), "msgs_per_s": round(got / wall),
            "broker_cpu_s": round(cpu_seconds(server_pid) - b0, 2)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("command", nargs="?", default="run")
    ap.add_argument("--namesrv")
    ap.add_argument("--topic")
    ap.add_argument("--group", default="BenchG")
    ap.add_argument("--count", type=int, default=0)
    ap.add_argument("--index", type=int, default=0)
    ap.add_argument("--latency", type=float, default=0.0)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sends", type=int, default=20000, help="sync sends per run (split over producers)")
    ap.add_argument("--backlog", type=int, default=200_000)
    ap.add_argument("--backlog-queues", type=int, default=4, help="queues of the backlog topic")
    a = ap.parse_args()
    if a.command == "worker-produce":
        return worker_produce(a)
    if a.command == "worker-consume":
        return worker_consume(a)
    if a.quick:
        a.sends, a.backlog = 4000, 50_000

    from harness import broker_port, namesrv_addr, rocket_server

    tmp = tempfile.mkdtemp(prefix="rmqbench-")
    home = os.path.join(tmp, "home")
    os.makedirs(home)
    server = rocket_server(os.path.join(tmp, "broker"), smss=False)
    server.start()
    pid = server.proc.pid
    ns = namesrv_addr(server)
    report = {}
    try:
        for n in (1, 4):
            report[f"sync_send_{n}p"] = send_throughput(home, ns, pid, n, a.sends // n, f"BenchSend{n}")
            print(json.dumps(report[f"sync_send_{n}p"]), flush=True)
        fill_backlog(broker_port(server), "BenchBacklog", a.backlog, a.backlog_queues)
        b0 = cpu_seconds(pid)
        c = spawn(home, "worker-consume", "--namesrv", ns, "--topic", "BenchBacklog", "--group", "BenchCatchUp",
                  "--count", a.backlog, "--timeout", 300)
        read_json(c, 60)
        r = read_json(c, 320)
        c.wait()
        report["catch_up"] = {"queues": a.backlog_queues, "messages": r["count"], "seconds": round(r["elapsed"], 2),
                              "msgs_per_s": round(r["count"] / max(r["elapsed"], 1e-9)),
                              "broker_cpu_s": round(cpu_seconds(pid) - b0, 2), "client_cpu_s": round(r["cpu"], 2)}
        print(json.dumps(report["catch_up"]), flush=True)
        report["raw_pull_catch_up"] = raw_pull_catch_up(broker_port(server), pid, "BenchBacklog", a.backlog,
                                                        a.backlog_queues)
        print(json.dumps(report["raw_pull_catch_up"]), flush=True)
        n_lat = 2000 if not a.quick else 500
        # the producer's warm-up creates the topic, so the consumer finds its route at start
        p = spawn(home, "worker-produce", "--namesrv", ns, "--topic", "BenchLat", "--count", n_lat,
                  "--latency", 0.002, "--index", 9)
        read_json(p, 60)
        c = spawn(home, "worker-consume", "--namesrv", ns, "--topic", "BenchLat", "--group", "BenchLatG",
                  "--count", n_lat + 20, "--latency", 1, "--timeout", 120)
        read_json(c, 60)
        time.sleep(5)  # first rebalance and offset lookups done
        p.stdin.write("go\n")
        p.stdin.flush()
        read_json(p, 300)
        r = read_json(c, 130)
        p.kill()
        c.kill()
        report["latency_ms"] = {"messages": r["count"], "p50": round(r.get("p50", -1), 2),
                                "p99": round(r.get("p99", -1), 2)}
        print(json.dumps(report["latency_ms"]), flush=True)
        report["broker_peak_rss_mb"] = round(peak_rss_mb(pid), 1)
    finally:
        server.stop()
        server.close()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
