"""Unit tests of the sans-IO smss codec.

Golden vectors are the worked hex examples of smss's protocol description; the golden
decoding tests feed their input both whole and one byte at a time.
"""

import struct
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.smss import client_codec as cc
from protocols.smss import codec, wire
from protocols.smss.client_codec import Expect, ResponseDecoder
from protocols.smss.codec import Mode, RequestDecoder
from protocols.smss.errors import InvalidPayload, SmssProtocolError
from protocols.smss.views import payload_to_messages
from protocols.smss.messages import (
    Ack,
    Alive,
    AliveResponse,
    Batch,
    Create,
    Delay,
    Delete,
    ErrResponse,
    List,
    OkResponse,
    PayloadTooSmall,
    Pub,
    PushedMessage,
    Replica,
    ReplicaBlock,
    Sub,
    SubEnd,
    TooLarge,
    TopicInfo,
    Unsupported,
    ValidList,
)


def h(text: str) -> bytes:
    """Bytes from spaced hex, as the spec writes them."""
    return bytes.fromhex(text)


Z16 = "00 " * 16

# -- worked example vectors -----------------------------------------------------------

HELLO = h("05 00 00 00 00 00 00 00 68 65 6c 6c 6f")
HELLO_KV = h("0f 00 00 00 01 00 00 00 01 00 00 00 6b 01 00 00 00 76 68 65 6c 6c 6f")
TWO_MSGS = h("02 00 00 00 00 00 00 00 61 31 02 00 00 00 00 00 00 00 62 32")

PUB_HELLO = (
    h("01 05 00 0d 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00") + b"order" + HELLO
)
PUB_TRACE = (
    h("01 05 00 17 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 03")
    + b"order"
    + b"t-1"
    + HELLO_KV
)
PUB_BATCH = (
    h("01 05 00 14 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 6f 72 64 65 72")
    + TWO_MSGS
)
DELAY_HELLO = (
    h("10 05 00 0d 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 6f 72 64 65 72")
    + h("88 13 00 00 00 00 00 00")
    + HELLO
)
CREATE_PERM = h(
    "02 05 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 6f 72 64 65 72 00 00 00 00 00 00 00 00"
)
CREATE_EXP = h(
    "02 05 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 6f 72 64 65 72 60 52 e6 cf 8b 01 00 00"
)
DELETE_ORDER = h("03 05 00" + Z16 + "00 6f 72 64 65 72")
LIST_REQ = h("64") + bytes(19)
VALID_LIST_REQ = h("63") + bytes(19) + bytes(8)
ALIVE_REQ = h("11") + bytes(19)
SUB_ACK = (
    h("00 05 00 0a 01 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00")
    + b"order"
    + h("00 00 00 00 00 00 00 00")
    + h("00 5e d0 b2 00 00 00 00")
    + h("02 00 00 00 67 31")
)
SUB_NO_ACK = (
    h("00 05 00 0a 00" + "00 " * 14 + "00")
    + b"order"
    + h("29 00 00 00 00 00 00 00 02 00 00 00 67 31")
)
REPLICA_REQ = h("40") + bytes(19) + h("29 00 00 00 00 00 00 00")

REQUEST_VECTORS = [
    ("pub", PUB_HELLO, Pub(b"order", b"", HELLO)),
    ("pub-trace-header", PUB_TRACE, Pub(b"order", b"t-1", HELLO_KV)),
    ("pub-batch", PUB_BATCH, Pub(b"order", b"", TWO_MSGS)),
    ("delay", DELAY_HELLO, Delay(b"order", b"", 5000, HELLO)),
    ("create-permanent", CREATE_PERM, Create(b"order", b"", 0)),
    ("create-expiring", CREATE_EXP, Create(b"order", b"", 1700000060000)),
    ("delete", DELETE_ORDER, Delete(b"order", b"")),
    ("list", LIST_REQ, List(b"")),
    ("valid-list", VALID_LIST_REQ, ValidList(b"", 0)),
    ("alive", ALIVE_REQ, Alive(b"")),
    ("sub-ack-timeout", SUB_ACK, Sub(b"order", b"", 0, 10, 3_000_000_000, b"g1")),
    ("sub-no-ack-timeout", SUB_NO_ACK, Sub(b"order", b"", 41, 10, None, b"g1")),
    ("replica", REPLICA_REQ, Replica(41)),
]

ONE_BATCH = (
    h("c8 00 01 00 2d 00 00 00 00 00")
    + h("7b 68 e5 cf 8b 01 00 00")
    + h("03 00 00 00 00 00 00 00")
    + h("00 00 00 00 00 00 00 00 3b 00 00 00 00 00 00 00")
    + HELLO
)
TRACE_HELLO = (
    h("16 00 00 00 01 00 00 00 07 00 00 00")
    + b"traceId"
    + h("02 00 00 00")
    + b"t1hello"
)
TS2 = 1795267483728  # ts of record 1 of the captured batch; record 2's ts is not given
TWO_BATCH = (
    h("c8 00 02 00 6b 00 00 00 00 00")
    + h("50 d8 47 fe a1 01 00 00")
    + wire.I64.pack(3)
    + wire.I64.pack(0)
    + wire.I64.pack(59)
    + HELLO
    + wire.I64.pack(TS2)
    + wire.I64.pack(4)
    + wire.I64.pack(0)
    + wire.I64.pack(135)
    + TRACE_HELLO
)
PUB_BLOCK = (
    h("29 00 00 00")
    + b"1700000000100\t1\t3\t1700000000099\torder\t14\n"
    + HELLO
    + b"\n"
)
DELETE_BLOCK = h("28 00 00 00") + b"1795267525745\t3\t9\t1795267525745\ttemp1\t0\n"


