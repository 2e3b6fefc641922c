"""Unit tests for the RocketMQ remoting codec: framing, headers, limits, properties, hashes, ids, batches."""

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.remoting import codes, wire
from protocols.remoting.codec import (
    RemotingProtocolError,
    decode_frame,
    decode_payload,
    encode,
    encode_binary_header,
    encode_json_header,
    encode_response,
    ext_value_to_str,
)
from protocols.remoting.framing import FrameDecoder
from protocols.remoting.messages import RemotingCommand, make_response
from protocols.remoting.props import (
    BatchMessage,
    decode_batch_body,
    decode_properties,
    encode_batch_body,
    encode_properties,
    java_string_hash,
    make_offset_msg_id,
    parse_offset_msg_id,
    tag_hash_code,
)

# -- strategies ------------------------------------------------------------------------

text = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
int16 = st.integers(-(2**15), 2**15 - 1)
int32 = st.integers(-(2**31), 2**31 - 1)
languages = st.sampled_from(codes.LANGUAGE_NAMES)


@st.composite
def commands(draw, serialize_type):
    """Arbitrary commands that fit both header layouts."""
    return RemotingCommand(
        code=draw(int16),
        language=draw(languages),
        version=draw(int16),
        opaque=draw(int32),
        flag=draw(int32),
        remark=draw(st.none() | text),
        ext_fields=draw(st.dictionaries(text, text, max_size=6)),
        body=draw(st.binary(max_size=300)),
        serialize_type=serialize_type,
    )


def _json_header(frame: bytes) -> dict:
    return json.loads(frame[8:8 + int.from_bytes(frame[5:8], "big")])


# -- wire schemas vs hot-path structs ----------------------------------------------------


@given(commands(codes.SERIALIZE_JSON) | commands(codes.SERIALIZE_ROCKETMQ))
def test_construct_frame_schema_agrees_with_encoder(command):
    """The construct FRAME schema builds and parses exactly the bytes the struct-based encoder produces."""
    frame = encode(command)
    parsed = wire.FRAME.parse(frame)
    assert parsed.serialize_type == command.serialize_type and parsed.body == command.body
    assert wire.FRAME.build(dict(serialize_type=parsed.serialize_type, header=parsed.header, body=parsed.body)) == frame
    prefix = wire.FRAME_PREFIX.parse(frame[:8])
    length, word = wire.FRAME_PREFIX_STRUCT.unpack(frame[:8])
    assert (prefix.length, (prefix.serialize_type << 24) | prefix.header_length) == (length, word)
    assert wire.pack_frame_prefix(prefix.serialize_type, prefix.header_length,
                                  len(parsed.body)) == frame[:8]


@given(commands(codes.SERIALIZE_ROCKETMQ))
def test_construct_binary_header_schema_agrees_with_encoder(command):
    """The construct ROCKETMQ_HEADER schema builds the same bytes as encode_binary_header."""
    built = wire.ROCKETMQ_HEADER.build(dict(
        code=command.code,
        language=codes.LANGUAGE_CODES[command.language],
        version=command.version,
        opaque=command.opaque,
        flag=command.flag,
        remark=command.remark or "",
        ext_fields=[dict(key=k, value=v) for k, v in command.ext_fields.items()],
    ))
    assert built == encode_binary_header(command)


@given(st.lists(st.tuples(int32, st.binary(max_size=50), st.dictionaries(st.sampled_from("ABCD"), st.sampled_from(["x", "yz"]), max_size=3)), max_size=4))
def test_construct_batch_schema_agrees_with_encoder(messages):
    """The construct BATCH_MESSAGE schema builds the same bytes as encode_batch_body."""
    built = b"".join(
        wire.BATCH_MESSAGE.build(dict(magic_code=0, body_crc=0, flag=flag, body=body, properties=encode_properties(props).encode()))
        for flag, body, props in messages
    )
    assert built == encode_batch_body(messages)


def test_binary_header_matches_spec_example():
    """A constructed ROCKETMQ-type GET_ROUTEINFO_BY_TOPIC frame is reproduced byte for byte."""
    command = RemotingCommand(code=105, language="JAVA", version=401, opaque=3, ext_fields={"topic": "T"}, serialize_type=1)
    expected = "00000025 01000021 0069 00 0191 00000003 00000000 00000000 0000000c 0005 746f706963 00000001 54"
    assert encode(command) == bytes.fromhex(expected.replace(" ", ""))
    assert decode_frame(encode(command)) == command


