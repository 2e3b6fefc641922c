"""The channel consumption model (mqserver/broker/channels.py) on a real store with a
fake clock: delivery, flow control, FIN/REQ/TOUCH, timeouts, durable positions."""

from twisted.internet.task import Clock

from mqserver.broker.broker import Broker
from mqserver.store.store import Message, MessageStore


class Consumer:
    """A consumer as the channel sees one."""

    def __init__(self, rdy=10, msg_timeout=5.0):
        self.rdy = rdy
        self.in_flight = 0
        self.msg_timeout = msg_timeout
        self.sample_rate = 0
        self.can_receive = True
        self.defer_room = 0
        self.got = []
        self.closed = False

    def deliver(self, items):
        for ts, attempts, eid, buf, b0, b1 in items:
            self.got.append((eid, attempts, bytes(buf[b0:b1])))

    def channel_closed(self):
        self.closed = True

    def take(self):
        out, self.got = self.got, []
        return out


def open_broker(path, clock):
    store = MessageStore(str(path), clock, clock=clock.seconds, segment_size=1 << 16,
                         cq_entries_per_file=50)
    broker = Broker(store, clock)
    store.open()
    broker.start()
    return store, broker


def publish(broker, topic, bodies):
    if broker.topic(topic) is None:
        broker.create_topic(topic)
    broker.publish(topic, [Message(b) for b in bodies])


def test_backlog_for_first_channel_then_fanout_and_fin(tmp_path):
    clock = Clock()
    store, broker = open_broker(tmp_path, clock)
    publish(broker, "t", [b"a", b"b"])
    first = broker.channels.create_channel("t", "first")
    c1 = Consumer(rdy=1)
    first.add_consumer(c1)
    clock.advance(0)
    (m,) = c1.take()  # RDY 1: one at a time
    assert (m[1], m[2]) == (1, b"a")
    later = broker.channels.create_channel("t", "later")
    c2 = Consumer()
    later.add_consumer(c2)
    publish(broker, "t", [b"c"])
    assert first.finish(m[0], c1) is None
    assert first.finish(m[0], c1) == "ID not in flight"
    assert first.finish(m[0] + 1, c2) == "ID not in flight"
    clock.advance(0)
    assert [x[2] for x in c1.take()] == [b"b"]
    assert [x[2] for x in c2.take()] == [b"c"]  # a later channel: from now on
    store.close()


def test_req_timeout_touch_and_attempts(tmp_path):
    clock = Clock()
    store, broker = open_broker(tmp_path, clock)
    publish(broker, "t", [b"x", b"y"])
    ch = broker.channels.create_channel("t", "c")
    c = Consumer(rdy=2, msg_timeout=1.0)
    ch.add_consumer(c)
    clock.advance(0)
    x, y = c.take()
    assert ch.requeue(x[0], c, 0) is None
    clock.advance(0)
    (x2,) = c.take()
    assert (x2[0], x2[1]) == (x[0], 2)
    clock.advance(0.6)
    assert ch.touch(y[0], c, 900) is None
    clock.pump([0.05] * 10)  # x2 times out at 1.0 + its start; y was touched
    (x3,) = c.take()
    assert (x3[0], x3[1]) == (x[0], 3) and ch.timeout_count == 1
    assert ch.finish(y[0], c) is None  # still ours thanks to TOUCH
    assert ch.requeue(x3[0], c, 500) is None
    clock.pump([0.05] * 5)
    assert c.take() == [] and len(ch.deferred) == 1
    clock.pump([0.05] * 6)
    assert [(e, a) for e, a, _ in c.take()] == [(x[0], 4)]
    store.close()


def test_positions_survive_restart(tmp_path):
    clock = Clock()
    store, broker = open_broker(tmp_path, clock)
    publish(broker, "t", [b"%d" % i for i in range(6)])
    ch = broker.channels.create_channel("t", "c")
    broker.channels.set_channel_paused(broker.channels.create_channel("t", "p"), True)
    c = Consumer(rdy=4)
    ch.add_consumer(c)
    clock.advance(0)
    got = c.take()
    for eid, _, body in got:
        if body != b"1":
            ch.finish(eid, c)
    tmp = broker.channels.create_channel("t", "tmp#ephemeral")
    assert tmp.ephemeral
    store.close()

    clock = Clock()
    store, broker = open_broker(tmp_path, clock)
    assert sorted(broker.channels.of("t")) == ["c", "p"]  # ephemeral channels are not kept
    assert broker.channels.get("t", "p").paused
    ch = broker.channels.get("t", "c")
    c = Consumer(rdy=10)
    ch.add_consumer(c)
    clock.advance(0)
    assert [b for _, _, b in c.take()] == [b"1", b"4", b"5"]
    store.close()


def test_ephemeral_channel_goes_with_last_consumer(tmp_path):
    clock = Clock()
    store, broker = open_broker(tmp_path, clock)
    publish(broker, "t", [b"a"])
    ch = broker.channels.create_channel("t", "e#ephemeral")
    c = Consumer()
    ch.add_consumer(c)
    ch.remove_consumer(c)
    assert broker.channels.get("t", "e#ephemeral") is None
    store.close()