def decode_requests(data: bytes, **limits) -> list:
    """Decode ``data`` whole and byte by byte, check both agree, return the events."""
    whole = RequestDecoder(**limits).feed(data)
    decoder = RequestDecoder(**limits)
    split = []
    for i in range(len(data)):
        split += decoder.feed(data[i : i + 1])
    assert split == whole
    return whole


def decode_responses(data: bytes, expect: Expect) -> list:
    """Decode server bytes whole and byte by byte, check both agree, return events."""
    whole = ResponseDecoder(expect).feed(data)
    decoder = ResponseDecoder(expect)
    split = []
    for i in range(len(data)):
        split += decoder.feed(data[i : i + 1])
    assert split == whole
    return whole


# -- golden request decoding ---------------------------------------------------------


@pytest.mark.parametrize(
    "name,data,event", REQUEST_VECTORS, ids=[v[0] for v in REQUEST_VECTORS]
)
def test_request_golden_vectors_decode(name, data, event):
    """Each section 15 request decodes to exactly one expected event, however split."""
    assert decode_requests(data) == [event]


def test_client_request_encoders_match_golden_vectors():
    """The client-side request encoders produce the section 15 bytes exactly."""
    assert cc.encode_pub("order", HELLO) == PUB_HELLO
    assert cc.encode_pub(b"order", HELLO_KV, trace="t-1") == PUB_TRACE
    assert cc.encode_pub("order", TWO_MSGS) == PUB_BATCH
    assert cc.encode_delay("order", 5000, HELLO) == DELAY_HELLO
    assert cc.encode_create("order") == CREATE_PERM
    assert cc.encode_create("order", 1700000060000) == CREATE_EXP
    assert cc.encode_delete("order") == DELETE_ORDER
    assert cc.encode_list() == LIST_REQ
    assert cc.encode_valid_list(0) == VALID_LIST_REQ
    assert cc.encode_alive() == ALIVE_REQ
    assert cc.encode_sub("order", 0, 10, 3_000_000_000, "g1") == SUB_ACK
    assert cc.encode_sub("order", 41, 10, None, b"g1") == SUB_NO_ACK
    assert cc.encode_replica(41) == REPLICA_REQ
    assert cc.encode_ack(0) == h("00 00") and cc.encode_ack(1) == h("01 00")


def test_golden_payloads_split_into_messages():
    """The section 15 payloads split into the messages the spec describes."""
    assert codec.split_payload(HELLO) == [([], b"hello")]
    assert codec.split_payload(HELLO_KV) == [([(b"k", b"v")], b"hello")]
    assert codec.split_payload(TWO_MSGS) == [([], b"a1"), ([], b"b2")]
    assert codec.count_messages(TWO_MSGS) == 2
    assert codec.record_spans(TWO_MSGS) == [(0, 10), (10, 20)]
    assert codec.encode_message([(b"k", b"v")], b"hello") == HELLO_KV
    assert codec.encode_payload([b"a1", ([], "b2")]) == TWO_MSGS


def test_topic_info_request_decodes():
    """TOPIC INFO (65) carries its topic and trace and no body."""
    data = cc.encode_topic_info("order", trace="x")
    assert data[0] == 65
    assert decode_requests(data + ALIVE_REQ) == [TopicInfo(b"order", b"x"), Alive(b"")]


def test_pipelined_requests_decode_in_order():
    """All section 15 requests except SUB/REPLICA, back to back, decode in order."""
    vectors = [v for v in REQUEST_VECTORS if not isinstance(v[2], (Sub, Replica))]
    data = b"".join(v[1] for v in vectors)
    assert decode_requests(data) == [v[2] for v in vectors]


def test_sub_batch_zero_means_one_and_nonpositive_timeout_is_default():
    """SUB batch 0 decodes as 1, and an ack timeout <= 0 decodes as None (default)."""
    data = cc.encode_sub("t", 5, 0, 0, "w")
    assert decode_requests(data) == [Sub(b"t", b"", 5, 1, None, b"w")]
    data = cc.encode_sub("t", 5, 0, -7, "w")
    assert decode_requests(data)[0].ack_timeout_ns is None


# -- golden response encoding -----------------------------------------------------------


def test_response_encoders_match_golden_vectors():
    """The response encoders produce the section 15 reply bytes exactly."""
    assert codec.ok() == h("c8 00 00 00 00 00 00 00 00 00")
    assert codec.err("topic not exist") == h(
        "90 01 0f 00 00 00 00 00 00 00 74 6f 70 69 63 20 6e 6f 74 20 65 78 69 73 74"
    )
    assert codec.err(b"topic not exist") == codec.err("topic not exist")
    assert codec.alive() == h("c9 00 00 00 00 00 00 00 00 00")
    assert codec.subend() == h("ff 00 00 00 00 00 00 00 00 00")
    assert codec.ok_json(b"x" * 353)[:10] == h("c8 00 61 01 00 00 00 00 00 00")
    assert codec.batch_header(2, 0x6B) == h("c8 00 02 00 6b 00 00 00 00 00")
    assert (
        codec.replica_frame(PUB_BLOCK)
        == h("c8 00 00 00 00 00 00 00 00 00 3b 00 00 00") + PUB_BLOCK
    )


def test_ok_json_with_empty_body_is_header_only():
    """An empty LIST result is a bare 10-byte header with length 0."""
    assert codec.ok_json(b"") == h("c8 00 00 00 00 00 00 00 00 00")


def test_err_cuts_text_to_u16_length():
    """An ERR text longer than 65535 bytes is cut so its u16 length stays exact."""
    frame = codec.err("e" * 70000)
    assert wire.U16.unpack_from(frame, 2)[0] == 0xFFFF and len(frame) == 10 + 0xFFFF