def test_binary_header_spec_example_parses_with_the_schema():
    """That constructed frame parses with FRAME and ROCKETMQ_HEADER, and the structs the codec
    uses (derived from them) read the same fixed fields."""
    frame = bytes.fromhex("00000025 01000021 0069 00 0191 00000003 00000000 00000000 0000000c"
                          " 0005 746f706963 00000001 54".replace(" ", ""))
    parsed = wire.FRAME.parse(frame)
    assert (parsed.serialize_type, len(parsed.header), parsed.body) == (1, 0x21, b"")
    length, word = wire.FRAME_PREFIX_STRUCT.unpack_from(frame)
    assert (length, word >> wire.SERIALIZE_TYPE_SHIFT, word & wire.MAX_HEADER_LENGTH) == (0x25, 1, 0x21)
    header = wire.ROCKETMQ_HEADER.parse(parsed.header)
    assert wire.BINARY_HEADER_FIXED.unpack_from(parsed.header) == (
        header.code, header.language, header.version, header.opaque, header.flag, 0)
    assert (header.code, header.version, header.opaque) == (105, 401, 3)
    assert wire.INT32_STRUCT.unpack_from(parsed.header, wire.BINARY_HEADER_FIXED.size) == (12,)
    assert wire.INT16_STRUCT.unpack_from(parsed.header, wire.BINARY_HEADER_FIXED.size + 4) == (5,)


# -- round trips ---------------------------------------------------------------------------


@given(commands(codes.SERIALIZE_JSON))
def test_json_round_trip(command):
    """A JSON-type command survives encode/decode unchanged."""
    assert decode_frame(encode(command)) == command


@given(commands(codes.SERIALIZE_ROCKETMQ))
def test_binary_round_trip(command):
    """A ROCKETMQ-type command survives encode/decode, with an empty remark read back as None (as in Java)."""
    decoded = decode_frame(encode(command))
    assert decoded.remark == (command.remark or None)
    decoded.remark = command.remark
    assert decoded == command


@given(st.lists(commands(codes.SERIALIZE_JSON) | commands(codes.SERIALIZE_ROCKETMQ), min_size=1, max_size=5), st.data())
def test_decoder_handles_arbitrary_chunking(batch, data):
    """A stream of frames cut at arbitrary points decodes to the same commands in order."""
    stream = b"".join(encode(c) for c in batch)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    decoder, out, start = FrameDecoder(), [], 0
    for cut in cuts + [len(stream)]:
        out += decoder.feed(stream[start:cut])
        start = cut
    assert [decode_frame(encode(c)) for c in batch] == out
    assert decoder.buffered() == 0


# -- limits and garbage -------------------------------------------------------------------


def test_oversized_length_rejected_before_buffering():
    """Eight bytes announcing a 17 MiB frame raise at once instead of waiting for the frame."""
    decoder = FrameDecoder()
    prefix = wire.FRAME_PREFIX_STRUCT.pack(17 * 1024 * 1024, 0x20)
    with pytest.raises(RemotingProtocolError, match="exceeds"):
        decoder.feed(prefix)
    with pytest.raises(RemotingProtocolError):  # the decoder stays failed
        decoder.feed(encode(RemotingCommand(code=34)))


def test_limit_counts_the_whole_frame():
    """A frame of exactly max_frame bytes (prefix included) passes; one byte more is refused."""
    frame = encode(RemotingCommand(code=34, body=b"x" * 10))
    assert FrameDecoder(max_frame=len(frame)).feed(frame) == [decode_frame(frame)]
    with pytest.raises(RemotingProtocolError):
        FrameDecoder(max_frame=len(frame) - 1).feed(frame[:4])


@pytest.mark.parametrize("garbage", [
    b"GET / HTTP/1.1\r\n",  # huge announced length
    bytes.fromhex("00000002") + b"xx",  # no room for the header length word
    bytes.fromhex("0000000802000000") + b"abcd",  # serialize type 2
    bytes.fromhex("0000000800000010") + b"abcd",  # header longer than the frame
    bytes.fromhex("0000000600000002") + b"{x",  # bad JSON
    bytes.fromhex("0000000600000002") + b"[]",  # JSON but not an object
    bytes.fromhex("0000000600000002") + b"{}",  # no code
    bytes.fromhex("0000000800000004") + b"\xff\xfe{}",  # not UTF-8
    bytes.fromhex("0000000801000004") + b"\x00\x0a\x00\x01",  # truncated binary header
    bytes.fromhex("0000001a01000016") + bytes.fromhex("000a00000100000001000000000000000100000001") + b"x",  # remark overruns
])
def test_garbage_raises_protocol_error(garbage):
    """Malformed frames raise RemotingProtocolError, never another exception."""
    with pytest.raises(RemotingProtocolError):
        FrameDecoder().feed(garbage)


