"""Server-side NSQ command decoder: golden vectors from the spec and nsqd's validation."""
import struct
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.nsq import errors as E
from protocols.nsq.codec import CommandDecoder, encode_command, encode_mpub, is_valid_name, is_valid_topic
from protocols.nsq.messages import (Auth, Cls, Dpub, Fin, Identify, Invalid, Mpub, Nop, Pub,
                                    Rdy, Req, Sub, Touch)

MAGIC = bytes.fromhex("20205632")
ID = b"18a3258a24e69000"
IDENTIFY_JSON = b'{"client_id":"c","feature_negotiation":true,"heartbeat_interval":30000}'


def u32(n):
    return struct.pack(">I", n)


def decode(data, chunk=None, **kw):
    """Feed ``data`` (after the magic) whole or in ``chunk``-byte pieces."""
    dec = CommandDecoder(**kw)
    data = MAGIC + data
    if chunk is None:
        return dec.feed(data)
    out = []
    for i in range(0, len(data), chunk):
        out += dec.feed(data[i:i + chunk])
    return out


def only_error(data, **kw):
    """Decode and return the single Invalid the data produces."""
    out = decode(data, **kw)
    assert len(out) == 1 and isinstance(out[0], Invalid), out
    return out[0]


# Client->server byte examples, as NSQ's TCP protocol documentation and nsqd 1.3.0 take them.
GOLDEN = [
    (bytes.fromhex("49 44 45 4e 54 49 46 59 0a 00 00 00 47") + IDENTIFY_JSON,
     Identify(IDENTIFY_JSON)),
    (bytes.fromhex("53 55 42 20 74 20 63 0a"), Sub("t", "c")),
    (bytes.fromhex("52 44 59 20 31 0a"), Rdy(1)),
    (bytes.fromhex("50 55 42 20 74 0a 00 00 00 05 68 65 6c 6c 6f"), Pub("t", b"hello")),
    (bytes.fromhex("46 49 4e 20 31 38 61 33 32 35 38 61 32 34 65 36 39 30 30 30 0a"), Fin(ID)),
    (bytes.fromhex("4d 50 55 42 20 74 0a 00 00 00 0f 00 00 00 02 00 00 00 01 61"
                   "00 00 00 02 62 63"), Mpub("t", [b"a", b"bc"])),
    (bytes.fromhex("44 50 55 42 20 74 20 31 30 30 30 0a 00 00 00 05 68 65 6c 6c 6f"),
     Dpub("t", 1000, b"hello")),
    (bytes.fromhex("52 45 51 20") + ID + bytes.fromhex("20 30 0a"), Req(ID, 0)),
    (bytes.fromhex("54 4f 55 43 48 20") + ID + b"\n", Touch(ID)),
    (bytes.fromhex("4e 4f 50 0a"), Nop()),
    (bytes.fromhex("43 4c 53 0a"), Cls()),
    (bytes.fromhex("41 55 54 48 0a 00 00 00 06 73 65 63 72 65 74"), Auth(b"secret")),
]
STREAM = b"".join(raw for raw, _ in GOLDEN)
EXPECTED = [cmd for _, cmd in GOLDEN]


@pytest.mark.parametrize("raw,cmd", GOLDEN, ids=[type(c).__name__ for _, c in GOLDEN])
def test_golden_vector_alone(raw, cmd):
    """Each spec byte example decodes to its command, fed whole and byte by byte."""
    assert decode(raw) == [cmd]
    assert decode(raw, chunk=1) == [cmd]


@pytest.mark.parametrize("chunk", [None, 1, 2, 3, 5, 7, 64])
def test_golden_stream_pipelined(chunk):
    """All spec examples pipelined in one stream decode in order at any chunking."""
    assert decode(STREAM, chunk=chunk) == EXPECTED


def test_golden_magic_split():
    """The magic may arrive split; nothing is produced until a command completes."""
    dec = CommandDecoder()
    assert dec.feed(b"  ") == []
    assert dec.feed(b"V2NO") == []
    assert dec.feed(b"P\n") == [Nop()]


def test_client_encoders_produce_spec_bytes():
    """encode_command/encode_mpub reproduce the spec's client byte examples."""
    assert encode_command("PUB", "t", body=b"hello") == GOLDEN[3][0]
    assert encode_command("FIN", ID) == GOLDEN[4][0]
    assert encode_mpub("t", [b"a", b"bc"]) == GOLDEN[5][0]
    assert encode_command("DPUB", "t", 1000, body=b"hello") == GOLDEN[6][0]


