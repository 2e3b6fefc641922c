"""msgout queues in the core (mqserver/broker/queues.py) on a real store with a fake
clock: attributes in the log, fetch/ack by receipt, fail-back, ordering, topic mode."""

import pytest
from twisted.internet.task import Clock

from mqserver.broker.queues import UnknownReceipt
from mqserver.errors import InvalidRequest
from mqserver.store.store import Message
from tests.support.inprocess import failure_of, result_of
from tests.unit.test_channels import open_broker


def declare(broker, name, **attrs):
    """The declared queue's attributes."""
    return result_of(broker.queues.declare(name, attrs))


def refused(broker, name, **attrs):
    """Check the declaration is refused as an invalid request."""
    failure_of(broker.queues.declare(name, attrs), InvalidRequest)


def pub(broker, name, *bodies):
    broker.publish(name, [Message(b) for b in bodies])


def test_attributes_are_stored_and_survive_restart(tmp_path):
    clock = Clock()
    store, broker = open_broker(tmp_path, clock)
    a = declare(broker, "q", mode="topic", ordered=True, ack_timeout_ms=500)
    assert a == {"mode": "topic", "ack": True, "ordered": True, "persistent": False,
                 "ack_timeout_ms": 500}
    refused(broker, "q", mode="queue")
    broker.create_topic("other")  # made by another protocol: its mode can be set once
    assert declare(broker, "other", mode="topic")["mode"] == "topic"
    refused(broker, "other", mode="queue")
    refused(broker, "q", bogus=1)
    refused(broker, "q", ack_timeout_ms="5")
    store.close()
    store, broker = open_broker(tmp_path, clock)
    assert broker.queues.attrs("q")["ordered"] is True
    assert broker.queues.attrs("q")["ack_timeout_ms"] == 500
    store.close()


def test_fetch_ack_nack_and_timeout(tmp_path):
    clock = Clock()
    store, broker = open_broker(tmp_path, clock)
    declare(broker, "q", ack_timeout_ms=1000)
    pub(broker, "q", b"a", b"b", b"c")
    svc = broker.queues
    got = svc.take("q", 2)
    assert [d.body for d in got] == [b"a", b"b"]
    assert svc.ack([got[0].receipt]) == {}
    assert got[0].receipt in svc.ack([got[0].receipt])  # twice: no longer in flight
    assert svc.nack([got[1].receipt]) == {}
    again = svc.take("q", 5)
    assert [(d.body, d.attempts) for d in again] == [(b"b", 2), (b"c", 1)]
    assert svc.ack([got[1].receipt])  # the first attempt's receipt is stale
    clock.advance(1.1)  # ack timeout: both come back
    third = svc.take("q", 5)
    assert sorted((d.body, d.attempts) for d in third) == [(b"b", 3), (b"c", 2)]
    assert svc.ack([d.receipt for d in third]) == {}
    assert svc.take("q", 5) == []
    with pytest.raises(UnknownReceipt):
        svc._entry("garbage")
    store.close()


def test_closing_a_session_fails_back_at_once(tmp_path):
    clock = Clock()
    store, broker = open_broker(tmp_path, clock)
    declare(broker, "q")
    pub(broker, "q", b"a", b"b")
    got = []
    c = broker.queues.consumer("q", lambda c, ds: got.extend(ds), 10)
    clock.advance(0)
    assert [d.body for d in got] == [b"a", b"b"]
    assert broker.queues.take("q", 5) == []
    c.close()
    back = broker.queues.take("q", 5)
    assert [(d.body, d.attempts) for d in back] == [(b"a", 2), (b"b", 2)]
    store.close()


def test_ordered_queue_never_has_two_in_flight(tmp_path):
    clock = Clock()
    store, broker = open_broker(tmp_path, clock)
    declare(broker, "q", ordered=True)
    pub(broker, "q", b"1", b"2", b"3")
    seen = [[], []]
    cs = [broker.queues.consumer("q", lambda c, ds, i=i: seen[i].extend(ds), 10)
          for i in range(2)]
    order = []
    for _ in range(4):
        clock.advance(0)
        ch = cs[0].channel
        assert len(ch.in_flight) <= 1
        held = [d for s in seen for d in s if d.id in ch.in_flight]
        if not held:
            break
        d = max(held, key=lambda d: d.attempts)  # this attempt's delivery
        order.append(d.body)
        if d.body == b"2" and d.attempts == 1:
            broker.queues.nack([d.receipt])  # comes back before 3
        else:
            broker.queues.ack([d.receipt])
    assert order == [b"1", b"2", b"2", b"3"]
    store.close()


def test_topic_mode_sub_ids_each_get_everything(tmp_path):
    clock = Clock()
    store, broker = open_broker(tmp_path, clock)
    declare(broker, "t", mode="topic")
    pub(broker, "t", b"old")
    svc = broker.queues
    with pytest.raises(InvalidRequest):
        svc.take("t", 5)
    svc.channel_for("t", "late", "latest")
    pub(broker, "t", b"x", b"y")
    a = [d.body for d in svc.take("t", 10, "a")]
    b = [d.body for d in svc.take("t", 10, "b")]
    late = [d.body for d in svc.take("t", 10, "late")]
    assert a == b == [b"old", b"x", b"y"]
    assert late == [b"x", b"y"]
    ds, _ = svc.read_from("t", "earliest", 10)
    assert [d.body for d in ds] == [b"old", b"x", b"y"]
    ds2, _ = svc.read_from("t", ds[1].id, 10)
    assert [d.body for d in ds2] == [b"x", b"y"]
    store.close()


