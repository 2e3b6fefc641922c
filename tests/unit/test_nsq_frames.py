"""NSQ frame encoders, client-side frame reader, error constructors and wire schemas."""
import struct

import pytest
from hypothesis import given, settings, strategies as st

from protocols.nsq import errors as E
from protocols.nsq import wire
from protocols.nsq.codec import (CLOSE_WAIT, HEARTBEAT, OK, FrameReader, decode_message, error,
                                 message_frame, message_frames, response)
from protocols.nsq.identify import negotiate
from protocols.nsq.messages import Message

ID = b"18a3258a24e69000"
TS = 1795267410341448703

# observed from nsqd v1.3.0
OK_BYTES = bytes.fromhex("00 00 00 06 00 00 00 00 4f 4b")
CLOSE_WAIT_BYTES = bytes.fromhex("00 00 00 0e 00 00 00 00 43 4c 4f 53 45 5f 57 41 49 54")
HEARTBEAT_BYTES = bytes.fromhex("00 00 00 0f 00 00 00 00 5f 68 65 61 72 74 62 65 61 74 5f")
MESSAGE_BYTES = bytes.fromhex(
    "00 00 00 23 00 00 00 02 18 ea 12 32 ae 3c cb ff 00 01"
    "31 38 61 33 32 35 38 61 32 34 65 36 39 30 30 30 68 65 6c 6c 6f")
BAD_PROTOCOL_BYTES = bytes.fromhex("00 00 00 12 00 00 00 01 45 5f 42 41 44 5f 50 52 4f 54 4f"
                                   "43 4f 4c")


def test_constant_frames_match_observed_bytes():
    """OK, CLOSE_WAIT and _heartbeat_ are byte-identical to nsqd's frames."""
    assert OK == OK_BYTES == response(b"OK")
    assert CLOSE_WAIT == CLOSE_WAIT_BYTES
    assert HEARTBEAT == HEARTBEAT_BYTES


def test_message_frame_matches_observed_bytes():
    """message_frame builds the observed 'hello' delivery exactly."""
    assert message_frame(TS, 1, ID, b"hello") == MESSAGE_BYTES


def test_message_frame_rejects_bad_id():
    """A non-16-byte id is refused rather than silently padded."""
    with pytest.raises(ValueError):
        message_frame(TS, 1, ID[:15], b"x")


def test_message_frames_equals_concatenation():
    """The batched encoder equals the single-frame encoder joined."""
    msgs = [(TS + i, i % 7 + 1, b"%016x" % i, b"body-%d" % i * (i % 5)) for i in range(200)]
    assert message_frames(msgs) == b"".join(message_frame(*m) for m in msgs)
    assert message_frames([]) == b""


@pytest.mark.parametrize("err,golden", [
    (E.bad_protocol(), BAD_PROTOCOL_BYTES),
    (E.cannot_in_state("FIN"),
     b"\x00\x00\x00\x29\x00\x00\x00\x01E_INVALID cannot FIN in current state"),
    (E.bad_topic("PUB", b"bad!topic"),
     b'\x00\x00\x00\x37\x00\x00\x00\x01E_BAD_TOPIC PUB topic name "bad!topic" is not valid'),
    (E.fin_failed(b"0000000000000000"),
     b"\x00\x00\x00\x3d\x00\x00\x00\x01E_FIN_FAILED FIN 0000000000000000 failed ID not in flight"),
])
def test_error_frames_match_observed_bytes(err, golden):
    """Error constructors framed by error() equal the spec's observed error frames."""
    assert error(err) == golden
    assert error(err.data) == golden


def test_only_fin_req_touch_failures_are_non_fatal():
    """Exactly E_FIN_FAILED, E_REQ_FAILED and E_TOUCH_FAILED keep the connection open."""
    non_fatal = {e.code for e in (E.fin_failed(ID), E.req_failed(ID, E.REASON_NOT_OWNER),
                                  E.touch_failed(ID)) if not e.fatal}
    assert non_fatal == {"E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"}
    fatal = [E.bad_protocol(), E.invalid_command(b"X"), E.bad_topic("PUB", "!"),
             E.bad_channel("SUB", "!"), E.bad_body("x"), E.bad_message("x"),
             E.pub_failed("exiting"), E.mpub_failed("exiting"), E.dpub_failed("exiting"),
             E.sub_failed("exiting"), E.identify_both_compressions(), E.auth_disabled(),
             E.auth_failed(), E.auth_no_authorizations(), E.unauthorized("PUB", "t"),
             E.auth_first("SUB"), E.auth_error("x"), E.identify_failed("x")]
    assert all(e.fatal for e in fatal)


