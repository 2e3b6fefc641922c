"""The usual SEND in short (BrokerProtocol._usual_send) against the general send path
(BrokerProtocol._any_send): the same answers, byte for byte, and the same records; and
the parts it uses against their references (the answer's template, the one-frame read,
the index's one-key put)."""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocols.remoting import codes
from protocols.remoting.broker_protocol import sent
from protocols.remoting.codec import RemotingProtocolError, encode, encode_send_answer
from protocols.remoting.framing import FrameDecoder
from protocols.remoting.sending import SHORT_NAMES, offset_msg_ids
from protocols.remoting.messages import RemotingCommand

from tests.unit.test_rocketmq_door import Door

#: The topics every pair of doors has: (name, queues, perm, expire_at, write queues).
TOPICS = [("T4", 4, 6, 0, 4), ("W2", 4, 6, 0, 1), ("RO", 2, 4, 0, 2), ("%RETRY%G", 1, 6, 0, 1),
          ("Exp", 2, 6, 2_000_000_000_000, 2), ("Gone", 1, 6, 1, 1),
          ("a.b", 1, 6, 0, 1)]


def _door(path):
    d = Door(path)
    for name, queues, perm, expire_at, write in TOPICS:
        d.create_topic(name, queues, perm, expire_at, queues, write)
    return d


@pytest.fixture
def doors(tmp_path):
    fast, general = _door(tmp_path / "fast"), _door(tmp_path / "general")
    # the other door serves every send through the general path
    general.conn.send = general.conn._any_send
    yield fast, general
    fast.close()
    general.close()


#: The C++ client's usual send header (bench/request_cost.py's), as strings.
USUAL = {"producerGroup": "PG", "topic": "T4", "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
         "queueId": "1", "sysFlag": "0", "bornTimestamp": "1795267749004", "flag": "0",
         "properties": "TAGS\x01A\x02UNIQ_KEY\x010100007F\x02WAIT\x01true\x02",
         "reconsumeTimes": "0", "unitMode": "0", "batch": "0"}

#: Values a field may take instead (None: left out).
CHANGES = {
    "topic": ("W2", "RO", "%RETRY%G", "Exp", "Gone", "a.b", "Missing", "bad topic", "", None),
    "queueId": ("", "-1", "0", "2", "3", "4", "x", " 1", "+1", "1_0", None),
    "sysFlag": ("1", "48", "4", "8", "x", str(2**31), None),
    "flag": ("7", "-1", str(-2**31 - 1), None),
    "bornTimestamp": ("1", "", str(2**63), None),
    "reconsumeTimes": ("3", "17", None),
    "maxReconsumeTimes": ("2", "20"),
    "properties": (
        "", "TAGS\x01A", "DELAY\x013\x02", "XDELAY\x011\x02", "DELAY\x010\x02",
        "TRAN_MSG\x01true\x02", "TRAN_MSG\x01false\x02", "UNIQ_KEY\x01abc\x02KEYS\x01k1 k2\x02",
        "é\x01ü\x02", "P\x01" + "x" * 33000, None),
    "batch": ("false", "true", "1", "TRUE", "", None),
}

#: Changes of more than one field that take a send off the short path.
COMBOS = [{"topic": "%RETRY%G", "queueId": "0", "reconsumeTimes": "17"},
          {"topic": "%RETRY%G", "queueId": "0", "reconsumeTimes": "3", "maxReconsumeTimes": "2"},
          {"topic": "a.b", "queueId": "0"}, {"topic": "Gone", "queueId": "0"},
          {"topic": "W2", "queueId": "0"}, {"topic": "RO", "queueId": "0"}]

send_headers = st.lists(
    st.one_of([st.tuples(st.just(k), st.sampled_from(v)) for k, v in CHANGES.items()]), max_size=3,
).map(lambda changes: {k: v for k, v in {**USUAL, **dict(changes)}.items() if v is not None})


#: Long send header names -> SEND_MESSAGE_V2's.
_SHORT = {long: short for short, long in SHORT_NAMES.items()}


def send_to_both(doors, ext, body=b"m", serialize_type=codes.SERIALIZE_JSON, code=codes.SEND_MESSAGE,
                 rename=True):
    """Send one SEND_MESSAGE (or, with C{code}, SEND_MESSAGE_V2 with the short names, or
    the names of C{ext} as they are when not C{rename}) to both doors; assert they answer
    alike."""
    fast = doors[0]
    fast.opaque += 1
    if code == codes.SEND_MESSAGE_V2 and rename:
        ext = {_SHORT.get(k, k): v for k, v in ext.items()}
    cmd = RemotingCommand(code=code, language="CPP", version=63, opaque=fast.opaque,
                          ext_fields=ext, body=body, serialize_type=serialize_type)
    frame = encode(cmd)
    answers = []
    for d in doors:
        random.seed(fast.opaque)  # the queue picked for queueId -1
        d.conn.dataReceived(frame)
        answers.append(d.conn.transport.value())
        d.conn.transport.clear()
    assert answers[0] == answers[1], ext
    return answers[0]


def assert_same_records(doors):
    log = [d.store.commitlog for d in doors]
    assert log[0].end == log[1].end
    assert log[0].read(0, log[0].end) == log[1].read(0, log[1].end)


