"""The C reading of remoting JSON headers (protocols/remoting/_header.c) against the
Python reference (codec.py_decode_json_header): the same command for every header it
reads, and None (the Python path) for every one it does not."""

import importlib
import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqserver import speedups
from protocols.remoting import codec, codes, framing
from protocols.remoting.codec import RemotingProtocolError, py_decode_json_header
from protocols.remoting.framing import FrameDecoder
from protocols.remoting.wire import DEFAULT_MAX_FRAME

#: A C++ client's SEND header (bench/request_cost.py), numbers as JSON numbers.
CPP_SEND = (b'{"code":10,"extFields":{"AccessKey":"","OnsChannel":"ALIYUN","batch":"0",'
            b'"bornTimestamp":"1795267749004","defaultTopicQueueNums":4,"flag":0,'
            b'"properties":"TAGS\\u0001TagA\\u0002UNIQ_KEY\\u00010100007F\\u0002","queueId":0,'
            b'"sysFlag":0,"topic":"cost"},"flag":0,"language":"CPP","opaque":1,"remark":"",'
            b'"version":63}')


def _module():
    if speedups.pure_python():
        pytest.skip("MQSERVER_PURE_PYTHON is set: the Python code is under test")
    return importlib.import_module("protocols.remoting._header")


def _c():
    return _module().json_header


def _python(header):
    try:
        cmd = py_decode_json_header(header, b"b")
    except RemotingProtocolError:
        return None
    return cmd


def _same(header):
    """Assert that the C reading of C{header} is the Python one's, or None."""
    fields = _c()(header, codes.LANGUAGE_JAVA)
    if fields is None:
        assert _module().json_command(header, b"b") is None
        return None
    expected = _python(header)
    assert expected is not None, header
    got = codec.RemotingCommand(*fields, b"b", codes.SERIALIZE_JSON)
    built = _module().json_command(header, memoryview(b"b"))
    for cmd in (got, built):
        assert type(cmd) is codec.RemotingCommand
        assert cmd == expected, header
        # the same fields in the same order and types, not only equal values (True == 1)
        assert [(k, type(v)) for k, v in vars(cmd).items()] == [
            (k, type(v)) for k, v in vars(expected).items()]
        assert list(cmd.ext_fields.items()) == list(expected.ext_fields.items())
    return built


def test_the_cpp_clients_send_header_is_read_in_c():
    cmd = _same(CPP_SEND)
    assert cmd is not None and cmd.ext_fields["queueId"] == "0"
    assert cmd.ext_fields["properties"] == "TAGS\x01TagA\x02UNIQ_KEY\x010100007F\x02"


def test_decode_json_header_uses_the_c_reading():
    _c()
    assert codec._json_command is not None
    cmd = codec.decode_json_header(CPP_SEND, memoryview(b"body"))
    assert cmd == codec.py_decode_json_header(CPP_SEND, b"body") and type(cmd.body) is bytes


_text = st.text(st.characters(codec="utf-8"), max_size=8) | st.sampled_from(
    ["", "é", "\x00", "\x01\x02", "\"\\/", "\ud800", "😀", "\u2028"])
_scalar = (st.integers(-10**20, 10**20) | _text | st.booleans() | st.none()
           | st.floats(allow_nan=False, allow_infinity=False))
_ext = st.dictionaries(_text, _scalar | st.lists(st.integers(), max_size=2)
                       | st.dictionaries(_text, st.integers(), max_size=2), max_size=5)
_header = st.fixed_dictionaries(
    {"code": st.integers(-2**31, 2**31) | st.sampled_from(["10", None, 1.5, True])},
    optional={"extFields": _ext | st.none() | st.just("x"), "flag": _scalar, "language": _scalar,
              "opaque": _scalar, "remark": _scalar, "version": _scalar, "other": _ext,
              "serializeTypeCurrentRPC": st.just("JSON")})


@given(_header, st.booleans(), st.sampled_from(["", " ", "\n", " \t\r\n"]),
       st.lists(st.tuples(st.integers(0, 300), st.binary(max_size=3)), max_size=2))
