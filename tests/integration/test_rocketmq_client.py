"""The real RocketMQ C++ client (PyPI ``rocketmq``) against mqserver's nameserver and
broker doors. Client code runs in subprocesses (tests/support/rmq_client.py) with hard
timeouts; one broker process serves the whole module, each test uses its own topic and
group."""

import json

import pytest

from protocols.remoting import codes
from tests.support.remoting_client import RemotingClient
from tests.support.rmq import (
    FAST_DELAYS, ClientProc, messages, namesrv_addr, broker_port, rocket_server, run_client, sends,
    wait_held_by_each, wait_members, wait_route, wait_split,
)

pytestmark = pytest.mark.timeout(180)
#: The queues of a topic auto-created on the broker (named broker-a by default).
QUEUES_A = {("broker-a", q) for q in range(4)}


@pytest.fixture(scope="module")
def rmq(tmp_path_factory):
    base = tmp_path_factory.mktemp("rmq")
    s = rocket_server(base / "broker", config={"rocketmq": {"messageDelayLevel": FAST_DELAYS}})
    with s.start():
        s.home = base / "home"
        s.ns = namesrv_addr(s)
        # every test's first send auto-creates its topic by TBW102's route
        wait_route(s.ns, "TBW102")
        yield s


def produce(rmq, topic, *args, timeout=60):
    """Send with the C++ producer; the topic's route is known when it returns (a send
    that creates the topic answers before the broker registers it anew)."""
    lines = run_client(rmq.home, "produce", rmq.ns, topic, *args, timeout=timeout)
    assert lines[-1] == {"done": True}
    # a failed send (e.g. the C++ client's "No route info", which it also reports after
    # every retry of a send failed) fails here, with the client's words
    assert not [x for x in lines if "error" in x], lines
    wait_route(rmq.ns, topic)
    return sends(lines)


def consume(rmq, topic, *args, timeout=60):
    """Start the C++ push consumer once the nameserver has the topic's route (it would
    find no queue until its next route poll otherwise)."""
    wait_route(rmq.ns, topic)
    return ClientProc(rmq.home, "consume", rmq.ns, topic, *args, timeout=timeout)


def pull(rmq, topic, *args):
    """Read every queue with the C++ pull consumer once the topic's route is known."""
    wait_route(rmq.ns, topic)
    return run_client(rmq.home, "pull", rmq.ns, topic, *args, timeout=60)


def test_sync_send_then_push_consumer(rmq):
    """Sync sends succeed with growing queue offsets; a push consumer gets them all."""
    r = produce(rmq, "RTSync", "--count", 8, "--tags", "TagA", "--group", "P1")
    assert [x["status"] for x in r] == [0] * 8
    assert len({x["id"] for x in r}) == 8
    got = messages(consume(rmq, "RTSync", "--group", "CSync", "--expect", 8).result())
    assert sorted(m["body"] for m in got) == sorted(f"msg-{i}" for i in range(8))
    assert {m["tags"] for m in got} == {"TagA"}
    assert {m["queue"] for m in got} == {0, 1, 2, 3}  # auto-created with 4 queues


def test_async_and_oneway_sends(rmq):
    """Async sends call back with OK; one-way sends arrive too."""
    r = produce(rmq, "RTAsync", "--mode", "async", "--count", 10, "--group", "P2")
    assert sorted(x["i"] for x in r if x.get("status") == 0) == list(range(10))
    produce(rmq, "RTAsync", "--mode", "oneway", "--count", 5, "--group", "P3", "--body", "ow-{i}")
    got = messages(consume(rmq, "RTAsync", "--group", "CAsync", "--expect", 15).result())
    bodies = sorted(m["body"] for m in got)
    assert bodies == sorted([f"msg-{i}" for i in range(10)] + [f"ow-{i}" for i in range(5)])


def test_batch_send(rmq):
    """A C++ batch (SEND_MESSAGE with batch=1) is stored as separate messages."""
    r = produce(rmq, "RTBatch", "--mode", "batch", "--count", 30, "--batch-size", 10, "--group", "P4",
                "--body-size", 600)  # 10 x 600 B: the batch goes out deflated
    assert [x["status"] for x in r] == [0, 0, 0]
    got = messages(consume(rmq, "RTBatch", "--group", "CBatch", "--expect", 30, "--full-body").result())
    assert len(got) == 30
    assert sorted(m["keys"] for m in got) == sorted(f"k{i}" for i in range(30))
    assert {m["len"] for m in got} == {600}


