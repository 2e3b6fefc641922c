"""Long polling's batch through the real server on 127.0.0.1, with a batch of a second
(the largest rocketmq.longPollBatchMs) so the timing leaves a wide margin: arrivals soon
after a pull parked come in one answer a batch later; a pull parked longer is answered
at the arrival."""

import time

import pytest

from protocols.remoting import codes
from tests.support.remoting_client import RemotingClient, records
from tests.support.rmq import broker_port, rocket_server

pytestmark = pytest.mark.timeout(60)
BATCH = 1.0


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = rocket_server(tmp_path_factory.mktemp("batch") / "broker", namesrv=False, smss=False,
                      config={"rocketmq": {"longPollBatchMs": int(BATCH * 1000)}})
    with s.start():
        yield s


@pytest.fixture
def clients(srv):
    consumer = RemotingClient("127.0.0.1", broker_port(srv))
    producer = RemotingClient("127.0.0.1", broker_port(srv))
    yield consumer, producer
    consumer.close()
    producer.close()


def send(c, topic, body):
    r = c.call(codes.SEND_MESSAGE, {"producerGroup": "PG", "topic": topic, "defaultTopic": "TBW102",
                                    "defaultTopicQueueNums": 1, "queueId": 0, "sysFlag": 0,
                                    "bornTimestamp": int(time.time() * 1000), "flag": 0,
                                    "properties": "", "reconsumeTimes": 0}, body)
    assert r.code == codes.SUCCESS, r.remark
    return r


def park(c, topic, offset):
    op = c.send(codes.PULL_MESSAGE, {"consumerGroup": "G", "topic": topic, "queueId": 0,
                                     "queueOffset": offset, "maxMsgNums": 32, "sysFlag": 6,
                                     "commitOffset": -1, "suspendTimeoutMillis": 20000,
                                     "subscription": "*", "subVersion": 0})
    # the connection's answers come in order: once a later request is answered, the pull
    # was handled, and with no answer it is parked
    c.call(codes.GET_MAX_OFFSET, {"topic": topic, "queueId": 0})
    assert not [m for m in c.inbox if m.opaque == op], "the pull was answered at once"
    return op


def test_arrivals_soon_after_the_park_come_in_one_answer(clients):
    consumer, producer = clients
    send(producer, "BatchT", b"first")
    op = park(consumer, "BatchT", 1)
    t0 = time.monotonic()
    send(producer, "BatchT", b"a")
    send(producer, "BatchT", b"b")
    r = consumer.recv(op, timeout=10)
    waited = time.monotonic() - t0
    assert r.code == codes.SUCCESS
    assert [bytes(v.body) for v in records(r.body)] == [b"a", b"b"]
    assert waited >= BATCH * 0.9  # gathered for the batch, not answered at the first


def test_a_pull_parked_longer_is_answered_at_the_arrival(clients):
    consumer, producer = clients
    send(producer, "QuietT", b"first")
    op = park(consumer, "QuietT", 1)
    time.sleep(BATCH * 1.2)
    t0 = time.monotonic()
    send(producer, "QuietT", b"late")
    r = consumer.recv(op, timeout=10)
    assert [bytes(v.body) for v in records(r.body)] == [b"late"]
    # a batch would have held it a whole second; answered at the arrival, it comes in
    # the time of a round trip (a bound with a wide margin, not a figure)
    assert time.monotonic() - t0 < BATCH * 0.5
