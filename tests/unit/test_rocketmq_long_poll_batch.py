"""Long polling's batch (rocketmq.longPollBatchMs): an arrival soon after a pull was parked
wakes it one batch later, with every message that came meanwhile; a pull parked longer,
or a batch of 0, is answered at the arrival. The broker door in process on a Clock."""

import pytest

from mqserver.config import ConfigError, build_config
from protocols.remoting import codes
from tests.support.remoting_client import records
from tests.unit.test_rocketmq_door import Door, pull_fields, send


@pytest.fixture
def door(tmp_path):
    d = Door(tmp_path / "s")  # the default batch: 1 ms
    yield d
    d.close()


def park(d, topic, offset, conn=None):
    """Send a PULL with the suspend bit at the end of C{topic}'s queue 0; check it parked."""
    op = d.send(codes.PULL_MESSAGE, pull_fields(topic, offset, 20000), conn=conn)
    assert d.received(conn) == []
    return op


def bodies(answer):
    return [bytes(r.body) for r in records(answer.body)]


def test_default_batch_is_one_millisecond():
    assert build_config({})["rocketmq.longPollBatchMs"] == 1


@pytest.mark.parametrize("value", [-1, 1001])
def test_batch_out_of_range_is_refused(value):
    with pytest.raises(ConfigError, match="longPollBatchMs"):
        build_config({"rocketmq": {"longPollBatchMs": value}})


def test_arrivals_soon_after_the_park_are_answered_together_one_batch_later(door):
    send(door, "B")
    op = park(door, "B", 1)
    producer = door.connect()
    send(door, "B", b"one", conn=producer)
    door.clock.advance(0.0005)
    send(door, "B", b"two", conn=producer)
    door.clock.advance(0.0004)
    assert door.received() == []  # 0.9 ms after the first arrival: still gathering
    door.clock.advance(0.0002)
    (r,) = door.received()
    assert (r.opaque, r.code) == (op, codes.SUCCESS)
    assert bodies(r) == [b"one", b"two"]
    assert r.ext_fields["nextBeginOffset"] == "3"
    door.clock.advance(0.002)  # one batch for both arrivals: nothing more is due
    assert door.received() == [] and not door.door.polls._due


def test_a_pull_parked_longer_than_the_batch_is_answered_at_arrival(door):
    send(door, "B")
    park(door, "B", 1)
    door.clock.advance(0.0011)
    send(door, "B", b"late", conn=door.connect())
    (r,) = door.received()
    assert bodies(r) == [b"late"]


def test_batch_zero_answers_at_arrival(tmp_path):
    d = Door(tmp_path / "s", longPollBatchMs=0)
    try:
        send(d, "B")
        park(d, "B", 1)
        send(d, "B", b"now", conn=d.connect())
        (r,) = d.received()
        assert bodies(r) == [b"now"]
    finally:
        d.close()


def test_a_pull_parked_during_a_batch_is_answered_with_it(door):
    """A second consumer's pull, parked after the arrival that started the batch, is run
    again when the batch is due too."""
    send(door, "B")
    park(door, "B", 1)
    send(door, "B", b"one", conn=door.connect())
    other = door.connect()
    op = door.send(codes.PULL_MESSAGE, dict(pull_fields("B", 1, 20000), consumerGroup="G2"), conn=other)
    (first,) = door.received(other)  # offset 1 is there: answered at once
    assert (first.opaque, bodies(first)) == (op, [b"one"])
    park(door, "B", 2, conn=other)
    door.clock.advance(0.0002)
    send(door, "B", b"two", conn=door.connect())
    door.clock.advance(0.0009)
    (r,) = door.received()
    assert bodies(r) == [b"one", b"two"]
    (r2,) = door.received(other)
    assert bodies(r2) == [b"two"]


def test_the_pulls_deadline_comes_first(door):
    """A pull whose suspend time ends inside the batch is answered at its deadline, with
    what arrived; the batch then finds nothing left to run."""
    send(door, "B")
    op = door.send(codes.PULL_MESSAGE, pull_fields("B", 1, 1))  # a 1 ms hold
    assert door.received() == []
    door.clock.advance(0.0005)
    send(door, "B", b"one", conn=door.connect())
    door.clock.advance(0.0006)  # the deadline (1 ms after parking), not yet the batch
    (r,) = door.received()
    assert (r.opaque, bodies(r)) == (op, [b"one"])
    door.clock.advance(0.001)
    assert door.received() == []


def test_a_connection_closed_during_the_batch_gets_nothing_and_breaks_nothing(door):
    send(door, "B")
    park(door, "B", 1)
    send(door, "B", b"one", conn=door.connect())
    door.conn.transport.loseConnection()
    door.conn.connectionLost(None)
    door.clock.advance(0.002)
    assert door.conn.transport.value() == b""
    fresh = door.connect()
    r = door.call(codes.PULL_MESSAGE, pull_fields("B", 1, 20000), conn=fresh)
    assert bodies(r) == [b"one"]


def test_stopping_cancels_a_pending_batch(tmp_path):
    d = Door(tmp_path / "s")
    send(d, "B")
    park(d, "B", 1)
    send(d, "B", b"one", conn=d.connect())
    assert d.door.polls._due
    d.close()
    assert not [c for c in d.clock.getDelayedCalls() if c.active() and c.func == d.door.polls._batch_due]