def test_compressed_body_read_back_intact(rmq):
    """A 5 KB body (compressed by the client) comes back byte for byte."""
    produce(rmq, "RTZip", "--count", 1, "--body-size", 5000, "--body", "zip", "--group", "P5")
    got = messages(consume(rmq, "RTZip", "--group", "CZip", "--expect", 1, "--full-body").result())
    expected = (b"zip-" + bytes(range(32, 127)) * 60)[:5000].decode("latin-1")  # no NUL: the client reads C strings
    assert got[0]["len"] == 5000 and got[0]["body"] == expected


def test_tag_filtering(rmq):
    """A consumer subscribed to TagB gets only TagB messages."""
    produce(rmq, "RTTags", "--count", 12, "--tags", "TagA,TagB,TagC", "--group", "P6")
    got = messages(consume(rmq, "RTTags", "--group", "CTags", "--expr", "TagB", "--expect", 4,
                           "--linger", 2).result())
    assert sorted(m["body"] for m in got) == sorted(f"msg-{i}" for i in range(1, 12, 3))
    got2 = messages(consume(rmq, "RTTags", "--group", "CTags2", "--expr", "TagA || TagC", "--expect", 8,
                            "--linger", 2).result())
    assert len(got2) == 8 and {m["tags"] for m in got2} == {"TagA", "TagC"}


def test_clustering_two_consumers_share_the_topic(rmq):
    """Two consumers of one group split a 4-queue topic; each message is consumed once."""
    produce(rmq, "RTShare", "--count", 1, "--group", "P7", "--body", "warm")
    c1 = consume(rmq, "RTShare", "--group", "CShare", "--instance", "i1", "--expect", 1000, "--timeout", 25)
    c2 = consume(rmq, "RTShare", "--group", "CShare", "--instance", "i2", "--expect", 1000, "--timeout", 25)
    try:
        wait_members(rmq, "CShare", 2)
        # NOTIFY_CONSUMER_IDS_CHANGED makes both rebalance: send once they split the queues
        wait_split([c1, c2], "RTShare", QUEUES_A)
        produce(rmq, "RTShare", "--count", 40, "--group", "P7")
        got1 = messages(c1.result())
        got2 = messages(c2.result())
    finally:
        c1.kill()
        c2.kill()
    bodies = [m["body"] for m in got1 + got2 if m["body"] != "warm"]
    assert sorted(bodies) == sorted(f"msg-{i}" for i in range(40))
    q1 = {m["queue"] for m in got1 if m["body"] != "warm"}
    q2 = {m["queue"] for m in got2 if m["body"] != "warm"}
    assert q1 and q2 and not q1 & q2


def test_broadcasting(rmq):
    """Two broadcasting consumers of one group each get every message."""
    # Broadcasting consumers start at the end of the queues: create the topic first and
    # send once each knows where it starts in every queue.
    produce(rmq, "RTBcast", "--count", 1, "--group", "P8", "--body", "warm")
    c1 = consume(rmq, "RTBcast", "--group", "CBcast", "--instance", "b1", "--broadcast", "--expect", 10)
    c2 = consume(rmq, "RTBcast", "--group", "CBcast", "--instance", "b2", "--broadcast", "--expect", 10)
    try:
        wait_held_by_each([c1, c2], "RTBcast", QUEUES_A)
        produce(rmq, "RTBcast", "--count", 10, "--group", "P8")
        got1, got2 = messages(c1.result()), messages(c2.result())
    finally:
        c1.kill()
        c2.kill()
    want = sorted(f"msg-{i}" for i in range(10))
    assert sorted(m["body"] for m in got1 if m["body"] != "warm") == want
    assert sorted(m["body"] for m in got2 if m["body"] != "warm") == want


def test_pull_consumer(rmq):
    """The pull consumer reads every queue to the end, with tag filtering."""
    produce(rmq, "RTPull", "--count", 9, "--tags", "TagA,TagB,TagC", "--group", "P9")
    lines = pull(rmq, "RTPull", "--group", "CPull")
    assert sorted(m["body"] for m in messages(lines)) == sorted(f"msg-{i}" for i in range(9))
    lines = pull(rmq, "RTPull", "--group", "CPull2", "--expr", "TagC")
    assert sorted(m["body"] for m in messages(lines)) == ["msg-2", "msg-5", "msg-8"]


def test_orderly_consumer(rmq):
    """Orderly sends to one queue are consumed in order by an orderly consumer."""
    r = produce(rmq, "RTOrder", "--mode", "orderly", "--order-key", 1, "--count", 20, "--group", "P10")
    assert [x["offset"] for x in r] == list(range(20))
    got = messages(consume(rmq, "RTOrder", "--group", "COrder", "--orderly", "--expect", 20).result())
    assert [m["body"] for m in got] == [f"msg-{i}" for i in range(20)]