def test_error_keeps_commands_decoded_before_it():
    """Commands completed earlier in the same chunk travel on the exception."""
    good = encode(RemotingCommand(code=34, opaque=7))
    with pytest.raises(RemotingProtocolError) as info:
        FrameDecoder().feed(good + b"\xff" * 8)
    assert [c.opaque for c in info.value.commands] == [7]


def test_large_frame_in_small_chunks():
    """A 4 MiB frame fed in 512-byte chunks decodes to exactly one command with its body."""
    frame = encode(RemotingCommand(code=10, body=bytes(range(256)) * 16384))
    decoder, out = FrameDecoder(), []
    for start in range(0, len(frame), 512):
        out += decoder.feed(frame[start:start + 512])
    assert decoder.buffered() == 0
    assert len(out) == 1 and out[0].body == frame[-4 * 1024 * 1024:]


# -- JSON header details -------------------------------------------------------------------


def test_json_header_is_java_shaped():
    """A response header reproduces a Java 4.9 broker's exactly: sorted keys, no remark, serializeTypeCurrentRPC."""
    response = make_response(RemotingCommand(code=105, language="CPP", version=63, opaque=0, remark=""), codes.SUCCESS)
    frame = encode(response)
    assert frame[8:] == b'{"code":0,"flag":1,"language":"JAVA","opaque":0,"serializeTypeCurrentRPC":"JSON","version":401}'
    assert frame[:8] == bytes.fromhex("000000630000005f")


def test_response_ext_fields_are_json_strings():
    """Numbers and booleans given as extFields go out as JSON strings (as the Go and C++ clients need)."""
    request = RemotingCommand(code=10, opaque=1)
    response = make_response(request, codes.SUCCESS, ext_fields={"msgId": "X", "queueId": 0, "queueOffset": 5, "TRACE_ON": True})
    assert _json_header(encode(response))["extFields"] == {"msgId": "X", "queueId": "0", "queueOffset": "5", "TRACE_ON": "true"}


def test_json_decoding_tolerates_client_dialects():
    """Trailing newline, raw control characters, numbers, booleans, nulls and nested values in extFields are accepted."""
    header = b'{"code":"10","extFields":{"a":1,"b":true,"c":null,"d":[1],"p":"K\x01v\x02"},"flag":0,"opaque":3,"x":1}\n'
    command = decode_payload(len(header).to_bytes(4, "big") + header + b"body")
    assert (command.code, command.opaque, command.language, command.remark, command.body) == (10, 3, "JAVA", None, b"body")
    assert command.ext_fields == {"a": "1", "b": "true", "d": "[1]", "p": "K\x01v\x02"}


_json_value = st.none() | st.booleans() | st.integers() | text | st.floats(allow_nan=False) | st.lists(st.integers(), max_size=2)


@given(st.dictionaries(text, _json_value, max_size=12))
def test_json_ext_values_of_any_type_decode_as_java_reads_them(ext):
    """Whatever mix of JSON types extFields holds (C++ sends some numbers), every value
    is read as its string form, in the sender's key order, and nulls are dropped."""
    header = json.dumps({"code": 11, "extFields": ext, "opaque": 1}).encode()
    command = decode_payload(len(header).to_bytes(4, "big") + header)
    expected = {k: ext_value_to_str(v) for k, v in ext.items() if v is not None}
    assert command.ext_fields == expected
    assert list(command.ext_fields) == list(expected)


@settings(max_examples=300)
@given(st.sampled_from(["", " ", "\n", "\t\r\n ", "x", "\u00a0"]),
       st.sampled_from(['{"code":11,"opaque":2}', '{"code":11', '[1]', '"s"', '', '{}{}']),
       st.sampled_from(["", "\n", " \t", "x", "{}", " ,", "\u00a0", "\x00"]))
