"""The usual PULL in short (BrokerProtocol._usual_pull) against the general pull path
(BrokerProtocol._any_pull): the same answers, byte for byte, the same offsets committed
and the same statistics, over pulls answered at once, parked then answered by a SEND,
parked then timed out, and parked on a connection that closes; the pull answer's
template against the general encoder; and the long polls' one timer on a Clock."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.python.failure import Failure

from protocols.remoting import codes
from protocols.remoting.pull_handlers import _GENERAL, make_pull_response
from protocols.remoting.codec import encode, encode_pull_answer, encode_response
from protocols.remoting.longpolls import EARLY
from protocols.remoting.messages import RemotingCommand
from protocols.remoting.pulling import PullResult

from tests.unit.test_rocketmq_door import Door

#: (name, queues, perm, expire_at, read queues)
TOPICS = [("T4", 4, 6, 0, 4), ("R2", 4, 6, 0, 2), ("RO", 2, 4, 0, 2), ("WO", 2, 2, 0, 2),
          ("Exp", 2, 6, 2_000_000_000_000, 2), ("R6", 2, 6, 0, 6), ("Gone", 1, 6, 1, 1),
          ("Dead", 1, 6, 0, 1)]
#: What the heartbeat says the group G subscribes to, with which subVersion.
HEARTBEAT_SUBS = {"T4": ("A||B", 100), "RO": ("*", 100), "Exp": ("*", -5)}
TAGS = ("A", "B", "C")


def _door(path):
    d = Door(path)
    for name, queues, perm, expire_at, read in TOPICS:
        d.create_topic(name, queues, perm, expire_at, read, queues)
    # a deleted topic the registry still held would be refused as a missing one
    d.broker.registry.topics["Dead"].state = 1
    d.hb_conn = d.connect()
    body = json.dumps({"clientID": "c1", "producerDataSet": [], "consumerDataSet": [{
        "groupName": "G", "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
        "subscriptionDataSet": [{"topic": t, "subString": s, "tagsSet": [], "codeSet": [], "subVersion": v}
                                for t, (s, v) in HEARTBEAT_SUBS.items()]}]}).encode()
    assert d.call(codes.HEART_BEAT, {}, body, d.hb_conn).code == codes.SUCCESS
    d.producer = d.connect()
    return d


@pytest.fixture
def doors(tmp_path):
    fast, general = _door(tmp_path / "fast"), _door(tmp_path / "general")
    general.conn.pull = general.conn._any_pull  # every pull through the general path
    yield fast, general
    fast.close()
    general.close()


#: The C++ push consumer's usual pull (sysFlag 6: suspend, subscription), as strings;
#: queueOffset is set by each test.
USUAL = {"consumerGroup": "G", "topic": "T4", "queueId": "0", "queueOffset": "0", "maxMsgNums": "32",
         "sysFlag": "6", "commitOffset": "-1", "suspendTimeoutMillis": "15000", "subscription": "*",
         "subVersion": "100"}

#: Values a field may take instead (None: left out).
CHANGES = {
    "topic": ("R2", "RO", "WO", "Exp", "R6", "Gone", "Dead", "Missing", "", None),
    "consumerGroup": ("G2", "bad group", "", None),
    "queueId": ("1", "3", "4", "5", "-1", "x", " 1", "", None),
    "queueOffset": ("1", "2", "3", "5", "-1", "x", "", None),
    "maxMsgNums": ("1", "0", "2", "x", "", None),
    "sysFlag": ("0", "1", "2", "3", "4", "5", "7", "x", "", None),
    "commitOffset": ("0", "2", "x", "", None),
    "suspendTimeoutMillis": ("0", "1000", "90000", "x", "", None),
    "subscription": ("A", "A||B", "B || C", "*", "", " ", None),
    "subVersion": ("0", "99", "101", "x", "", None),
}

#: Changes of more than one field: the subscription from the heartbeat (sysFlag without
#: 4), and the commit offset (sysFlag with 1).
COMBOS = [{"sysFlag": "2", "subVersion": "101"}, {"sysFlag": "2", "subVersion": "x"},
          {"sysFlag": "2", "topic": "Exp"}, {"sysFlag": "2", "topic": "Exp", "subVersion": None},
          {"sysFlag": "2", "topic": "R2"}, {"sysFlag": "3", "commitOffset": "x"},
          {"sysFlag": "7", "commitOffset": "x"}, {"sysFlag": "7", "commitOffset": "3"},
          {"sysFlag": "7", "commitOffset": ""}, {"sysFlag": "6", "suspendTimeoutMillis": "x"},
          {"sysFlag": "2", "consumerGroup": "G2"}]

pull_headers = st.lists(
    st.one_of([st.tuples(st.just(k), st.sampled_from(v)) for k, v in CHANGES.items()]), max_size=3,
).map(lambda changes: {k: v for k, v in {**USUAL, **dict(changes)}.items() if v is not None})


def _command(d, code, ext, body=b"", serialize_type=codes.SERIALIZE_JSON):
    d.opaque += 1
    return encode(RemotingCommand(code=code, language="CPP", version=63, opaque=d.opaque,
                                  ext_fields=ext, body=body, serialize_type=serialize_type))


def _answers(doors, attr):
    out = []
    for d in doors:
        conn = getattr(d, attr)
        out.append(conn.transport.value())
        conn.transport.clear()
    assert out[0] == out[1]
    return out[0]


def pull_both(doors, ext, serialize_type=codes.SERIALIZE_JSON):
    """Send one PULL to both doors' consumer connections; assert they answer alike (now:
    the answer, or nothing while it is parked)."""
    for d in doors:
        d.conn.dataReceived(_command(d, codes.PULL_MESSAGE, ext, serialize_type=serialize_type))
    return _answers(doors, "conn")


def send_both(doors, topic, qid, tag):
    """Send one message to both doors (another connection); assert the parked pulls they
    answered are alike."""
    for d in doors:
        send_one(d, topic, qid, tag)
    return _answers(doors, "conn")


def send_one(d, topic, qid, tag):
    ext = {"producerGroup": "PG", "topic": topic, "queueId": str(qid), "sysFlag": "0", "bornTimestamp": "1",
           "flag": "0", "reconsumeTimes": "0", "properties": f"TAGS\x01{tag}\x02"}
    return d.call(codes.SEND_MESSAGE, ext, b"m", d.producer).code


def advance_both(doors, seconds):
    for d in doors:
        d.clock.advance(seconds)
    return _answers(doors, "conn")


def reconnect_both(doors):
    """Close both consumer connections (their parked pulls with them) and open new ones."""
    for d in doors:
        old = d.conn
        old.connectionLost(Failure(ConnectionError("closed")))
        d.conn = d.connect()
        if d is doors[1]:
            d.conn.pull = d.conn._any_pull


def assert_same_state(doors):
    fast, general = doors
    assert fast.broker.offsets.table == general.broker.offsets.table
    assert fast.broker.stats.counts() == general.broker.stats.counts()
    pulled = [{k: c.pulled for k, c in d.broker.stats.consumers.items()} for d in doors]
    assert pulled[0] == pulled[1]
    assert ({k: len(v) for k, v in fast.door.polls.holds.items()}
            == {k: len(v) for k, v in general.door.polls.holds.items()})


def _fill(doors):
    for i, tag in enumerate(("A", "B", "C", "A")):
        send_both(doors, "T4", 0, tag)
        send_both(doors, "Exp", 0, tag)
        send_both(doors, "R2", 3, tag)


def test_each_change_of_the_usual_pull_answers_as_the_general_path(doors):
    """The usual header, then every field changed in turn to each value that may take a
    pull off the short path; each parked pull is then answered by a message or its time."""
    _fill(doors)
    changes = [{}] + [{name: value} for name, values in CHANGES.items() for value in values] + COMBOS
    for change in changes:
        for offset in ("0", "2", "4"):
            ext = {k: v for k, v in {**USUAL, "queueOffset": offset, **change}.items() if v is not None}
            pull_both(doors, ext)
            pull_both(doors, ext, codes.SERIALIZE_ROCKETMQ)
        assert_same_state(doors)
    send_both(doors, "T4", 0, "B")
    advance_both(doors, 100)
    assert_same_state(doors)
    assert not doors[0].door.polls.holds


ops = st.one_of(
    st.tuples(st.just("pull"), pull_headers, st.sampled_from([codes.SERIALIZE_JSON, codes.SERIALIZE_ROCKETMQ])),
    st.tuples(st.just("send"), st.sampled_from(["T4", "R2", "Exp", "RO"]), st.integers(0, 3),
              st.sampled_from(TAGS)),
    st.tuples(st.just("advance"), st.sampled_from([0.5, 1, 14.9, 15, 30, 100])),
    st.tuples(st.just("close")),
)


@given(st.lists(ops, min_size=1, max_size=12))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_usual_pull_answers_commits_and_counts_as_the_general_path(doors, program):
    """Mixes of pulls (held or not), sends that answer held pulls, the clock passing their
    deadlines, and the consumer's connection closing while pulls are held."""
    for op in program:
        if op[0] == "pull":
            pull_both(doors, op[1], op[2])
        elif op[0] == "send":
            send_both(doors, op[1], op[2] % 2 if op[1] != "T4" else op[2], op[3])
        elif op[0] == "advance":
            advance_both(doors, op[1])
        else:
            reconnect_both(doors)
        assert_same_state(doors)


