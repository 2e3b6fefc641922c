"""Fault rules: the core registry (matching, every Nth, uses, expiry, refusals) and what
the RocketMQ broker and nsqd TCP doors do with a rule, in process (StringTransport,
a MemoryReactorClock, a real store)."""

import io
import json
import struct

import pytest
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web import server
from twisted.web.test.requesthelper import DummyRequest

from mqserver.faults import FaultRules
from protocols.admin.door import AdminResource
from protocols.admin.ctl import load_scenario
from protocols.msgout.door import make_factory as msgout_factory
from protocols.nsq.factory import make_factory as nsqd_factory
from protocols.nsq.http_door import make_factory as nsqd_http_factory
from protocols.nsq.lookupd_http_door import make_factory as lookupd_http_factory
from protocols.nsq.frames import FrameReader
from protocols.remoting import codes
from protocols.remoting.broker_door import make_factory as broker_factory
from protocols.remoting.codec import encode
from protocols.remoting.framing import FrameDecoder
from protocols.remoting.messages import RemotingCommand
from protocols.remoting.namesrv_door import make_factory as namesrv_factory
from protocols.smss import client_codec as cc
from protocols.smss.factory import make_factory as smss_factory
from tests.support.inprocess import running

OK_SMSS = bytes.fromhex("c8000000000000000000")
ALIVE_SMSS = bytes.fromhex("c9000000000000000000")


def err_smss(text):
    return struct.pack("<HH6x", 400, len(text)) + text

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
    op, first = c.conn.protocol, encode(RemotingCommand(code=codes.HEART_BEAT, opaque=90))
    c.send_message()
    assert c.answers() == [] and not c.conn.connected
    assert rmq.store.queue("FT", 0).max_offset == 1  # only the delayed one was stored
    # requests after the closing one, in the same read, are not run either
    c = RemotingClient(rmq)
    faults.add({"door": "broker", "command": "34", "close": True, "times": 1})
    c.conn.send(first + encode(RemotingCommand(code=codes.SEND_MESSAGE, opaque=91, ext_fields={
        "producerGroup": "PG", "topic": "FT", "queueId": "0"}, body=b"late")))
    assert c.answers() == [] and not c.conn.connected
    assert rmq.store.queue("FT", 0).max_offset == 1
    assert op is not c.conn.protocol


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


# -- the smss door ------------------------------------------------------------------------


@pytest.fixture
def smss(tmp_path):
    with running(tmp_path / "data", smss_factory) as n:
        yield n


def smss_pub(topic, body):
    return cc.encode_pub(topic, struct.pack("<II", len(body), 0) + body)


def test_smss_respond_delay_drop_close(smss):
    """respond: an ERR with the rule's text in the request's turn; delay: that answer and
    the ones after it wait; drop: no answer; close: closed, nothing run."""
    faults = smss.broker.wiretap.faults
    c = smss.connect(smss.factory)
    c.send(cc.encode_create(b"s"))
    assert c.take() == OK_SMSS
    faults.add({"door": "smss", "command": "PUB", "respond": "store busy", "times": 1})
    c.send(smss_pub(b"s", b"a") + smss_pub(b"s", b"b"))
    assert c.take() == err_smss(b"store busy") + OK_SMSS
    faults.add({"door": "smss", "command": "1", "delay": 3, "times": 1})
    c.send(smss_pub(b"s", b"c") + cc.encode_alive())
    assert c.take() == b""
    smss.clock.advance(3)
    assert c.take() == OK_SMSS + ALIVE_SMSS
    faults.add({"door": "smss", "command": "ALIVE", "drop": True, "times": 1})
    c.send(cc.encode_alive() + cc.encode_alive())
    assert c.take() == ALIVE_SMSS
    faults.add({"door": "smss", "command": "PUB", "close": True, "times": 1})
    c.send(smss_pub(b"s", b"d"))
    assert c.take() == b"" and not c.connected
    assert smss.store.queue("s", 0).max_offset == 2  # b and c


