"""Golden tests: decode every frame captured from real RocketMQ clients (tests/vectors/rocketmq)."""

import json
import re
import zlib
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import pytest

from protocols.remoting import codes
from protocols.remoting.codec import decode_frame, encode
from protocols.remoting.framing import FrameDecoder
from protocols.remoting.props import decode_properties, encode_properties, tag_hash_code, uniq_key_ip

VECTORS = Path(__file__).resolve().parents[1] / "vectors" / "rocketmq"

CREDENTIALS = {"AccessKey", "OnsChannel", "Signature"}


class Capture(NamedTuple):
    """One captured frame and what the capture log says about it."""

    where: str  # file:line, for failure messages
    peer: str  # NS / BRK (C++ sessions), FIRST (first-frames log), JAVA / GO
    direction: str  # REQ (client -> server) or RSP (server -> client)
    frame: bytes  # whole frame, length prefix included
    logged: dict  # the header as the capture tool decoded it
    body_captured: bool  # False when only the body length was recorded


_SESSION_LINE = re.compile(r"^\S+ (NS|BRK) (<-|->) (REQ|RSP) (\{.*\})$")
_HEX_LINE = re.compile(r"^\s+HEX:? ([0-9a-f]+)$")
_FIRST_LINE = re.compile(r"^\S+ FRAME from .* total=(\d+) serType=(\d+) headerLen=(\d+) bodyLen=(\d+)$")
_JAVA_GO_LINE = re.compile(r"^(JAVA|GO) code=(\d+) totalLen=(\d+) serializeType\(byte0\)=(\d+) headerLen=(\d+) bodyLen=(\d+)$")


def _parse_session_log(name: str) -> list[Capture]:
    """Parse a mock-session log: a REQ/RSP line with the decoded header, then a HEX line."""
    lines = (VECTORS / name).read_text().splitlines()
    captures = []
    for index, line in enumerate(lines):
        match = _SESSION_LINE.match(line)
        if match:
            hex_match = _HEX_LINE.match(lines[index + 1])
            assert hex_match, f"{name}:{index + 2}: expected a HEX line"
            peer, _, direction, header = match.groups()
            captures.append(Capture(f"{name}:{index + 2}", peer, direction, bytes.fromhex(hex_match.group(1)), json.loads(header), True))
    return captures


def _parse_first_frames() -> list[Capture]:
    """Parse the silent-listener log: FRAME line with sizes, HEX line, HEADER line."""
    name = "cpp-client-first-frames.log"
    lines = (VECTORS / name).read_text().splitlines()
    captures = []
    for index, line in enumerate(lines):
        match = _FIRST_LINE.match(line)
        if match:
            frame = bytes.fromhex(_HEX_LINE.match(lines[index + 1]).group(1))
            total, ser_type, header_len, body_len = map(int, match.groups())
            assert (len(frame) - 4, frame[4], int.from_bytes(frame[5:8], "big")) == (total, ser_type, header_len)
            assert total == 4 + header_len + body_len
            header = json.loads(lines[index + 2].split("HEADER: ", 1)[1])
            captures.append(Capture(f"{name}:{index + 2}", "FIRST", "REQ", frame, header, True))
    return captures


def _parse_java_go() -> list[Capture]:
    """Rebuild Java/Go request frames from their logged sizes and exact header text (bodies not captured)."""
    name = "java-go-client-frames.txt"
    lines = (VECTORS / name).read_text().splitlines()
    captures = []
    for index, line in enumerate(lines):
        match = _JAVA_GO_LINE.match(line)
        if match:
            client, _code, total, ser_type, header_len, body_len = match.groups()
            header = lines[index + 1].strip().encode("utf-8")
            assert len(header) == int(header_len), f"{name}:{index + 2}: header text is not the exact header"
            body = b"\x00" * int(body_len)  # placeholder of the recorded size
            frame = int(total).to_bytes(4, "big") + bytes([int(ser_type)]) + len(header).to_bytes(3, "big") + header + body
            captures.append(Capture(f"{name}:{index + 2}", client, "REQ", frame, json.loads(header), False))
    return captures


