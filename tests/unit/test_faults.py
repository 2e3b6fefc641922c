"""Fault rules: the core registry (matching, every Nth, uses, expiry, refusals) and what
the RocketMQ broker and nsqd TCP doors do with a rule, in process (StringTransport,
a MemoryReactorClock, a real store)."""

import struct

import pytest
from twisted.internet.task import Clock

from mqserver.faults import FaultRules
from protocols.nsq.factory import make_factory as nsqd_factory
from protocols.nsq.frames import FrameReader
from protocols.remoting import codes
from protocols.remoting.broker_door import make_factory as broker_factory
from protocols.remoting.codec import encode
from protocols.remoting.framing import FrameDecoder
from protocols.remoting.messages import RemotingCommand
from tests.support.inprocess import running

# -- the registry -------------------------------------------------------------------------


@pytest.fixture
def rules():
    clock = Clock()
    r = FaultRules(clock.seconds)
    r.door("broker", lambda rule: None)
    r.clock = clock
    return r


def names(command):
    return (command,)


def test_a_rule_ends_after_its_uses(rules):
    """times=2: two matching requests get it, the third does not; the registry is off
    again once no rule is left."""
    rules.add({"door": "broker", "command": "10", "respond": "2", "times": 2})
    assert rules.active
    got = [rules.match("broker", 1, "127.0.0.1", 5000, names("10")) for _ in range(3)]
    assert [r is not None for r in got] == [True, True, False]
    assert not rules.active and rules.list() == []
    assert rules.applied_total == {("broker", "respond"): 2}


def test_other_doors_commands_connections_and_addresses_do_not_match(rules):
    rules.door("nsqd_tcp", lambda rule: None)
    rules.add({"door": "broker", "command": "10", "conn": 3, "address": "127.0.0.1", "drop": True})
    assert rules.match("nsqd_tcp", 3, "127.0.0.1", 1, names("10")) is None
    assert rules.match("broker", 3, "127.0.0.1", 1, names("11")) is None
    assert rules.match("broker", 4, "127.0.0.1", 1, names("10")) is None
    assert rules.match("broker", 3, "10.0.0.1", 1, names("10")) is None
    assert rules.match("broker", 3, "127.0.0.1", 1, names("10")).action == "drop"
    rules.clear()
    rules.add({"door": "broker", "address": "127.0.0.1:7", "close": True})
    assert rules.match("broker", 1, "127.0.0.1", 8, names("34")) is None
    assert rules.match("broker", 1, "127.0.0.1", 7, names("34")).action == "close"


def test_every_nth_match(rules):
    """every=3: the 3rd, 6th, ... matching requests; the counts say so."""
    rules.add({"door": "broker", "command": "PULL_MESSAGE", "every": 3, "close": True})
    hits = [rules.match("broker", 1, "h", 1, ("11", "PULL_MESSAGE")) is not None
            for _ in range(7)]
    assert hits == [False, False, True, False, False, True, False]
    (r,) = rules.list()
    assert (r["matched"], r["applied"]) == (7, 2)


def test_a_rule_expires_after_its_seconds(rules):
    rules.add({"door": "broker", "delay": 1.5, "seconds": 10})
    rules.clock.advance(9.9)
    assert rules.match("broker", 1, "h", 1, names("10")).value == 1.5
    assert rules.list()[0]["seconds_left"] == pytest.approx(0.1)
    rules.clock.advance(0.1)
    assert rules.match("broker", 1, "h", 1, names("10")) is None
    assert not rules.active


@pytest.mark.parametrize("spec, text", [
    ({"door": "brokr", "drop": True}, "no front door 'brokr' takes fault rules (these do: broker)"),
    ({"door": "broker"}, "give exactly one action"),
    ({"door": "broker", "drop": True, "close": True}, "give exactly one action"),
    ({"door": "broker", "drop": True, "times": 0}, "times must be an integer >= 1"),
    ({"door": "broker", "drop": True, "every": "2"}, "every must be an integer >= 1"),
    ({"door": "broker", "drop": True, "seconds": 0}, "seconds must be a number of seconds > 0"),
    ({"door": "broker", "delay": -1}, "delay must be a number of seconds >= 0"),
    ({"door": "broker", "drop": True, "color": "red"}, "unknown rule field(s): color"),
    ([1], "a rule is a JSON object"),
])
def test_bad_rules_are_refused(rules, spec, text):
    with pytest.raises(ValueError) as e:
        rules.add(spec)
    assert str(e.value).startswith(text)
    assert not rules.active