def test_batch_encoder_matches_golden_batches():
    """encode_batch/pushed_prefix produce the one- and two-message batch frames."""
    assert codec.encode_batch([(1700000000123, 3, 0, 59, HELLO)]) == ONE_BATCH
    two = codec.encode_batch(
        [(1795267483728, 3, 0, 59, HELLO), (TS2, 4, 0, 135, TRACE_HELLO)]
    )
    assert two == TWO_BATCH
    assert codec.pushed_prefix(1700000000123, 3, 0, 59) == ONE_BATCH[10:42]


# -- golden client-side decoding --------------------------------------------------------


def test_one_message_batch_decodes():
    """The one-message pushed batch of section 15 decodes to its message."""
    expected = Batch([PushedMessage(1700000000123, 3, 0, 59, [], b"hello")])
    assert decode_responses(ONE_BATCH, Expect.SUB) == [expected]


def test_two_message_batch_decodes_with_headers():
    """The captured two-message batch decodes, headers parsed off the body."""
    expected = Batch(
        [
            PushedMessage(1795267483728, 3, 0, 59, [], b"hello"),
            PushedMessage(TS2, 4, 0, 135, [(b"traceId", b"t1")], b"hello"),
        ]
    )
    assert decode_responses(TWO_BATCH, Expect.SUB) == [expected]


def test_stream_frames_decode():
    """ALIVE, SUBEND and ERR decode in a SUB stream, between batches."""
    data = codec.alive() + ONE_BATCH + codec.err("EOF") + codec.subend()
    events = decode_responses(data, Expect.SUB)
    assert events[0] == AliveResponse() and isinstance(events[1], Batch)
    assert events[2:] == [ErrResponse("EOF"), SubEnd()]


def test_ok_replies_depend_on_expectation():
    """A 200 is a bare OK, a JSON reply or a replica block depending on expect."""
    assert decode_responses(codec.ok(), Expect.SIMPLE) == [OkResponse(None)]
    assert decode_responses(codec.ok_json(b""), Expect.JSON) == [OkResponse(b"")]
    body = b'[{"name":"order"}]'
    assert decode_responses(codec.ok_json(body), Expect.JSON) == [OkResponse(body)]
    frames = (
        codec.replica_frame(PUB_BLOCK)
        + codec.alive()
        + codec.replica_frame(DELETE_BLOCK)
    )
    assert decode_responses(frames, Expect.REPLICA) == [
        ReplicaBlock(PUB_BLOCK),
        AliveResponse(),
        ReplicaBlock(DELETE_BLOCK),
    ]


def test_response_decoder_rejects_unknown_status_and_bad_batches():
    """An unknown status, or a batch whose records do not fill its body, is fatal."""
    with pytest.raises(SmssProtocolError) as info:
        ResponseDecoder().feed(h("2c 01") + bytes(8))
    assert info.value.fatal
    padded = codec.batch_header(1, 46) + ONE_BATCH[10:] + b"\0"
    with pytest.raises(SmssProtocolError):
        ResponseDecoder(Expect.SUB).feed(padded)
    short = codec.batch_header(2, 45) + ONE_BATCH[10:]
    with pytest.raises(SmssProtocolError):
        ResponseDecoder(Expect.SUB).feed(short)


# -- binlog record ----------------------------------------------------------------------


def test_binlog_schema_parses_and_builds_golden_blocks():
    """BINLOG_RECORD parses the section 15 blocks and builds them back byte for byte."""
    rec = wire.BINLOG_RECORD.parse(PUB_BLOCK)
    assert rec.cmd_len == 41
    assert rec.cmd_line == dict(
        write_time=1700000000100,
        cmd=1,
        event_id=3,
        timestamp=1700000000099,
        topic=b"order",
        payload_len=14,
    )
    assert rec.payload == HELLO + b"\n"
    assert wire.BINLOG_RECORD.build(rec) == PUB_BLOCK
    rec = wire.BINLOG_RECORD.parse(DELETE_BLOCK)
    assert (rec.cmd_len, rec.cmd_line["topic"], rec.payload) == (40, b"temp1", b"")
    assert len(codec.replica_frame(DELETE_BLOCK)) - 10 - 4 == 44
    assert wire.BINLOG_RECORD.build(rec) == DELETE_BLOCK


# -- construct schemas vs struct fast paths ---------------------------------------------

u8 = st.integers(0, 0xFF)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
i64 = st.integers(-(2**63), 2**63 - 1)


@given(code=st.sampled_from([1, 16]), topic_len=u16, payload_len=u32, trace_len=u8)
def test_pub_header_struct_matches_construct(code, topic_len, payload_len, trace_len):
    """REQUEST_HEADER_STRUCT and the construct REQUEST_HEADER agree for PUB/DELAY."""
    packed = wire.REQUEST_HEADER_STRUCT.pack(code, topic_len, payload_len, trace_len)
    built = wire.REQUEST_HEADER.build(
        dict(
            code=code,
            topic_len=topic_len,
            args=dict(payload_len=payload_len),
            trace_len=trace_len,
        )
    )
    assert packed == built
    parsed = wire.REQUEST_HEADER.parse(packed)
    assert (
        parsed.code,
        parsed.topic_len,
        parsed.args.payload_len,
        parsed.trace_len,
    ) == (
        code,
        topic_len,
        payload_len,
        trace_len,
    )


@given(topic_len=u16, batch=u8, flag=u8, trace_len=u8)
def test_sub_header_struct_matches_construct(topic_len, batch, flag, trace_len):
    """SUB_REQUEST_HEADER_STRUCT and REQUEST_HEADER with SUB_ARGS agree."""
    packed = wire.SUB_REQUEST_HEADER_STRUCT.pack(0, topic_len, batch, flag, trace_len)
    built = wire.REQUEST_HEADER.build(
        dict(
            code=0,
            topic_len=topic_len,
            args=dict(batch=batch, ack_flag=flag),
            trace_len=trace_len,
        )
    )
    assert packed == built
    assert wire.REQUEST_HEADER_STRUCT.unpack(packed)[2] == batch | flag << 8