@pytest.mark.parametrize("magic", [b"  V1", b"V2  ", b"GET ", b"\x00\x00\x00\x00"])
def test_bad_magic_is_fatal(magic):
    """A wrong magic gives the bare E_BAD_PROTOCOL and closes the decoder."""
    dec = CommandDecoder()
    out = dec.feed(magic[:2]) + dec.feed(magic[2:] + b"NOP\n")
    assert out == [Invalid("", (), E.bad_protocol(), False)]
    assert out[0].error.data == b"E_BAD_PROTOCOL" and out[0].error.fatal
    assert dec.closed and dec.feed(b"NOP\n") == []


def test_trailing_cr_is_stripped_once():
    """`NOP\\r\\n` and `PUB e\\r\\n` are accepted; a second \\r stays part of the verb."""
    assert decode(b"NOP\r\nPUB e\r\n" + u32(1) + b"x") == [Nop(), Pub("e", b"x")]
    assert only_error(b"NOP\r\r\n").error.data == b"E_INVALID invalid command NOP\r"


def test_unknown_verbs_are_case_sensitive():
    """Verbs are upper case only; anything else is `invalid command <VERB>`."""
    assert only_error(b"nop\n").error.data == b"E_INVALID invalid command nop"
    assert only_error(b"\n").error.data == b"E_INVALID invalid command "
    assert only_error(b"BOGUS x\n").params == (b"BOGUS", b"x")


def test_commands_before_an_error_are_kept():
    """Commands decoded in the same chunk before a bad one are returned before it."""
    out = decode(b"PUB t\n" + u32(1) + b"xFIN short\nNOP\n")
    assert out[0] == Pub("t", b"x")
    assert out[1].error.data == b"E_INVALID invalid message ID" and out[1].in_sync
    assert out[2] == Nop()  # a line-only error leaves the stream in sync


def test_rdy_parse_error_keeps_stream_in_sync():
    """nsqd ignores RDY after CLS before parsing it, so a bad RDY must not kill the decoder."""
    out = decode(b"RDY x\nNOP\n")
    assert out == [Invalid("RDY", (b"RDY", b"x"), E.rdy_parse(b"x"), True), Nop()]


# -- body sizes are checked before the body arrives ---------------------------------

@pytest.mark.parametrize("line,size,text", [
    (b"PUB t\n", 1048577, b"E_BAD_MESSAGE PUB message too big 1048577 > 1048576"),
    (b"DPUB t 0\n", 1048577, b"E_BAD_MESSAGE DPUB message too big 1048577 > 1048576"),
    (b"IDENTIFY\n", 5242881, b"E_BAD_BODY IDENTIFY body too big 5242881 > 5242880"),
    (b"AUTH\n", 5242881, b"E_BAD_BODY AUTH body too big 5242881 > 5242880"),
    (b"MPUB t\n", 5242881, b"E_BAD_BODY MPUB body too big 5242881 > 5242880"),
    (b"PUB t\n", 0, b"E_BAD_MESSAGE PUB invalid message body size 0"),
    (b"DPUB t 0\n", 0, b"E_BAD_MESSAGE DPUB invalid message body size 0"),
    (b"IDENTIFY\n", 0, b"E_BAD_BODY IDENTIFY invalid body size 0"),
    (b"AUTH\n", 0, b"E_BAD_BODY AUTH invalid body size 0"),
    (b"MPUB t\n", 0, b"E_BAD_BODY MPUB invalid body size 0"),
    # nsqd reads lengths into an int32
    (b"PUB t\n", 0xFFFFFFFF, b"E_BAD_MESSAGE PUB invalid message body size -1"),
    (b"IDENTIFY\n", 0x80000000, b"E_BAD_BODY IDENTIFY invalid body size -2147483648"),
])
def test_body_size_rejected_before_body(line, size, text):
    """Only the command line and the 4-byte size are fed; the fatal error comes at once."""
    err = only_error(line + u32(size), chunk=1)
    assert err.error.data == text and err.error.fatal and not err.in_sync


