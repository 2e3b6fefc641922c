"""Every smss command and every business error, through our client, on the real broker.

Most tests share one broker process (module scope) and use topic names of their own; the
tests that need exact eventIds, an empty topic list or a restart get a fresh broker.
The shared broker sends ALIVE after 300 ms of idleness, so helpers skip ALIVE frames.
"""

import threading
import time

import pytest

from protocols.smss import client_codec as cc
from protocols.smss.client import SmssError
from protocols.smss.messages import AliveResponse, Batch, ErrResponse, OkResponse, SubEnd
from protocols.smss.payload import encode_payload
from tests.support.server import ServerProcess
from tests.support.smss import (
    NAME_RULE,
    as_tuples,
    connect,
    next_data,
    now_ms,
    read_topic,
    topic_event_id,
    unique_who,
    wait_until,
)

ALIVE_MS = 300
SHARED_CONFIG = {"timeout": {"server": {"alive": ALIVE_MS}}}
INFO_FIELDS = [
    "name",
    "createTimeStamp",
    "expireAt",
    "createEventId",
    "stateChangeTime",
    "stateChangeEventId",
    "state",
    "topicRoot",
]


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One broker for the tests that do not need a fresh one."""
    s = ServerProcess(tmp_path_factory.mktemp("smss-commands") / "broker", config=SHARED_CONFIG)
    try:
        s.start()
        yield s
        assert s.stop() is not None
        assert "Traceback" not in s.read_log(), s.read_log()
    finally:
        s.close()


@pytest.fixture
def client(shared):
    """A connection to the shared broker."""
    with connect(shared) as c:
        yield c


@pytest.fixture
def fresh(server_factory):
    """A broker of its own (empty store, eventIds from 1) and a connection to it."""
    s = server_factory(config=SHARED_CONFIG)
    with connect(s) as c:
        yield s, c


def alive_ok(c):
    """Send ALIVE on C{c} and return True when the answer is the 201."""
    c.send_raw(cc.encode_alive())
    return isinstance(c.read_response(), AliveResponse)


def err_of(call, *args, **kw):
    """Run a client call that must fail; return the server's error text."""
    with pytest.raises(SmssError) as info:
        call(*args, **kw)
    return info.value.text


# -- CREATE ------------------------------------------------------------------------------


def test_create_permanent_topic_info_fields_and_types(client):
    """A permanent topic's TOPIC INFO has smss's fields, in order, with the right types."""
    before = now_ms()
    client.create("order")
    after = now_ms()
    info = client.topic_info("order")
    assert list(info) == INFO_FIELDS
    for key in INFO_FIELDS:
        want = str if key in ("name", "topicRoot") else int
        assert type(info[key]) is want, (key, info[key])
    assert info["name"] == "order"
    assert before <= info["createTimeStamp"] <= after
    assert info["expireAt"] == 0
    assert info["createEventId"] >= 1
    assert info["stateChangeEventId"] == info["createEventId"]
    assert info["stateChangeTime"] == info["createTimeStamp"]
    assert info["state"] == 0
    # As the smss server does: with folderCount 10, "order" hashes to /3/3.
    assert info["topicRoot"] == "/3/3/order"


def test_create_with_lifetime_records_expire_at(client):
    """CREATE with an absolute expireAt at least 10 s ahead is accepted and reported."""
    expire = now_ms() + 60_000
    client.create("temp1", expire_at=expire)
    info = client.topic_info("temp1")
    assert info["expireAt"] == expire
    assert info["topicRoot"] == "/8/6/temp1"
    listed = {t["name"]: t for t in client.list()}
    assert listed["temp1"]["expireAt"] == expire


@pytest.mark.parametrize("offset_ms", [5_000, 9_000, -1, -60_000])
def test_create_with_too_short_lifetime_is_refused(client, offset_ms):
    """An expireAt less than 10 s ahead (or in the past) gets 'expire MUST more than 10s'."""
    name = f"short-life-{abs(offset_ms)}"
    expire = now_ms() + offset_ms
    assert err_of(client.create, name, expire_at=expire) == "expire MUST more than 10s"
    assert err_of(client.topic_info, name) == "topic not exist"


def test_create_with_negative_expire_at_is_refused(client):
    """A negative expireAt gets 'expire MUST more than 10s' (as the smss server answers)."""
    assert err_of(client.create, "neg-life", expire_at=-1) == "expire MUST more than 10s"
    assert err_of(client.topic_info, "neg-life") == "topic not exist"