@given(status=u16, length=u32, count=u8, text_len=u16)
def test_response_header_structs_match_construct(status, length, count, text_len):
    """Every response header struct agrees byte for byte with its construct schema."""
    assert wire.STATUS_HEADER_STRUCT.pack(status) == wire.STATUS_HEADER.build(
        dict(status=status)
    )
    assert wire.OK_JSON_HEADER_STRUCT.pack(200, length) == wire.OK_JSON_HEADER.build(
        dict(body_len=length)
    )
    batch = wire.BATCH_HEADER_STRUCT.pack(200, count, length)
    assert batch == wire.BATCH_HEADER.build(dict(count=count, body_len=length))
    parsed = wire.BATCH_HEADER.parse(batch)
    assert (parsed.count, parsed.body_len) == (count, length)
    assert wire.ERR_HEADER_STRUCT.pack(400, text_len) == wire.ERR_HEADER.build(
        dict(text_len=text_len)
    )
    assert wire.REPLICA_FRAME_HEADER_STRUCT.pack(
        200, length
    ) == wire.REPLICA_FRAME_HEADER.build(dict(block_len=length))


@given(
    ts=i64, event_id=i64, file_id=i64, pos=i64, body=st.binary(min_size=1, max_size=40)
)
def test_pushed_record_structs_match_construct(ts, event_id, file_id, pos, body):
    """PUSHED_PREFIX/RECORD_HEAD and MESSAGE_PREFIX structs agree with PUSHED_RECORD."""
    message = dict(headers=[dict(key=b"k", value=b"v")], body=body)
    built = wire.PUSHED_RECORD.build(
        dict(
            ts=ts,
            event_id=event_id,
            next_file_id=file_id,
            next_pos=pos,
            message=message,
        )
    )
    record = codec.encode_message([(b"k", b"v")], body)
    assert built == codec.pushed_prefix(ts, event_id, file_id, pos) + record
    assert wire.PUSHED_RECORD_HEAD_STRUCT.unpack_from(built) == (
        ts,
        event_id,
        file_id,
        pos,
        len(record) - 8,
        1,
    )
    assert wire.MESSAGE_PREFIX_STRUCT.unpack_from(record) == (len(record) - 8, 1)


def test_pushed_batch_schema_parses_golden_batch():
    """The construct PUSHED_BATCH schema reads the captured two-message batch."""
    batch = wire.PUSHED_BATCH.parse(TWO_BATCH)
    assert (batch.count, batch.body_len) == (2, 0x6B)
    assert [r.event_id for r in batch.records] == [3, 4]
    assert batch.records[1].message.headers[0].key == b"traceId"
    assert batch.records[1].message.body == b"hello"


# -- message record round trips ---------------------------------------------------------

headers_st = st.lists(
    st.tuples(st.binary(max_size=20), st.binary(max_size=20)), max_size=5
)
message_st = st.tuples(headers_st, st.binary(max_size=60)).filter(
    lambda m: m[0] or m[1]
)


@settings(max_examples=200)
@given(messages=st.lists(message_st, min_size=1, max_size=8))
def test_encode_split_round_trip(messages):
    """split_payload inverts encode_message; count_messages and spans agree."""
    payload = b"".join(codec.encode_message(hs, body) for hs, body in messages)
    assert codec.split_payload(payload) == [(list(hs), body) for hs, body in messages]
    assert codec.count_messages(payload) == len(messages)
    spans = codec.record_spans(payload)
    assert spans[0][0] == 0 and spans[-1][1] == len(payload)


@given(message=message_st)
def test_encode_message_matches_construct_schema(message):
    """encode_message and the construct MESSAGE_RECORD build the same bytes."""
    headers, body = message
    built = wire.MESSAGE_RECORD.build(
        dict(headers=[dict(key=k, value=v) for k, v in headers], body=body)
    )
    assert built == codec.encode_message(headers, body)
    parsed = wire.MESSAGE_RECORD.parse(built)
    assert [(x.key, x.value) for x in parsed.headers] == list(
        headers
    ) and parsed.body == body


def test_encode_message_accepts_str_and_dict():
    """Headers may be a dict and str values are sent as UTF-8."""
    assert codec.encode_message({"k": "v"}, "hello") == HELLO_KV


INVALID_PAYLOADS = [
    ("empty", b""),
    ("eight-bytes", HELLO[:8]),
    ("zero-size", h("00 00 00 00 00 00 00 00 00")),
    ("record-too-long", h("0a 00 00 00 00 00 00 00") + b"hello"),
    ("leftover-1", HELLO + b"\0"),
    ("leftover-8", HELLO + bytes(8)),
    ("second-zero-size", HELLO + bytes(9)),
]


@pytest.mark.parametrize(
    "name,payload", INVALID_PAYLOADS, ids=[p[0] for p in INVALID_PAYLOADS]
)
def test_invalid_payloads_rejected(name, payload):
    """Payloads that break the section 5 walk rules raise InvalidPayload (not fatal)."""
    with pytest.raises(InvalidPayload) as info:
        codec.count_messages(payload)
    assert not info.value.fatal
    with pytest.raises(InvalidPayload):
        codec.record_spans(payload)
    with pytest.raises(InvalidPayload):
        codec.split_payload(payload)