@settings(max_examples=1500)
def test_c_reading_matches_python(obj, ascii_only, space, damage):
    text = json.dumps(obj, ensure_ascii=ascii_only,
                      separators=(",", ":") if not space else (", " + space, ":" + space))
    header = bytearray(space.encode() + text.encode("utf-8", "surrogatepass") + space.encode())
    for pos, data in damage:
        header[pos:pos + len(data)] = data
    _same(bytes(header))


@pytest.mark.parametrize("header", [
    b"", b"{", b"}", b"[]", b"{}", b'{"code":1}', b'{"code":1,}', b'{"code":01}', b'{"code":-0}',
    b'{"code":-}', b'{"code":1.0}', b'{"code":1e3}', b'{"code":123456789012345678}',
    b'{"code":1234567890123456789}', b'{"code":1} x', b'{"code":1}\n', b' {"code":1}',
    b'{"code":1,"code":2}', b'{"code":1,"extFields":{"a":1,"a":"2"}}', b'{"code":1,"remark":null}',
    b'{"code":1,"language":""}', b'{"code":1,"language":0}', b'{"code":1,"extFields":{"a":{}}}',
    b'{"code":1,"x":{"y":{}}}', b'{"code":1,"extFields":{"a":"\\ud83d\\ude00"}}',
    b'{"code":1,"extFields":{"a":"\\u00e9\\u20ac\\n\\t\\"\\\\\\/\\b\\f\\r"}}',
    b'{"code":1,"extFields":{"a":"\\x"}}', b'{"code":1,"extFields":{"a":"\\u12"}}',
    b'{"code":1,"extFields":{"a":"\xc3"}}', b'{"code":1,"extFields":{"a":"\xed\xa0\x80"}}',
    b'{"code":1,"extFields":{"a":"\xc3\\u00a9"}}', b'{"code":1,"extFields":{"a":"\x01\x7f"}}',
    b'\xef\xbb\xbf{"code":1}', b'{"code" : 1 , "opaque" : 7 }', b'{"code":1,"extFields":[]}',
])
def test_c_reading_matches_python_on_edges(header):
    _same(header)


def test_deep_nesting_is_left_to_python():
    """Objects nest one level in C (extFields): a deep header neither recurses nor
    crashes; the Python path refuses it."""
    header = b'{"code":1,"x":' + b'{"a":' * 100_000 + b"1" + b"}" * 100_001
    assert _c()(header, codes.LANGUAGE_JAVA) is None
    with pytest.raises(RemotingProtocolError):
        py_decode_json_header(header)


def test_a_header_that_is_no_buffer_is_left_to_python():
    assert _c()("{}", codes.LANGUAGE_JAVA) is None
    assert _module().json_command(None, b"") is None
    with pytest.raises(TypeError):
        _c()(b"{}", None)


# -- a read that is one whole frame (_header.json_frame, inside FrameDecoder.feed) ----------

def _frame(header, body=b"", serialize_type=0, header_len=None, length=None):
    header_len = len(header) if header_len is None else header_len
    length = 4 + len(header) + len(body) if length is None else length
    return struct.pack(">II", length, serialize_type << 24 | header_len) + header + body


def _python_feed(data, max_frame):
    """What FrameDecoder.feed gives for the read C{data} without the C speedup: the one
    command it decodes, else None (an error, a part of a frame, several frames)."""
    saved = framing._json_frame
    framing._json_frame = None
    try:
        commands = FrameDecoder(max_frame).feed(data)
    except RemotingProtocolError:
        return None
    finally:
        framing._json_frame = saved
    return commands[0] if len(commands) == 1 and _one_frame(data) else None


def _one_frame(data):
    return len(data) >= 4 and struct.unpack_from(">I", data)[0] + 4 == len(data)