def test_create_existing_topic_is_refused(client):
    """A second CREATE of the same name gets 'topic exist' and leaves the topic alone."""
    client.create("twice")
    first = client.topic_info("twice")
    assert err_of(client.create, "twice") == "topic exist"
    assert err_of(client.create, "twice", expire_at=now_ms() + 60_000) == "topic exist"
    assert client.topic_info("twice") == first


@pytest.mark.parametrize(
    "name, text",
    [
        (b"", "topic name is required"),
        (b"a/b", NAME_RULE),
        (b"/abs", NAME_RULE),
        (b"..", NAME_RULE),
        (b".", NAME_RULE),
        (b".hidden", NAME_RULE),
        (b"a b", NAME_RULE),
        (b"a\tb", NAME_RULE),
        (b"a\nb", NAME_RULE),
        (b"a\x00b", NAME_RULE),
        (b"x" * 129, NAME_RULE),
        (b"\xff\xfe", NAME_RULE),
    ],
    ids=["empty", "slash", "leading-slash", "dotdot", "dot", "leading-dot", "space", "tab",
         "newline", "nul", "129-bytes", "bad-utf8"],
)
def test_create_invalid_names_are_refused(client, name, text):
    """CREATE refuses empty, path-like, blank-holding and over-long names, and the
    connection stays usable."""
    assert err_of(client.create, name) == text
    assert alive_ok(client)
    assert name.decode("utf-8", "replace") not in [t["name"] for t in client.list()]


def test_create_name_of_128_bytes_is_accepted_and_carries_messages(client, shared):
    """A 128-byte name is the longest CREATE accepts, as the reference server's "> 128"
    check does (its SDKs' tests create such names): it takes a PUB and a SUB reads it."""
    name = "n" * 128
    client.create(name)
    assert client.topic_info(name)["name"] == name
    client.publish(name, [b"long-name"])
    assert [m.body for m in read_topic(shared, name, count=1)] == [b"long-name"]


def test_create_name_of_129_bytes_is_refused(client):
    """A 129-byte name gets the reference server's name rule ERR; the connection stays
    usable."""
    name = "n" * 129
    assert err_of(client.create, name) == NAME_RULE
    assert alive_ok(client)
    assert name not in [t["name"] for t in client.list()]


# -- DELETE ------------------------------------------------------------------------------


def test_delete_missing_and_existing_topic(client, shared):
    """DELETE of a missing topic gets 'topic not exist'; an existing one goes, with its
    messages, and a re-created topic of that name starts empty."""
    assert err_of(client.delete, "never-there") == "topic not exist"
    assert err_of(client.delete, b"") == "topic name is required"
    client.create("doomed")
    client.publish("doomed", [b"old-1", b"old-2"])
    client.delete("doomed")
    assert err_of(client.topic_info, "doomed") == "topic not exist"
    assert "doomed" not in [t["name"] for t in client.list()]
    assert err_of(client.publish, "doomed", [b"x"]) == "topic not exist"
    assert err_of(client.delete, "doomed") == "topic not exist"
    client.create("doomed")
    client.publish("doomed", [b"new-1"])
    assert [m.body for m in read_topic(shared, "doomed", count=1)] == [b"new-1"]


# -- eventIds ------------------------------------------------------------------------------


def test_event_ids_are_global_dense_and_start_at_1(fresh):
    """CREATE, DELETE and DELAY take one eventId each, PUB one per message, and each
    delivered delayed message one more."""
    server, c = fresh
    c.create("ea")  # 1
    c.publish("ea", [b"a1", b"a2", b"a3"])  # 2, 3, 4
    c.create("eb")  # 5
    c.publish("eb", [b"b1"])  # 6
    c.delay("ea", 1000, [b"d1", b"d2"])  # 7
    c.delete("eb")  # 8
    c.create("ec")  # 9
    assert topic_event_id(c, "ea") == 1
    assert topic_event_id(c, "ec") == 9
    got = read_topic(server, "ea", count=5, timeout=10)
    assert [(m.event_id, m.body) for m in got] == [
        (2, b"a1"), (3, b"a2"), (4, b"a3"), (10, b"d1"), (11, b"d2"),
    ]
    c.create("ed")
    assert topic_event_id(c, "ed") == 12


