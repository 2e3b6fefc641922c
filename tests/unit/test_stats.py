"""The core statistics (mqserver/broker/stats.py) on a real store with a fake clock:
messages in counted at the store write, consumers, windows, replay from a time or an
eventId for a channel and a cursor consumer."""

from twisted.internet.task import Clock

from mqserver.broker.stats import (CHANNEL, MSGOUT, SMSS, Consumer, payload_bytes,
                                   record_overhead)
from mqserver.store.store import Message
from tests.unit.test_channels import Consumer as ChannelClient
from tests.unit.test_channels import open_broker, publish


def test_in_counted_at_the_store_write_per_queue(tmp_path):
    """Every write counts its messages and record bytes once on its queue."""
    clock = Clock()
    store, broker = open_broker(tmp_path, clock)
    publish(broker, "t", [b"a", b"bb"])
    broker.publish("t", [b"ccc"])
    msgs, nbytes = broker.stats.topic_in("t")
    assert msgs == 3
    assert nbytes == store.commitlog.end - _admin_bytes(store)
    assert payload_bytes("t", msgs, nbytes) == 6
    assert nbytes == 6 + 3 * record_overhead("t")
    store.close()


def _admin_bytes(store):
    # the CREATE record of the topic is in the log too, not counted as a message
    from mqserver.store import format as fmt

    view = store.read_record(0, fmt.I32.unpack(store.commitlog.read(0, 4))[0])
    return view.size


def test_windows_and_totals(tmp_path):
    """Sums over a minute and a day, and the per-second rate, follow the samples."""
    clock = Clock()
    clock.advance(1_000_000)
    store, broker = open_broker(tmp_path, clock)
    stats = broker.stats
    publish(broker, "t", [b"x"] * 5)
    for _ in range(12):
        clock.advance(10)
        stats.tick()
    publish(broker, "t", [b"y"] * 3)
    assert stats.window(("put", "t"), 0, 60)[0] == 3
    assert stats.window(("put", "t"), 0, 86400)[0] == 8
    assert stats.window(("put", None), 0, 86400)[0] == 8
    store.close()


def test_channel_counts_and_rewind_by_event_and_time(tmp_path):
    """A channel is a consumer: deliveries, bytes, requeues; rewinding drops what is in
    flight and redelivers from the point, nothing before it."""
    clock = Clock()
    clock.advance(100)
    store, broker = open_broker(tmp_path, clock)
    publish(broker, "t", [b"a", b"b"])
    clock.advance(10)
    t_c = clock.seconds() * 1000
    publish(broker, "t", [b"c", b"d"])
    ch = broker.channels.create_channel("t", "c")
    client = ChannelClient(rdy=10)
    ch.add_consumer(client)
    clock.advance(0)
    got = client.take()
    assert [g[2] for g in got] == [b"a", b"b", b"c", b"d"]
    stats = broker.stats
    (cc,) = stats.all_consumers("t")
    assert (cc.kind, cc.out_msgs, cc.in_flight) == (CHANNEL, 4, 4)
    assert ch.requeue(got[0][0], client, 0) is None
    clock.advance(0)
    assert [g[2] for g in client.take()] == [b"a"]
    assert ch.message_count == 4 and cc.out_msgs == 5 and cc.requeues == 1
    # rewind to the time "c" was stored: in flight dropped, c and d again
    stats.rewind(cc, ts_ms=t_c)
    assert client.in_flight == 0 and cc.in_flight == 0
    clock.advance(0)
    assert [(g[1], g[2]) for g in client.take()] == [(1, b"c"), (1, b"d")]
    assert stats.lag(cc) == 0
    # rewind to an eventId: b's
    eid_b = got[1][0]
    stats.rewind(cc, event_id=eid_b)
    clock.advance(0)
    assert [g[2] for g in client.take()] == [b"b", b"c", b"d"]
    assert ch.message_count == 4 + 2 + 3  # what entered again counts again
    store.close()


def test_cursor_consumer_rewind_and_lag(tmp_path):
    """A registered cursor consumer reports its lag and is moved by rewind."""
    clock = Clock()
    store, broker = open_broker(tmp_path, clock)
    publish(broker, "t", [b"a", b"b", b"c"])
    pos = {0: 3}
    moved = []

    def on_rewind(p):
        moved.append(p)
        pos.update(p)

    c = Consumer(SMSS, "w", "t", positions=lambda: pos, on_rewind=on_rewind)
    broker.stats.add_consumer(c)
    assert broker.stats.lag(c) == 0
    broker.stats.rewind(c, event_id=0)
    assert moved == [{0: 0}] and broker.stats.lag(c) == 3
    assert broker.stats.first_event_at("t", 10**15) == store.next_event_id
    assert broker.stats.find(SMSS, "w", "t") is c
    broker.stats.remove_consumer(c)
    assert broker.stats.find(SMSS, "w", "t") is None
    store.close()


def test_day_marks_for_clusterlist(tmp_path):
    """The first sample of a new day keeps the totals (msgPutTotalTodayMorning), and the
    one before becomes yesterday's."""
    clock = Clock()
    clock.advance(1_000_000)
    store, broker = open_broker(tmp_path, clock)
    publish(broker, "t", [b"x"] * 2)
    clock.advance(86400)
    broker.stats.tick()
    assert broker.stats.history.day_marks[1][("put", None)][0] == 2
    publish(broker, "t", [b"y"])
    clock.advance(86400)
    broker.stats.tick()
    yesterday, today = broker.stats.history.day_marks
    assert (yesterday[("put", None)][0], today[("put", None)][0]) == (2, 3)
    store.close()


def test_a_listening_door_is_listed_before_its_first_connection(tmp_path):
    """A door the service tree listens on is in connections() with none open."""
    store, broker = open_broker(tmp_path, Clock())
    broker.stats.door_listening("smss")
    broker.stats.door_listening("admin")
    assert broker.stats.connections() == {"admin": [], "smss": []}
    store.close()


def test_topic_stats_lists_every_queue_of_the_topic(tmp_path):
    """Queues never written to are there with zeros, beside those written to."""
    store, broker = open_broker(tmp_path, Clock())
    broker.create_topic("four", queues=4)
    broker.publish("four", [Message(b"x")])
    queues = broker.stats.topic_stats("four")["queues"]
    assert sorted(queues) == ["0", "1", "2", "3"]
    written = [q for q, v in queues.items() if v["in_msgs"]]
    assert len(written) == 1 and queues[written[0]]["max_offset"] == 1
    zero = {"in_msgs": 0, "in_bytes": 0, "min_offset": 0, "max_offset": 0}
    assert [v for q, v in queues.items() if q not in written] == [zero] * 3
    store.close()


def test_a_msgout_channel_is_found_once_as_kind_msgout(tmp_path):
    """msgout's channel ``msgout:queue`` is a consumer of kind msgout: a lookup as an NSQ
    channel does not find it too (which made one consumer look like two)."""
    store, broker = open_broker(tmp_path, Clock())
    publish(broker, "jobs", [b"a"])
    broker.channels.create_channel("jobs", "msgout:queue")
    broker.channels.create_channel("jobs", "ch")
    stats = broker.stats
    assert stats.find(CHANNEL, "msgout:queue", "jobs") is None
    found = stats.find(MSGOUT, "msgout:queue", "jobs")
    assert (found.kind, found.name) == (MSGOUT, "msgout:queue")
    assert stats.find(MSGOUT, "queue", "jobs").name == "msgout:queue"
    assert (stats.find(CHANNEL, "ch", "jobs").kind) == CHANNEL
    store.close()
