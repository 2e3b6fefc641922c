"""Drive the real RocketMQ C++ client (PyPI ``rocketmq``) from a subprocess.

The C++ client has long internal timeouts and can hang at shutdown, so tests never load
it in the pytest process: they run this script (see L{run_client}) and read one JSON
object per line from its stdout. Commands:

- ``produce``: send messages (sync, async, oneway, batch, orderly); one line per result.
- ``consume``: a push consumer; one line per delivered message; exits after ``--expect``
  messages plus ``--linger`` seconds, or at ``--timeout``.
- ``pull``: a pull consumer reading every queue of a topic until no new message.
"""

import argparse
import json
import os
import sys
import threading
import time


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def hard_exit(code=0, after=0.0):
    """Leave without running the C++ destructors (they can hang)."""
    def go():
        time.sleep(after)
        sys.stdout.flush()
        os._exit(code)
    if after:
        threading.Thread(target=go, daemon=True).start()
    else:
        go()


#: A send the client fails with "No route info of this topic" is made this many times in
#: all, as an application retries it. The C++ client says so when it found no route, and
#: also when each of its own attempts at the send failed (5, of 5 s each); each new
#: attempt looks the route up at the nameserver anew. So one lookup or send lost under
#: load fails no test, while a broker that never takes the send still does.
ROUTE_ATTEMPTS = 3


def asking_again(attempts, send, *args):
    """Return C{send(*args)}, made up to C{attempts} times while it fails with "No route
    info" (each failure is written as a C{retry} line, for the test's failure message)."""
    for attempt in range(1, attempts + 1):
        try:
            return send(*args)
        except Exception as e:
            if attempt == attempts or "No route info" not in str(e):
                raise
            emit({"retry": str(e)})


