"""msgout over HTTP and the console against the real broker process: fetch/ack over
separate connections, long polls, refusals before the body, fail-back on a dropped
console, topic mode with two sub_ids, ordered queues, push to a failing receiver, and
NSQ on the other side."""

import json
import socket
import time

import pytest

from protocols.smss.client import SmssClient
from tests.support.msgout import LOOPBACK, Api, Console, Receiver
from tests.support.nsq import NSQ_DOORS, V2, http
from tests.support.server import ServerProcess
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    listen = {name: LOOPBACK for name in NSQ_DOORS + ("msgout", "console", "smss")}
    s = ServerProcess(tmp_path_factory.mktemp("msgout") / "broker", listen=listen,
                      config={"msgout": {"maxBodySize": 65536}}).start()
    s.http = s.ports["MsgoutSite"]
    s.console = s.ports["ConsoleFactory"]
    s.tmp = tmp_path_factory.mktemp("push")
    try:
        yield s
    finally:
        s.stop()
        s.close()


@pytest.fixture
def api(srv):
    a = Api(srv.http)
    yield a
    a.close()


def test_queue_admin_publish_fetch_and_ack_from_another_connection(srv, api):
    assert api.put_queue("mq1", ack_timeout_ms=60000)["mode"] == "queue"
    ids = api.publish("mq1", "a", "b", "c")
    assert ids == sorted(ids) and len(ids) == 3
    got = api.fetch("mq1", max=2)
    assert [(m["body"], m["id"], m["attempts"]) for m in got] == [
        ("a", ids[0], 1), ("b", ids[1], 1)]
    other = Api(srv.http)
    try:
        assert other.ack([got[0]["receipt"]]) == {"acked": 1, "errors": {}}
        assert other.ok("POST", "/v1/nack", {"receipts": [got[1]["receipt"]]})["nacked"] == 1
    finally:
        other.close()
    again = api.fetch("mq1", max=5)
    assert [(m["body"], m["attempts"]) for m in again] == [("b", 2), ("c", 1)]
    info = api.ok("GET", "/v1/queues/mq1")
    assert (info["messages"], info["in_flight"], info["depth"]) == (3, 2, 0)
    assert "mq1" in [q["name"] for q in api.ok("GET", "/v1/queues")["queues"]]
    assert api.ok("DELETE", "/v1/queues/mq1") == {"deleted": "mq1"}
    assert api.call("GET", "/v1/queues/mq1")[0] == 404


def test_errors_are_json_with_fitting_statuses(srv, api):
    api.put_queue("mq_err")
    assert api.call("POST", "/v1/queues/mq_err/messages", raw=b"{not json") == (
        400, {"error": "the body is not valid JSON"})
    assert api.call("PUT", "/v1/queues/mq_err", {"mode": "sideways"})[0] == 400
    assert api.call("PUT", "/v1/queues/mq_err", {"mode": "topic"})[0] == 400
    assert api.call("GET", "/v2/nothing")[0] == 404
    assert api.call("DELETE", "/v1/ack")[0] == 405
    assert api.call("POST", "/v1/ack", {"receipts": ["9.9.9"]})[1]["acked"] == 0
    assert api.call("POST", "/v1/queues/mq_err/fetch", {"max": 0})[0] == 400