def set_retry_max(rmq, group, n):
    c = RemotingClient("127.0.0.1", broker_port(rmq))
    try:
        r = c.call(codes.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                   body=json.dumps({"groupName": group, "retryMaxTimes": n}).encode())
        assert r.code == codes.SUCCESS
    finally:
        c.close()


def test_failing_callback_retries_then_dead_letter(rmq):
    """A failing callback gets the message back with reconsumeTimes 1, 2, ...; after the
    group's max reconsume times it is in %DLQ%group."""
    set_retry_max(rmq, "CFail", 2)
    produce(rmq, "RTFail", "--count", 1, "--group", "P11", "--body", "bad")
    got = messages(consume(rmq, "RTFail", "--group", "CFail", "--fail", 99, "--expect", 3, "--linger", 3,
                           "--timeout", 40).result())
    assert [m["reconsume"] for m in got] == [0, 1, 2]
    assert {m["body"] for m in got} == {"bad"}
    assert {m["topic"] for m in got} == {"RTFail"}
    lines = pull(rmq, "%DLQ%CFail", "--group", "CDlq")
    dead = messages(lines)
    assert [m["body"] for m in dead] == ["bad"]


def test_delay_level_one(rmq):
    """A DELAY=1 message reaches the consumer no earlier than 1 s after it was sent."""
    produce(rmq, "RTDelay", "--count", 1, "--group", "P12", "--body", "warm")
    c = consume(rmq, "RTDelay", "--group", "CDelay", "--expect", 2, "--props", "REAL_TOPIC,REAL_QID,DELAY")
    try:
        wait_members(rmq, "CDelay", 1)
        produce(rmq, "RTDelay", "--count", 1, "--group", "P12", "--delay", 1)
        got = [m for m in messages(c.result()) if m["body"] != "warm"]
    finally:
        c.kill()
    assert len(got) == 1
    assert got[0]["recv_ms"] - got[0]["sent_ms"] >= 1000
    # as the 4.9.4 broker delivers it (ScheduleMessageService.messageTimeup): on the queue
    # it was sent to, REAL_TOPIC/REAL_QID naming it, DELAY still in the property string
    assert got[0]["props"] == {"REAL_TOPIC": "RTDelay", "REAL_QID": str(got[0]["queue"]), "DELAY": "1"}


def test_query_by_key_and_view_by_id(rmq):
    """QUERY_MESSAGE finds messages by KEYS and UNIQ_KEY; VIEW_MESSAGE_BY_ID by offset id."""
    r = produce(rmq, "RTKeys", "--count", 3, "--keys", "order-{i} common", "--group", "P13")
    c = RemotingClient("127.0.0.1", broker_port(rmq))
    try:
        resp = c.call(codes.QUERY_MESSAGE, {"topic": "RTKeys", "key": "order-1", "maxNum": 32,
                                            "beginTimestamp": 0, "endTimestamp": 2**62})
        assert resp.code == codes.SUCCESS
        from mqserver.store.format import RecordView
        view = RecordView(resp.body)
        assert bytes(view.body) == b"msg-1" and view.size == len(resp.body)
        resp = c.call(codes.QUERY_MESSAGE, {"topic": "RTKeys", "key": "common", "maxNum": 32,
                                            "beginTimestamp": 0, "endTimestamp": 2**62})
        assert resp.code == codes.SUCCESS
        n = 0
        pos = 0
        while pos < len(resp.body):
            pos += RecordView(resp.body, pos).size
            n += 1
        assert n == 3
        resp = c.call(codes.QUERY_MESSAGE, {"topic": "RTKeys", "key": r[2]["id"], "maxNum": 32,
                                            "beginTimestamp": 0, "endTimestamp": 2**62, "_UNIQUE_KEY_QUERY": "true"})
        assert resp.code == codes.SUCCESS and bytes(RecordView(resp.body).body) == b"msg-2"
        resp = c.call(codes.QUERY_MESSAGE, {"topic": "RTKeys", "key": "nope", "maxNum": 32,
                                            "beginTimestamp": 0, "endTimestamp": 2**62})
        assert resp.code == codes.QUERY_NOT_FOUND
        view = RecordView(c.call(codes.QUERY_MESSAGE, {"topic": "RTKeys", "key": "order-0", "maxNum": 1,
                                                        "beginTimestamp": 0, "endTimestamp": 2**62}).body)
        resp = c.call(codes.VIEW_MESSAGE_BY_ID, {"offset": view.offset})
        assert resp.code == codes.SUCCESS and bytes(RecordView(resp.body).body) == b"msg-0"
    finally:
        c.close()
