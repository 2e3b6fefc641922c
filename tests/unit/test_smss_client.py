"""Unit tests of the blocking SmssClient against a scripted in-process fake server."""

import socket
import threading

import pytest

from protocols.smss import client_codec as cc
from protocols.smss import codec
from protocols.smss.client import SmssClient, SmssError
from protocols.smss.messages import (
    AliveResponse,
    Batch,
    ErrResponse,
    PushedMessage,
    SubEnd,
)

HELLO = bytes.fromhex("05 00 00 00 00 00 00 00 68 65 6c 6c 6f")


class FakeServer:
    """Accepts one connection and plays a script of (expected request, reply) steps.

    Each step reads exactly len(expected) bytes, records whether they matched, and
    then sends the reply.  ``mismatches`` lists every step that did not match.
    """

    def __init__(self, script):
        self.script = script
        self.mismatches = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        conn, _ = self.listener.accept()
        with conn:
            conn.settimeout(5)
            for expected, reply in self.script:
                got = b""
                while len(got) < len(expected):
                    chunk = conn.recv(len(expected) - len(got))
                    if not chunk:
                        break
                    got += chunk
                if got != expected:
                    self.mismatches.append((expected, got))
                    return
                # Send replies in two pieces to exercise incremental decoding.
                conn.sendall(reply[:3])
                conn.sendall(reply[3:])
            conn.recv(1)  # wait for the client to close

    def finish(self):
        """Join the server thread and fail on any script mismatch."""
        self.thread.join(5)
        self.listener.close()
        assert self.mismatches == []


def run_client(script, body):
    """Run ``body(client)`` against a FakeServer playing ``script``."""
    server = FakeServer(script)
    with SmssClient("127.0.0.1", server.port, timeout=5) as client:
        body(client)
    server.finish()


def test_publish_create_delete_send_spec_bytes():
    """create/publish/delete send the spec's request bytes and accept OK."""
    script = [
        (cc.encode_create("order"), codec.ok()),
        (cc.encode_pub("order", HELLO), codec.ok()),
        (
            cc.encode_pub("order", codec.encode_message({"k": "v"}, b"hi"), trace="t"),
            codec.ok(),
        ),
        (cc.encode_delay("order", 5000, HELLO), codec.ok()),
        (cc.encode_delete("order"), codec.ok()),
    ]

    def body(client):
        client.create("order")
        client.publish("order", [b"hello"])
        client.publish(b"order", [([("k", "v")], b"hi")], trace="t")
        client.delay("order", 5000, ["hello"])
        client.delete("order")

    run_client(script, body)


def test_server_error_raises_and_connection_stays_usable():
    """An ERR reply raises SmssError with its text; the next request still works."""
    script = [
        (cc.encode_pub("nope", HELLO), codec.err("topic not exist")),
        (cc.encode_alive(), codec.alive()),
    ]

    def body(client):
        with pytest.raises(SmssError) as info:
            client.publish("nope", [b"hello"])
        assert info.value.text == "topic not exist"
        client.alive()

    run_client(script, body)


def test_json_commands_decode_bodies():
    """topic_info returns a dict; list and valid_list return [] for an empty body."""
    info = b'{"name":"order","state":0}'
    script = [
        (cc.encode_topic_info("order"), codec.ok_json(info)),
        (cc.encode_list(), codec.ok_json(b"")),
        (cc.encode_valid_list(7), codec.ok_json(b'[{"name":"a"}]')),
    ]

    def body(client):
        assert client.topic_info("order") == {"name": "order", "state": 0}
        assert client.list() == []
        assert client.valid_list(7) == [{"name": "a"}]

    run_client(script, body)


def test_raw_send_and_read_response_return_errors_as_events():
    """send_raw/read_response let bad-input tests see ERR frames without raising."""
    bad = cc.encode_request(4, "order")
    script = [(bad, codec.err("don't support action"))]

    def body(client):
        client.send_raw(bad)
        assert client.read_response("simple") == ErrResponse("don't support action")

    run_client(script, body)


def test_subscription_flow():
    """subscribe sends SUB, yields batches and ALIVE, acks, and ends on SUBEND."""
    batch = codec.encode_batch([(1, 3, 0, 59, HELLO)])
    script = [
        (cc.encode_sub("order", 0, 10, 1_000_000_000, "g1"), batch),
        (cc.encode_ack(0), codec.alive() + codec.subend()),
        (cc.encode_alive(), codec.alive()),
    ]

    def body(client):
        sub = client.subscribe("order", batch=10, ack_timeout_ms=1000, who="g1")
        assert sub.next_batch() == Batch([PushedMessage(1, 3, 0, 59, [], b"hello")])
        with pytest.raises(RuntimeError):
            sub.next_batch()  # the batch must be acked first
        sub.ack()
        assert sub.next_batch() == AliveResponse()
        assert sub.next_batch() == SubEnd()
        assert not sub.active
        client.alive()

    run_client(script, body)


def test_refused_subscription_raises_on_first_batch():
    """A SUB refused with ERR raises SmssError from next_batch and frees the client."""
    script = [
        (cc.encode_sub("gone"), codec.err("topic not exist")),
        (cc.encode_alive(), codec.alive()),
    ]

    def body(client):
        sub = client.subscribe("gone")
        with pytest.raises(SmssError):
            sub.next_batch()
        client.alive()

    run_client(script, body)


def test_ack_end_and_timeout():
    """next_batch raises TimeoutError when idle; ack_end sends 01 00 and ends the sub."""
    batch = codec.encode_batch([(1, 3, 0, 59, HELLO)])
    script = [
        (cc.encode_sub("order"), batch),
        (cc.encode_ack(1), b""),
    ]

    def body(client):
        sub = client.subscribe("order")
        assert isinstance(sub.next_batch(), Batch)
        sub.ack_end()
        assert not sub.active
        with pytest.raises(RuntimeError):
            sub.ack()

    run_client(script, body)

    script = [(cc.encode_sub("order"), b"")]

    def idle(client):
        sub = client.subscribe("order")
        with pytest.raises(TimeoutError):
            sub.next_batch(timeout=0.2)
        assert sub.active

    run_client(script, idle)


def test_follow_master_sends_a_refused_write_to_the_master_it_names():
    """A follower's "just master can ... (master: HOST:PORT)" names where the write goes:
    with follow_master the client sends it there and stays connected there."""
    master = FakeServer([(cc.encode_pub("t", HELLO), codec.ok()),
                         (cc.encode_create("u"), codec.ok())])
    hint = f"just master can pub message (master: 127.0.0.1:{master.port})"
    follower = FakeServer([(cc.encode_pub("t", HELLO), codec.err(hint))])
    with SmssClient("127.0.0.1", follower.port, timeout=5, follow_master=True) as client:
        client.publish("t", [b"hello"])
        client.create("u")
        assert client.address == ("127.0.0.1", master.port)
    follower.finish()
    master.finish()


def test_without_follow_master_the_refusal_names_the_master():
    hint = "just master can manage topic (master: 10.0.0.2:12301)"
    script = [(cc.encode_create("u"), codec.err(hint)), (cc.encode_create("u"), codec.err("x"))]

    def body(client):
        with pytest.raises(SmssError) as e:
            client.create("u")
        assert e.value.text == hint and e.value.master == ("10.0.0.2", 12301)
        with pytest.raises(SmssError) as e:
            client.create("u")
        assert e.value.master is None

    run_client(script, body)
