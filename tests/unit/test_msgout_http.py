"""The msgout HTTP site (protocols/msgout/http.py): real twisted.web requests over
StringTransport on a real store with a fake clock."""

import json

from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from protocols.msgout.api import MsgoutApi
from mqserver.webrequest import Request, _Discard, request_target
from protocols.msgout.http import MsgoutSite
from tests.unit.test_msgout_queues import declare, open_broker, pub


def site(tmp_path, **kw):
    clock = Clock()
    store, broker = open_broker(tmp_path, clock)
    return clock, store, broker, MsgoutSite(MsgoutApi(broker, clock, **kw))


def connect(s):
    t = StringTransport()
    ch = s.buildProtocol(None)
    ch.makeConnection(t)
    return t, ch


def response(raw):
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1])
    return status, json.loads(body) if body else None


def request(ch, t, clock, method, path, body=b""):
    ch.dataReceived(b"%s %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                    % (method, path, len(body), body))
    clock.advance(0)
    out = t.value()
    t.clear()
    return response(out)


def test_routes_publish_fetch_ack(tmp_path):
    clock, store, broker, s = site(tmp_path)
    t, ch = connect(s)
    assert request(ch, t, clock, b"PUT", b"/v1/queues/q", b'{"ack_timeout_ms": 1000}')[0] == 200
    status, out = request(ch, t, clock, b"POST", b"/v1/queues/q/messages",
                          b'{"messages": [{"body": "hi", "headers": {"k": "v"}}, '
                          b'{"body_b64": "/w=="}]}')
    assert status == 200 and len(out["ids"]) == 2
    status, out = request(ch, t, clock, b"POST", b"/v1/queues/q/fetch", b'{"max": 5}')
    ms = out["messages"]
    assert [(m["body"] if "body" in m else m["body_b64"], m["headers"]) for m in ms] == [
        ("hi", {"k": "v"}), ("/w==", {})]
    status, out = request(ch, t, clock, b"POST", b"/v1/ack",
                          json.dumps({"receipts": [m["receipt"] for m in ms]}).encode())
    assert out == {"acked": 2, "errors": {}}
    store.close()


def test_refused_from_the_head_without_buffering(tmp_path):
    clock, store, broker, s = site(tmp_path, max_body=1024)
    declare(broker, "q")
    t, ch = connect(s)
    ch.dataReceived(b"POST /v1/queues/q/messages HTTP/1.1\r\nHost: x\r\n"
                    b"Content-Length: 5000\r\n\r\n")
    assert t.value().startswith(b"HTTP/1.1 413 ")
    assert t.disconnecting
    req = ch.requests[-1] if hasattr(ch, "requests") and ch.requests else None
    ch.dataReceived(b"x" * 5000)  # whatever still comes is dropped, not kept
    if req is not None:
        assert isinstance(req.content, _Discard)
    t2, ch2 = connect(s)
    ch2.dataReceived(b"POST /v1/queues/none/fetch HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: 10\r\n\r\n")
    assert t2.value().startswith(b"HTTP/1.1 404 ") and b"no queue none" in t2.value()
    store.close()


def test_request_target_falls_back_when_the_channel_hides_it():
    class Bare:
        pass

    r = Request.__new__(Request)
    r.channel = Bare()
    assert request_target(r) == (None, None)


def test_long_poll_answers_on_arrival_and_fails_back_when_the_client_left(tmp_path):
    clock, store, broker, s = site(tmp_path)
    declare(broker, "q")
    t, ch = connect(s)
    body = b'{"max": 5, "wait_ms": 5000}'
    ch.dataReceived(b"POST /v1/queues/q/fetch HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                    % (len(body), body))
    clock.advance(1)
    assert t.value() == b""
    pub(broker, "q", b"late")
    clock.advance(0)
    status, out = response(t.value())
    assert status == 200 and [m["body"] for m in out["messages"]] == ["late"]
    # a client that leaves while waiting leaves nothing attached
    t2, ch2 = connect(s)
    ch2.dataReceived(b"POST /v1/queues/q/fetch HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body))
    ch2.connectionLost(Failure(ConnectionDone()))
    pub(broker, "q", b"next")
    clock.advance(0)
    assert [d.body for d in broker.queues.take("q", 5)] == [b"next"]
    store.close()


def test_from_id_read_long_polls_and_gives_next_id(tmp_path):
    clock, store, broker, s = site(tmp_path)
    declare(broker, "t", mode="topic")
    t, ch = connect(s)
    body = b'{"from_id": 0, "max": 5, "wait_ms": 3000}'
    ch.dataReceived(b"POST /v1/queues/t/fetch HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                    % (len(body), body))
    clock.advance(1)
    assert t.value() == b""
    pub(broker, "t", b"a", b"b")
    clock.advance(0)
    status, out = response(t.value())
    assert [m["body"] for m in out["messages"]] == ["a", "b"]
    assert out["next_id"] == out["messages"][-1]["id"] + 1
    assert not broker._watchers.get("t")  # the wait left nothing behind
    store.close()


def test_delivery_json_is_the_documented_object():
    from mqserver.broker.queue_consumer import Delivery
    from mqserver.store import format as fmt
    from protocols.msgout.api import Messages

    ds = [Delivery("q", 7, "1.7.2", 2, 'say "hi"\n\\ é \x01 \u2028'.encode(), b"", 5),
          Delivery("q", 8, None, 1, b"\xff\x00", fmt.encode_properties([("k", "v\"")]), 6)]
    out = json.loads(Messages(ds, next_id=9).json())
    assert out == {"next_id": 9, "messages": [
        {"id": 7, "receipt": "1.7.2", "attempts": 2, "ts": 5,
         "body": 'say "hi"\n\\ é \x01 \u2028', "headers": {}},
        {"id": 8, "receipt": None, "attempts": 1, "ts": 6, "body_b64": "/wA=",
         "headers": {"k": 'v"'}}]}


def test_a_refused_expect_100_continue_gets_no_continue(tmp_path):
    clock, store, broker, s = site(tmp_path, max_body=1024)
    declare(broker, "q")
    t, ch = connect(s)
    ch.dataReceived(b"POST /v1/queues/q/messages HTTP/1.1\r\nHost: x\r\n"
                    b"Expect: 100-continue\r\nContent-Length: 5000\r\n\r\n")
    assert t.value().startswith(b"HTTP/1.1 413 ") and b"100 Continue" not in t.value()
    store.close()