def test_custom_limits_apply():
    """max_msg_size / max_body_size from the constructor drive the checks and texts."""
    assert decode(b"PUB t\n" + u32(10) + b"0123456789", max_msg_size=10) == [
        Pub("t", b"0123456789")]
    err = only_error(b"PUB t\n" + u32(11), max_msg_size=10)
    assert err.error.data == b"E_BAD_MESSAGE PUB message too big 11 > 10"
    err = only_error(b"IDENTIFY\n" + u32(101), max_body_size=100)
    assert err.error.data == b"E_BAD_BODY IDENTIFY body too big 101 > 100"


def test_decoder_is_dead_after_framing_error():
    """After a body-size error nothing more is decoded, whatever follows."""
    dec = CommandDecoder()
    out = dec.feed(MAGIC + b"PUB t\n" + u32(0) + b"NOP\n")
    assert len(out) == 1 and dec.closed
    assert dec.feed(b"NOP\n") == []


# -- MPUB ---------------------------------------------------------------------------

def mpub_raw(parts, count=None, body_len=None):
    inner = u32(len(parts) if count is None else count) + b"".join(u32(n) + b for n, b in parts)
    return b"MPUB t\n" + u32(len(inner) if body_len is None else body_len) + inner


def test_mpub_zero_size_message_is_bad_message():
    """A zero-length inner message is fatal E_BAD_MESSAGE naming its 0-based index."""
    err = only_error(mpub_raw([(1, b"a"), (0, b""), (1, b"b")]), chunk=1)
    assert err.error.data == b"E_BAD_MESSAGE MPUB invalid message(1) body size 0"


def test_mpub_message_too_big_before_its_body():
    """An inner size above max_msg_size fails as soon as the size arrives."""
    err = only_error(b"MPUB t\n" + u32(100) + u32(2) + u32(1) + b"a" + u32(1048577))
    assert err.error.data == b"E_BAD_MESSAGE MPUB message too big 1048577 > 1048576"


@pytest.mark.parametrize("count,ok", [(0, False), (0x80000000, False), (1048575, True),
                                      (1048576, False)])
def test_mpub_message_count_limits(count, ok):
    """Count must be 1..(max_body_size-4)//5; otherwise fatal E_BAD_BODY."""
    out = decode(b"MPUB t\n" + u32(8) + u32(count))
    if ok:
        assert out == []  # waiting for the messages
    else:
        expected = count - (1 << 32) if count >= 0x80000000 else count
        assert out[0].error.data == b"E_BAD_BODY MPUB invalid message count %d" % expected


def test_mpub_ignores_outer_length_like_nsqd():
    """nsqd reads count messages regardless of the MPUB body length; so do we."""
    raw = mpub_raw([(1, b"a"), (2, b"bc")], body_len=1) + b"NOP\n"
    assert decode(raw) == [Mpub("t", [b"a", b"bc"]), Nop()]
    assert decode(raw, chunk=1) == [Mpub("t", [b"a", b"bc"]), Nop()]


def test_mpub_many_messages_split_anywhere():
    """A 1000-message MPUB decodes identically whatever the chunk size."""
    bodies = [bytes([i % 251]) * (i % 37 + 1) for i in range(1000)]
    raw = encode_mpub("t", bodies)
    for chunk in (None, 1, 13, 4096):
        assert decode(raw, chunk=chunk) == [Mpub("t", bodies)]


# -- names --------------------------------------------------------------------------

@pytest.mark.parametrize("verb", ["PUB", "SUB"])
def test_leading_dot_topic_is_a_bad_topic(verb):
    """A topic is also a directory name here: ".", ".." and ".x" (valid for nsqd) are
    E_BAD_TOPIC; a channel never becomes a path, so it keeps nsqd's rule."""
    assert is_valid_name(b"..") and not is_valid_topic(b"..")
    raw = b"SUB .. ..\n" if verb == "SUB" else encode_command("PUB", "..", body=b"m")
    err = only_error(raw).error
    assert err.data == b"E_BAD_TOPIC " + verb.encode() + b' topic name ".." is not valid' and err.fatal
    assert decode(b"SUB t ..\n") == [Sub("t", "..")]


@pytest.mark.parametrize("name", [b"t", b"a" * 64, b"a" * 54 + b"#ephemeral", b"_.-",
                                  b"Topic_09.x-y", b"c#ephemeral"])