@pytest.mark.parametrize(
    "record",
    [
        h("0a 00 00 00 01 00 00 00 64 00 00 00") + b"hello!",  # key runs past S
        h("0a 00 00 00 01 00 00 00 01 00 00 00 6b 09 00 00 00 76"),  # value runs past S
        h("05 00 00 00 40 42 0f 00") + b"hello",  # a million headers in 5 bytes
    ],
)
def test_header_past_record_is_invalid_only_when_parsing(record):
    """A header running past its record fails split_payload, but the server walk
    (count_messages) accepts it because headers are opaque to the server."""
    payload = record + HELLO
    assert codec.count_messages(payload) == 2
    with pytest.raises(InvalidPayload):
        codec.split_payload(payload)


# -- limits, discard mode and error events ------------------------------------------------


def test_too_large_pub_reported_before_body_and_discarded():
    """TooLarge comes after header+topic+trace alone; the body is skipped unbuffered
    and the next request on the stream decodes."""
    decoder = RequestDecoder(max_payload=100)
    head = cc.encode_request(wire.CMD_PUB, "order", "t", payload_len=1000)
    assert decoder.feed(head[:-1]) == []
    assert decoder.feed(head[-1:]) == [TooLarge(1, b"order", b"t", 1000, 100)]
    body = bytes(1000)
    for i in range(0, 1000, 7):
        assert decoder.feed(body[i : i + 7]) == []
        assert decoder.buffered == 0
    assert decoder.feed(ALIVE_REQ) == [Alive(b"")]


def test_too_large_pub_with_body_and_next_request_in_one_chunk():
    """A too-large PUB, its body and the next request in one chunk, or byte by byte,
    give TooLarge then the next request."""
    data = cc.encode_pub("order", HELLO * 10) + PUB_HELLO
    assert decode_requests(data, max_payload=100) == [
        TooLarge(1, b"order", b"", 130, 100),
        Pub(b"order", b"", HELLO),
    ]


def test_too_large_delay_discards_delay_field_and_payload():
    """A too-large DELAY skips its 8-byte delay field as well as the payload."""
    data = cc.encode_delay("order", 5000, HELLO * 10) + ALIVE_REQ
    assert decode_requests(data, max_payload=100) == [
        TooLarge(16, b"order", b"", 130, 100),
        Alive(b""),
    ]


def test_payload_at_limit_is_accepted():
    """A payload exactly at max_payload decodes normally."""
    assert decode_requests(PUB_HELLO, max_payload=13) == [Pub(b"order", b"", HELLO)]


@pytest.mark.parametrize("size", range(0, 9))
def test_small_pub_payload_is_consumed(size):
    """A PUB with P <= 8 yields PayloadTooSmall and its P bytes are consumed, so the
    following request decodes (unlike reference bug 2)."""
    data = cc.encode_pub("order", b"\x07" * size, trace="t") + PUB_HELLO
    assert decode_requests(data) == [
        PayloadTooSmall(1, b"order", b"t"),
        Pub(b"order", b"", HELLO),
    ]


def test_small_delay_payload_passes_through():
    """A DELAY with P <= 8 is decoded as Delay; the handler checks role, then size."""
    data = cc.encode_delay("order", 5000, b"abc") + ALIVE_REQ
    assert decode_requests(data) == [Delay(b"order", b"", 5000, b"abc"), Alive(b"")]


@pytest.mark.parametrize("code", [4, 5, 18, 101, 102, 200])
def test_unsupported_codes_read_no_body(code):
    """Unknown codes (and 101) give Unsupported after topic+trace, with no body read,
    even when bytes 3..6 hold a length."""
    data = cc.encode_request(code, "order", "t", payload_len=50) + ALIVE_REQ
    assert decode_requests(data) == [Unsupported(code, b"order", b"t"), Alive(b"")]


def test_truncated_header_waits_for_completion():
    """Nothing is decoded from a partial header; completing it yields the event."""
    decoder = RequestDecoder()
    assert decoder.feed(ALIVE_REQ[:19]) == []
    assert decoder.buffered == 19
    assert decoder.feed(ALIVE_REQ[19:]) == [Alive(b"")]
    assert decoder.buffered == 0


def test_who_over_limit_is_fatal_before_who_arrives():
    """A SUB who length over max_who raises a fatal error as soon as the length is
    read, carrying the events decoded before it, and the decoder stays failed."""
    data = cc.encode_sub("order", 0, 1, None, b"w" * 101)
    cut = len(data) - 101  # everything up to and including whoLen
    decoder = RequestDecoder(max_who=100)
    with pytest.raises(SmssProtocolError) as info:
        decoder.feed(ALIVE_REQ + data[:cut])
    assert info.value.fatal
    assert info.value.events == [Alive(b"")]
    with pytest.raises(SmssProtocolError):
        decoder.feed(b"w")


def test_topic_over_limit_is_fatal_after_header():
    """A topic length over max_topic raises as soon as the header is complete."""
    head = cc.encode_request(wire.CMD_PUB, "x" * 11, payload_len=13)[:20]
    with pytest.raises(SmssProtocolError) as info:
        RequestDecoder(max_topic=10).feed(head)
    assert info.value.fatal


def test_large_pub_in_small_chunks_is_linear():
    """An 8 MiB PUB fed in 4 KiB chunks decodes once, at the last chunk, quickly."""
    payload = codec.encode_message([], bytes(8 * 1024 * 1024 - 8))
    data = cc.encode_pub("big", payload)
    decoder = RequestDecoder(max_payload=len(payload))
    started = time.perf_counter()
    events = []
    for i in range(0, len(data), 4096):
        events.append(decoder.feed(data[i : i + 4096]))
    elapsed = time.perf_counter() - started
    assert all(e == [] for e in events[:-1])
    assert events[-1] == [Pub(b"big", b"", payload)]
    assert elapsed < 2.0  # quadratic re-slicing would copy ~16 GiB here