@pytest.mark.parametrize("err,text", [
    (E.auth_disabled(), b"E_AUTH_DISABLED AUTH disabled"),
    (E.auth_failed(), b"E_AUTH_FAILED AUTH failed"),
    (E.auth_no_authorizations(), b"E_UNAUTHORIZED AUTH no authorizations found"),
    (E.unauthorized("SUB", "t", "c"), b'E_UNAUTHORIZED AUTH failed for SUB on "t" "c"'),
    (E.unauthorized("PUB", "t"), b'E_UNAUTHORIZED AUTH failed for PUB on "t" ""'),
    (E.auth_first("PUB"), b"E_AUTH_FIRST AUTH required before PUB"),
    (E.auth_already_set(), b"E_INVALID AUTH already set"),
    (E.sub_heartbeats_disabled(), b"E_INVALID cannot SUB with heartbeats disabled"),
    (E.tls_required("PUB"), b"E_INVALID cannot PUB in current state (TLS required)"),
    (E.pub_failed("exiting"), b"E_PUB_FAILED PUB failed exiting"),
    (E.mpub_failed("exiting"), b"E_MPUB_FAILED MPUB failed exiting"),
    (E.dpub_failed("exiting"), b"E_DPUB_FAILED DPUB failed exiting"),
    (E.sub_failed("exiting"), b"E_SUB_FAILED SUB failed exiting"),
    (E.req_failed(ID, E.REASON_NOT_OWNER),
     b"E_REQ_FAILED REQ 18a3258a24e69000 failed client does not own message"),
    (E.touch_failed(ID), b"E_TOUCH_FAILED TOUCH 18a3258a24e69000 failed ID not in flight"),
    (E.identify_both_compressions(),
     b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression"),
])
def test_error_texts(err, text):
    """Error constructors produce nsqd's spec texts."""
    assert err.data == text


def test_identify_reply_frame_size():
    """The default feature-negotiation reply frames to size 0x10c like the observed one."""
    frame = response(negotiate(b'{"feature_negotiation":true}').reply())
    assert frame[:8] == bytes.fromhex("00 00 01 0c 00 00 00 00")
    assert frame[8:11] == bytes.fromhex("7b 22 6d")


# -- client-side reader -------------------------------------------------------------

STREAM = OK_BYTES + MESSAGE_BYTES + HEARTBEAT_BYTES + BAD_PROTOCOL_BYTES + CLOSE_WAIT_BYTES
FRAMES = [(0, b"OK"), (2, MESSAGE_BYTES[8:]), (0, b"_heartbeat_"), (1, b"E_BAD_PROTOCOL"),
          (0, b"CLOSE_WAIT")]


@pytest.mark.parametrize("chunk", [None, 1, 3, 9])
def test_frame_reader_golden_stream(chunk):
    """FrameReader splits the golden server stream into frames at any chunking."""
    reader = FrameReader()
    chunk = chunk or len(STREAM)
    out = []
    for i in range(0, len(STREAM), chunk):
        out += reader.feed(STREAM[i:i + chunk])
    assert out == FRAMES


def test_frame_reader_big_frame_in_chunks():
    """A 4 MiB frame arriving in small pieces comes out whole once complete."""
    body = b"z" * (4 << 20)
    data = message_frame(TS, 3, ID, body)
    reader = FrameReader()
    out = []
    for i in range(0, len(data), 4096):
        out += reader.feed(data[i:i + 4096])
    assert len(out) == 1 and decode_message(out[0][1]) == Message(TS, 3, ID, body)


def test_frame_reader_rejects_size_below_four():
    """A frame size smaller than its type field is corrupt."""
    with pytest.raises(ValueError):
        FrameReader().feed(b"\x00\x00\x00\x03\x00\x00\x00\x00")


def test_decode_message_golden():
    """decode_message splits the observed message payload into its fields."""
    assert decode_message(MESSAGE_BYTES[8:]) == Message(TS, 1, ID, b"hello")
    with pytest.raises(ValueError):
        decode_message(MESSAGE_BYTES[8:33])


# -- construct schemas vs. struct fast paths --------------------------------------------

def test_construct_schemas_parse_golden_bytes():
    """The construct reference schemas read the observed frame and message."""
    frame = wire.FRAME.parse(MESSAGE_BYTES)
    assert frame.frame_type == 2
    msg = wire.MESSAGE.parse(frame.data)
    assert (msg.timestamp, msg.attempts, msg.id, msg.body) == (TS, 1, ID, b"hello")
    assert wire.MAGIC.build(None) == b"  V2"
    mpub = bytes.fromhex("00 00 00 02 00 00 00 01 61 00 00 00 02 62 63")
    assert wire.MPUB_BODY.parse(mpub) == [b"a", b"bc"]


@settings(max_examples=200, deadline=None)
@given(ts=st.integers(-(1 << 63), (1 << 63) - 1), attempts=st.integers(0, 65535),
       msg_id=st.binary(min_size=16, max_size=16), body=st.binary(max_size=300),
       frame_type=st.integers(0, 2))
def test_struct_and_construct_agree(ts, attempts, msg_id, body, frame_type):
    """Hot-path struct encoders and the construct schemas build identical bytes."""
    assert message_frame(ts, attempts, msg_id, body) == wire.FRAME.build(
        {"frame_type": 2, "data": wire.MESSAGE.build(
            {"timestamp": ts, "attempts": attempts, "id": msg_id, "body": body})})
    assert wire.MESSAGE_HEADER.pack(ts, attempts, msg_id) + body == wire.MESSAGE.build(
        {"timestamp": ts, "attempts": attempts, "id": msg_id, "body": body})
    assert wire.FRAME_HEADER.pack(len(body) + 4, frame_type) + body == wire.FRAME.build(
        {"frame_type": frame_type, "data": body})


@settings(max_examples=100, deadline=None)
@given(bodies=st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=20))
def test_mpub_struct_and_construct_agree(bodies):
    """encode_mpub's body equals the construct MPUB_BODY schema's build."""
    from protocols.nsq.codec import encode_mpub
    raw = encode_mpub("t", bodies)
    inner = raw[len(b"MPUB t\n") + 4:]
    assert inner == wire.MPUB_BODY.build(bodies)
    assert struct.unpack(">I", raw[7:11])[0] == len(inner)