# -- PUB -----------------------------------------------------------------------------------


def test_publish_batch_with_headers(client, shared):
    """One PUB of several messages with headers gives consecutive eventIds, in order,
    with headers and bodies byte for byte."""
    client.create("pubbatch")
    base = topic_event_id(client, "pubbatch")
    msgs = [
        ([], b"plain"),
        ([(b"k", b"v")], b"one header"),
        ([(b"traceId", b"t-1"), (b"k2", b""), (b"k", b"dup key")], b"three headers"),
        ([(b"bin", b"\x01\x02\xff\x00")], b"binary header value"),
        ([(b"utf8", "wert-\u00e9".encode())], bytes(range(256))),
    ]
    client.publish("pubbatch", msgs, trace=b"trace-xyz")
    got = read_topic(shared, "pubbatch", count=len(msgs))
    assert as_tuples(got) == [(base + 1 + i, h, b) for i, (h, b) in enumerate(msgs)]


def test_publish_to_missing_topic(client):
    """PUB to a topic that does not exist gets 'topic not exist'; the connection stays."""
    assert err_of(client.publish, "no-such-topic", [b"x"]) == "topic not exist"
    assert err_of(client.publish, "no-such-topic", [b"x", b"y"]) == "topic not exist"
    client.create("pub-after-err")
    client.publish("pub-after-err", [b"fine"])


# -- DELAY ---------------------------------------------------------------------------------


def test_delay_errors(client, shared):
    """DELAY refuses a delay under 1 s, a payload of 8 bytes or less, a malformed payload
    and a missing topic, with smss's texts."""
    client.create("delay-errors")
    text = "delay time must be more than 1 second"
    assert err_of(client.delay, "delay-errors", 999, [b"x"]) == text
    assert err_of(client.delay, "delay-errors", 0, [b"x"]) == text
    assert err_of(client.delay, "delay-errors", -5000, [b"x"]) == text
    for payload in (b"", b"\x01\x00\x00\x00\x00\x00\x00\x00", b"\x64\x00\x00\x00\x00\x00\x00\x00abc"):
        client.send_raw(cc.encode_delay("delay-errors", 2000, payload))
        assert client.read_response() == ErrResponse("invalid delay request"), payload
    assert err_of(client.delay, "no-such-topic", 2000, [b"x"]) == "topic not exist"
    # None of these queued anything.
    assert read_topic(shared, "delay-errors", settle=0.3) == []


def test_delay_arrives_on_time_with_body_and_headers(client, shared):
    """A DELAY of 1.5 s arrives no earlier than 1.5 s later, with its headers and body and
    fresh eventIds after the DELAY's own."""
    client.create("delayed")
    base = topic_event_id(client, "delayed")
    msgs = [([(b"kind", b"delayed"), (b"n", b"1")], b"later-1"), ([], b"later-2")]
    with connect(shared) as sc:
        sub = sc.subscribe("delayed", 0, batch=10, who=b"dsub")
        sent = time.monotonic()
        client.delay("delayed", 1500, msgs)
        got = []
        while len(got) < 2:
            ev = next_data(sub, 6.0)
            assert isinstance(ev, Batch)
            got.extend(ev.messages)
            sub.ack()
        arrived = time.monotonic()
    assert arrived - sent >= 1.5 - 0.005
    # base = CREATE, base + 1 = DELAY, then one eventId per delivered message.
    assert as_tuples(got) == [(base + 2, msgs[0][0], b"later-1"), (base + 3, [], b"later-2")]


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_delay_survives_restart(server_factory, how):
    """A DELAY still fires, once, when the broker is stopped (or killed) before its
    trigger time and started again."""
    server = server_factory(config=SHARED_CONFIG)
    delay_ms = 2000
    with connect(server) as c:
        c.create("dr")
        sent = time.monotonic()
        c.delay("dr", delay_ms, [([(b"h", b"v")], b"after restart")])
    if how == "stop":
        server.stop()
    else:
        server.kill()
    assert time.monotonic() - sent < delay_ms / 1000, "the broker stopped too late for the test"
    server.start()
    got = read_topic(server, "dr", count=1, timeout=10, settle=0.5)
    assert time.monotonic() - sent >= delay_ms / 1000 - 0.005
    assert as_tuples(got) == [(3, [(b"h", b"v")], b"after restart")]


# -- ALIVE, TOPIC INFO, LIST, VALID LIST ------------------------------------------------