def test_valid_names(name):
    """1..64 bytes of [.a-zA-Z0-9_-], optional #ephemeral counted in the 64, are valid."""
    assert is_valid_name(name)
    assert decode(b"SUB " + name + b" " + name + b"\n") == [Sub(name.decode(), name.decode())]


@pytest.mark.parametrize("name", [b"", b"a" * 65, b"a" * 55 + b"#ephemeral", b"bad!topic",
                                  b"t#eph", b"#ephemeral", b"t#ephemeral#ephemeral",
                                  b"t#EPHEMERAL", "tö".encode(), b"t:c", b"t/c"])
def test_invalid_names(name):
    """Names outside the rule are refused with E_BAD_TOPIC / E_BAD_CHANNEL."""
    assert not is_valid_name(name)
    assert only_error(b"SUB " + name + b" c\n").error.code == "E_BAD_TOPIC"
    assert only_error(b"SUB t " + name + b"\n").error.code == "E_BAD_CHANNEL"


@pytest.mark.parametrize("line,text", [
    (b"PUB bad!topic\n", b'E_BAD_TOPIC PUB topic name "bad!topic" is not valid'),
    (b"DPUB bad!topic 0\n", b'E_BAD_TOPIC DPUB topic name "bad!topic" is not valid'),
    (b"MPUB bad!topic\n", b'E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "bad!topic" is not valid'),
    (b"SUB bad!topic c\n", b'E_BAD_TOPIC SUB topic name "bad!topic" is not valid'),
    (b"SUB t bad!chan\n", b'E_BAD_CHANNEL SUB channel name "bad!chan" is not valid'),
    (b"PUB \n", b'E_BAD_TOPIC PUB topic name "" is not valid'),
    (b'PUB a"\\\x01\xff\t\n', b'E_BAD_TOPIC PUB topic name "a\\"\\\\\\x01\\xff\\t" is not valid'),
    ("PUB tö\u200b\n".encode(), 'E_BAD_TOPIC PUB topic name "tö\\u200b" is not valid'.encode()),
])
def test_name_error_texts(line, text):
    """Name errors carry nsqd's exact text, the name quoted like Go's %q."""
    err = only_error(line).error
    assert err.data == text and err.fatal


def test_body_verb_name_error_is_out_of_sync():
    """A PUB refused on its line leaves its body unread, so the decoder stops."""
    err = only_error(b"PUB bad!topic\n" + u32(1) + b"x" + b"NOP\n")
    assert not err.in_sync


# -- parameters -------------------------------------------------------------------

@pytest.mark.parametrize("line,text", [
    (b"SUB t\n", b"E_INVALID SUB insufficient number of parameters"),
    (b"PUB\n", b"E_INVALID PUB insufficient number of parameters"),
    (b"MPUB\n", b"E_INVALID MPUB insufficient number of parameters"),
    (b"DPUB t\n", b"E_INVALID DPUB insufficient number of parameters"),
    (b"FIN\n", b"E_INVALID FIN insufficient number of params"),
    (b"REQ " + ID + b"\n", b"E_INVALID REQ insufficient number of params"),
    (b"TOUCH\n", b"E_INVALID TOUCH insufficient number of params"),
    (b"AUTH x\n", b"E_INVALID AUTH invalid number of parameters"),
    (b"FIN 18a3258a24e6900\n", b"E_INVALID invalid message ID"),
    (b"TOUCH 18a3258a24e690000\n", b"E_INVALID invalid message ID"),
    (b"REQ 123 0\n", b"E_INVALID invalid message ID"),
    (b"RDY -1\n", b"E_INVALID RDY could not parse count -1"),
    (b"RDY 1x\n", b"E_INVALID RDY could not parse count 1x"),
    (b"RDY 2501\n", b"E_INVALID RDY count 2501 out of range 0-2500"),
    (b"RDY 18446744073709551615\n", b"E_INVALID RDY count -1 out of range 0-2500"),
    (b"REQ " + ID + b" 1s\n", b"E_INVALID REQ could not parse timeout 1s"),
    (b"DPUB t x\n", b"E_INVALID DPUB could not parse timeout x"),
    (b"DPUB t 3600001\n", b"E_INVALID DPUB timeout 3600001 out of range 0-3600000"),
    (b"DPUB t 18446744073709551615\n",
     b"E_INVALID DPUB timeout 18446744073709551615 out of range 0-3600000"),
])
def test_parameter_errors(line, text):
    """Malformed parameters give nsqd's exact fatal E_INVALID text."""
    err = only_error(line).error
    assert err.data == text and err.fatal and err.code == "E_INVALID"