@pytest.mark.parametrize("raw, frame_type", [(OK_BYTES, 0), (CLOSE_WAIT_BYTES, 0),
                                             (HEARTBEAT_BYTES, 0), (BAD_PROTOCOL_BYTES, 1),
                                             (MESSAGE_BYTES, 2)])
def test_frame_headers_parse_with_the_schema(raw, frame_type):
    """Each observed frame's head, read with the struct the encoders use (derived from
    FRAME), gives what the FRAME schema parses."""
    parsed = wire.FRAME.parse(raw)
    assert parsed.frame_type == frame_type
    assert wire.FRAME_HEADER.unpack_from(raw) == (len(raw) - 4, frame_type)


def test_message_frame_head_parses_with_the_schema():
    """The observed message frame parses with MESSAGE_FRAME; the derived struct and the
    offsets _frames.c is given read the same fields."""
    parsed = wire.MESSAGE_FRAME.parse(MESSAGE_BYTES)
    head = (len(MESSAGE_BYTES) - 4, parsed.frame_type, parsed.message.timestamp,
            parsed.message.attempts, parsed.message.id)
    assert head == (0x23, 2, TS, 1, ID)
    assert wire.MESSAGE_FRAME_HEADER.unpack_from(MESSAGE_BYTES) == head
    assert wire.MESSAGE_FRAME_OFFSETS == (0, 4, 8, 16, 18)
    assert (wire.MESSAGE_FRAME_HEADER.size, wire.MESSAGE_HEADER_LENGTH) == (34, 26)
    assert wire.MESSAGE_FRAME.build(
        {"message": {"timestamp": TS, "attempts": 1, "id": ID, "body": b"hello"}}
    ) == MESSAGE_BYTES