def test_alive(client):
    """ALIVE is answered with a bare 201, also pipelined and with a 255-byte traceId."""
    assert alive_ok(client)
    client.send_raw(cc.encode_alive() * 3 + cc.encode_alive(b"t" * 255))
    for _ in range(4):
        assert isinstance(client.read_response(), AliveResponse)


def test_topic_info_errors(client):
    """TOPIC INFO of a missing topic gets 'topic not exist'; with no name 'topic name is
    required'."""
    assert err_of(client.topic_info, "no-such-topic") == "topic not exist"
    assert err_of(client.topic_info, b"") == "topic name is required"
    assert err_of(client.topic_info, "../etc") == "topic not exist"


def test_list_empty_then_ordered_by_name_bytes(fresh):
    """LIST with no topics is an empty body (the client returns []); otherwise every topic
    in bytewise name order, with Go's escaping of <, > and &."""
    _, c = fresh
    c.send_raw(cc.encode_list())
    assert c.read_response("json") == OkResponse(b"")
    assert c.list() == []
    names = ["b", "B", "ab", "a-", "a", "\u00e9t\u00e9", "Z9", "_x", "a<b>&c", "aa"]
    for n in names:
        c.create(n)
    listed = c.list()
    assert [t["name"] for t in listed] == sorted(names, key=lambda n: n.encode())
    assert all(list(t) == INFO_FIELDS for t in listed)
    c.send_raw(cc.encode_list())
    raw = c.read_response("json").body
    assert b'"name":"a\\u003cb\\u003e\\u0026c"' in raw
    assert b" " not in raw  # compact, as Go writes it


def test_valid_list_filters_by_create_event_id(fresh):
    """VALID LIST E=0 returns every live topic; E>0 only those with createEventId <= E;
    deleted topics never; an empty result is []."""
    _, c = fresh
    assert c.valid_list(0) == []
    c.create("v1")  # 1
    c.create("v2")  # 2
    c.publish("v2", [b"x"])  # 3
    c.create("v3")  # 4
    c.create("v4")  # 5
    c.delete("v4")  # 6

    def names(e):
        return [t["name"] for t in c.valid_list(e)]

    assert names(0) == ["v1", "v2", "v3"]
    assert names(1) == ["v1"]
    assert names(2) == ["v1", "v2"]
    assert names(3) == ["v1", "v2"]
    assert names(4) == ["v1", "v2", "v3"]
    assert names(1000) == ["v1", "v2", "v3"]
    assert [t["createEventId"] for t in c.valid_list(0)] == [1, 2, 4]


# -- SUB -----------------------------------------------------------------------------------


@pytest.fixture
def history(client, shared):
    """A topic 'hist' with 9 messages whose eventIds have gaps (another topic's messages
    in between); returns (client, list of (eventId, body))."""
    name = "hist-" + unique_who("t").decode()
    client.create(name)
    client.create(name + "-other")
    for i in range(3):
        client.publish(name, [f"m{3 * i}".encode(), f"m{3 * i + 1}".encode()])
        client.publish(name + "-other", [b"noise"])
        client.publish(name, [f"m{3 * i + 2}".encode()])
    got = read_topic(shared, name, count=9)
    ids = [m.event_id for m in got]
    assert ids == sorted(set(ids))
    assert [m.body for m in got] == [f"m{i}".encode() for i in range(9)]
    return name, [(m.event_id, m.body) for m in got]


def test_sub_from_zero_and_resume_after_exact_event_id(client, history, shared):
    """SUB 0 reads everything; SUB after any message's eventId resumes right after it,
    with no duplicate and no gap."""
    name, all_msgs = history
    server = shared
    for k, (eid, _) in enumerate(all_msgs):
        got = read_topic(server, name, after=eid, count=len(all_msgs) - k - 1, settle=0.05)
        assert [(m.event_id, m.body) for m in got] == all_msgs[k + 1 :]