def _load() -> dict[str, list[Capture]]:
    return {
        "cpp-client-sessions.log": _parse_session_log("cpp-client-sessions.log"),
        "cpp-client-examples.log": _parse_session_log("cpp-client-examples.log"),
        "cpp-client-first-frames.log": _parse_first_frames(),
        "java-go-client-frames.txt": _parse_java_go(),
    }


CAPTURES = _load()
ALL = [capture for captures in CAPTURES.values() for capture in captures]
FILES = sorted(CAPTURES) or ["(missing)"]


def _header_len(frame: bytes) -> int:
    return int.from_bytes(frame[5:8], "big")


def _expected_ext(logged: dict) -> dict[str, str]:
    """The logged extFields as strings, the normalisation servers apply (numbers -> str)."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in (logged.get("extFields") or {}).items()}


def test_capture_files_parse_completely():
    """The log parser finds every HEX dump / header record in the four capture files."""
    for name in ("cpp-client-sessions.log", "cpp-client-examples.log", "cpp-client-first-frames.log"):
        hex_lines = sum(1 for line in (VECTORS / name).read_text().splitlines() if _HEX_LINE.match(line))
        assert len(CAPTURES[name]) == hex_lines > 0, name
    assert len(CAPTURES["java-go-client-frames.txt"]) == 15
    assert Counter(c.direction for c in CAPTURES["cpp-client-sessions.log"]) == {"REQ": 180, "RSP": 180}


@pytest.mark.parametrize("name", FILES)
def test_frames_decode_whole_as_logged(name):
    """Every captured frame decodes, fed whole, to the header and body the capture log recorded."""
    for capture in CAPTURES[name]:
        command = decode_frame(capture.frame)
        logged = capture.logged
        assert command.serialize_type == codes.SERIALIZE_JSON, capture.where
        assert (command.code, command.opaque, command.flag) == (logged["code"], logged["opaque"], logged["flag"]), capture.where
        assert (command.language, command.version, command.remark) == (logged["language"], logged["version"], logged.get("remark")), capture.where
        assert command.ext_fields == _expected_ext(logged), capture.where
        assert command.body == capture.frame[8 + _header_len(capture.frame):], capture.where


@pytest.mark.parametrize("name", FILES)
def test_frames_decode_byte_by_byte(name):
    """Fed one byte at a time, each frame yields exactly one command, on its last byte, equal to the whole decode."""
    decoder = FrameDecoder()
    for capture in CAPTURES[name]:
        frame = capture.frame
        for index in range(len(frame) - 1):
            assert decoder.feed(frame[index:index + 1]) == [], capture.where
        assert decoder.feed(frame[-1:]) == [decode_frame(frame)], capture.where
        assert decoder.buffered() == 0


@pytest.mark.parametrize("name", FILES)
def test_capture_stream_decodes_in_one_feed(name):
    """All frames of a file concatenated into one chunk come out in order."""
    frames = [capture.frame for capture in CAPTURES[name]]
    assert FrameDecoder().feed(b"".join(frames)) == [decode_frame(frame) for frame in frames]


@pytest.mark.parametrize("name", FILES)
def test_reencode_preserves_decoded_form(name):
    """Re-encoding a decoded frame gives a frame that decodes to the same command, and re-encoding is stable."""
    for capture in CAPTURES[name]:
        command = decode_frame(capture.frame)
        again = encode(command)
        assert decode_frame(again) == command, capture.where
        assert encode(decode_frame(again)) == again, capture.where


def test_java_frames_reencode_byte_for_byte():
    """Java 4.9.4 headers (sorted keys, no remark, serializeTypeCurrentRPC) re-encode to the identical bytes."""
    java = [c for c in CAPTURES["java-go-client-frames.txt"] if c.peer == "JAVA"]
    assert len(java) == 8
    for capture in java:
        assert encode(decode_frame(capture.frame)) == capture.frame, capture.where


def test_java_style_responses_reencode_byte_for_byte():
    """Captured responses without remark/extFields re-encode to the identical bytes."""
    plain = [c for c in ALL if c.direction == "RSP" and set(c.logged) == {"code", "flag", "language", "opaque", "serializeTypeCurrentRPC", "version"}]
    assert len(plain) > 50
    for capture in plain:
        assert encode(decode_frame(capture.frame)) == capture.frame, capture.where


def test_cpp_requests_follow_spec_conventions():
    """C++ requests: JSON type, CPP/63, remark "", flag 0 even for "one-way" offset commits, credentials, trailing newline."""
    cpp = [c for c in ALL if c.direction == "REQ" and c.peer not in ("JAVA", "GO")]
    assert len(cpp) == 180 + 10 + 11
    for capture in cpp:
        command = decode_frame(capture.frame)
        header_end = 8 + _header_len(capture.frame)
        assert capture.frame[header_end - 1:header_end] == b"\n", capture.where
        assert (command.language, command.version, command.remark, command.flag) == ("CPP", 63, "", 0), capture.where
        assert not command.is_response() and not command.is_oneway(), capture.where
        assert CREDENTIALS <= command.ext_fields.keys(), capture.where
    commits = [decode_frame(c.frame) for c in cpp if decode_frame(c.frame).code == codes.UPDATE_CONSUMER_OFFSET]
    assert commits and all(command.flag == 0 for command in commits)


# Required request fields per code, as RocketMQ 4.9.4's request headers mark them (@CFNotNull).
REQUIRED_FIELDS = {
    codes.GET_ROUTEINFO_BY_TOPIC: {"topic"},
    codes.SEND_MESSAGE: {"producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag", "bornTimestamp", "flag", "properties"},
    codes.SEND_MESSAGE_V2: set("abcdefgh"),
    codes.PULL_MESSAGE: {"consumerGroup", "topic", "queueId", "queueOffset", "maxMsgNums", "sysFlag", "commitOffset", "suspendTimeoutMillis", "subVersion"},
    codes.QUERY_CONSUMER_OFFSET: {"consumerGroup", "topic", "queueId"},
    codes.UPDATE_CONSUMER_OFFSET: {"consumerGroup", "topic", "queueId", "commitOffset"},
    codes.GET_MAX_OFFSET: {"topic", "queueId"},
    codes.UNREGISTER_CLIENT: {"clientID"},
    codes.CONSUMER_SEND_MSG_BACK: {"offset", "group", "delayLevel"},
    codes.GET_CONSUMER_LIST_BY_GROUP: {"consumerGroup"},
    codes.HEART_BEAT: set(),
    codes.LOCK_BATCH_MQ: set(),
    codes.UNLOCK_BATCH_MQ: set(),
}


def test_requests_carry_the_fields_the_spec_lists():
    """Every captured request uses a known code and carries the extFields the spec marks as required, as strings."""
    for capture in (c for c in ALL if c.direction == "REQ"):
        command = decode_frame(capture.frame)
        assert command.code in REQUIRED_FIELDS, capture.where
        assert REQUIRED_FIELDS[command.code] <= command.ext_fields.keys(), capture.where
        assert all(isinstance(v, str) for v in command.ext_fields.values()), capture.where
        if command.code in (codes.PULL_MESSAGE, codes.QUERY_CONSUMER_OFFSET, codes.GET_MAX_OFFSET):
            assert command.ext_fields["queueId"].isdigit(), capture.where


def test_responses_answer_outstanding_requests():
    """Each captured response has the response bit and the opaque of a still-unanswered request on that connection role."""
    for name in ("cpp-client-sessions.log", "cpp-client-examples.log"):
        pending: Counter = Counter()
        for capture in CAPTURES[name]:
            command = decode_frame(capture.frame)
            key = (capture.peer, command.opaque)
            if capture.direction == "REQ":
                pending[key] += 1
            else:
                assert command.is_response() and command.flag == codes.FLAG_RESPONSE, capture.where
                assert pending[key] > 0, capture.where
                pending[key] -= 1


def test_spec_example_10_1_is_the_first_captured_frame():
    """The worked route lookup example is byte-identical to the first frame of the silent-listener capture."""
    spec_hex = (
        "000000c2000000be"
        "7b22636f6465223a3130352c226578744669656c6473223a7b224163636573734b6579223a22222c224f6e73"
        "4368616e6e656c223a22414c4959554e222c225369676e6174757265223a2272324b73634170676d70346d54"
        "625846322f577a4f6d72555671773d222c22746f706963223a2250726f6265546f706963227d2c22666c6167"
        "223a302c226c616e6775616765223a22435050222c226f7061717565223a302c2272656d61726b223a22222c"
        "2276657273696f6e223a36337d0a"
    )
    first = CAPTURES["cpp-client-first-frames.log"][0].frame
    assert first == bytes.fromhex(spec_hex)
    command = decode_frame(first)
    assert (command.code, command.opaque, command.ext_fields["topic"]) == (codes.GET_ROUTEINFO_BY_TOPIC, 0, "ProbeTopic")
    # The client alternates the topic and its TBW102 fallback, opaque counting up.
    topics = [decode_frame(c.frame).ext_fields["topic"] for c in CAPTURES["cpp-client-first-frames.log"]]
    assert topics[:4] == ["ProbeTopic", "TBW102", "ProbeTopic", "TBW102"]
    assert [decode_frame(c.frame).opaque for c in CAPTURES["cpp-client-first-frames.log"]] == list(range(11))


def test_spec_examples_10_3_to_10_6():
    """The send request/response and pull response of the worked examples decode to the documented values."""
    examples = CAPTURES["cpp-client-examples.log"]
    send = decode_frame(examples[2].frame)
    assert (len(examples[2].frame), _header_len(examples[2].frame), send.body) == (0x203 + 4, 506, b"hello")
    assert send.ext_fields["queueId"] == "0" and send.ext_fields["defaultTopicQueueNums"] == "4"
    assert send.ext_fields["batch"] == "0" and send.ext_fields["unitMode"] == "0"
    props = decode_properties(send.ext_fields["properties"])
    assert props == {"KEYS": "k1", "TAGS": "TagA", "UNIQ_KEY": "0100007F0000799700000C47416F0100", "WAIT": "true"}
    send_rsp = decode_frame(examples[3].frame)
    assert (send_rsp.code, send_rsp.opaque, send_rsp.flag) == (codes.SUCCESS, 1, 1)
    assert send_rsp.ext_fields == {"msgId": "7F00000100002A9F0000000000000000", "queueId": "0", "queueOffset": "0", "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
    pull_rsp = decode_frame(examples[9].frame)
    assert (_header_len(examples[9].frame), len(pull_rsp.body), pull_rsp.remark) == (207, 176, "FOUND")
    assert pull_rsp.ext_fields == {"suggestWhichBrokerId": "0", "nextBeginOffset": "1", "minOffset": "0", "maxOffset": "1"}
    body = pull_rsp.body
    assert int.from_bytes(body[:4], "big") == len(body) and body[4:8] == bytes.fromhex("daa320a7")
    assert int.from_bytes(body[8:12], "big") == zlib.crc32(b"hello") & 0x7FFFFFFF
    assert decode_properties(body[-70:]) == props


def test_compressed_send_body_is_kept_verbatim():
    """The C++ 5000-byte send (sysFlag 1) keeps its zlib body byte for byte; it inflates to the original."""
    sends = [decode_frame(c.frame) for c in ALL if c.direction == "REQ" and decode_frame(c.frame).code == codes.SEND_MESSAGE]
    compressed = [s for s in sends if int(s.ext_fields["sysFlag"]) & codes.MSG_COMPRESSED_FLAG]
    assert len(compressed) == 1
    assert zlib.decompress(compressed[0].body) == b"x" * 5000


def test_captured_properties_round_trip_per_client_style():
    """Captured property strings decode and re-encode identically: C++ and Go with a trailing \\x02, Java without."""
    seen = set()
    for capture in (c for c in ALL if c.direction == "REQ"):
        command = decode_frame(capture.frame)
        text = command.ext_fields.get("properties") or command.ext_fields.get("i") if command.code in (codes.SEND_MESSAGE, codes.SEND_MESSAGE_V2) else None
        if text is None:
            continue
        props = decode_properties(text)
        trailing = command.language != "JAVA"
        assert text.endswith("\x02") == trailing, capture.where
        assert encode_properties(props, trailing_separator=trailing) == text, capture.where
        assert tag_hash_code(props["TAGS"]) == {"TagA": 2598919, "TagB": 2598920}[props["TAGS"]]
        assert ("WAIT" in props) == (command.language != "GO"), capture.where
        seen.add(command.language)
    assert seen == {"CPP", "JAVA", "GO"}


def test_java_and_go_header_differences():
    """Client quirks: Java one-way flag 2, missing/empty extFields on heartbeats, Go remark "", UNIQ_KEY shapes."""
    frames = {(c.peer, c.logged["code"]): decode_frame(c.frame) for c in CAPTURES["java-go-client-frames.txt"]}
    assert frames["JAVA", 15].is_oneway() and not frames["GO", 15].is_oneway()
    assert frames["JAVA", 34].ext_fields == {} and frames["GO", 34].ext_fields == {}
    assert frames["JAVA", 105].remark is None and frames["GO", 105].remark == ""
    assert (frames["JAVA", 105].version, frames["GO", 105].version) == (401, 317)
    java_key = decode_properties(frames["JAVA", 310].ext_fields["i"])["UNIQ_KEY"]
    go_key = decode_properties(frames["GO", 10].ext_fields["properties"])["UNIQ_KEY"]
    assert (len(java_key), uniq_key_ip(java_key)) == (56, "fd00::2")  # IPv6 client address
    assert (len(go_key), uniq_key_ip(go_key)) == (32, "192.0.2.2")
    assert uniq_key_ip("0100007F0000799700000C47416F0100") == "1.0.0.127"  # C++: IP byte-reversed


def test_json_bodies_of_cpp_requests_end_with_newline():
    """C++ heartbeat and lock bodies are JSON followed by a newline."""
    bodies = [decode_frame(c.frame) for c in ALL if c.direction == "REQ" and c.logged["code"] in (34, 41, 42) and c.body_captured]
    assert len(bodies) == 13
    for command in bodies:
        assert command.body.endswith(b"}\n")
        assert isinstance(json.loads(command.body), dict)


def test_captured_frame_prefixes_parse_with_the_schema():
    """Every captured frame's first 8 bytes parse with FRAME_PREFIX, and the struct,
    shift and mask the codec uses (derived from that schema) read the same fields; the
    captures are all JSON-type, the binary header's golden test is in
    test_remoting_codec.py)."""
    from protocols.remoting import wire

    for capture in ALL:
        frame = capture.frame
        prefix = wire.FRAME_PREFIX.parse(frame)
        length, word = wire.FRAME_PREFIX_STRUCT.unpack_from(frame)
        assert length == prefix.length == len(frame) - 4 or not capture.body_captured, capture.where
        assert word >> wire.SERIALIZE_TYPE_SHIFT == prefix.serialize_type, capture.where
        assert word & wire.MAX_HEADER_LENGTH == prefix.header_length, capture.where
        assert frame[wire.SERIALIZE_TYPE_OFFSET] == prefix.serialize_type, capture.where
    assert len(ALL) > 50
    assert (wire.FRAME_PREFIX_STRUCT.size, wire.WORD_SIZE, wire.SERIALIZE_TYPE_SHIFT,
            wire.MAX_HEADER_LENGTH, wire.SERIALIZE_TYPE_OFFSET) == (8, 4, 24, 0xFFFFFF, 4)
    assert wire.BATCH_MESSAGE_HEAD_SIZE == 22