# -- ack mode and pauses ------------------------------------------------------------------


def test_sub_pauses_until_ack_mode_chosen():
    """Bytes after a SUB are held until the protocol enables ack mode; then they
    decode as acks."""
    decoder = RequestDecoder()
    assert decoder.feed(SUB_ACK + h("00 00")) == [
        Sub(b"order", b"", 0, 10, 3_000_000_000, b"g1")
    ]
    assert decoder.paused and decoder.feed(h("00")) == []
    assert decoder.set_mode(Mode.ACKS) == [Ack(0)]  # one held byte is left over
    assert decoder.feed(h("00")) == [Ack(0)]
    assert decoder.feed(h("01")) == []
    assert decoder.feed(h("00")) == [Ack(1)]


def test_ack_end_returns_to_header_mode():
    """Ack(1) switches the decoder back to requests, even within the same chunk."""
    decoder = RequestDecoder()
    decoder.feed(SUB_NO_ACK)
    decoder.ack_mode = True
    data = h("00 00 01 00") + ALIVE_REQ
    events = []
    for i in range(len(data)):
        events += decoder.feed(data[i : i + 1])
    assert events == [Ack(0), Ack(1), Alive(b"")]
    assert not decoder.ack_mode


def test_refused_sub_resumes_header_parsing():
    """When the SUB is refused, leaving ack mode off decodes the held request."""
    decoder = RequestDecoder()
    assert decoder.feed(SUB_NO_ACK + ALIVE_REQ) == [
        Sub(b"order", b"", 41, 10, None, b"g1")
    ]
    decoder.ack_mode = False
    assert decoder.feed(b"") == [Alive(b"")]


def test_invalid_ack_pauses_decoder():
    """An ack other than 0/1 is reported and nothing after it is decoded."""
    decoder = RequestDecoder()
    decoder.feed(SUB_NO_ACK)
    decoder.ack_mode = True
    assert decoder.feed(h("05 00") + ALIVE_REQ) == [Ack(5)]
    assert decoder.paused and decoder.feed(ALIVE_REQ) == []


def test_replica_stream_sinks_slave_bytes():
    """After REPLICA, sink mode drops whatever the slave sends without buffering."""
    decoder = RequestDecoder()
    assert decoder.feed(REPLICA_REQ + bytes(30)) == [Replica(41)]
    assert decoder.set_mode(Mode.SINK) == []
    assert decoder.feed(h("00 00") * 50) == [] and decoder.buffered == 0


# -- whole-stream property ----------------------------------------------------------------

request_st = st.one_of(
    st.builds(
        lambda t, p: (cc.encode_pub(t, p), Pub(t, b"", p)),
        st.binary(max_size=8),
        st.binary(min_size=9, max_size=50),
    ),
    st.builds(
        lambda t, e: (cc.encode_create(t, e), Create(t, b"", e)),
        st.binary(max_size=8),
        i64,
    ),
    st.builds(lambda tr: (cc.encode_alive(tr), Alive(tr)), st.binary(max_size=255)),
    st.builds(lambda e: (cc.encode_valid_list(e), ValidList(b"", e)), i64),
    st.builds(
        lambda c: (cc.encode_request(c, "x"), Unsupported(c, b"x", b"")),
        st.sampled_from([4, 5, 18, 101, 102, 200]),
    ),
)


@settings(max_examples=100)
@given(requests=st.lists(request_st, min_size=1, max_size=10), data=st.data())
def test_any_split_of_a_request_stream_decodes_the_same(requests, data):
    """A stream of requests decodes to the same events however it is chunked."""
    stream = b"".join(r[0] for r in requests)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=20)))
    decoder = RequestDecoder()
    events = []
    for start, stop in zip([0] + cuts, cuts + [len(stream)]):
        events += decoder.feed(stream[start:stop])
    assert events == [r[1] for r in requests]
    assert decoder.buffered == 0


# -- feed's fast decode of a read that is one PUB ------------------------------------------

_WHOLE_LIMITS = dict(max_payload=40, max_topic=12)


@settings(max_examples=400, deadline=None)
@given(
    code=st.sampled_from([wire.CMD_PUB, wire.CMD_PUB, wire.CMD_PUB, wire.CMD_DELAY,
                          wire.CMD_CREATE, wire.CMD_ALIVE]),
    topic=st.binary(max_size=14),
    trace=st.binary(max_size=4),
    payload=st.binary(max_size=44),
    announced_delta=st.integers(-2, 2),
    extra=st.binary(max_size=3),
)
def test_one_pub_is_what_feed_decodes_byte_by_byte(code, topic, trace, payload,
                                                    announced_delta, extra):
    """Whatever the bytes, feeding them in one read (which tries the fast decode of one
    PUB) gives the events, error or held bytes that feeding them a byte at a time (the
    general way) gives; and the fast decode takes every complete PUB within the limits
    and nothing else (py_one_pub, the reference of the C speedup)."""
    announced = max(0, len(payload) + announced_delta)
    data = cc.encode_request(code, topic, trace, announced, payload) + extra

    def decode(chunks):
        decoder = RequestDecoder(**_WHOLE_LIMITS)
        events = []
        try:
            for chunk in chunks:
                events += decoder.feed(chunk)
        except SmssProtocolError as e:
            return events + e.events, str(e), None  # what it holds then is dropped
        return events, None, decoder.buffered

    whole = decode([data])
    assert whole == decode([data[i:i + 1] for i in range(len(data))])
    fast = codec.py_one_pub(data, **_WHOLE_LIMITS)
    plain = (code == wire.CMD_PUB and len(topic) <= 12 and 8 < announced <= 40
             and announced == len(payload) + len(extra))
    assert (fast is not None) == plain
    if plain:
        assert whole == ([fast], None, 0)
        assert type(fast) is Pub
        assert all(type(x) is bytes for x in (fast.topic, fast.trace, fast.payload))
        _assert_messages_read_right(fast)