def test_smss_delayed_sub_starts_after_the_delay(smss):
    """A delayed SUB: the stream starts when the delay ends, with what the topic holds."""
    smss.broker.wiretap.faults.add({"door": "smss", "command": "SUB", "delay": 2, "times": 1})
    c = smss.connect(smss.factory)
    c.send(cc.encode_create(b"s") + smss_pub(b"s", b"x"))
    assert c.take() == OK_SMSS + OK_SMSS
    c.send(cc.encode_sub(b"s", who=b"w1"))
    smss.clock.advance(1.9)
    assert c.take() == b""
    smss.clock.advance(0.1)
    got = cc.ResponseDecoder(cc.Expect.SUB).feed(c.take())
    assert [m.body for b in got for m in b.messages] == [b"x"]
    c.lose()


# -- the HTTP doors -----------------------------------------------------------------------


def http_request(conn, method, path, body=b""):
    conn.send(b"%s %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
              % (method, path, len(body), body))


def http_answer(conn):
    head, _, body = conn.take().partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        chunks = []
        while True:
            size, _, body = body.partition(b"\r\n")
            if not int(size, 16):
                break
            chunks.append(body[:int(size, 16)])
            body = body[int(size, 16) + 2:]
        body = b"".join(chunks)
    return int(head.split(b" ")[1]), json.loads(body) if body.startswith(b"{") else body


@pytest.fixture
def nsqd_http(tmp_path):
    with running(tmp_path / "data", nsqd_http_factory) as n:
        yield n


def test_nsqd_http_respond_delay_drop_close(nsqd_http):
    """nsqd HTTP: respond answers the status with nsqd's JSON error; delay answers later;
    drop never; close closes."""
    node = nsqd_http
    faults = node.broker.wiretap.faults
    c = node.connect(node.factory)
    faults.add({"door": "nsqd_http", "command": "POST /pub", "respond": "503", "times": 1})
    http_request(c, b"POST", b"/pub?topic=h", b"one")
    assert http_answer(c) == (503, {"message": "injected by mqserver fault rule 1"})
    faults.add({"door": "nsqd_http", "command": "/pub", "delay": 1, "times": 1})
    http_request(c, b"POST", b"/pub?topic=h", b"two")
    assert c.take() == b""
    node.clock.advance(1)
    assert http_answer(c) == (200, b"OK")
    faults.add({"door": "nsqd_http", "command": "/ping", "drop": True, "times": 1})
    http_request(c, b"GET", b"/ping")
    assert c.take() == b"" and c.connected
    c.lose()
    c = node.connect(node.factory)
    faults.add({"door": "nsqd_http", "command": "/pub", "close": True, "times": 1})
    http_request(c, b"POST", b"/pub?topic=h", b"three")
    assert c.take() == b"" and not c.connected
    assert node.store.queue("h", 0).max_offset == 1  # only "two"


def test_msgout_respond_and_bad_status(tmp_path):
    """msgout: respond answers the status with msgout's {"error"} body; a status that is
    not an HTTP error is refused."""
    with running(tmp_path / "data", msgout_factory) as node:
        faults = node.broker.wiretap.faults
        with pytest.raises(ValueError, match="HTTP error status"):
            faults.add({"door": "msgout", "respond": "200"})
        faults.add({"door": "msgout", "command": "GET /v1/queues", "respond": "500",
                    "remark": "try later", "times": 1})
        c = node.connect(node.factory)
        http_request(c, b"GET", b"/v1/queues")
        assert http_answer(c) == (500, {"error": "try later"})
        http_request(c, b"GET", b"/v1/queues")
        assert http_answer(c)[0] == 200


# -- the nameserver -----------------------------------------------------------------------