def test_sub_event_id_not_in_topic(client, history):
    """SUB with an eventId below the topic's first message gets "can't find event id";
    one above the last, or one of another topic inside its range, gets 'EOF'; the
    connection stays usable."""
    name, all_msgs = history
    first, last = all_msgs[0][0], all_msgs[-1][0]
    other_topic_id = next(
        e for e in range(first, last) if e not in {eid for eid, _ in all_msgs}
    )
    cases = [
        (first - 1, "can't find event id"),
        (topic_event_id(client, name), "can't find event id"),
        (-5, "can't find event id"),
        (last + 1, "EOF"),
        (last + 10_000, "EOF"),
        (other_topic_id, "EOF"),
    ]
    for eid, text in cases:
        sub = client.subscribe(name, eid, who=b"same-who")
        assert err_of(sub.next_batch, 5.0) == text, eid
        assert alive_ok(client)


def test_sub_on_never_published_topic_accepts_any_event_id(client, shared):
    """A topic that never had a message accepts any eventId and delivers the first
    message published afterwards."""
    client.create("virgin")
    server = shared
    for eid in (0, 1, 999_999, -3):
        with connect(server) as sc:
            sub = sc.subscribe("virgin", eid, who=unique_who())
            with pytest.raises(TimeoutError):
                next_data(sub, 0.4)  # accepted: no ERR, only ALIVEs
    with connect(server) as sc:
        sub = sc.subscribe("virgin", 123_456, who=unique_who())
        with pytest.raises(TimeoutError):
            next_data(sub, 0.4)
        client.publish("virgin", [b"first"])
        ev = next_data(sub, 5.0)
        assert [m.body for m in ev.messages] == [b"first"]


def test_sub_who_is_exclusive_while_live(client, shared):
    """A second live SUB with the same (topic, who) gets '<who> regiester exist'; another
    who is fine; once the first goes away the who is free again."""
    client.create("excl")
    client.publish("excl", [b"x"])
    server = shared
    first = connect(server)
    try:
        sub1 = first.subscribe("excl", 0, who=b"g1")
        assert isinstance(next_data(sub1, 5.0), Batch)
        sub1.ack()
        with connect(server) as c2:
            sub2 = c2.subscribe("excl", 0, who=b"g1")
            assert err_of(sub2.next_batch, 5.0) == "g1 regiester exist"
            assert alive_ok(c2)
            sub3 = c2.subscribe("excl", 0, who=b"g2")
            assert [m.body for m in next_data(sub3, 5.0).messages] == [b"x"]
        with connect(server) as c4:  # an empty who is one more group
            sub4 = c4.subscribe("excl", 0, who=b"")
            assert isinstance(next_data(sub4, 5.0), Batch)
    finally:
        first.close()

    def free():
        with connect(server) as c5:
            sub5 = c5.subscribe("excl", 0, who=b"g1")
            try:
                return isinstance(next_data(sub5, 5.0), Batch)
            except SmssError:
                return False

    wait_until(free, 5.0, "the who to be released after its connection closed")


@pytest.mark.parametrize("batch, sizes", [(0, [1] * 7), (1, [1] * 7), (3, [3, 3, 1]), (255, [7])])
def test_sub_batch_sizes(client, batch, sizes, shared):
    """A SUB's batch size caps each pushed batch (0 counts as 1)."""
    name = f"batches-{batch}"
    client.create(name)
    client.publish(name, [f"b{i}".encode() for i in range(4)])
    client.publish(name, [f"b{i}".encode() for i in range(4, 7)])
    with connect(shared) as sc:
        sub = sc.subscribe(name, 0, batch=batch, who=unique_who())
        seen, bodies = [], []
        while sum(seen) < 7:
            ev = next_data(sub, 5.0)
            seen.append(len(ev.messages))
            bodies += [m.body for m in ev.messages]
            sub.ack()
    assert seen == sizes
    assert bodies == [f"b{i}".encode() for i in range(7)]


def test_sub_gets_alive_while_idle(client, shared):
    """An idle subscription gets ALIVE every timeout.server.alive ms, and then the next
    message as usual."""
    client.create("idle")
    with connect(shared) as sc:
        sub = sc.subscribe("idle", 0, who=unique_who())
        start = time.monotonic()
        assert isinstance(sub.next_batch(5.0), AliveResponse)
        assert isinstance(sub.next_batch(5.0), AliveResponse)
        assert time.monotonic() - start >= 2 * ALIVE_MS / 1000 - 0.05
        client.publish("idle", [b"wake"])
        ev = next_data(sub, 5.0)
        assert [m.body for m in ev.messages] == [b"wake"]
        sub.ack()
        assert isinstance(sub.next_batch(5.0), AliveResponse)