def test_json_header_accepts_what_json_decode_accepts(before, value, after):
    """The header is read with the JSON scanner directly: it accepts and refuses exactly
    what json's decode() (strict=False) does with any text around the value."""
    text = before + value + after
    try:
        obj = json.JSONDecoder(strict=False).decode(text)
    except json.JSONDecodeError:
        obj = None
    header = text.encode()
    frame = (len(header) + 4).to_bytes(4, "big") + len(header).to_bytes(4, "big") + header
    if type(obj) is dict and "code" in obj:
        assert decode_frame(frame).code == obj["code"]
    else:
        with pytest.raises(RemotingProtocolError):
            decode_frame(frame)


def test_json_control_characters_are_escaped():
    """Property separators are written as \\u0001/\\u0002 escapes, like jsoncpp and fastjson do."""
    command = RemotingCommand(code=10, ext_fields={"properties": "TAGS\x01TagA\x02"})
    assert b'"properties":"TAGS\\u0001TagA\\u0002"' in encode(command)


def _reference_json_header(command):
    """The header as json.dumps writes the dict a Java 4.9 server would."""
    obj = {"code": command.code}
    if command.ext_fields:
        obj["extFields"] = {k: str(v) for k, v in command.ext_fields.items()}
    obj.update(flag=command.flag, language=command.language, opaque=command.opaque)
    if command.remark is not None:
        obj["remark"] = command.remark
    obj.update(serializeTypeCurrentRPC="JSON", version=command.version)
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


any_text = st.text(max_size=20)  # surrogates included: they cannot be UTF-8


@given(st.builds(
    RemotingCommand, code=st.integers(), language=any_text | languages | st.integers(),
    version=st.integers(), opaque=st.integers(), flag=st.integers(),
    remark=st.none() | any_text | st.integers(),
    ext_fields=st.dictionaries(any_text, any_text | st.integers(), max_size=6)))
@settings(max_examples=300)
def test_json_header_template_gives_json_dumps_bytes(command):
    """The templated JSON header is byte for byte what json.dumps gives, or refused alike."""
    try:
        expected = _reference_json_header(command)
    except UnicodeEncodeError:
        with pytest.raises(RemotingProtocolError):
            encode_json_header(command)
    else:
        assert encode_json_header(command) == expected


@given(commands(codes.SERIALIZE_JSON) | commands(codes.SERIALIZE_ROCKETMQ), int16,
       st.dictionaries(any_text, any_text, max_size=6), st.none() | any_text, st.binary(max_size=300))
@settings(max_examples=300)
def test_encode_response_gives_the_bytes_of_the_response_command(asked, code, ext, remark, body):
    """encode_response (the answers of SEND and PULL) is byte for byte the frame of
    make_response's command, in either header layout, or refused alike."""
    try:
        expected = encode(make_response(asked, code, remark, ext, body))
    except RemotingProtocolError:
        with pytest.raises(RemotingProtocolError):
            encode_response(asked, code, ext, body, remark)
    else:
        assert encode_response(asked, code, ext, body, remark) == expected


def test_encode_rejects_unrepresentable_commands():
    """Unknown serialize types, non-string extFields values and out-of-range binary fields raise."""
    with pytest.raises(RemotingProtocolError):
        encode(RemotingCommand(code=1, serialize_type=3))
    with pytest.raises(RemotingProtocolError):
        encode(RemotingCommand(code=1, ext_fields={"a": 1.5}))
    with pytest.raises(RemotingProtocolError):
        encode(RemotingCommand(code=70000, serialize_type=codes.SERIALIZE_ROCKETMQ))


# -- messages ---------------------------------------------------------------------------------


def test_make_response_follows_the_request():
    """make_response copies opaque and serialize type, sets only the response bit, announces JAVA/401."""
    request = RemotingCommand(code=14, language="CPP", version=63, opaque=42, flag=codes.FLAG_ONEWAY, serialize_type=1)
    response = make_response(request, codes.QUERY_NOT_FOUND, remark="Not found")
    assert (response.opaque, response.serialize_type, response.flag) == (42, 1, codes.FLAG_RESPONSE)
    assert (response.code, response.remark, response.language, response.version) == (22, "Not found", "JAVA", 401)
    assert response.is_response() and not response.is_oneway()
    assert decode_frame(encode(response)).serialize_type == codes.SERIALIZE_ROCKETMQ