@pytest.mark.parametrize("line,cmd", [
    (b"RDY\n", Rdy(1)),            # omitted -> 1
    (b"RDY \n", Rdy(0)),           # empty parameter parses as 0
    (b"RDY 0\n", Rdy(0)),
    (b"RDY 2500\n", Rdy(2500)),
    (b"RDY 0002500\n", Rdy(2500)),
    (b"RDY 5 extra\n", Rdy(5)),    # extra parameters are ignored
    (b"REQ " + ID + b" 500\n", Req(ID, 500)),
    (b"REQ " + ID + b" 3600001\n", Req(ID, 3600000)),   # clamped, no error
    (b"REQ " + ID + b" 99999999999999\n", Req(ID, 3600000)),
    (b"REQ " + ID + b" \n", Req(ID, 0)),
    (b"NOP x y\n", Nop()),
    (b"CLS now\n", Cls()),
    (b"SUB t c extra\n", Sub("t", "c")),
    (b"SUB t#ephemeral c#ephemeral\n", Sub("t#ephemeral", "c#ephemeral")),
])
def test_parameter_edge_cases_accepted(line, cmd):
    """nsqd's lenient parsing: defaults, clamping and ignored extra parameters."""
    assert decode(line) == [cmd]


def test_dpub_defer_bounds_and_unconsumed_body():
    """DPUB accepts 0..max_req_timeout inclusive; an out-of-range one stops the decoder."""
    assert decode(b"DPUB t 3600000\n" + u32(1) + b"x") == [Dpub("t", 3600000, b"x")]
    assert decode(b"DPUB t 0\n" + u32(1) + b"x") == [Dpub("t", 0, b"x")]
    assert decode(b"DPUB t 10\n" + u32(1) + b"x", max_req_timeout_ms=5) == [
        Invalid("DPUB", (b"DPUB", b"t", b"10"), E.dpub_range(10, 5), False)]


def test_custom_max_rdy_count():
    """The RDY ceiling follows the decoder's max_rdy_count."""
    assert decode(b"RDY 10\n", max_rdy_count=10) == [Rdy(10)]
    assert only_error(b"RDY 11\n", max_rdy_count=10).error.data == (
        b"E_INVALID RDY count 11 out of range 0-10")


def test_huge_digit_string_does_not_crash():
    """A 10000-digit RDY count wraps like nsqd's uint64 parse instead of raising."""
    digits = b"1" * 10000
    err = only_error(b"RDY " + digits + b"\n").error
    # 111...1 (10000 ones) = (10**10000 - 1) / 9, reduced modulo 2**64 without int(str)
    expected = (pow(10, 10000, 9 << 64) - 1) // 9
    expected = expected - (1 << 64) if expected >> 63 else expected
    assert err.data == b"E_INVALID RDY count %d out of range 0-2500" % expected


# -- line length and big bodies -----------------------------------------------------

def test_line_at_max_line_is_accepted():
    """A line of exactly max_line bytes including the newline still decodes."""
    line = b"NOP" + b" " * (16384 - 4) + b"\n"
    assert len(line) == 16384
    assert decode(line) == [Nop()]
    assert decode(line, chunk=1000) == [Nop()]


@pytest.mark.parametrize("chunk", [None, 1, 1000])
def test_overlong_line_is_fatal_without_frame(chunk):
    """max_line bytes without a newline is fatal (nsqd closes without an error frame)."""
    dec = CommandDecoder(max_line=100)
    data = MAGIC + b"PUB " + b"a" * 96 + b"aaaa"
    out = []
    for i in range(0, len(data), chunk or len(data)):
        out += dec.feed(data[i:i + (chunk or len(data))])
    assert len(out) == 1 and not out[0].error.send_frame and out[0].error.fatal
    assert dec.closed and dec._buf == b""


@pytest.mark.parametrize("chunk", [None, 7])
def test_overlong_line_with_newline_is_fatal(chunk):
    """A line one byte over max_line is refused even when its newline is already here."""
    line = b"NOP" + b" " * (16384 - 3) + b"\n"
    assert len(line) == 16385
    out = decode(line + b"NOP\n", chunk=chunk)
    assert len(out) == 1 and out[0].error.fatal and not out[0].error.send_frame