def test_each_change_of_the_usual_send_answers_as_the_general_path(doors):
    """The usual header, then every field changed in turn to each value that may take
    a send off the short path, and to its other forms."""
    send_to_both(doors, USUAL)
    for name, values in CHANGES.items():
        for value in values:
            ext = {k: v for k, v in {**USUAL, name: value}.items() if v is not None}
            send_to_both(doors, ext)
            send_to_both(doors, ext, b"", codes.SERIALIZE_ROCKETMQ)
            send_to_both(doors, ext, b"v2", code=codes.SEND_MESSAGE_V2)
    for combo in COMBOS:
        send_to_both(doors, {**USUAL, **combo})
    assert_same_records(doors)


@given(st.lists(st.tuples(send_headers, st.sampled_from([b"", b"m", b"x" * 300]),
                          st.sampled_from([codes.SERIALIZE_JSON, codes.SERIALIZE_ROCKETMQ]),
                          st.sampled_from([codes.SEND_MESSAGE, codes.SEND_MESSAGE_V2])),
                min_size=1, max_size=8))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_usual_send_answers_and_stores_as_the_general_path(doors, sends):
    for ext, body, serialize_type, code in sends:
        send_to_both(doors, ext, body, serialize_type, code)
    assert_same_records(doors)


def test_v2_headers_with_long_names_too_answer_as_the_general_path(doors):
    """A SEND_MESSAGE_V2 is read by its short names only when no long name is there;
    with one, the header is renamed as the general path renames it (a long name after
    its short one wins, "topic" turns the renaming off), whichever field it is."""
    usual = {_SHORT.get(k, k): v for k, v in USUAL.items()}
    for long_name, value in [("properties", "TAGS\x01L\x02DELAY\x013\x02"), ("queueId", "1"),
                             ("batch", "true"), ("topic", "T4"), ("flag", "x"),
                             ("maxReconsumeTimes", "1"), ("sysFlag", "8"),
                             ("reconsumeTimes", "2")]:
        send_to_both(doors, {**usual, long_name: value}, code=codes.SEND_MESSAGE_V2, rename=False)
        short = _SHORT[long_name]
        send_to_both(doors, {**{k: v for k, v in usual.items() if k != short},
                             long_name: value, short: usual.get(short, "0")},
                     code=codes.SEND_MESSAGE_V2, rename=False)
    assert_same_records(doors)


@pytest.mark.parametrize("code", [codes.SEND_MESSAGE, codes.SEND_MESSAGE_V2])
def test_the_usual_send_takes_the_short_path(doors, code):
    """The C++ client's usual send (and V2's) does not reach the general path."""
    fast, _ = doors

    def general(cmd):
        raise AssertionError("the general path served the usual send")

    fast.conn._any_send = general
    ext = {"producerGroup": "PG", "topic": "T4", "queueId": 2, "sysFlag": 0, "bornTimestamp": 1, "flag": 0,
           "reconsumeTimes": 0, "batch": "0", "properties": "TAGS\x01A\x02UNIQ_KEY\x01K\x02WAIT\x01true\x02"}
    if code == codes.SEND_MESSAGE_V2:
        ext = {_SHORT.get(k, k): v for k, v in ext.items()}
    r = fast.call(code, ext, b"m")
    assert r.code == codes.SUCCESS and r.ext_fields["queueId"] == "2"


# -- the parts the short path uses ------------------------------------------------------


@given(st.integers(-(2**63), 2**63), st.binary(min_size=8, max_size=8), st.integers(0, 2**64 - 1),
       st.integers(0, 1023), st.integers(0, 2**63 - 1))
@settings(max_examples=300)
def test_send_answer_template_gives_the_bytes_of_the_general_answer(opaque, host, offset, qid, qoff):
    request = RemotingCommand(code=codes.SEND_MESSAGE, opaque=opaque)
    msg_id = offset_msg_ids(host, [offset])
    assert encode_send_answer(request, msg_id, qid, qoff) == sent(request, msg_id, qid, qoff)


def _feed_alike(data, max_frame=1 << 20):
    """Return what a fresh decoder makes of C{data} in one read, and what one makes of it
    a byte, then the rest (the buffered path): commands, or the error's text."""
    out = []
    for chunks in ([data], [data[:1], data[1:]]):
        decoder = FrameDecoder(max_frame)
        try:
            got = []
            for c in chunks:
                got += decoder.feed(c)
            out.append(got)
        except RemotingProtocolError as e:
            out.append(str(e))
    return out


@given(st.builds(RemotingCommand, code=st.integers(0, 400), opaque=st.integers(0, 2**31 - 1),
                 ext_fields=st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=4),
                 body=st.binary(max_size=40),
                 serialize_type=st.sampled_from([codes.SERIALIZE_JSON, codes.SERIALIZE_ROCKETMQ])),
       st.lists(st.tuples(st.integers(0, 60), st.integers(0, 255)), max_size=3),
       st.sampled_from([1 << 20, 64]))
@settings(max_examples=400)
def test_one_frame_read_decodes_as_the_buffered_path(cmd, damage, max_frame):
    """A read of exactly one frame (decoded in short) gives the commands, or the error,
    of the same bytes decoded through the buffer; also with damaged prefixes and headers."""
    data = bytearray(encode(cmd))
    for pos, value in damage:
        if pos < len(data):
            data[pos] = value
    one, buffered = _feed_alike(bytes(data), max_frame)
    assert one == buffered
