"""Arrivals left in the store for a consumer's flush (Channel.arrived, Subscriber.defer_room):
while an NSQ consumer's output buffer waits for its flush timer, new messages are not
handed over one pump at a time but all at once when it flushes; an arrival that would
fill its ready window or its buffer goes out at once, as before. What the client receives,
and when, is what nsqd's buffered writer gives. In process (StringTransport, a Clock, a
real store)."""

import json
import struct

from twisted.internet.task import Clock

from protocols.nsq.factory import make_factory
from tests.support.inprocess import door_fixtures
from tests.unit.test_channels import Consumer, open_broker, publish
from tests.unit.test_nsqd_protocol import OK, connect, consumer, messages, pub

node, held = door_fixtures(make_factory)


def channel(node):
    return node.broker.channels.channels["t"]["ch"]


def publish_one(node, producer, body):
    producer.send(pub(b"t", body))
    assert producer.take() == OK
    node.clock.advance(0)  # a turn: the channel's pump, when one is due


def test_arrivals_wait_in_the_store_for_the_flush_and_go_out_together(node):
    c = consumer(node, rdy=10)
    ch = channel(node)
    producer = connect(node)
    publish_one(node, producer, b"1")  # handed over: the buffer waits for its timer
    publish_one(node, producer, b"2")
    publish_one(node, producer, b"3")
    assert len(ch.in_flight) == 1 and ch.left_for_flush  # 2 and 3 still in the store
    assert c.take() == b""
    node.clock.advance(0.25)  # the output buffer timeout
    assert [m.body for m in messages(c.take())] == [b"1", b"2", b"3"]
    assert len(ch.in_flight) == 3 and not ch.left_for_flush


def test_the_arrival_that_fills_the_ready_window_goes_at_once(node):
    c = consumer(node, rdy=3)
    producer = connect(node)
    publish_one(node, producer, b"1")
    publish_one(node, producer, b"2")
    assert c.take() == b""
    publish_one(node, producer, b"3")  # RDY 3 full: flushed at once, no timer
    assert [m.body for m in messages(c.take())] == [b"1", b"2", b"3"]


def test_the_arrival_that_fills_the_buffer_goes_at_once(node):
    c = connect(node)
    body = json.dumps({"output_buffer_size": 216}).encode()
    c.send(b"IDENTIFY\n" + struct.pack(">I", len(body)) + body)
    assert c.take() == OK
    c.send(b"SUB t ch\nRDY 100\n")
    assert c.take() == OK
    node.clock.advance(0)
    producer = connect(node)
    # frames of 54 bytes (8 of frame header, 26 of message header, a body of 20)
    for i in range(3):
        publish_one(node, producer, b"%020d" % i)
    assert c.take() == b"" and channel(node).left_for_flush
    publish_one(node, producer, b"%020d" % 3)  # 4 x 54 = 216, the size: flushed at once
    assert [m.body for m in messages(c.take())] == [b"%020d" % i for i in range(4)]


def test_a_smaller_ready_window_leaves_what_waits_for_a_later_pump(node):
    c = consumer(node, rdy=10)
    producer = connect(node)
    publish_one(node, producer, b"1")
    publish_one(node, producer, b"2")
    c.send(b"RDY 1\n")  # in flight 1 >= RDY 1: flushed at once, 2 stays in the store
    (m,) = messages(c.take())
    assert m.body == b"1"
    c.send(b"FIN " + m.msg_id + b"\n")
    node.clock.advance(0)
    node.clock.advance(0.25)
    assert [x.body for x in messages(c.take())] == [b"2"]


def test_a_larger_ready_window_hands_over_what_waits(node):
    c = consumer(node, rdy=10)
    ch = channel(node)
    producer = connect(node)
    publish_one(node, producer, b"1")
    publish_one(node, producer, b"2")
    c.send(b"RDY 20\n")
    node.clock.advance(0)
    assert len(ch.in_flight) == 2 and not ch.left_for_flush
    node.clock.advance(0.25)
    assert [x.body for x in messages(c.take())] == [b"1", b"2"]


def test_a_connection_lost_with_arrivals_waiting_loses_none_of_them(node):
    c = consumer(node, rdy=10, msg_timeout_ms=1000)
    producer = connect(node)
    publish_one(node, producer, b"1")
    publish_one(node, producer, b"2")
    c.lose()
    node.clock.advance(0)
    other = consumer(node, rdy=10)
    # 2 never left the store; 1 was in flight to the lost consumer: back after its timeout
    assert [x.body for x in messages(other.take())] == [b"2"]
    node.clock.advance(1.1)
    node.clock.advance(0.25)
    assert [x.body for x in messages(other.take())] == [b"1"]


# -- the channel's side, with a consumer as the channel sees one -------------------------


class Buffering(Consumer):
    """A consumer with room for C{room} messages before it would flush."""

    def __init__(self, room, **kw):
        super().__init__(**kw)
        self.defer_room = room
        self.deliveries = 0

    def deliver(self, items):
        self.deliveries += 1
        super().deliver(items)


def channel_with(tmp_path, *consumers):
    """A broker on a Clock whose topic "t" holds b"first", and its channel "ch" with
    C{consumers}, which have been handed b"first"."""
    clock = Clock()
    store, broker = open_broker(tmp_path, clock)
    publish(broker, "t", [b"first"])
    ch = broker.channels.create_channel("t", "ch")
    for c in consumers:
        ch.add_consumer(c)
    clock.advance(0)
    return clock, store, broker, ch


def test_the_channel_leaves_arrivals_within_the_room_then_hands_them_over_in_one_pass(tmp_path):
    c = Buffering(room=0, rdy=100)
    clock, store, broker, ch = channel_with(tmp_path, c)
    assert [x[2] for x in c.take()] == [b"first"]
    c.defer_room = 2
    publish(broker, "t", [b"a"])
    publish(broker, "t", [b"b"])
    clock.advance(0)
    assert c.take() == [] and ch.left_for_flush
    ch.pump_deferred()
    assert [x[2] for x in c.take()] == [b"a", b"b"] and c.deliveries == 2
    c.defer_room = 1
    publish(broker, "t", [b"c", b"d"])  # two waiting, room for one: pumped
    clock.advance(0)
    assert [x[2] for x in c.take()] == [b"c", b"d"]
    store.close()


def test_two_consumers_are_pumped_as_before(tmp_path):
    c1, c2 = Buffering(room=10, rdy=100), Buffering(room=10, rdy=100)
    clock, store, broker, ch = channel_with(tmp_path, c1, c2)
    publish(broker, "t", [b"a"])
    clock.advance(0)
    assert not ch.left_for_flush
    assert sorted(x[2] for x in c1.take() + c2.take()) == [b"a", b"first"]
    store.close()