def test_multi_queue_topic_is_read_merged_by_event_id(tmp_path):
    clock = Clock()
    store, broker = open_broker(tmp_path, clock)
    broker.create_topic("rmq", queues=3)
    for i in range(6):
        broker.publish("rmq", [Message(b"%d" % i)], queue_id=i % 3)
    ch = broker.channels.create_channel("rmq", "c")
    c = Consumer(rdy=10)
    ch.add_consumer(c)
    clock.advance(0)
    got = c.take()
    assert [b for _, _, b in got] == [b"%d" % i for i in range(6)]
    for eid, _, _ in got:
        assert ch.finish(eid, c) is None
    assert ch.snapshot()["floor"] == {"0": 2, "1": 2, "2": 2}
    store.close()


def test_ephemeral_topics_do_not_survive_a_restart(tmp_path):
    clock = Clock()
    store, broker = open_broker(tmp_path, clock)
    publish(broker, "gone#ephemeral", [b"a"])
    broker.channels.note_ephemeral_topic("gone#ephemeral")  # as NSQ does when it creates one
    publish(broker, "smss#ephemeral", [b"b"])  # another protocol's topic with that suffix
    publish(broker, "kept", [b"b"])
    store.close()
    store, broker = open_broker(tmp_path, clock)
    assert broker.topic("gone#ephemeral") is None and broker.topic("kept") is not None
    assert broker.topic("smss#ephemeral") is not None
    store.close()


def test_failed_fin_leaves_timeouts_in_order(tmp_path):
    """A FIN for another consumer's message fails and leaves that message where it was:
    timeouts still come in deadline order (the in-flight table is scanned in order)."""
    clock = Clock()
    store, broker = open_broker(tmp_path, clock)
    publish(broker, "t", [b"a", b"b", b"c"])
    ch = broker.channels.create_channel("t", "c")
    mine, other = Consumer(rdy=1), Consumer(rdy=2)
    ch.add_consumer(mine)
    clock.advance(0)
    (a,) = mine.take()
    clock.advance(1)  # b and c go out a second later, so they time out a second later
    ch.add_consumer(other)
    clock.advance(0)
    b, c = other.take()
    assert ch.finish_many([a[0], b[0]], mine) == 1  # a finished; b is not mine
    assert ch.finish(b[0], mine) == "client does not own message"
    assert list(ch.in_flight) == [b[0], c[0]]
    # b and c time out together and come back in their order
    mine.rdy = 0
    clock.advance(5.1)
    clock.advance(0)
    assert [(eid, attempts) for eid, attempts, _ in other.take()] == [(b[0], 2), (c[0], 2)]


def test_stop_leaves_no_channel_timer_and_later_fail_backs_arm_none(tmp_path):
    from twisted.internet.testing import MemoryReactorClock

    clock = MemoryReactorClock()
    store, broker = open_broker(tmp_path, clock)
    publish(broker, "t", [b"a", b"b", b"c"])
    ch = broker.channels.create_channel("t", "c")
    c = Consumer(rdy=3)
    ch.add_consumer(c)
    clock.advance(0)
    a, b, third = c.take()
    assert ch.requeue(a[0], c, 0) is None  # a fail-back: its pump is armed
    assert clock.getDelayedCalls()
    broker.stop()
    assert clock.getDelayedCalls() == [], "stop cancels the channel's pump and the scan"
    # a connection closing after the services stopped fails back what it held
    assert ch.requeue(b[0], c, 0) is None
    assert ch.requeue(third[0], c, 500) is None  # a delayed one: no scan timer either
    ch.schedule_pump()
    broker.channels.data_available("t", 0)
    assert clock.getDelayedCalls() == []
    ch.pump()
    assert c.take() == [], "a pump after stop delivers nothing"
    store.close()


def test_a_direct_pump_takes_over_the_armed_one(tmp_path):
    from twisted.internet.testing import MemoryReactorClock

    clock = MemoryReactorClock()
    store, broker = open_broker(tmp_path, clock)
    publish(broker, "t", [b"a"])
    ch = broker.channels.create_channel("t", "c")
    c = Consumer()
    ch.add_consumer(c)  # arms a pump
    ch.pump()  # as a FETCH does
    assert [m[2] for m in c.take()] == [b"a"]
    pumps = [d for d in clock.getDelayedCalls() if d.func == ch.pump]
    assert pumps == [], "no pump left armed where stop cannot reach it"
    broker.stop()
    store.close()


class _CountingDone(dict):
    """A channel's done map that counts the lookups of a queue's set from Python."""

    lookups = 0

    def __getitem__(self, qid):
        _CountingDone.lookups += 1
        return super().__getitem__(qid)


def test_out_of_order_fins_do_not_slow_later_deliveries(tmp_path):
    """FINs out of order leave offsets in done above the floor; those were read already,
    so later reads are not checked against done one message at a time (the bench_reader
    profile: that check was most of the channel's time per message). Offsets finished
    before a restart still are (test_positions_survive_restart)."""
    clock = Clock()
    store, broker = open_broker(tmp_path, clock)
    publish(broker, "t", [b"%d" % i for i in range(40)])
    ch = broker.channels.create_channel("t", "c")
    c = Consumer(rdy=10)
    ch.add_consumer(c)
    clock.advance(0)
    first = c.take()
    for eid, _, _ in first[1:]:  # all but the first: done holds 9 offsets above the floor
        assert ch.finish(eid, c) is None
    assert len(ch.done[0]) == 9
    ch.done = _CountingDone(ch.done)
    _CountingDone.lookups = 0
    clock.advance(0)
    assert [b for _, _, b in c.take()] == [b"%d" % i for i in range(10, 19)]
    assert _CountingDone.lookups == 0
    assert ch.finish(first[0][0], c) is None  # the floor catches up over the done ones
    assert ch.floor[0] == 10 and not ch.done[0]
    store.close()