def test_big_body_in_many_chunks_is_linear():
    """An 8 MiB body fed in 1 KiB chunks decodes quickly (O(n), not O(n^2) copying)."""
    body = bytes(range(256)) * (8 * 4096)
    dec = CommandDecoder(max_msg_size=len(body))
    data = MAGIC + b"PUB big\n" + u32(len(body)) + body + b"NOP\n"
    start = time.perf_counter()
    out = []
    for i in range(0, len(data), 1024):
        out += dec.feed(data[i:i + 1024])
    elapsed = time.perf_counter() - start
    assert out == [Pub("big", body), Nop()]
    assert elapsed < 2.0, elapsed  # quadratic copying would move ~32 GiB here


def test_feed_accepts_bytearray_and_memoryview():
    """Bytes-like input other than bytes is accepted."""
    dec = CommandDecoder()
    assert dec.feed(bytearray(MAGIC + b"NOP\nPUB t\n")) == [Nop()]
    assert dec.feed(memoryview(u32(1) + b"x")) == [Pub("t", b"x")]


def test_decoder_without_magic():
    """expect_magic=False starts directly with command lines (e.g. after a handoff)."""
    assert CommandDecoder(expect_magic=False).feed(b"NOP\n") == [Nop()]


# -- feed's fast decode of a read that is one PUB ------------------------------------------

@settings(max_examples=400, deadline=None)
@given(
    verb=st.sampled_from([b"PUB", b"PUB", b"PUB", b"DPUB", b"MPUB", b"FIN", b"pub"]),
    topic=st.sampled_from([b"t", b"t#ephemeral", b"a.b-c_d", b"", b"bad topic", b"t\r",
                           b"x" * 64, b"x" * 65, b"t/u"]),
    cr=st.booleans(),
    body=st.binary(max_size=12),
    announced_delta=st.integers(-2, 2),
    extra=st.binary(max_size=3),
)
def test_one_pub_is_what_feed_decodes_byte_by_byte(verb, topic, cr, body, announced_delta,
                                                    extra):
    """Whatever the bytes, feeding them in one read (which tries the fast decode of one
    PUB) gives the commands that feeding them a byte at a time (the general way) gives;
    and the fast decode takes every plain one-message PUB within the limits and nothing
    else."""
    announced = len(body) + announced_delta
    data = (verb + b" " + topic + (b"\r" if cr else b"") + b"\n"
            + struct.pack(">i", announced) + body + extra)
    limits = dict(max_msg_size=10, expect_magic=False)
    whole = CommandDecoder(**limits)
    commands = whole.feed(data)
    bytewise = CommandDecoder(**limits)
    assert commands == [c for i in range(len(data)) for c in bytewise.feed(data[i:i + 1])]
    assert whole.at_line_start == bytewise.at_line_start
    fast = CommandDecoder(**limits)._one_pub(data) if data.startswith(b"PUB ") else None
    plain = (verb == b"PUB" and is_valid_name(topic) and not cr
             and 0 < announced <= 10 and announced == len(body) + len(extra))
    assert (fast is not None) == plain
    if plain:
        assert commands == [fast] and whole.at_line_start
        assert type(fast.body) is bytes and fast.body == (body + extra)[:announced]




def test_a_pub_read_after_held_bytes_takes_the_general_way():
    """feed decodes a read that is one PUB in one step only at a line start with nothing
    held: before the magic, or after a PUB's line, the same bytes mean what they mean
    there."""
    pub = b"PUB t\n" + u32(5) + b"hello"
    dec = CommandDecoder()
    assert [type(c) for c in dec.feed(pub)] == [Invalid]  # the magic has not come
    dec = CommandDecoder()
    assert dec.feed(MAGIC) == []
    assert dec.feed(pub) == [Pub("t", b"hello")]
    assert dec.feed(b"PUB t\n") == []
    # the body's size (u32 of b"PUB ") is over the limit: the PUB that waited fails
    assert [type(c) for c in dec.feed(pub)] == [Invalid]
    assert CommandDecoder(expect_magic=False).feed(bytearray(pub)) == [Pub("t", b"hello")]