@pytest.mark.parametrize("sys_flag, extra", [
    ("6", {}), ("7", {"commitOffset": "1"}), ("2", {"subVersion": "100"}), ("4", {}),
    ("6", {"subscription": "A||B"}), ("3", {"subVersion": ""}),
])
def test_the_usual_pull_takes_the_short_path(doors, sys_flag, extra):
    """The C++ client's usual pulls (and the Java push consumer's, subscription from the
    heartbeat) do not reach the general path."""
    fast, _ = doors

    def general(cmd):
        raise AssertionError("the general path served the usual pull")

    fast.conn._any_pull = general
    send_both(doors, "T4", 0, "A")
    r = fast.call(codes.PULL_MESSAGE, {**USUAL, "sysFlag": sys_flag, **extra})
    assert r.code == codes.SUCCESS and r.ext_fields["nextBeginOffset"] == "1"


def test_a_parked_pull_costs_no_deferred_and_no_timer_of_its_own(doors):
    fast, _ = doors
    send_both(doors, "T4", 0, "A")
    timers = len(fast.clock.getDelayedCalls())
    for i in range(20):
        cmd = RemotingCommand(code=codes.PULL_MESSAGE, opaque=100 + i, ext_fields=dict(USUAL, queueOffset="1"))
        assert fast.conn.pull(cmd) is None  # parked: answered later by the connection
    assert len(fast.clock.getDelayedCalls()) <= timers + 1
    assert len(fast.door.polls.holds[("T4", 0)]) == 20