def _same_frame(data, max_frame=DEFAULT_MAX_FRAME):
    """Assert that the C reading of the read C{data} is the Python one's (FrameDecoder.feed
    without the speedup), or None where the C code leaves it (feed then reads it in
    Python); and that feed gives it."""
    built = _module().json_frame(data, max_frame)
    expected = _python_feed(data, max_frame)
    if built is None:
        if expected is not None and not data[4]:  # a JSON header the C code leaves
            assert _module().json_command(data[8:8 + (len(data) - len(expected.body) - 8)],
                                          expected.body) is None, data
        return expected
    assert expected is not None, data
    assert type(built) is codec.RemotingCommand and type(built.body) is bytes
    assert built == expected, data
    assert [(k, type(v)) for k, v in vars(built).items()] == [
        (k, type(v)) for k, v in vars(expected).items()]
    assert FrameDecoder(max_frame).feed(data) == [built]
    return built


def test_a_cpp_send_alone_in_its_read_is_read_in_c():
    cmd = _same_frame(_frame(CPP_SEND, b"body"))
    assert cmd is not None and cmd.body == b"body" and cmd.code == 10
    # what FrameDecoder.feed uses
    assert framing._json_frame is codec.json_frame is not None


@pytest.mark.parametrize("data,max_frame", [
    (b"", 100), (_frame(b'{"code":1}')[:7], 100),
    (_frame(b'{"code":1}'), 100),  # one whole frame
    (_frame(b'{"code":1}', b"x"), 100),  # with a body
    (_frame(b'{"code":1}') + b"x", 100),  # more than the frame: a pipelined read
    (_frame(b'{"code":1}')[:-1], 100),  # less: a frame in parts
    (_frame(b'{"code":1}', b"xyz")[:-1], 100),  # the header whole, the body not
    (_frame(b'{"code":1}', length=3), 100),  # a length shorter than the word
    (_frame(b'{"code":1}', b"xy"), 20),  # over max_frame (22 bytes with the prefix)
    (_frame(b'{"code":1}', b"x"), 19),  # at it
    (_frame(b'{"code":1}', b"xy"), 19),  # one byte over it
    (_frame(b'{"code":1}', serialize_type=1), 100),  # RocketMQ serialization
    (_frame(b'{"code":1}', serialize_type=128), 100),
    (_frame(b'{"code":1}', header_len=11), 100),  # a header longer than the frame
    (_frame(b'{"code":1}', b"x", header_len=9), 100),  # shorter: the rest is the body
    (_frame(b'{"code":1}', header_len=0xFFFFFF), 100),
    (_frame(b'{"code":1,"extFields":{"a":"\\ud83d\\ude00"}}'), 100),  # left to Python
    (_frame(b"{x}"), 100),  # no JSON: None, and feed says what is wrong
])
def test_c_frame_reading_matches_python_on_edges(data, max_frame):
    _same_frame(data, max_frame)


@given(_header, st.binary(max_size=8), st.integers(-3, 3), st.integers(-3, 3),
       st.sampled_from([0, 0, 0, 1, 255]), st.integers(8, 400))
@settings(max_examples=500)
def test_c_frame_reading_matches_python(obj, body, length_off, header_off, serialize_type,
                                        max_frame):
    header = json.dumps(obj).encode("utf-8", "surrogatepass")
    data = _frame(header, body, serialize_type, max(0, len(header) + header_off),
                  max(0, 4 + len(header) + len(body) + length_off))
    _same_frame(data, max_frame)


def test_a_read_that_is_no_bytes_or_an_unsized_limit():
    assert _module().json_frame(bytearray(_frame(b'{"code":1}')), 100) is None
    with pytest.raises(TypeError):
        _module().json_frame(_frame(b'{"code":1}'), None)
    with pytest.raises(OverflowError):
        _module().json_frame(_frame(b'{"code":1}'), 2**70)


def test_the_c_reading_is_only_for_a_read_that_is_one_frame_with_nothing_waiting():
    """feed reads a read in one C call only when it is one whole frame and no part of a
    frame waits: the rest of a frame, or two frames, are read from the buffer."""
    one = _frame(b'{"code":1,"opaque":1}')
    d = FrameDecoder()
    assert [c.opaque for c in d.feed(one + one)] == [1, 1] and d.buffered() == 0
    assert [c.opaque for c in d.feed(one[:5])] == [] and d.buffered() == 5
    assert [c.opaque for c in d.feed(one[5:] + one)] == [1, 1] and d.buffered() == 0