def test_namesrv_route_answers_an_error(tmp_path):
    """The embedded nameserver: GET_ROUTEINFO_BY_TOPIC answers the rule's code."""
    with running(tmp_path / "data", namesrv_factory) as node:
        node.broker.wiretap.faults.add({"door": "namesrv", "command": "GET_ROUTEINFO_BY_TOPIC",
                                        "respond": "TOPIC_NOT_EXIST", "times": 1})
        c = RemotingClient(node)
        c.send(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "x"})
        (a,) = c.answers()
        assert (a.code, a.remark) == (codes.TOPIC_NOT_EXIST,
                                      "[FAULT] rule 1: TOPIC_NOT_EXIST injected by mqserver")


# -- split and corrupt --------------------------------------------------------------------


def test_rocketmq_split_writes_the_answer_in_pieces(rmq):
    """split 7: the answer comes 7 bytes at a time, 50 ms apart; a request handled
    meanwhile is answered after it, whole; then the connection writes as usual."""
    c = RemotingClient(rmq)
    c.send_message()
    whole = c.conn.take()
    rmq.broker.wiretap.faults.add({"door": "broker", "command": "10", "split": 7, "times": 1})
    c.send_message()
    pieces = [c.conn.take()]
    hb = c.send(codes.HEART_BEAT, body=b"{}")  # answered at once without the rule
    assert pieces == [whole[:7]]
    while c.conn.protocol.transport is not c.conn.transport:
        rmq.clock.advance(0.05)
        pieces.append(c.conn.take())
    assert {len(p) for p in pieces[:-1]} == {7}
    answers = c.decoder.feed(b"".join(pieces))
    assert [a.code for a in answers] == [codes.SUCCESS, codes.SUCCESS]
    assert answers[1].opaque == hb
    c.send(codes.HEART_BEAT, body=b"{}")
    assert len(c.answers()) == 1


def test_rocketmq_corrupt_inverts_one_byte(rmq):
    """corrupt 0: the first byte of the answer (its length prefix) is inverted, so the
    client's decoder refuses the frame."""
    c = RemotingClient(rmq)
    c.send_message()
    whole = c.conn.take()
    rmq.broker.wiretap.faults.add({"door": "broker", "command": "SEND_MESSAGE", "corrupt": 0,
                                   "times": 1})
    c.send_message()
    got = c.conn.take()
    assert len(got) == len(whole) and got[0] == whole[0] ^ 0xFF and got[1:4] == whole[1:4]
    assert c.conn.protocol.transport is c.conn.transport


def test_nsq_split_and_corrupt(nsqd):
    faults = nsqd.broker.wiretap.faults
    c = nsq_connect(nsqd)
    faults.add({"door": "nsqd_tcp", "command": "PUB", "split": 4, "times": 1})
    c.send(nsq_pub(b"a") + b"NOP\n" + nsq_pub(b"b"))
    got = [c.take()]
    nsqd.clock.advance(0.05)
    got.append(c.take())
    nsqd.clock.advance(0.05)
    got.append(c.take())
    nsqd.clock.advance(0.05)
    got.append(c.take())
    nsqd.clock.advance(0.05)
    got.append(c.take())
    assert [len(g) for g in got] == [4, 4, 4, 4, 4]  # OK OK: 20 bytes, 4 at a time
    assert FrameReader().feed(b"".join(got)) == [(0, b"OK"), (0, b"OK")]
    faults.add({"door": "nsqd_tcp", "command": "PUB", "corrupt": -1, "times": 1})
    c.send(nsq_pub(b"c"))
    assert FrameReader().feed(c.take()) == [(0, b"O" + bytes([ord("K") ^ 0xFF]))]


def test_smss_split(smss):
    smss.broker.wiretap.faults.add({"door": "smss", "command": "CREATE", "split": 3, "times": 1})
    c = smss.connect(smss.factory)
    c.send(cc.encode_create(b"s"))
    got = [c.take()]
    for _ in range(3):
        smss.clock.advance(0.05)
        got.append(c.take())
    assert b"".join(got) == OK_SMSS and [len(g) for g in got] == [3, 3, 3, 1]


# -- the wire trace -----------------------------------------------------------------------