def test_sub_ack_timeout_closes_connection(client, shared):
    """A batch not acked within the ack timeout closes the connection and frees the who;
    a new SUB gets the same message again."""
    client.create("noack")
    client.publish("noack", [b"unacked"])
    server = shared
    with connect(server) as sc:
        start = time.monotonic()  # before the SUB, so the bound below holds under load
        sub = sc.subscribe("noack", 0, ack_timeout_ms=500, who=b"slow")
        ev = next_data(sub, 5.0)
        eid = ev.messages[0].event_id
        with pytest.raises(ConnectionError):
            sc.read_response("sub", timeout=5.0)
        assert time.monotonic() - start >= 0.5 - 0.005
    got = read_topic(server, "noack", count=1, who=b"slow")
    assert [(m.event_id, m.body) for m in got] == [(eid, b"unacked")]


def test_sub_ack_timeout_counts_from_each_batch(client, shared):
    """The ack timeout runs from the batch being acked, not from the first batch: slow
    acks inside the timeout keep the stream open past it, and a later unacked batch
    still closes the connection."""
    client.create("slowack")
    client.publish("slowack", [b"m%d" % i for i in range(5)])
    with connect(shared) as sc:
        sub = sc.subscribe("slowack", 0, batch=1, ack_timeout_ms=600, who=b"slowacker")
        bodies = []
        for _ in range(4):  # 4 x 0.3 s: twice the timeout in all, each ack inside it
            ev = next_data(sub, 5.0)
            bodies += [m.body for m in ev.messages]
            time.sleep(0.3)  # a slow consumer: the duration under test, not an ordering
            sub.ack()
        assert bodies == [b"m0", b"m1", b"m2", b"m3"]
        ev = next_data(sub, 5.0)
        assert [m.body for m in ev.messages] == [b"m4"]
        start = time.monotonic()
        with pytest.raises(ConnectionError):
            sc.read_response("sub", timeout=5.0)
        assert time.monotonic() - start < 5.0


def test_sub_ack_and_end_returns_connection_to_requests(client, shared):
    """After ACK-and-end the same connection takes requests at once, including a new SUB
    resuming after the last eventId read."""
    client.create("ackend")
    client.publish("ackend", [b"one", b"two"])
    with connect(shared) as sc:
        sub = sc.subscribe("ackend", 0, batch=10, who=b"ender")
        ev = next_data(sub, 5.0)
        last = ev.messages[-1].event_id
        sub.ack_end()
        assert alive_ok(sc)
        sc.publish("ackend", [b"three"])
        assert sc.topic_info("ackend")["name"] == "ackend"
        sub = sc.subscribe("ackend", last, who=b"ender")
        ev = next_data(sub, 5.0)
        assert [m.body for m in ev.messages] == [b"three"]
        sub.ack_end()
        # Pipelined: ACK-and-end and a request in one write.
        sub = sc.subscribe("ackend", last, who=b"ender")
        next_data(sub, 5.0)
        sub._pending = False
        sub._finish()
        sc.send_raw(cc.encode_ack(1) + cc.encode_alive())
        assert isinstance(sc.read_response(), AliveResponse)


def test_delete_sends_subend_to_every_subscriber_without_stalling_writes(client, shared):
    """DELETE of a topic with 3 live subscribers (one with a batch waiting for its ack)
    sends SUBEND to all 3, while a 4th connection keeps publishing to another topic."""
    server = shared
    client.create("fanout")
    client.create("busy")
    client.publish("fanout", [b"x"])
    subs = []
    stop = threading.Event()
    done = []  # (start, end) of each PUB to 'busy'
    failure = []

    def publisher():
        try:
            with connect(server, timeout=5.0) as pc:
                i = 0
                while not stop.is_set():
                    t0 = time.monotonic()
                    pc.publish("busy", [f"p{i}".encode()])
                    done.append((t0, time.monotonic()))
                    i += 1
        except Exception as e:  # reported by the main thread
            failure.append(e)

    conns = [connect(server) for _ in range(3)]
    thread = threading.Thread(target=publisher, daemon=True)
    try:
        for i, sc in enumerate(conns):
            sub = sc.subscribe("fanout", 0, who=f"w{i}".encode(), ack_timeout_ms=20_000)
            assert isinstance(next_data(sub, 5.0), Batch)
            if i < 2:
                sub.ack()  # idle; the third one still owes its ack
            subs.append(sub)
        thread.start()
        wait_until(lambda: len(done) >= 5 or failure, 10.0, "the publisher to get going")
        deleted_at = time.monotonic()
        client.delete("fanout")
        for i, (sc, sub) in enumerate(zip(conns, subs)):
            if i < 2:
                assert isinstance(next_data(sub, 5.0), SubEnd)
            else:
                ev = sc.read_response("sub", timeout=5.0)
                while isinstance(ev, AliveResponse):
                    ev = sc.read_response("sub", timeout=5.0)
                assert isinstance(ev, SubEnd)
                sub._finish()
        wait_until(
            lambda: sum(1 for t0, _ in done if t0 > deleted_at) >= 20 or failure,
            10.0, "publishes after the DELETE",
        )
        stop.set()
        thread.join(10)
        assert not failure, failure
        assert max(t1 - t0 for t0, t1 in done) < 2.0
        # SUBEND ends sub mode: the connections take requests again.
        for sc in conns:
            assert alive_ok(sc)
        # The claims are gone: the same who can subscribe to a re-created topic.
        client.create("fanout")
        sub = conns[0].subscribe("fanout", 0, who=b"w0")
        with pytest.raises(TimeoutError):
            next_data(sub, 0.4)
    finally:
        stop.set()
        for sc in conns:
            sc.close()
        thread.join(10)