def test_no_ack_queue_finishes_on_delivery(tmp_path):
    clock = Clock()
    store, broker = open_broker(tmp_path, clock)
    declare(broker, "q", ack=False)
    pub(broker, "q", b"a")
    got = broker.queues.take("q", 5)
    assert [(d.body, d.receipt) for d in got] == [(b"a", None)]
    assert not broker.channels.get("q", "msgout:queue").in_flight
    clock.advance(100)
    assert broker.queues.take("q", 5) == []
    store.close()


def test_headers_and_redelivered_headers(tmp_path):
    clock = Clock()
    store, broker = open_broker(tmp_path, clock)
    declare(broker, "q")
    from mqserver.store import format as fmt
    broker.publish("q", [Message(b"a", properties=fmt.encode_properties([("k", "v")]))])
    (d,) = broker.queues.take("q", 1)
    assert d.headers() == {"k": "v"}
    broker.queues.nack([d.receipt])
    (d2,) = broker.queues.take("q", 1)
    assert d2.attempts == 2 and d2.headers() == {"k": "v"}
    store.close()


def test_push_subscriptions_survive_restart(tmp_path):
    clock = Clock()
    store, broker = open_broker(tmp_path, clock)
    declare(broker, "t", mode="topic")
    broker.queues.subscribe("t", "s1", "http://127.0.0.1:1/x", 50)
    store.checkpoint() if hasattr(store, "checkpoint") else None
    store.close()
    store, broker = open_broker(tmp_path, clock)
    (s,) = broker.queues.subscriptions.values()
    assert (s.queue, s.sub_id, s.url, s.batch) == ("t", "s1", "http://127.0.0.1:1/x", 50)
    ch = broker.channels.get("t", "msgout:sub:s1")
    assert ch is not None
    broker.queues.subscribe("t", "s1", "http://127.0.0.1:2/y", 5)  # replaced: same position
    assert broker.channels.get("t", "msgout:sub:s1") is ch
    assert broker.queues.subscriptions[("t", "s1")].url == "http://127.0.0.1:2/y"
    assert broker.queues.unsubscribe("t", "s1")
    assert broker.channels.get("t", "msgout:sub:s1") is None
    store.close()


def test_fetch_long_polls_until_a_message_or_the_wait_ends(tmp_path):
    clock = Clock()
    store, broker = open_broker(tmp_path, clock)
    declare(broker, "q")
    out = []
    broker.queues.fetch("q", 5, 2.0).addCallback(out.append)
    clock.advance(0.5)
    assert out == []
    pub(broker, "q", b"a")
    clock.advance(0)
    assert [d.body for d in out[0]] == [b"a"]
    out2 = []
    broker.queues.fetch("q", 5, 1.0).addCallback(out2.append)
    clock.advance(1.0)
    assert out2 == [[]]
    # a cancelled wait leaves nothing attached
    d = broker.queues.fetch("q", 5, 1.0)
    d.addErrback(lambda f: None)
    d.cancel()
    pub(broker, "q", b"b")
    clock.advance(0)
    assert [x.body for x in broker.queues.take("q", 5)] == [b"b"]
    store.close()


def test_ack_of_a_batch_with_a_repeated_and_a_foreign_receipt(tmp_path):
    clock = Clock()
    store, broker = open_broker(tmp_path, clock)
    declare(broker, "q")
    declare(broker, "r")
    pub(broker, "q", b"a", b"b", b"c")
    pub(broker, "r", b"z")
    qs = broker.queues.take("q", 3)
    (z,) = broker.queues.take("r", 1)
    rs = [qs[0].receipt, qs[1].receipt, qs[1].receipt, z.receipt, qs[2].receipt]
    errors = broker.queues.ack(rs)
    assert list(errors) == [qs[1].receipt]
    assert broker.queues.take("q", 5) == [] and broker.queues.take("r", 5) == []
    clock.advance(60)  # nothing comes back: all were finished
    assert broker.queues.take("q", 5) == [] and broker.queues.take("r", 5) == []
    store.close()


def test_persistent_queue_answers_after_fsync(tmp_path):
    from mqserver.broker.broker import Broker
    from mqserver.store.store import MessageStore
    from tests.unit.test_store import ManualRunner

    clock, runner = Clock(), ManualRunner()
    store = MessageStore(str(tmp_path), clock, clock=clock.seconds, runner=runner)
    broker = Broker(store, clock)
    store.open()
    broker.start()
    runner.finish_all()
    declare(broker, "p", persistent=True)
    declare(broker, "f")
    got_p, got_f = [], []
    broker.queues.publish("p", [Message(b"x")]).addCallback(got_p.append)
    broker.queues.publish("f", [Message(b"y")]).addCallback(got_f.append)
    assert got_f and not got_p  # the persistent one waits for the fsync
    runner.finish_all()
    assert len(got_p) == 1
    store.close()