def test_held_pulls_are_answered_at_their_own_deadlines(doors):
    """Pulls parked for 15 s, then 3 s, then 9 s: each is answered with PULL_NOT_FOUND
    at its own time (the timer moves earlier for the shorter one)."""
    fast, _ = doors
    for ms, opaque in (("15000", 1), ("3000", 2), ("9000", 3)):
        cmd = RemotingCommand(code=codes.PULL_MESSAGE, opaque=opaque,
                              ext_fields=dict(USUAL, suspendTimeoutMillis=ms))
        fast.conn._command(cmd)
        fast.clock.advance(1)
    answered = []
    for _ in range(120):
        fast.clock.advance(0.125)  # exact in binary: the clock hits each deadline exactly
        for c in fast.received():
            answered.append((c.opaque, fast.clock.seconds() - 1_700_000_000))
            assert c.code == codes.PULL_NOT_FOUND
    # parked at 0, 1 and 2 s
    assert [o for o, _ in answered] == [2, 3, 1]
    assert [t for _, t in answered] == [4.0, 11.0, 15.0]
    assert not fast.door.polls.holds


def test_a_pull_is_not_answered_before_its_deadline(doors):
    fast, _ = doors
    fast.conn._command(RemotingCommand(code=codes.PULL_MESSAGE, opaque=1, ext_fields=dict(USUAL)))
    fast.clock.advance(15 - 2 * EARLY)
    assert fast.received() == []
    fast.clock.advance(2 * EARLY)
    assert [c.code for c in fast.received()] == [codes.PULL_NOT_FOUND]