def test_topic_lifetime_expiry_sends_subend(client, shared):
    """A topic created with expireAt = now + 10.5 s is deleted when it expires: its
    subscribers get SUBEND and it is gone from TOPIC INFO and LIST."""
    server = shared
    expire = now_ms() + 10_500
    client.create("shortlived", expire_at=expire)
    client.publish("shortlived", [b"before expiry"])
    conns = [connect(server, timeout=15.0) for _ in range(2)]
    try:
        subs = [sc.subscribe("shortlived", 0, who=f"life{i}".encode()) for i, sc in enumerate(conns)]
        ev = next_data(subs[0], 5.0)
        assert [m.body for m in ev.messages] == [b"before expiry"]
        subs[0].ack()
        for sub in subs:
            if sub is not subs[0]:
                next_data(sub, 5.0)
                sub.ack()
        for sub in subs:
            assert isinstance(next_data(sub, 15.0), SubEnd)
        assert now_ms() >= expire - 5
    finally:
        for sc in conns:
            sc.close()
    assert err_of(client.topic_info, "shortlived") == "topic not exist"
    assert "shortlived" not in [t["name"] for t in client.list()]
    assert err_of(client.publish, "shortlived", [b"late"]) == "topic not exist"


# -- unknown commands ----------------------------------------------------------------------


@pytest.mark.parametrize("code", [4, 5, 18, 101, 102])
def test_unknown_command_codes(client, code):
    """Unknown codes (and DelayApply, 101, which is internal) get "don't support action",
    and the connection stays usable."""
    client.send_raw(cc.encode_request(code, topic=b"some-topic", trace=b"tr"))
    assert client.read_response() == ErrResponse("don't support action")
    client.send_raw(cc.encode_request(code) + cc.encode_alive())
    assert client.read_response() == ErrResponse("don't support action")
    assert isinstance(client.read_response(), AliveResponse)
    assert isinstance(client.list(), list)


# -- pipelining ----------------------------------------------------------------------------


def test_pipelined_pubs_at_flush_level_2_are_answered_in_order_without_stalling(server_factory):
    """4000 PUBs pipelined in one write at flush level 2 (answers wait for fsync) are all
    answered OK, in order, within a bound, and stored in order."""
    server = server_factory(config={"store": {"flushLevel": 2}, **SHARED_CONFIG})
    n = 4000
    with connect(server) as a, connect(server) as b:
        a.create("piped")
        a.send_raw(b"".join(cc.encode_pub("piped", encode_payload([b"p%d" % i])) for i in range(n)))
        start = time.monotonic()
        assert alive_ok(b)  # another connection is served meanwhile
        for i in range(n):
            assert a.read_response(timeout=10.0) == OkResponse(None), i
        # Unbounded bookkeeping per answer made this take tens of seconds (quadratic).
        assert time.monotonic() - start < 10.0
        assert alive_ok(a)
    got = read_topic(server, "piped", count=n, timeout=20.0)
    assert [m.body for m in got] == [b"p%d" % i for i in range(n)]
    assert [m.event_id for m in got] == list(range(2, 2 + n))