def _raw_head(port, head):
    """Send only a request head; return what the server answers (it must answer and
    close without waiting for the announced body)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        s.sendall(head)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return data
            data += chunk
    finally:
        s.close()


def test_oversize_bodies_and_unknown_queues_are_refused_before_the_body(srv, api):
    api.put_queue("mq_big")
    big = _raw_head(srv.http, b"POST /v1/queues/mq_big/messages HTTP/1.1\r\nHost: x\r\n"
                              b"Content-Length: 100000000\r\n\r\n")
    assert big.startswith(b"HTTP/1.1 413 ") and b'"error"' in big
    unknown = _raw_head(srv.http, b"POST /v1/queues/no_such_q/messages HTTP/1.1\r\nHost: x\r\n"
                                  b"Content-Length: 1000\r\n\r\n")
    assert unknown.startswith(b"HTTP/1.1 404 ") and b"no_such_q" in unknown
    # a chunked body is counted as it comes
    s = socket.create_connection(("127.0.0.1", srv.http), timeout=10)
    s.sendall(b"POST /v1/queues/mq_big/messages HTTP/1.1\r\nHost: x\r\n"
              b"Transfer-Encoding: chunked\r\n\r\n" + (b"8000\r\n" + b"x" * 0x8000 + b"\r\n") * 3)
    assert s.recv(65536).startswith(b"HTTP/1.1 413 ")
    s.close()
    assert api.publish("mq_big", "still fine")  # the server is unharmed


def test_long_poll_wakes_on_publish(srv, api):
    api.put_queue("mq_wait")
    s = socket.create_connection(("127.0.0.1", srv.http), timeout=20)
    body = json.dumps({"max": 5, "wait_ms": 15000}).encode()
    s.sendall(b"POST /v1/queues/mq_wait/fetch HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
              % len(body) + body)
    # the waiting fetch is the queue's one consumer: publish only once it waits, or the
    # fetch would find the message at once and the wake-up would go untested
    wait_until(lambda: api.ok("GET", "/v1/queues/mq_wait")["consumers"] == 1, 10, "the fetch waiting")
    api.publish("mq_wait", "woke")
    data = b""
    while b"woke" not in data:
        chunk = s.recv(65536)
        assert chunk, data
        data += chunk
    s.close()
    assert data.startswith(b"HTTP/1.1 200 ")


def test_console_drop_fails_back_at_once(srv, api):
    api.put_queue("mq_drop", ack_timeout_ms=600000)
    api.publish("mq_drop", "one", "two")
    c = Console(srv.console)
    c.send(b"SUB mq_drop")
    assert c.line() == b"OK subscribed mq_drop"
    got = [c.message(), c.message()]
    assert [m[4] for m in got] == [b"one", b"two"]
    assert api.fetch("mq_drop", max=5) == []
    c.close()  # un-acked: back at once, not after the 10-minute ack timeout
    deadline = time.monotonic() + 10
    back = []
    while len(back) < 2 and time.monotonic() < deadline:
        back += api.fetch("mq_drop", max=5, wait_ms=1000)
    assert sorted((m["body"], m["attempts"]) for m in back) == [("one", 2), ("two", 2)]


def test_console_commands_and_ack_over_http(srv, api):
    api.put_queue("mq_con")
    c = Console(srv.console)
    c.send(b"PUB mq_con hello there")
    assert c.line().startswith(b"OK ")
    c.send(b"FETCH mq_con 5")
    assert c.line() == b"OK 1"
    q, eid, receipt, attempts, body = c.message()
    assert (q, attempts, body) == ("mq_con", 1, b"hello there")
    assert api.ack([receipt])["acked"] == 1
    c.send(b"BOGUS")
    assert c.line().startswith(b"ERR unknown command")
    c.send(b"PEEK mq_con")
    assert c.line() == b"OK 1"
    assert c.message()[4] == b"hello there"
    c.send(b"QUIT")
    assert c.line() == b"OK bye"
    c.close()


def test_topic_mode_two_sub_ids_each_get_every_message(srv, api):
    api.put_queue("mt", mode="topic")
    for sub in ("s1", "s2"):
        assert api.fetch("mt", sub_id=sub) == []  # made before the messages
    api.publish("mt", "x", "y")
    for sub in ("s1", "s2"):
        got = api.fetch("mt", sub_id=sub, max=10)
        assert [m["body"] for m in got] == ["x", "y"]
        api.ack([m["receipt"] for m in got])
    assert api.call("POST", "/v1/queues/mt/fetch", {"max": 1})[0] == 400
    first = api.ok("POST", "/v1/queues/mt/fetch", {"from_id": 0, "max": 1})
    assert first["messages"][0]["body"] == "x" and first["messages"][0]["receipt"] is None
    rest = api.ok("POST", "/v1/queues/mt/fetch", {"from_id": first["next_id"], "max": 5})
    assert [m["body"] for m in rest["messages"]] == ["y"]
    info = api.ok("GET", "/v1/queues/mt")
    assert set(info["subs"]) == {"s1", "s2"}


def test_ordered_queue_never_has_two_in_flight(srv, api):
    api.put_queue("mo", ordered=True)
    api.publish("mo", "1", "2", "3")
    c = Console(srv.console)
    c.send(b"SUB mo")
    assert c.line() == b"OK subscribed mo"
    order = []
    m = c.message()
    while True:
        assert api.ok("GET", "/v1/queues/mo")["in_flight"] == 1
        assert api.fetch("mo", max=10) == []  # nothing while one is in flight
        order.append(m[4])
        if m[4] == b"2" and m[3] == 1:
            c.send(b"NACK " + m[2].encode())
        else:
            c.send(b"ACK " + m[2].encode())
        assert c.line().startswith(b"OK")
        if len(order) == 4:
            break
        m = c.message()
    assert order == [b"1", b"2", b"2", b"3"]
    c.close()


def test_nsq_publish_msgout_consume_and_back(srv, api):
    nsq_http = srv.ports["NsqdHttpSite"]
    assert http(nsq_http, "POST", "/pub?topic=from_nsq", b"over nsq")[0] == 200
    got = api.fetch("from_nsq", max=5)
    assert [m["body"] for m in got] == ["over nsq"]
    api.put_queue("to_nsq")
    api.publish("to_nsq", "over msgout")
    c = V2(srv.ports["NsqdFactory"])
    try:
        c.send(b"SUB to_nsq ch\nRDY 5\n")
        assert c.frame() == (0, b"OK")
        (m,) = c.messages(1)
        assert m.body == b"over msgout"
        c.send(b"FIN " + m.msg_id + b"\n")
    finally:
        c.close()


def test_push_to_a_failing_receiver_gets_everything_in_order(srv, api):
    rec = Receiver(srv.tmp / "push1.jsonl", fail_every=3)
    try:
        api.put_queue("mpush", ordered=True)
        bodies = [f"m{i}" for i in range(12)]
        api.publish("mpush", *bodies[:6])
        sub = api.ok("POST", "/v1/queues/mpush/subscriptions",
                     {"url": rec.url, "sub_id": "p1", "batch": 5})
        assert sub["url"] == rec.url
        api.publish("mpush", *bodies[6:])
        got = rec.wait_bodies(12)
        assert got == bodies  # ordered: each once, in order, despite the failures
        info = api.ok("GET", "/v1/queues/mpush/subscriptions/p1")
        assert info["failures"] >= 1 and "500" in info["last_error"]
        assert info["delivered"] == 12 and info["lag"] == 0
        assert api.ok("DELETE", "/v1/queues/mpush/subscriptions/p1") == {"deleted": "p1"}
        assert api.call("GET", "/v1/queues/mpush/subscriptions/p1")[0] == 404
    finally:
        rec.close()


def test_push_batches_of_a_topic_mode_queue(srv, api):
    rec = Receiver(srv.tmp / "push2.jsonl", fail_every=4)
    try:
        api.put_queue("mpt", mode="topic")
        api.ok("POST", "/v1/queues/mpt/subscriptions",
               {"url": rec.url, "sub_id": "pp", "batch": 10})
        bodies = [f"b{i}" for i in range(40)]
        api.publish("mpt", *bodies)
        got = rec.wait_bodies(40)
        assert sorted(set(got)) == sorted(bodies)  # at least once
        assert max(len(b["batch"]["messages"]) for b in rec.batches()) > 1
    finally:
        rec.close()


def test_smss_publish_msgout_consume_and_back(srv, api):
    with SmssClient("127.0.0.1", srv.smss_port) as smss:
        smss.create("from_smss")
        smss.publish("from_smss", [b"plain", ([(b"k", b"v")], b"with header")])
        got = api.fetch("from_smss", max=5)
        assert [(m["body"], m["headers"]) for m in got] == [
            ("plain", {}), ("with header", {"k": "v"})]
        api.put_queue("to_smss")
        api.ok("POST", "/v1/queues/to_smss/messages",
               {"messages": [{"body": "over msgout", "headers": {"h": "1"}}]})
    with SmssClient("127.0.0.1", srv.smss_port) as smss:
        sub = smss.subscribe("to_smss", 0, batch=10, who="g1")
        (m,) = sub.next_batch(5).messages
        assert (m.body, m.headers) == (b"over msgout", [(b"h", b"1")])


def test_console_is_told_when_its_queue_is_deleted(srv, api):
    api.put_queue("mq_gone")
    c = Console(srv.console)
    c.send(b"SUB mq_gone")
    assert c.line() == b"OK subscribed mq_gone"
    api.ok("DELETE", "/v1/queues/mq_gone")
    assert c.line() == b"ERR queue mq_gone was deleted"
    c.send(b"STATS")
    assert c.line().startswith(b"OK topics=")
    c.close()