def _assert_messages_read_right(pub):
    # messages: [body] for a payload of one record without headers, else None
    size, header_count = wire.MESSAGE_PREFIX_STRUCT.unpack_from(pub.payload)
    if header_count == 0 and size + 8 == len(pub.payload):
        assert pub.messages == payload_to_messages(pub.payload)
        assert type(pub.messages) is list and type(pub.messages[0]) is bytes
    else:
        assert pub.messages is None


@given(topic=st.binary(max_size=12), body=st.binary(min_size=1, max_size=22),
       headers=st.sampled_from([0, 0, 1]), size_delta=st.sampled_from([0, 0, -1, 1]),
       more=st.sampled_from([b"", b"", wire.MESSAGE_PREFIX_STRUCT.pack(1, 0) + b"x"]))
def test_one_pub_reads_a_lone_record_without_headers(topic, body, headers, size_delta,
                                                      more):
    """A read that is one PUB whose payload is one message record without headers (what
    the SDKs send) gives a Pub with messages [body], as payload_to_messages makes them;
    any other payload leaves messages None (the handler reads the payload)."""
    size = max(0, len(body) + size_delta)
    payload = wire.MESSAGE_PREFIX_STRUCT.pack(size, headers) + body + more
    pub = RequestDecoder(**_WHOLE_LIMITS).feed(cc.encode_pub(topic, payload))
    assert len(pub) == 1 and type(pub[0]) is Pub and pub[0].payload == payload
    _assert_messages_read_right(pub[0])
    if not headers and not size_delta and not more:
        assert pub[0].messages == [body]


def test_the_fast_decode_waits_for_what_the_decoder_holds_or_waits_for():
    """feed decodes a read that is one PUB in one step only when the decoder holds
    nothing and waits for nothing; else the PUB's bytes take the general way and mean
    what they mean there."""
    pub = cc.encode_pub(b"t", struct.pack("<II", 4, 0) + b"body")
    assert RequestDecoder().feed(pub) == [Pub(b"t", b"", pub[-12:])]
    half = RequestDecoder()
    assert half.feed(pub[:5]) == []
    # the rest of a PUB, then a whole one: both, from the buffer
    assert half.feed(pub[5:] + pub) == [Pub(b"t", b"", pub[-12:])] * 2
    assert half.buffered == 0
    paused = RequestDecoder()
    assert isinstance(paused.feed(cc.encode_sub(b"t", 0, 1, who=b"w"))[0], Sub)
    assert paused.feed(pub) == [] and paused.buffered == len(pub)  # the SUB's answer decides
    acks = RequestDecoder()
    acks.ack_mode = True
    assert type(acks.feed(pub)[0]).__name__ == "Ack"  # two bytes of it, an ack
    skipping = RequestDecoder(max_payload=10)
    assert isinstance(skipping.feed(pub[:-4])[0], TooLarge)  # its body is being skipped
    assert skipping.feed(pub[-4:]) == []  # the rest of the skipped body
    assert [type(e) for e in skipping.feed(pub)] == [TooLarge]  # read as a request again
    assert RequestDecoder().feed(bytearray(pub)) == [Pub(b"t", b"", pub[-12:])]


# -- the schemas are the one definition: golden vectors parsed with them ------------------


def _header_fields(schema_fields):
    """The named values of a parsed construct container, nested args flattened."""
    out = {}
    for key, value in schema_fields.items():
        if key.startswith("_"):
            continue
        if hasattr(value, "items"):
            out.update({f"{key}.{k}": v for k, v in value.items() if not k.startswith("_")})
        else:
            out[key] = value
    return out


@pytest.mark.parametrize("name, data, event", REQUEST_VECTORS, ids=[v[0] for v in REQUEST_VECTORS])
def test_request_vector_headers_parse_with_the_schema(name, data, event):
    """Each worked example request header parses with REQUEST_HEADER, and the struct
    the decoder uses (derived from the schema) reads the same values."""
    parsed = wire.REQUEST_HEADER.parse(data[: wire.REQUEST_HEADER_SIZE])
    topic = getattr(event, "topic", b"")
    assert parsed.topic_len == len(topic)
    assert parsed.trace_len == len(getattr(event, "trace", b""))
    if parsed.code == wire.CMD_SUB:
        values = wire.SUB_REQUEST_HEADER_STRUCT.unpack_from(data)
        assert values == (0, parsed.topic_len, parsed.args.batch, parsed.args.ack_flag,
                          parsed.trace_len)
        assert parsed.args.batch == event.batch
        assert parsed.args.ack_flag == (event.ack_timeout_ns is not None)
    else:
        code, topic_len, arg, trace_len = wire.REQUEST_HEADER_STRUCT.unpack_from(data)
        assert (code, topic_len, trace_len) == (parsed.code, parsed.topic_len, parsed.trace_len)
        if parsed.code in (wire.CMD_PUB, wire.CMD_DELAY):
            assert arg == parsed.args.payload_len == len(event.payload)