def test_a_closed_connection_drops_its_held_pulls(doors):
    """Nothing is answered or counted for a pull whose connection closed while it was held."""
    fast, _ = doors
    fast.conn._command(RemotingCommand(code=codes.PULL_MESSAGE, opaque=1, ext_fields=dict(USUAL)))
    assert fast.door.polls.holds
    fast.conn.connectionLost(Failure(ConnectionError("closed")))
    assert not fast.door.polls.holds
    send_one(fast, "T4", 0, "A")
    assert fast.broker.stats.group("G", "T4").pulled == {}


def test_a_failing_parked_pull_is_answered_with_system_error(doors):
    fast, _ = doors
    fast.conn._command(RemotingCommand(code=codes.PULL_MESSAGE, opaque=1, ext_fields=dict(USUAL)))

    def broken(hold, final):
        raise RuntimeError("boom")

    fast.conn.finish_pull = broken
    send_one(fast, "T4", 0, "A")
    fast.clock.advance(0.001)  # the long-poll batch
    (r,) = fast.received()
    assert (r.opaque, r.code, r.remark) == (1, codes.SYSTEM_ERROR, "boom")
    assert not fast.door.polls.holds


def test_short_path_leaves_what_it_does_not_serve(doors):
    fast, _ = doors
    ext = dict(USUAL, topic="R6", queueId="3")  # below the read queues, not the queue count
    assert fast.conn._usual_pull(RemotingCommand(code=codes.PULL_MESSAGE, ext_fields=ext), ext) is _GENERAL


# -- the pull answer's template --------------------------------------------------------


@given(st.integers(-(2**31), 2**31 - 1), st.sampled_from(
           [codes.SUCCESS, codes.PULL_NOT_FOUND, codes.PULL_OFFSET_MOVED, codes.PULL_RETRY_IMMEDIATELY, 7]),
       st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1), st.binary(max_size=50),
       st.one_of(st.none(), st.sampled_from(["FOUND", "OFFSET_OVERFLOW_ONE", "NO_MATCHED_MESSAGE"]),
                 st.text(max_size=8)),
       st.sampled_from([codes.SERIALIZE_JSON, codes.SERIALIZE_ROCKETMQ]))
@settings(max_examples=400)
def test_pull_answer_template_gives_the_bytes_of_the_general_answer(opaque, code, nxt, lo, hi, body, remark,
                                                                   serialize_type):
    request = RemotingCommand(code=codes.PULL_MESSAGE, opaque=opaque, serialize_type=serialize_type)
    r = PullResult(code, nxt, lo, hi, body, 1, remark)
    expected = encode_response(request, code, {
        "suggestWhichBrokerId": "0", "nextBeginOffset": str(nxt), "minOffset": str(lo),
        "maxOffset": str(hi)}, body, remark)
    assert encode_pull_answer(request, code, nxt, lo, hi, body, remark) == expected
    assert make_pull_response(request, r) == expected


def test_a_parked_pull_that_still_finds_nothing_stays_parked(doors):
    """An arrival whose message a parked pull cannot read yet (flush level 2) leaves it
    parked, behind the pulls parked meanwhile, until it is answered."""
    fast, _ = doors
    polls = fast.door.polls
    runs = []

    class Waiting:
        def __init__(self, name, misses):
            self.name, self.misses = name, misses

        def finish_pull(self, hold, final):
            runs.append(self.name)
            if self.misses and not final:
                self.misses -= 1
                if self.name == "a":  # a pull parked while the arrival is handled
                    polls.park(Waiting("c", 0), None, ("T4", 0), 1000)
                return False
            return True

    polls.park(Waiting("a", 1), None, ("T4", 0), 1000)
    polls.park(Waiting("b", 0), None, ("T4", 0), 1000)
    fast.clock.advance(0.002)  # parked longer than the long-poll batch: run at arrivals
    polls.data_available("T4", 0)
    assert runs == ["a", "b"]
    assert [h.protocol.name for h in polls.holds[("T4", 0)]] == ["a", "c"]
    fast.clock.advance(0.002)
    polls.data_available("T4", 0)
    assert runs == ["a", "b", "a", "c"] and not polls.holds
