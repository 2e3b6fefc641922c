"""The C reading of remoting ROCKETMQ binary headers (protocols/remoting/_header.c,
binary_command) against the Python reference (codec.py_decode_binary_header): the same
command for every header it reads, and None (the Python path, which says what is wrong)
for every one it does not."""

import importlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqserver import speedups
from protocols.remoting import codec, codes
from protocols.remoting.codec import (
    RemotingProtocolError, decode_binary_header, encode, encode_binary_header,
    py_decode_binary_header)
from protocols.remoting.messages import RemotingCommand

#: The extFields of a Java 4.9.4 SEND_MESSAGE_V2 (SendMessageRequestHeaderV2's one-letter
#: keys), as RocketMQ's benchmark Producer sends it with its binary header.
JAVA_SEND_EXT = {
    "a": "benchmark_producer", "b": "BenchT", "c": "TBW102", "d": "4", "e": "2", "f": "0",
    "g": "1795881724177", "h": "0", "i": "UNIQ_KEY\x017F0000010001\x02WAIT\x01true\x02",
    "j": "0", "k": "false", "m": "false", "n": "broker-a",
}


def _java_send(opaque=7):
    return RemotingCommand(code=codes.SEND_MESSAGE_V2, language="JAVA", version=395,
                           opaque=opaque, flag=0, remark=None, ext_fields=dict(JAVA_SEND_EXT),
                           body=b"x" * 200, serialize_type=codes.SERIALIZE_ROCKETMQ)


def _module():
    if speedups.pure_python():
        pytest.skip("MQSERVER_PURE_PYTHON is set: the Python code is under test")
    return importlib.import_module("protocols.remoting._header")


def _same(header):
    """Assert that the C reading of C{header} is the Python one's, or None when the
    Python one refuses it; return the command."""
    got = _module().binary_command(header, memoryview(b"b"))
    try:
        expected = py_decode_binary_header(header, b"b")
    except RemotingProtocolError:
        assert got is None, header
        return None
    assert got is not None, header
    assert type(got) is RemotingCommand
    assert got == expected, header
    # the same fields in the same order and types, extFields in the same order
    assert [(k, type(v)) for k, v in vars(got).items()] == [
        (k, type(v)) for k, v in vars(expected).items()]
    assert list(got.ext_fields.items()) == list(expected.ext_fields.items())
    return got


def test_a_java_send_header_is_read_in_c():
    cmd = _same(encode_binary_header(_java_send()))
    assert cmd.serialize_type == codes.SERIALIZE_ROCKETMQ and cmd.language == "JAVA"
    assert cmd.ext_fields == JAVA_SEND_EXT and cmd.remark is None and cmd.opaque == 7


def test_decode_binary_header_uses_the_c_reading():
    _module()
    assert codec._binary_command is not None
    header = encode_binary_header(_java_send())
    cmd = decode_binary_header(memoryview(header), memoryview(b"body"))
    assert cmd == py_decode_binary_header(header, b"body") and type(cmd.body) is bytes


def test_a_java_send_frame_decodes_to_the_command_sent():
    """A whole frame decodes to the command encoded, with or without the C reading (this
    test also runs with MQSERVER_PURE_PYTHON set)."""
    for opaque in (1, 2):
        assert codec.decode_frame(encode(_java_send(opaque))) == _java_send(opaque)


_text = st.text(st.characters(codec="utf-8"), max_size=8) | st.sampled_from(
    ["", "é", "\x00", "\x01\x02", "😀", "\u2028"])


def _pack(code, language, version, opaque, flag, remark, ext):
    """A binary header as wire.ROCKETMQ_HEADER lays it out, from raw parts (bytes)."""
    body = b"".join(struct.pack(">h", len(k)) + k + struct.pack(">i", len(v)) + v
                    for k, v in ext)
    return (struct.pack(">hBhiii", code, language, version, opaque, flag, len(remark)) + remark
            + struct.pack(">i", len(body)) + body)


@given(st.integers(-2**15, 2**15 - 1), st.integers(0, 255), st.integers(-2**15, 2**15 - 1),
       st.integers(-2**31, 2**31 - 1), st.integers(-2**31, 2**31 - 1), _text,
       st.lists(st.tuples(_text, _text), max_size=6),
       st.lists(st.tuples(st.integers(0, 120), st.binary(max_size=4)), max_size=2),
       st.integers(0, 3))
@settings(max_examples=1500)
def test_c_reading_matches_python(code, language, version, opaque, flag, remark, ext, damage,
                                  cut):
    header = bytearray(_pack(code, language, version, opaque, flag, remark.encode(),
                             [(k.encode(), v.encode()) for k, v in ext]))
    for pos, data in damage:
        header[pos:pos + len(data)] = data
    _same(bytes(header[:len(header) - cut]))


@pytest.mark.parametrize("header", [
    b"", b"\x00" * 20, b"\x00" * 21, b"\xff" * 21,
    _pack(1, 0, 0, 0, 0, b"", []),
    _pack(1, 12, 0, 0, 0, b"", []),  # the last known language (RUST)
    _pack(1, 13, 0, 0, 0, b"", []),  # past the known ones: OTHER
    _pack(1, 255, 0, 0, 0, b"", []),
    _pack(1, 0, 0, 0, 0, b"remark", [(b"a", b"1"), (b"a", b"2"), (b"", b"")]),
    _pack(1, 0, 0, 0, 0, b"\xc3", []),  # a remark that is no UTF-8
    _pack(1, 0, 0, 0, 0, b"", [(b"\xed\xa0\x80", b"x")]),  # a surrogate in a key
    _pack(1, 0, 0, 0, 0, b"", [(b"k", b"\xff")]),
    _pack(1, 0, 0, 0, 0, b"", [(b"k", b"v")]) + b"x",  # a byte past the extFields
    _pack(1, 0, 0, 0, 0, b"", [(b"k", b"v")])[:-1],
    struct.pack(">hBhiii", 1, 0, 0, 0, 0, -1) + struct.pack(">i", 0),  # remark length -1
    struct.pack(">hBhiii", 1, 0, 0, 0, 0, 0) + struct.pack(">i", -1),  # extFields length -1
    struct.pack(">hBhiii", 1, 0, 0, 0, 0, 0) + struct.pack(">i", 1) + b"\x00",  # half a key length
    struct.pack(">hBhiii", 1, 0, 0, 0, 0, 0) + struct.pack(">i", 6) + struct.pack(">hi", -1, 0),
    struct.pack(">hBhiii", 1, 0, 0, 0, 0, 0) + struct.pack(">i", 6) + struct.pack(">hi", 0, -1),
    struct.pack(">hBhiii", 1, 0, 0, 0, 0, 0) + struct.pack(">i", 6) + struct.pack(">hi", 0, 9),
    struct.pack(">hBhiii", 1, 0, 0, 0, 0, 2**31 - 1) + struct.pack(">i", 0),
])
def test_c_reading_matches_python_on_edges(header):
    _same(header)


def test_a_header_that_is_no_buffer_is_left_to_python():
    assert _module().binary_command("text", b"") is None
    assert _module().binary_command(None, b"") is None
    with pytest.raises(TypeError):
        _module().binary_command(b"")