@pytest.mark.parametrize("flag, response, oneway", [(0, False, False), (1, True, False), (2, False, True), (3, True, True)])
def test_flag_helpers(flag, response, oneway):
    """is_response and is_oneway read bits 0 and 1 of flag."""
    command = RemotingCommand(code=15, flag=flag)
    assert (command.is_response(), command.is_oneway()) == (response, oneway)


def test_code_constants_match_spec_tables():
    """A sample of code values of RequestCode and ResponseCode, and the language byte codes of LanguageCode."""
    assert (codes.SEND_MESSAGE, codes.PULL_MESSAGE, codes.HEART_BEAT, codes.GET_ROUTEINFO_BY_TOPIC) == (10, 11, 34, 105)
    assert (codes.SEND_MESSAGE_V2, codes.SEND_BATCH_MESSAGE, codes.GET_CONSUMER_RUNNING_INFO) == (310, 320, 307)
    assert (codes.TOPIC_NOT_EXIST, codes.PULL_NOT_FOUND, codes.QUERY_NOT_FOUND, codes.NO_MESSAGE) == (17, 19, 22, 208)
    assert codes.LANGUAGE_CODES["CPP"] == 1 and codes.LANGUAGE_CODES["GO"] == 9 and codes.LANGUAGE_CODES["RUST"] == 12


# -- properties ------------------------------------------------------------------------------

prop_text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x01\x02"), min_size=1, max_size=20)


def test_properties_decoding_rules():
    """Trailing separators, empty pieces and pieces without a name or value are skipped; the first \\x01 splits."""
    assert decode_properties("KEYS\x01k1\x02TAGS\x01TagA\x02") == {"KEYS": "k1", "TAGS": "TagA"}
    assert decode_properties(b"WAIT\x01true") == {"WAIT": "true"}
    assert decode_properties("\x02\x02A\x01\x02\x01v\x02B\x02C\x01x\x01y") == {"C": "x\x01y"}
    assert decode_properties("") == {}
    with pytest.raises(RemotingProtocolError):
        decode_properties(b"\xff\x01x")


@given(st.dictionaries(prop_text, prop_text, max_size=8), st.booleans())
def test_properties_round_trip(props, trailing):
    """encode_properties then decode_properties returns the same ordered dict, with or without the trailing \\x02."""
    encoded = encode_properties(props, trailing_separator=trailing)
    assert list(decode_properties(encoded).items()) == list(props.items())
    assert encoded.endswith("\x02") == (trailing and bool(props))


def test_properties_reject_separators():
    """A name or value that would corrupt the property string is refused."""
    with pytest.raises(RemotingProtocolError):
        encode_properties({"A\x01": "x"})
    with pytest.raises(RemotingProtocolError):
        encode_properties({"A": "x\x02y"})


# -- Java String.hashCode -------------------------------------------------------------------


@pytest.mark.parametrize("value, expected", [
    ("", 0),
    ("a", 97),
    # T=84 a=97 g=103 A=65: 84*31^3 + 97*31^2 + 103*31 + 65 = 2502444 + 93217 + 3193 + 65 = 2598919
    ("TagA", 2598919),
    ("TagB", 2598920),  # same as TagA with the last unit 66 instead of 65
    # A=65 a=97: 65*31 + 97 = 2112; B=66: 66*31 + 66 = 2112 (the classic collision)
    ("Aa", 2112),
    ("BB", 2112),
    # h=104; 104*31+101=3325; 3325*31+108=103183; 103183*31+108=3198781; 3198781*31+111=99162322
    ("hello", 99162322),
    # U+1F600 is the UTF-16 pair D83D DE00: 55357*31 + 56832 = 1716067 + 56832 = 1772899
    ("\U0001F600", 1772899),
    # well-known Java value: "polygenelubricants".hashCode() == Integer.MIN_VALUE (wraps to negative)
    ("polygenelubricants", -2147483648),
])
def test_java_string_hash_known_values(value, expected):
    """java_string_hash matches String.hashCode values computed by hand from s[0]*31^(n-1)+... mod 2^32."""
    assert java_string_hash(value) == expected


@given(st.text(max_size=700))
def test_java_string_hash_matches_definition(value):
    """The block-wise implementation equals the textbook loop over UTF-16 units, signed 32-bit."""
    units = value.encode("utf-16-be", "surrogatepass")
    h = 0
    for index in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[index:index + 2], "big")) % 2**32
    assert java_string_hash(value) == (h - 2**32 if h >= 2**31 else h)