def test_trace_hub_filters_and_switches_the_tap(rmq):
    """A subscription makes the tap active; it gets only its door's, connection's and
    command's frames, with raw bytes only when it asked; cancelling turns the tap off."""
    tap = rmq.broker.wiretap
    got, raw = [], []
    a = tap.trace.subscribe(got.append, "broker", command="SEND_MESSAGE|SEND_MESSAGE_V2")
    b = tap.trace.subscribe(raw.append, "broker", conn=99, raw=True)
    assert tap.active
    c = RemotingClient(rmq)
    c.send(codes.HEART_BEAT, body=b"{}")
    c.send_message()
    assert [(e["dir"], e["command"]) for e in got] == [("in", "SEND_MESSAGE")]
    assert "raw" not in got[0] and raw == []
    a.cancel()
    b.cancel()
    b.cancel()
    assert not tap.active


def test_rocketmq_trace_is_what_the_client_sent_and_got(rmq):
    """The in frame's fields and bytes are the request's; the out frame's are the
    answer's, with the request's opaque."""
    events = []
    rmq.broker.wiretap.trace.subscribe(events.append, "broker", raw=True)
    c = RemotingClient(rmq)
    ext = {"producerGroup": "PG", "topic": "TT", "defaultTopic": "TBW102",
           "defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": "0", "bornTimestamp": "1",
           "flag": "0", "properties": "", "reconsumeTimes": "0"}
    sent = encode(RemotingCommand(code=codes.SEND_MESSAGE, language="CPP", version=63, opaque=77,
                                  ext_fields=ext, body=b"hello"))
    c.conn.send(sent[:10])  # a frame in two reads
    c.conn.send(sent[10:])
    written = c.conn.take()
    inn, out = events
    assert (inn["dir"], inn["command"], inn["size"], inn["raw"]) == (
        "in", "SEND_MESSAGE", len(sent), sent.hex())
    assert inn["fields"] == {"code": 10, "opaque": 77, "flag": 0, "language": "CPP",
                             "version": 63, "remark": None, "ext": ext, "body": 5,
                             "serialize": "JSON"}
    assert (out["dir"], out["command"], out["raw"]) == ("out", "SUCCESS", written.hex())
    assert out["fields"]["opaque"] == 77 and out["fields"]["ext"]["queueId"] == "0"
    assert inn["conn"] == out["conn"] == rmq.broker.wiretap.conn_id(c.conn.protocol)
    assert inn["peer"] == "192.168.1.1:54321"  # StringTransport's peer


def test_nsq_trace_of_a_short_exchange(nsqd):
    """The commands' fields and bytes as the client sent them (the magic and a PUB in one
    read, a NOP cut in two), and the frame the door wrote."""
    events = []
    nsqd.broker.wiretap.trace.subscribe(events.append, "nsqd_tcp", raw=True)
    c = nsqd.connect(nsqd.factory)
    c.send(b"  V2" + nsq_pub(b"hello"))
    written = c.take()
    c.send(b"NO")
    c.send(b"P\n")
    assert [(e["dir"], e["command"], e["fields"], e["size"]) for e in events] == [
        ("in", "PUB", {"topic": "t", "body": 5}, 15),
        ("out", "RESPONSE", {"data": "OK"}, 10),  # answered as soon as it is stored
        ("in", "NOP", {}, 4)]
    assert [e["raw"] for e in events] == [nsq_pub(b"hello").hex(), written.hex(), b"NOP\n".hex()]


def test_smss_trace_and_faults_are_traced(smss):
    """smss requests and answers; a fault rule's application is a frame of its own."""
    events = []
    smss.broker.wiretap.trace.subscribe(events.append, "smss")
    smss.broker.wiretap.faults.add({"door": "smss", "command": "CREATE", "respond": "no",
                                    "times": 1})
    c = smss.connect(smss.factory)
    c.send(cc.encode_create(b"s1"))
    assert [(e["dir"], e["command"]) for e in events] == [
        ("in", "CREATE"), ("fault", "CREATE"), ("out", "ERR")]
    assert events[0]["fields"] == {"topic": "s1", "trace": "", "expire_at": 0}
    assert events[1]["fields"] == {"rule": 1, "action": "respond", "value": "no"}
    assert events[2]["fields"] == {"status": 400, "error": "no"}