RESPONSE_VECTORS = [
    ("ok", wire.STATUS_HEADER, "c8 00 00 00 00 00 00 00 00 00", {"status": 200}),
    ("alive", wire.STATUS_HEADER, "c9 00 00 00 00 00 00 00 00 00", {"status": 201}),
    ("subend", wire.STATUS_HEADER, "ff 00 00 00 00 00 00 00 00 00", {"status": 255}),
    ("err", wire.ERR_HEADER, "90 01 0f 00 00 00 00 00 00 00", {"status": 400, "text_len": 15}),
    ("list", wire.OK_JSON_HEADER, "c8 00 61 01 00 00 00 00 00 00",
     {"status": 200, "body_len": 353}),
    ("batch-one", wire.BATCH_HEADER, "c8 00 01 00 2d 00 00 00 00 00",
     {"status": 200, "count": 1, "body_len": 45}),
    ("batch-two", wire.BATCH_HEADER, "c8 00 02 00 6b 00 00 00 00 00",
     {"status": 200, "count": 2, "body_len": 0x6B}),
    ("replica", wire.REPLICA_FRAME_HEADER, "c8 00 00 00 00 00 00 00 00 00 3b 00 00 00",
     {"status": 200, "block_len": 59}),
]
_RESPONSE_STRUCTS = {
    id(wire.STATUS_HEADER): wire.STATUS_HEADER_STRUCT,
    id(wire.ERR_HEADER): wire.ERR_HEADER_STRUCT,
    id(wire.OK_JSON_HEADER): wire.OK_JSON_HEADER_STRUCT,
    id(wire.BATCH_HEADER): wire.BATCH_HEADER_STRUCT,
    id(wire.REPLICA_FRAME_HEADER): wire.REPLICA_FRAME_HEADER_STRUCT,
}


@pytest.mark.parametrize("name, schema, data, fields", RESPONSE_VECTORS,
                         ids=[v[0] for v in RESPONSE_VECTORS])
def test_response_vector_headers_parse_with_the_schema(name, schema, data, fields):
    """Each worked example response header parses with its schema, and the struct the
    encoders use (derived from it) reads and writes the same bytes."""
    raw = h(data)
    assert _header_fields(schema.parse(raw)) == fields
    hot = _RESPONSE_STRUCTS[id(schema)]
    assert hot.size == len(raw)
    assert hot.unpack(raw) == tuple(fields.values())
    assert hot.pack(*fields.values()) == raw


def test_pushed_record_head_parses_with_the_schema():
    """The head of the spec's one-message pushed batch, read with the derived structs,
    gives what PUSHED_RECORD parses; its offsets are the ones _push.c is given."""
    record = ONE_BATCH[wire.RESPONSE_HEADER_SIZE:]
    parsed = wire.PUSHED_RECORD.parse(record)
    head = (parsed.ts, parsed.event_id, parsed.next_file_id, parsed.next_pos,
            parsed.message.size, parsed.message.header_count)
    assert head == (1700000000123, 3, 0, 59, 5, 0)
    assert wire.PUSHED_RECORD_HEAD_STRUCT.unpack_from(record) == head
    assert wire.PUSHED_PREFIX_STRUCT.unpack_from(record) == head[:4]
    assert wire.PUSHED_HEAD_OFFSETS == (0, 8, 16, 24, 32, 36)
    assert (wire.PUSHED_PREFIX_SIZE, wire.PUSHED_RECORD_HEAD_STRUCT.size) == (32, 40)
    assert (wire.REQUEST_HEADER_SIZE, wire.RESPONSE_HEADER_SIZE) == (20, 10)


def test_binlog_payload_prefixes_parse_with_the_schema():
    """CREATE and DELAY binlog payloads parse with their schemas, and the
    derived structs the binlog code runs read the same values."""
    from protocols.smss import binlog

    create = h("60 52 e6 cf 8b 01 00 00")  # expireAt 1700000060000, as in section 15
    assert wire.BINLOG_CREATE.parse(create).expire_at == 1700000060000
    assert binlog.create_spec(create)[0] == 1700000060000
    delay = h("88 13 00 00 00 00 00 00 07 00 00 00 00 00 00 00") + HELLO
    parsed = wire.BINLOG_DELAY.parse(delay)
    assert (parsed.trigger_time, parsed.delay_event_id, parsed.messages) == (5000, 7, HELLO)
    assert wire.BINLOG_DELAY_STRUCT.unpack_from(delay) == (5000, 7)
    assert wire.BINLOG_DELAY_STRUCT.size == 16


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.binary(min_size=1, max_size=40),
                          st.lists(st.tuples(st.binary(min_size=1, max_size=6).filter(
                              lambda k: b"\x01" not in k and b"\x02" not in k
                              and not k.startswith(b"MQ_")),  # a master's own headers
                              st.sampled_from([b"", b"v", b"x\x01y"])), max_size=2)),
                min_size=1, max_size=4),
       st.sampled_from([b"", b"\x44ELAY\x011\x02"]))
def test_replicated_records_become_the_messages_they_hold(records, extra):
    """A PUB payload's records, with headers or without (H 0, which most replicated
    messages are and which takes a shorter way), become messages as the smss door stores
    them: a record without headers is its body alone, born at the record's time; one
    whose headers fit a properties string carries them as properties; any other keeps
    the whole record as its body, flagged as such."""
    from mqserver import message as fmt
    from mqserver.message import Message
    from protocols.smss import binlog
    from protocols.smss.payload import encode_message

    payload = b"".join(encode_message(headers, body) for body, headers in records)
    got = binlog.messages_of(payload, 1700000000000, extra)
    want = []
    for (body, headers), raw in zip(records, _records_of(payload)):
        if not headers:
            want.append((0, Message(body=body, properties=extra, born_ts=1700000000000)))
        elif fmt.properties_safe(headers):
            want.append((0, Message(body=body, properties=fmt.encode_properties(headers) + extra,
                                    born_ts=1700000000000)))
        else:
            want.append((0, Message(body=raw, properties=extra,
                                    sys_flag=fmt.SYSFLAG_SMSS_FRAMED, born_ts=1700000000000)))
    assert got == want


def _records_of(payload):
    from protocols.smss.payload import record_spans

    return [payload[s:e] for s, e in record_spans(payload)]