def test_tag_hash_code_of_missing_tag_is_zero():
    """Messages without a tag hash to 0."""
    assert tag_hash_code(None) == tag_hash_code("") == 0 and tag_hash_code("TagA") == 2598919


# -- message ids ------------------------------------------------------------------------------


def test_offset_msg_id_spec_example():
    """127.0.0.1:10911 at commit log offset 0xB0 gives the id MessageDecoder.createMessageId makes, and parses back."""
    assert make_offset_msg_id("127.0.0.1", 10911, 0xB0) == "7F00000100002A9F00000000000000B0"
    assert parse_offset_msg_id("7f00000100002a9f00000000000000b0") == ("127.0.0.1", 10911, 176)


def test_offset_msg_id_ipv6_and_errors():
    """IPv6 store hosts give 56 hex characters; other lengths and non-hex ids raise."""
    msg_id = make_offset_msg_id("fd00::2", 10911, 2**40)
    assert len(msg_id) == 56 and parse_offset_msg_id(msg_id) == ("fd00::2", 10911, 2**40)
    for bad in ("7F000001", "zz" * 16, ""):
        with pytest.raises(RemotingProtocolError):
            parse_offset_msg_id(bad)


# -- batch bodies -------------------------------------------------------------------------------


def test_batch_body_layout_by_hand():
    """One batch message is TOTALSIZE, zero MAGICCODE and BODYCRC, FLAG, BODYLEN, BODY, PROPLEN, PROPERTIES."""
    body = encode_batch_body([(3, b"hi", {"TAGS": "A"})])
    expected = bytes.fromhex("0000001e 00000000 00000000 00000003 00000002 6869 0006".replace(" ", "")) + b"TAGS\x01A"
    assert body == expected  # 30 = 20 + 2 (body) + 2 + 6 (properties)
    assert decode_batch_body(body) == [BatchMessage(3, b"hi", {"TAGS": "A"})]


@given(st.lists(st.tuples(int32, st.binary(max_size=100), st.dictionaries(prop_text, prop_text, max_size=4)), max_size=5), st.booleans())
def test_batch_body_round_trip(messages, trailing):
    """encode_batch_body then decode_batch_body returns the (flag, body, properties) triples."""
    decoded = decode_batch_body(encode_batch_body(messages, trailing_separator=trailing))
    assert [tuple(m) for m in decoded] == [(f, b, dict(p)) for f, b, p in messages]


@settings(max_examples=50)
@given(st.integers(1, 26))  # the last message is 27 bytes: cutting all of it leaves a valid batch
def test_batch_body_must_tile_exactly(cut):
    """A truncated batch body, or one whose TOTALSIZE disagrees with its parts, raises."""
    body = encode_batch_body([(0, b"hello", {"UNIQ_KEY": "X"}), (0, b"world", {})])
    with pytest.raises(RemotingProtocolError):
        decode_batch_body(body[:-cut])
    grown = (int.from_bytes(body[:4], "big") + 1).to_bytes(4, "big") + body[4:]
    with pytest.raises(RemotingProtocolError):
        decode_batch_body(grown)


# -- deep nesting ------------------------------------------------------------------------


def test_deeply_nested_json_header_is_a_protocol_error():
    """100,000 "[" as a JSON header is refused like any undecodable header, not a
    RecursionError out of the decoder."""
    from protocols.remoting.codec import RemotingProtocolError

    header = b"[" * 100_000
    frame = struct.pack(">II", 4 + len(header), len(header)) + header
    with pytest.raises(RemotingProtocolError, match="nested too deeply"):
        FrameDecoder().feed(frame)


@pytest.mark.parametrize("text", [b"[" * 100_000, b'{"a":' * 50_000, b"{0:" * 50_000])
def test_deeply_nested_json_body_is_a_value_error(text):
    from protocols.remoting.tolerant_json import loads_object, loads_tolerant

    with pytest.raises(ValueError):
        loads_tolerant(text)
    with pytest.raises(ValueError):
        loads_object(text)


@pytest.mark.parametrize("text", [b"[]", b"1", b'"s"', b"null"])
def test_loads_object_refuses_non_objects(text):
    from protocols.remoting.tolerant_json import loads_object

    with pytest.raises(ValueError):
        loads_object(text)