def test_a_rule_names_several_commands(rules):
    rules.add({"door": "broker", "command": "SEND_MESSAGE|SEND_MESSAGE_V2", "drop": True})
    assert rules.match("broker", 1, "h", 1, ("310", "SEND_MESSAGE_V2")) is not None
    assert rules.match("broker", 1, "h", 1, ("10", "SEND_MESSAGE")) is not None
    assert rules.match("broker", 1, "h", 1, ("34", "HEART_BEAT")) is None


# -- scenario files -----------------------------------------------------------------------


@pytest.mark.parametrize("text, error", [
    ("{}", "a scenario is a YAML list of steps"),
    ("- {after: 1s}", "step 1: give its rules"),
    ("- {rules: [{door: smss, drop: true}]}", "step 1: give after: DURATION or until: used"),
    ("- {rules: [{door: smss, drop: true}], until: gone}", "give after: DURATION or until: used"),
    ("- {rules: [{door: smss, drop: true}], after: soon}", "after wants a duration"),
    ("- {rules: [{door: smss, drop: true}], after: 1s, wait: 2}", "unknown key(s) wait"),
])
def test_bad_scenarios_are_refused(tmp_path, text, error):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(SystemExit) as e:
        load_scenario(str(path))
    assert error in str(e.value)


def test_scenario_durations(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("- {rules: [{door: smss, drop: true}], after: 500ms}\n"
                    "- {rules: [{door: smss, drop: true}], until: used, timeout: 2m}\n"
                    "- {rules: [{door: smss, drop: true}], after: 3}\n")
    assert [(s["after"], s["timeout"]) for s in load_scenario(str(path))] == [
        (0.5, 60.0), (None, 120.0), (3.0, 60.0)]


# -- the admin API ------------------------------------------------------------------------


class StreamRequest(DummyRequest):
    """A DummyRequest that keeps the push producer registered with it (DummyRequest
    itself runs pull producers only)."""

    producer = None

    def registerProducer(self, producer, streaming):
        self.producer = producer


def admin_request(resource, method, path, body=b"", args=None):
    r = StreamRequest([p for p in path.split(b"/") if p])
    r.method = method
    r.path = path
    r.args = args or {}
    r.content = io.BytesIO(body)
    out = resource.render(r)
    return r, out


def admin_answer(resource, method, path, body=b"", args=None):
    r, out = admin_request(resource, method, path, body, args)
    return r.responseCode or 200, json.loads(out)


def test_admin_fault_routes(rmq):
    """403 unless admin.faults; then a bad rule is a 400 saying why, an unknown id 404."""
    off = AdminResource(rmq.broker, faults=False)
    status, body = admin_answer(off, b"GET", b"/faults")
    assert status == 403 and "admin.faults: true" in body["error"]
    api = AdminResource(rmq.broker, faults=True)
    status, body = admin_answer(api, b"POST", b"/faults", b'{"door": "broker", "respond": "x"}')
    assert status == 400 and body["error"].startswith("respond wants a RocketMQ response code")
    status, body = admin_answer(api, b"POST", b"/faults",
                                b'{"door": "broker", "command": 10, "respond": 2, "times": 1}')
    assert status == 200 and (body["command"], body["value"], body["times_left"]) == ("10", "2", 1)
    assert admin_answer(api, b"DELETE", b"/faults/99") == (404, {"error": "no fault rule 99"})
    assert admin_answer(api, b"DELETE", b"/faults/%d" % body["id"]) == (200, {"cleared": 1})
    status, body = admin_answer(api, b"GET", b"/trace", args={b"door": [b"nope"]})
    assert status == 400 and body["error"] == "door must be one of broker"


def test_trace_stream_counts_what_a_slow_client_misses(rmq):
    """While the client's transport is full the stream counts frames instead of writing
    them, then says how many it dropped; it unsubscribes when the client goes."""
    api = AdminResource(rmq.broker)
    r, out = admin_request(api, b"GET", b"/trace", args={b"door": [b"broker"]})
    assert out is server.NOT_DONE_YET and json.loads(r.written[0]) == {"tracing": "broker"}
    stream = r.producer
    c = RemotingClient(rmq)
    c.send(codes.HEART_BEAT, body=b"{}")
    stream.pauseProducing()
    c.send(codes.HEART_BEAT, body=b"{}")
    c.send(codes.HEART_BEAT, body=b"{}")
    stream.resumeProducing()
    c.send(codes.HEART_BEAT, body=b"{}")
    lines = [json.loads(x) for x in r.written[1:]]
    assert [x.get("dropped") or x["dir"] for x in lines] == ["in", "out", 4, "in", "out"]
    assert rmq.broker.wiretap.active
    r.processingFailed(Failure(ConnectionDone()))  # the client goes
    assert not rmq.broker.wiretap.active


def test_refused_rules_take_no_number(rules):
    with pytest.raises(ValueError):
        rules.add({"door": "broker"})
    assert rules.add({"door": "broker", "drop": True}).id == 1


def test_a_rule_ends_on_time_without_traffic(rmq):
    """With the reactor's timer, a rule whose seconds are up ends then: the tap is off
    again with no request needed; a rule cleared early leaves no timer behind."""
    faults = rmq.broker.wiretap.faults
    faults.add({"door": "broker", "drop": True, "seconds": 5})
    cleared = faults.add({"door": "broker", "close": True, "seconds": 60})
    faults.clear(cleared.id)
    rmq.clock.advance(4.9)
    assert rmq.broker.wiretap.active
    rmq.clock.advance(0.1)
    assert not rmq.broker.wiretap.active and faults.list() == []


def test_smss_trace_shows_the_batches_a_subscription_pushes(smss):
    """A SUB stream's batches are frames the door writes: their record count, first and
    last eventId and body size, and their bytes as sent; an idle stream's ALIVE too."""
    tap = smss.broker.wiretap
    c = smss.connect(smss.factory)
    c.send(cc.encode_create(b"s") + b"".join(smss_pub(b"s", b"m%d" % i) for i in range(3)))
    c.take()
    events = []
    sub = tap.trace.subscribe(events.append, "smss", command="BATCH|ALIVE", raw=True)
    c.send(cc.encode_sub(b"s", batch=2, who=b"w1"))
    first = c.take()
    c.send(cc.encode_ack())
    second = c.take()
    got = cc.ResponseDecoder(cc.Expect.SUB).feed(first + second)
    ids = [[m.event_id for m in b.messages] for b in got]
    assert [len(i) for i in ids] == [2, 1]
    batches = [e for e in events if e["command"] == "BATCH"]
    assert [(e["dir"], e["size"], e["raw"]) for e in batches] == [
        ("out", len(first), first.hex()), ("out", len(second), second.hex())]
    assert [e["fields"] for e in batches] == [
        {"status": 200, "count": 2, "first": ids[0][0], "last": ids[0][1], "body": len(first) - 10},
        {"status": 200, "count": 1, "first": ids[1][0], "last": ids[1][0], "body": len(second) - 10}]
    sub.cancel()
    c.send(cc.encode_ack())
    smss.clock.advance(60)  # an idle stream: ALIVE
    assert c.take().startswith(ALIVE_SMSS[:2]) and len(events) == 2  # nobody traces
    tap.trace.subscribe(events.append, "smss", command="ALIVE")
    smss.clock.advance(60)
    assert [(e["command"], e["size"]) for e in events[2:]] == [("ALIVE", len(ALIVE_SMSS))]
    c.lose()


def test_http_answers_are_traced(tmp_path, nsqd_http):
    """Each HTTP door's answers are frames it writes: the status, the route and the body's
    size, after the request; a rule's error answer too; nothing once nobody traces."""
    node = nsqd_http
    events = []
    sub = node.broker.wiretap.trace.subscribe(events.append, "nsqd_http")
    c = node.connect(node.factory)
    http_request(c, b"POST", b"/pub?topic=h", b"one")
    assert http_answer(c) == (200, b"OK")
    http_request(c, b"GET", b"/nope")
    assert http_answer(c)[0] == 404
    node.broker.wiretap.faults.add({"door": "nsqd_http", "command": "/ping", "respond": "503",
                                    "times": 1})
    http_request(c, b"GET", b"/ping")
    status, body = http_answer(c)
    assert status == 503
    conn = events[0]["conn"]
    assert [(e["dir"], e["command"], e["conn"]) for e in events] == [
        ("in", "POST /pub", conn), ("out", "200", conn), ("in", "GET /nope", conn),
        ("out", "404", conn), ("in", "GET /ping", conn), ("fault", "GET /ping", conn),
        ("out", "503", conn)]
    outs = [e["fields"] for e in events if e["dir"] == "out"]
    assert outs[0] == {"status": 200, "route": "POST /pub", "body": 2}
    assert outs[1]["route"] == "GET /nope" and outs[2]["body"] == len(json.dumps(body))
    sub.cancel()
    http_request(c, b"GET", b"/ping")
    assert http_answer(c) == (200, b"OK") and len(events) == 7
    c.lose()
    for factory, door, path in ((msgout_factory, "msgout", b"/v1/queues"),
                                (lookupd_http_factory, "lookupd_http", b"/topics")):
        with running(tmp_path / door, factory) as n:
            got = []
            n.broker.wiretap.trace.subscribe(got.append, door, command="GET " + path.decode())
            c = n.connect(n.factory)
            http_request(c, b"GET", path)
            status, body = http_answer(c)
            assert status == 200
            assert [(e["dir"], e["command"]) for e in got] == [
                ("in", "GET " + path.decode()), ("out", "200")]
            assert got[1]["fields"]["body"] == len(json.dumps(body, separators=(",", ":")))
            c.lose()


def test_http_split_writes_the_answer_in_pieces(nsqd_http):
    """split on an HTTP door: the whole answer, head and body, a few bytes at a time; the
    connection's next answer comes whole."""
    node = nsqd_http
    node.broker.wiretap.faults.add({"door": "nsqd_http", "command": "/ping", "split": 7,
                                    "times": 1})
    c = node.connect(node.factory)
    http_request(c, b"GET", b"/ping")
    pieces = [c.take()]
    while True:
        node.clock.advance(0.05)
        piece = c.take()
        if not piece:
            break
        pieces.append(piece)
    whole = b"".join(pieces)
    assert len(pieces) > 3 and all(len(p) == 7 for p in pieces[:-1]) and len(pieces[-1]) <= 7
    assert whole.startswith(b"HTTP/1.1 200 OK\r\n") and whole.endswith(b"\r\n\r\nOK")
    http_request(c, b"GET", b"/ping")
    assert http_answer(c) == (200, b"OK") and c.connected


def test_http_corrupt_inverts_one_byte_of_the_body(nsqd_http):
    """corrupt on an HTTP door: the head is intact, the body's byte at the offset is
    inverted (from the end when negative); the next answer is whole."""
    node = nsqd_http
    faults = node.broker.wiretap.faults
    c = node.connect(node.factory)
    faults.add({"door": "nsqd_http", "command": "/ping", "corrupt": 0, "times": 1})
    http_request(c, b"GET", b"/ping")
    assert http_answer(c) == (200, bytes([ord("O") ^ 0xFF]) + b"K")
    faults.add({"door": "nsqd_http", "command": "/info", "corrupt": -1, "times": 1})
    http_request(c, b"GET", b"/info")
    head, _, body = c.take().partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"Content-Length: %d" % len(body) in head
    assert body.startswith(b'{"version"') and body[-1] == ord("}") ^ 0xFF
    http_request(c, b"GET", b"/ping")
    assert http_answer(c) == (200, b"OK")