def make_message(a, i):
    from rocketmq.client import Message

    m = Message(a.topic)
    if a.tags:
        tags = a.tags.split(",")
        m.set_tags(tags[i % len(tags)])
    m.set_keys(a.keys.replace("{i}", str(i)) if a.keys else f"k{i}")
    body = (a.body.replace("{i}", str(i)) if a.body else f"msg-{i}").encode()
    if a.body_size:
        body = (body + b"-" + bytes(range(32, 127)) * (a.body_size // 95 + 1))[: a.body_size]
    m.set_body(body)
    if a.delay:
        m.set_delay_time_level(a.delay)
    m.set_property("SENT_MS", str(int(time.time() * 1000)))
    return m


def produce(a):
    from rocketmq.client import Message, Producer

    p = Producer(a.group, timeout=a.send_timeout)
    p.set_namesrv_addr(a.namesrv)
    if a.access_key:  # RocketMQ ACL: the client signs every request
        p.set_session_credentials(a.access_key, a.secret_key, "ALIYUN")
    p.start()
    done = threading.Semaphore(0)
    if a.mode == "batch":
        for start in range(0, a.count, a.batch_size):
            msgs = [make_message(a, i) for i in range(start, min(a.count, start + a.batch_size))]
            r = asking_again(a.send_attempts, p.send_batch, msgs)
            emit({"i": start, "status": int(r.status), "id": r.msg_id, "offset": r.offset, "n": len(msgs)})
    for i in range(a.count if a.mode != "batch" else 0):
        m = make_message(a, i)
        if a.mode == "sync":
            try:
                r = asking_again(a.send_attempts, p.send_sync, m)
            except Exception as e:  # e.g. refused by the broker's ACL
                emit({"i": i, "error": str(e)})
                continue
            emit({"i": i, "status": int(r.status), "id": r.msg_id, "offset": r.offset})
        elif a.mode == "oneway":
            asking_again(a.send_attempts, p.send_oneway, m)
            emit({"i": i, "status": 0})
        elif a.mode == "orderly":
            r = asking_again(a.send_attempts, p.send_orderly, m, i % 2 if a.order_key is None else a.order_key)
            emit({"i": i, "status": int(r.status), "id": r.msg_id, "offset": r.offset})
        elif a.mode == "async":
            def ok(r, i=i):
                emit({"i": i, "status": int(r.status), "id": r.msg_id, "offset": r.offset})
                done.release()

            def fail(e, i=i):
                emit({"i": i, "error": str(e)})
                done.release()

            asking_again(a.send_attempts, p.send_async, m, ok, fail)
    if a.mode == "async":
        for _ in range(a.count):
            done.acquire(timeout=30)
    if a.mode == "oneway":
        # One-way sends are written to the broker connection by the client's event thread,
        # after send_oneway returned: a sync send behind them on that connection (another
        # topic, so the test's own is untouched) is answered only after they arrived.
        probe = Message(a.topic + "_flushed")
        probe.set_body(b"after the one-way sends")
        p.send_sync(probe)
    emit({"done": True})
    hard_exit(0)


def consume(a):
    from rocketmq.client import MessageModel, PushConsumer

    model = MessageModel.BROADCASTING if a.broadcast else MessageModel.CLUSTERING
    c = PushConsumer(a.group, orderly=a.orderly, message_model=model)
    c.set_namesrv_addr(a.namesrv)
    if a.access_key:
        c.set_session_credentials(a.access_key, a.secret_key, "ALIYUN")
    if a.instance:
        c.set_instance_name(a.instance)
    if a.threads:
        c.set_thread_count(a.threads)
    lock = threading.Lock()
    state = {"n": 0, "last": time.monotonic()}
    quiet = a.quiet

    def on_message(msg):
        now = int(time.time() * 1000)
        with lock:
            state["n"] += 1
            state["last"] = time.monotonic()
        if not quiet:
            sent = msg.get_property("SENT_MS")
            emit({
                "topic": msg.topic, "tags": msg.tags.decode() if msg.tags else "",
                "keys": msg.keys.decode() if msg.keys else "", "id": msg.id,
                "body": msg.body.decode("latin-1") if a.full_body else msg.body[:64].decode("latin-1"),
                "len": len(msg.body), "queue": msg.queue_id, "offset": msg.queue_offset,
                "reconsume": msg.reconsume_times, "recv_ms": now,
                "sent_ms": int(sent) if sent else 0,
                **({"props": {n: _text(msg.get_property(n)) for n in a.props.split(",")}} if a.props else {}),
            })
        if a.fail and msg.reconsume_times < a.fail:
            raise RuntimeError("failing on purpose")

    c.subscribe(a.topic, on_message, a.expr)
    c.start()
    emit({"started": True})
    deadline = time.monotonic() + a.timeout
    reached = None
    while time.monotonic() < deadline:
        time.sleep(0.05)
        with lock:
            n = state["n"]
        if a.expect and n >= a.expect and reached is None:
            reached = time.monotonic()
            if a.quiet:
                emit({"count": n, "t": reached})
        if reached is not None and time.monotonic() - reached >= a.linger:
            break
    with lock:
        emit({"done": True, "count": state["n"]})
    if a.clean_shutdown:
        hard_exit(0, after=15.0)
        c.shutdown()
    hard_exit(0)


def _text(value):
    return value.decode("latin-1") if isinstance(value, bytes) else value


def pull(a):
    from rocketmq.client import PullConsumer

    c = PullConsumer(a.group)
    c.set_namesrv_addr(a.namesrv)
    c.start()
    n = 0
    for msg in c.pull(a.topic, a.expr, a.max_num):
        n += 1
        emit({"topic": msg.topic, "tags": msg.tags.decode() if msg.tags else "", "body": msg.body[:64].decode("latin-1"),
              "queue": msg.queue_id, "offset": msg.queue_offset, "id": msg.id})
    emit({"done": True, "count": n})
    hard_exit(0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("command", choices=["produce", "consume", "pull"])
    ap.add_argument("--namesrv", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", default="G")
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--mode", default="sync")
    ap.add_argument("--batch-size", type=int, default=10)
    ap.add_argument("--tags", default="")
    ap.add_argument("--keys", default="")
    ap.add_argument("--body", default="")
    ap.add_argument("--body-size", type=int, default=0)
    ap.add_argument("--delay", type=int, default=0)
    ap.add_argument("--order-key", type=int, default=None)
    ap.add_argument("--send-timeout", type=int, default=5000)
    ap.add_argument("--send-attempts", type=int, default=ROUTE_ATTEMPTS,
                    help='times a send failed with "No route info" is made (1: once, as '
                         "a test that counts the broker's answers needs)")
    ap.add_argument("--expr", default="*")
    ap.add_argument("--broadcast", action="store_true")
    ap.add_argument("--orderly", action="store_true")
    ap.add_argument("--fail", type=int, default=0, help="fail while reconsumeTimes < FAIL")
    ap.add_argument("--expect", type=int, default=0)
    ap.add_argument("--linger", type=float, default=1.0)
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--instance", default="")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--max-num", type=int, default=32)
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--props", default="", help="comma-separated property names to print")
    ap.add_argument("--full-body", action="store_true")
    ap.add_argument("--clean-shutdown", action="store_true")
    ap.add_argument("--access-key", default="")
    ap.add_argument("--secret-key", default="")
    a = ap.parse_args()
    {"produce": produce, "consume": consume, "pull": pull}[a.command](a)


if __name__ == "__main__":
    main()