# -- the RocketMQ broker door -------------------------------------------------------------


@pytest.fixture
def rmq(tmp_path):
    with running(tmp_path / "data", broker_factory) as n:
        yield n


class RemotingClient:
    """A client connection to a remoting door in process."""

    def __init__(self, node):
        self.conn = node.connect(node.factory)
        self.decoder = FrameDecoder()
        self.opaque = 0

    def send(self, code, ext=None, body=b""):
        self.opaque += 1
        cmd = RemotingCommand(code=code, language="JAVA", version=401, opaque=self.opaque,
                              ext_fields={k: str(v) for k, v in (ext or {}).items()}, body=body)
        self.conn.send(encode(cmd))
        return self.opaque

    def answers(self):
        return self.decoder.feed(self.conn.take())

    def send_message(self, topic="FT", body=b"m"):
        return self.send(codes.SEND_MESSAGE, {
            "producerGroup": "PG", "topic": topic, "defaultTopic": "TBW102",
            "defaultTopicQueueNums": 4, "queueId": 0, "sysFlag": 0, "bornTimestamp": 1,
            "flag": 0, "properties": "", "reconsumeTimes": 0}, body)


def test_rocketmq_respond_answers_the_code_once(rmq):
    """The issue's rule: the next SEND_MESSAGE answers SYSTEM_BUSY (code 2) with a remark
    and its opaque, and nothing is stored; the next one SEND_OK."""
    c = RemotingClient(rmq)
    c.send_message()  # creates the topic
    assert c.answers()[0].code == codes.SUCCESS
    rmq.broker.wiretap.faults.add({"door": "broker", "command": "10", "respond": "2", "times": 1})
    op = c.send_message()
    (busy,) = c.answers()
    assert (busy.code, busy.opaque, busy.flag) == (codes.SYSTEM_BUSY, op, codes.FLAG_RESPONSE)
    assert busy.remark == "[FAULT] rule 1: SYSTEM_BUSY injected by mqserver"
    assert rmq.store.queue("FT", 0).max_offset == 1
    op = c.send_message()
    (ok,) = c.answers()
    assert (ok.code, ok.opaque) == (codes.SUCCESS, op)
    assert rmq.store.queue("FT", 0).max_offset == 2
    assert not rmq.broker.wiretap.active


def test_rocketmq_respond_by_names_leaves_other_requests_alone(rmq):
    """A rule naming SEND_MESSAGE and TOPIC_NOT_EXIST, with its own remark: heartbeats
    go on as usual."""
    c = RemotingClient(rmq)
    rmq.broker.wiretap.faults.add({"door": "broker", "command": "SEND_MESSAGE",
                                   "respond": "topic_not_exist", "remark": "no route"})
    c.send(codes.HEART_BEAT, body=b'{"clientID":"c1","producerDataSet":[],"consumerDataSet":[]}')
    c.send_message()
    hb, sent = c.answers()
    assert hb.code == codes.SUCCESS
    assert (sent.code, sent.remark) == (codes.TOPIC_NOT_EXIST, "no route")


def test_rocketmq_drop_close_and_delay(rmq):
    """drop: no answer, the connection serves on; delay: the answer after the delay;
    close: the connection closes, the request is not served."""
    faults = rmq.broker.wiretap.faults
    c = RemotingClient(rmq)
    faults.add({"door": "broker", "command": "10", "drop": True, "times": 1})
    c.send_message()
    assert c.answers() == [] and c.conn.connected
    faults.add({"door": "broker", "command": "10", "delay": 2, "times": 1})
    op = c.send_message()
    assert c.answers() == []
    rmq.clock.advance(1.9)
    assert c.answers() == []
    rmq.clock.advance(0.1)
    assert [(a.code, a.opaque) for a in c.answers()] == [(codes.SUCCESS, op)]
    faults.add({"door": "broker", "command": "10", "close": True, "times": 1})
    c.send_message()
    assert c.answers() == [] and not c.conn.connected
    assert rmq.store.queue("FT", 0).max_offset == 1  # only the delayed one was stored


def test_rocketmq_rule_for_one_connection(rmq):
    """A rule with the connection id of the first connection the tap saw leaves a
    second connection alone."""
    a, b = RemotingClient(rmq), RemotingClient(rmq)
    faults = rmq.broker.wiretap.faults
    faults.add({"door": "broker", "command": "34", "seconds": 60, "drop": True})
    a.send(codes.HEART_BEAT, body=b"{}")  # the tap numbers a: 1
    faults.clear()
    faults.add({"door": "broker", "conn": rmq.broker.wiretap.conn_id(a.conn.protocol),
                "respond": "SYSTEM_ERROR"})
    a.send_message()
    b.send_message()
    assert [x.code for x in a.answers()] == [codes.SYSTEM_ERROR]
    assert [x.code for x in b.answers()] == [codes.SUCCESS]


def test_rocketmq_door_refuses_what_it_cannot_do(rmq):
    faults = rmq.broker.wiretap.faults
    with pytest.raises(ValueError, match="respond wants a RocketMQ response code"):
        faults.add({"door": "broker", "respond": "E_PUB_FAILED"})


# -- the nsqd TCP door --------------------------------------------------------------------


@pytest.fixture
def nsqd(tmp_path):
    with running(tmp_path / "data", nsqd_factory) as n:
        yield n


def nsq_pub(body):
    return b"PUB t\n" + struct.pack(">I", len(body)) + body


def nsq_connect(node):
    c = node.connect(node.factory)
    c.send(b"  V2")
    return c


def test_nsq_respond_sends_the_error_once(nsqd):
    """The issue's rule: one PUB gets E_PUB_FAILED (the connection stays), the next OK;
    the failed one is not stored."""
    nsqd.broker.wiretap.faults.add({"door": "nsqd_tcp", "command": "PUB",
                                    "respond": "E_PUB_FAILED", "times": 1})
    c = nsq_connect(nsqd)
    c.send(nsq_pub(b"a"))
    c.send(nsq_pub(b"b"))
    assert FrameReader().feed(c.take()) == [
        (1, b"E_PUB_FAILED PUB failed: injected by mqserver fault rule 1"), (0, b"OK")]
    assert c.connected
    assert nsqd.store.queue("t", 0).max_offset == 1


def test_nsq_delay_holds_the_answers_in_order(nsqd):
    """delay: the delayed PUB's OK, and the answers after it, come after the delay."""
    nsqd.broker.wiretap.faults.add({"door": "nsqd_tcp", "command": "PUB", "delay": 1,
                                    "times": 1})
    c = nsq_connect(nsqd)
    c.send(nsq_pub(b"a") + b"NOP\n" + nsq_pub(b"b"))
    assert c.take() == b""
    nsqd.clock.advance(1)
    assert FrameReader().feed(c.take()) == [(0, b"OK"), (0, b"OK")]


def test_nsq_drop_and_close(nsqd):
    faults = nsqd.broker.wiretap.faults
    faults.add({"door": "nsqd_tcp", "command": "PUB", "drop": True, "times": 1})
    c = nsq_connect(nsqd)
    c.send(nsq_pub(b"a") + nsq_pub(b"b"))
    assert FrameReader().feed(c.take()) == [(0, b"OK")]
    faults.add({"door": "nsqd_tcp", "command": "PUB", "close": True, "times": 1})
    c.send(nsq_pub(b"c") + nsq_pub(b"d"))
    assert c.take() == b"" and not c.connected
    assert nsqd.store.queue("t", 0).max_offset == 1


def test_nsq_door_refuses_what_it_cannot_do(nsqd):
    with pytest.raises(ValueError, match="respond wants an nsqd error code"):
        nsqd.broker.wiretap.faults.add({"door": "nsqd_tcp", "respond": "2"})
