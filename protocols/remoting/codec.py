"""Sans-IO encoder and decoder of RocketMQ remoting frames (the incremental decoder of a
connection's bytes is L{protocols.remoting.framing.FrameDecoder}).

Frame: u32 length, u32 (serializeType << 24 | headerLength), header, body
(RocketMQ 4.9.4's RemotingCommand.encode).  Headers are JSON (type 0, the only one the C++
client reads) or the ROCKETMQ binary layout (type 1).  Every decoding failure raises
``RemotingProtocolError``; the connection should then be dropped.
"""

import dataclasses
import json
import struct
from collections.abc import Mapping
from itertools import compress, repeat
from operator import is_not
from json.encoder import encode_basestring

from mqserver import speedups

from protocols.remoting import codes
from protocols.remoting.messages import RemotingCommand, make_response
from protocols.remoting.wire import (
    BINARY_HEADER_FIXED,
    FRAME_PREFIX_STRUCT,
    INT16_STRUCT,
    INT32_STRUCT,
    LENGTH_STRUCT,
    MAX_HEADER_LENGTH,
    SERIALIZE_TYPE_SHIFT,
    WORD_SIZE,
)

_LENGTH_SIZE = LENGTH_STRUCT.size
#: The C speedup of decode_json_header (None: py_decode_json_header only).
_header = speedups.load("protocols.remoting._header")
_json_command = None
#: The C reading of a read that is one whole frame (framing.FrameDecoder.whole; None:
#: Python only).
json_frame = None
#: The C speedup of decode_binary_header (None: py_decode_binary_header only).
_binary_command = None
if _header is not None:
    _header.configure(RemotingCommand, tuple(f.name for f in dataclasses.fields(RemotingCommand)),
                      codes.SERIALIZE_JSON, codes.LANGUAGE_JAVA, SERIALIZE_TYPE_SHIFT,
                      MAX_HEADER_LENGTH)
    _header.configure_binary(codes.SERIALIZE_ROCKETMQ, codes.LANGUAGE_NAMES, codes.LANGUAGE_OTHER)
    _json_command = _header.json_command
    json_frame = _header.json_frame
    _binary_command = _header.binary_command

_JSON_TYPE_NAME = codes.SERIALIZE_TYPE_NAMES[codes.SERIALIZE_JSON]
_OTHER_LANGUAGE_CODE = codes.LANGUAGE_CODES[codes.LANGUAGE_OTHER]
# One decoder for every header: json.loads(..., strict=False) would build one per call.
_JSON_DECODER = json.JSONDecoder(strict=False)
_json_decode = _JSON_DECODER.decode
_json_scan = _JSON_DECODER.scan_once
#: What JSON counts as whitespace around a value (json.decoder.WHITESPACE).
_JSON_SPACE = " \t\n\r"
#: A JSON string as json.dumps(..., ensure_ascii=False) writes it (the very function).
_json_str = encode_basestring
_COLON_JOIN = ":".join
_STR_ONLY = frozenset((str,))
_INT_ONLY = {int}
_MISSING = object()
_LANGUAGE_JSON = {name: json.dumps(name) for name in codes.LANGUAGE_NAMES}
# The JSON header a Java 4.9 server writes, keys in fastjson's (alphabetical) order;
# extFields and remark come with their leading comma, or empty when left out.
_HEADER_TEMPLATE = ('{"code":%d%s,"flag":%d,"language":%s,"opaque":%d%s,"serializeTypeCurrentRPC":'
                    + json.dumps(_JSON_TYPE_NAME) + ',"version":%d}')


class RemotingProtocolError(ValueError):
    """A frame, header or body that violates the remoting protocol (or our limits).

    ``commands`` holds the commands a ``FrameDecoder.feed`` call had already decoded
    from the same chunk before it hit the bad frame.
    """

    def __init__(self, message: str, commands: list[RemotingCommand] | None = None):
        super().__init__(message)
        self.commands = commands or []


# -- value normalisation ------------------------------------------------------------


def ext_value_to_str(value) -> str | None:
    """Return the string form of an extFields value as Java would read it, None for null.

    Clients send some values as JSON numbers (C++) and booleans as true/false or
    "0"/"1" (as RocketMQ's clients send them); callers convert by the declared type.
    """
    if isinstance(value, str):
        return value
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _int_field(obj: dict, name: str, default: int) -> int:
    value = obj.get(name, default)
    if value is None:
        return default
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    # fastjson would also read an int field written as a decimal string
    if isinstance(value, str) and value.isascii() and value.removeprefix("-").isdigit():
        return int(value)
    raise RemotingProtocolError(f"header field {name!r} is not an integer: {value!r}")


# -- JSON header -----------------------------------------------------------------------


def _read_header(c_reading, py_reading, header, body) -> RemotingCommand:
    """The command C{c_reading} (a C speedup, or None) makes of C{header} and C{body};
    when it leaves them (None), the one C{py_reading} (its Python reference) makes."""
    if c_reading is not None:
        cmd = c_reading(header, body)
        if cmd is not None:
            return cmd
    return py_reading(header, body)


def decode_json_header(header: bytes, body: bytes = b"") -> RemotingCommand:
    """Decode a JSON header (serializeType 0) into a command carrying ``body``.

    Tolerates a trailing newline, unescaped control characters, unknown keys and
    non-string extFields values (stringified with ``ext_value_to_str``).
    The C speedup (C{_header.c}) reads the headers clients send; whatever it leaves
    (None) goes to L{py_decode_json_header}, the reference.
    """
    return _read_header(_json_command, py_decode_json_header, header, body)


def py_decode_json_header(header: bytes, body: bytes = b"") -> RemotingCommand:
    """L{decode_json_header} in Python: the reference of the C speedup, and what reads
    every header the speedup leaves."""
    try:
        text = str(header, "utf-8")
        try:
            # the scanner decode() runs, called directly: a header is one JSON value
            obj, end = _json_scan(text, 0)
        except StopIteration:
            obj = end = None  # leading whitespace, or nothing: decode() says which
        if end != len(text) and (end is None or text[end:].strip(_JSON_SPACE)):
            obj = _json_decode(text)  # what is around the value: decode() judges it
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RemotingProtocolError(f"undecodable JSON header: {exc}") from None
    except RecursionError:
        # the C scanner recurses once per "[" or "{": refuse deep nesting as bad input
        raise RemotingProtocolError("JSON header nested too deeply") from None
    if type(obj) is not dict:
        raise RemotingProtocolError("JSON header is not an object")
    get = obj.get
    code = get("code", _MISSING)
    if code is _MISSING:
        raise RemotingProtocolError("JSON header has no code")
    version, opaque, flag = get("version", 0), get("opaque", 0), get("flag", 0)
    # The usual header has int numbers: check them all at once, convert only otherwise.
    if not type(code) is type(version) is type(opaque) is type(flag) is int:
        code = _int_field(obj, "code", 0)
        version = _int_field(obj, "version", 0)
        opaque = _int_field(obj, "opaque", 0)
        flag = _int_field(obj, "flag", 0)
    language = get("language") or codes.LANGUAGE_JAVA
    remark = get("remark")
    ext_fields = get("extFields")
    if ext_fields is None:
        ext_fields = {}
    elif type(ext_fields) is not dict:
        raise RemotingProtocolError("extFields is not an object")
    elif not {*map(type, ext_fields.values())} <= _STR_ONLY:
        # C++ sends some values as numbers: a fresh dict from the decoder,
        # so only those are converted, in place.
        _ext_fields_in(ext_fields)
    return RemotingCommand(
        code,
        language if type(language) is str else str(language),
        version,
        opaque,
        flag,
        remark if remark is None or type(remark) is str else str(remark),
        ext_fields,
        bytes(body),
        codes.SERIALIZE_JSON,
    )


def _ext_fields_in(ext_fields: dict) -> None:
    """Make every value of the decoded C{ext_fields} a string, in place (see
    L{ext_value_to_str}); null-valued entries go, as Java drops them."""
    # the keys whose values are not strings, found without a Python loop over them all
    keys = [*compress(ext_fields, map(is_not, map(type, ext_fields.values()), repeat(str)))]
    values = [*map(ext_fields.__getitem__, keys)]
    if {*map(type, values)} == _INT_ONLY:  # the usual case: C++ numbers (not bools)
        ext_fields.update(zip(keys, map(str, values)))
        return
    for key, value in zip(keys, values):
        text = ext_value_to_str(value)
        if text is None:
            del ext_fields[key]
        else:
            ext_fields[key] = text


def _ext_fields_out(ext_fields: Mapping) -> dict[str, str]:
    out = {}
    for key, value in ext_fields.items():
        if not isinstance(key, str):
            raise RemotingProtocolError(f"extFields key is not a string: {key!r}")
        if value is None:
            continue
        if not isinstance(value, (str, int)):
            raise RemotingProtocolError(f"extFields value for {key!r} is not a string: {value!r}")
        out[key] = ext_value_to_str(value)
    return out


def encode_json_header(command: RemotingCommand) -> bytes:
    """Encode the JSON header the way a Java 4.9 server does.

    Keys in alphabetical order (as fastjson writes them), ``remark`` and
    ``extFields`` left out when empty, every extFields value a JSON string (the C++
    client ignores numeric values, the Go client fails on them).
    """
    ext = command.ext_fields
    code, flag, opaque, version = command.code, command.flag, command.opaque, command.version
    language, remark = command.language, command.remark
    if (type(code) is type(flag) is type(opaque) is type(version) is int
            and type(language) is str and (remark is None or type(remark) is str)
            and type(ext) is dict and {*map(type, ext), *map(type, ext.values())} <= _STR_ONLY):
        # The usual answer: ints and strings only, written straight from a template
        # (the same bytes json.dumps gives for the dict the general path builds).
        return _templated_header(code, ext, flag, _LANGUAGE_JSON.get(language) or _json_str(language),
                                 opaque, remark, version)
    return _encode_json_header_slow(command)


def _templated_header(code, ext, flag, language_json, opaque, remark, version):
    """Return L{_HEADER_TEMPLATE} filled: ints, a str-to-str C{ext}, the language already
    a JSON string, C{remark} a str or None."""
    try:
        return (_HEADER_TEMPLATE % (
            code,
            ',"extFields":{%s}' % ",".join(map(_COLON_JOIN, zip(
                map(_json_str, ext), map(_json_str, ext.values())))) if ext else "",
            flag,
            language_json,
            opaque,
            "" if remark is None else ',"remark":' + _json_str(remark),
            version,
        )).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise RemotingProtocolError(f"cannot encode JSON header: {exc}") from None


def _encode_json_header_slow(command: RemotingCommand) -> bytes:
    obj = {"code": command.code}
    ext = _ext_fields_out(command.ext_fields)
    if ext:
        obj["extFields"] = ext
    obj["flag"] = command.flag
    obj["language"] = command.language
    obj["opaque"] = command.opaque
    if command.remark is not None:
        obj["remark"] = command.remark
    obj["serializeTypeCurrentRPC"] = _JSON_TYPE_NAME
    obj["version"] = command.version
    try:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise RemotingProtocolError(f"cannot encode JSON header: {exc}") from None


# -- ROCKETMQ binary header ----------------------------------------------------------


def _utf8(data) -> str:
    try:
        return str(data, "utf-8")
    except UnicodeDecodeError as exc:
        raise RemotingProtocolError(f"invalid UTF-8 in binary header: {exc}") from None


def decode_binary_header(header: bytes, body: bytes = b"") -> RemotingCommand:
    """Decode a ROCKETMQ binary header (serializeType 1) into a command carrying ``body``.

    A zero-length remark decodes as None, as in Java. The C speedup (C{_header.c}) reads
    the headers clients send (the Java clients with C{rocketmq.serialize.type=ROCKETMQ});
    whatever it leaves (None) goes to L{py_decode_binary_header}, the reference.
    """
    return _read_header(_binary_command, py_decode_binary_header, header, body)


def py_decode_binary_header(header: bytes, body: bytes = b"") -> RemotingCommand:
    """L{decode_binary_header} in Python: the reference of the C speedup, and what reads
    every header the speedup leaves (and says what is wrong with it)."""
    view = memoryview(header)
    end = len(view)
    if end < BINARY_HEADER_FIXED.size + 4:
        raise RemotingProtocolError(f"binary header too short: {end} bytes")
    code, language, version, opaque, flag, remark_len = BINARY_HEADER_FIXED.unpack_from(view, 0)
    pos = BINARY_HEADER_FIXED.size
    if remark_len < 0 or pos + remark_len + 4 > end:
        raise RemotingProtocolError(f"bad remark length {remark_len}")
    remark = _utf8(view[pos:pos + remark_len]) if remark_len else None
    pos += remark_len
    (ext_len,) = INT32_STRUCT.unpack_from(view, pos)
    pos += 4
    if ext_len < 0 or pos + ext_len != end:
        raise RemotingProtocolError(f"bad extFields length {ext_len}")
    ext_fields = {}
    while pos < end:
        if pos + 2 > end:
            raise RemotingProtocolError("truncated extFields key length")
        (key_len,) = INT16_STRUCT.unpack_from(view, pos)
        pos += 2
        if key_len < 0 or pos + key_len + 4 > end:
            raise RemotingProtocolError(f"bad extFields key length {key_len}")
        key = _utf8(view[pos:pos + key_len])
        pos += key_len
        (value_len,) = INT32_STRUCT.unpack_from(view, pos)
        pos += 4
        if value_len < 0 or pos + value_len > end:
            raise RemotingProtocolError(f"bad extFields value length {value_len}")
        ext_fields[key] = _utf8(view[pos:pos + value_len])
        pos += value_len
    names = codes.LANGUAGE_NAMES
    return RemotingCommand(
        code=code,
        language=names[language] if language < len(names) else codes.LANGUAGE_OTHER,
        version=version,
        opaque=opaque,
        flag=flag,
        remark=remark,
        ext_fields=ext_fields,
        body=bytes(body),
        serialize_type=codes.SERIALIZE_ROCKETMQ,
    )


def encode_binary_header(command: RemotingCommand) -> bytes:
    """Encode the ROCKETMQ binary header; unknown language names are sent as OTHER."""
    remark = command.remark.encode("utf-8") if command.remark else b""
    return _binary_header(command.code, codes.LANGUAGE_CODES.get(command.language, _OTHER_LANGUAGE_CODE),
                          command.version, command.opaque, command.flag, remark,
                          _ext_fields_out(command.ext_fields))


def _binary_header(code, language_code, version, opaque, flag, remark, ext_fields) -> bytes:
    """The binary header of these fields: C{remark} in bytes, C{ext_fields} mapping
    strings to strings."""
    parts = []
    for key, value in ext_fields.items():
        key_bytes = key.encode("utf-8")
        value_bytes = value.encode("utf-8")
        parts += (INT16_STRUCT.pack(len(key_bytes)), key_bytes, INT32_STRUCT.pack(len(value_bytes)), value_bytes)
    ext = b"".join(parts)
    try:
        fixed = BINARY_HEADER_FIXED.pack(code, language_code, version, opaque, flag, len(remark))
    except struct.error as exc:
        raise RemotingProtocolError(f"header field out of range for the binary header: {exc}") from None
    return b"".join((fixed, remark, INT32_STRUCT.pack(len(ext)), ext))


# -- frames -------------------------------------------------------------------------------


def decode_payload(payload) -> RemotingCommand:
    """Decode one frame without its 4-byte length prefix (what Int32StringReceiver hands over)."""
    view = memoryview(payload)
    if len(view) < WORD_SIZE:
        raise RemotingProtocolError(f"frame too short: {len(view)} bytes")
    (word,) = LENGTH_STRUCT.unpack_from(view, 0)
    serialize_type = word >> SERIALIZE_TYPE_SHIFT
    header_len = word & MAX_HEADER_LENGTH
    if WORD_SIZE + header_len > len(view):
        raise RemotingProtocolError(f"header length {header_len} exceeds frame length {len(view)}")
    header = view[WORD_SIZE:WORD_SIZE + header_len]
    body = view[WORD_SIZE + header_len:]
    if serialize_type == codes.SERIALIZE_JSON:
        return decode_json_header(header, body)
    if serialize_type == codes.SERIALIZE_ROCKETMQ:
        return decode_binary_header(header, body)
    raise RemotingProtocolError(f"unknown serialize type {serialize_type}")


def decode_frame(frame) -> RemotingCommand:
    """Decode exactly one whole frame, length prefix included."""
    view = memoryview(frame)
    if len(view) < _LENGTH_SIZE:
        raise RemotingProtocolError("frame shorter than its length prefix")
    (length,) = LENGTH_STRUCT.unpack_from(view, 0)
    if length != len(view) - _LENGTH_SIZE:
        raise RemotingProtocolError(
            f"length prefix {length} does not match {len(view) - _LENGTH_SIZE} bytes")
    return decode_payload(view[_LENGTH_SIZE:])


def encode(command: RemotingCommand) -> bytes:
    """Encode ``command`` as a whole frame in its own serialize type."""
    if command.serialize_type == codes.SERIALIZE_JSON:
        header = encode_json_header(command)
    elif command.serialize_type == codes.SERIALIZE_ROCKETMQ:
        header = encode_binary_header(command)
    else:
        raise RemotingProtocolError(f"unknown serialize type {command.serialize_type}")
    if len(header) > MAX_HEADER_LENGTH:
        raise RemotingProtocolError(f"header of {len(header)} bytes does not fit in 24 bits")
    body = bytes(command.body)
    length = WORD_SIZE + len(header) + len(body)
    if length > 0xFFFFFFFF:
        raise RemotingProtocolError(f"frame of {length} bytes does not fit the length prefix")
    word = (command.serialize_type << SERIALIZE_TYPE_SHIFT) | len(header)
    return b"".join((FRAME_PREFIX_STRUCT.pack(length, word), header, body))


# What every answer of ours carries (messages.make_response): the response bit, and the
# language and version our servers announce.
_ANSWER_LANGUAGE = _LANGUAGE_JSON[codes.SERVER_LANGUAGE]
_ANSWER_FLAG = codes.FLAG_RESPONSE
_ANSWER_VERSION = codes.SERVER_VERSION
_JSON_TYPE_WORD = codes.SERIALIZE_JSON << SERIALIZE_TYPE_SHIFT
_BINARY_TYPE_WORD = codes.SERIALIZE_ROCKETMQ << SERIALIZE_TYPE_SHIFT
_ANSWER_LANGUAGE_CODE = codes.LANGUAGE_CODES[codes.SERVER_LANGUAGE]


def encode_response(request: RemotingCommand, code: int, ext_fields: dict[str, str],
                    body: bytes = b"", remark: str | None = None) -> bytes:
    """Return the frame of C{make_response(request, code, remark, ext_fields, body)}, the
    same bytes C{encode} gives it, without building the command (the answers of the
    per-message requests). C{ext_fields} maps strings to strings."""
    if request.serialize_type == codes.SERIALIZE_ROCKETMQ:
        # what encode_binary_header writes for make_response's command
        header = _binary_header(code, _ANSWER_LANGUAGE_CODE, _ANSWER_VERSION, request.opaque,
                                _ANSWER_FLAG, remark.encode("utf-8") if remark else b"",
                                _ext_fields_out(ext_fields) if ext_fields else {})
        type_word = _BINARY_TYPE_WORD
    elif request.serialize_type == codes.SERIALIZE_JSON:
        header = _templated_header(code, ext_fields, _ANSWER_FLAG, _ANSWER_LANGUAGE,
                                   request.opaque, remark, _ANSWER_VERSION)
        type_word = _JSON_TYPE_WORD
    else:
        return encode(make_response(request, code, remark, ext_fields, body))
    n = len(header)
    length = WORD_SIZE + n + len(body)
    if n > MAX_HEADER_LENGTH or length > 0xFFFFFFFF:
        raise RemotingProtocolError(f"answer of {length} bytes does not fit its frame")
    return b"".join((FRAME_PREFIX_STRUCT.pack(length, type_word | n), header, body))


#: The SUCCESS answer to a send (broker_protocol.sent) as a template: only the msgId (hex),
#: queueId, queueOffset and opaque differ between sends (the ints as the general template
#: writes them, the msgId needing no JSON escape).
_SEND_ANSWER = (
    '{"code":%d,"extFields":{"MSG_REGION":"DefaultRegion","TRACE_ON":"true","msgId":"%%s",'
    '"queueId":"%%d","queueOffset":"%%d"},"flag":%d,"language":%s,"opaque":%%d,'
    '"serializeTypeCurrentRPC":%s,"version":%d}') % (
    codes.SUCCESS, _ANSWER_FLAG, _ANSWER_LANGUAGE, json.dumps(_JSON_TYPE_NAME), _ANSWER_VERSION)


def encode_send_answer(request: RemotingCommand, msg_id: str, queue_id: int,
                       queue_offset: int) -> bytes:
    """Return the frame of the SUCCESS answer to the send C{request} (a JSON one): the
    bytes C{encode_response} gives for C{MSG_REGION}, C{TRACE_ON}, C{msgId} (uppercase
    hex), C{queueId} and C{queueOffset}, from one template."""
    header = (_SEND_ANSWER % (msg_id, queue_id, queue_offset, request.opaque)).encode()
    n = len(header)
    return FRAME_PREFIX_STRUCT.pack(WORD_SIZE + n, _JSON_TYPE_WORD | n) + header


#: The answer to a pull as templates (code, remark) -> (head, tail) around its numbers:
#: only the offsets, the opaque and the body differ between pulls with the same outcome.
_PULL_ANSWERS = {}
_PULL_HEAD = '{"code":%d,"extFields":{"suggestWhichBrokerId":"0","nextBeginOffset":"'
_PULL_TAIL = '%s,"serializeTypeCurrentRPC":%s,"version":%d}' % (
    "%s", json.dumps(_JSON_TYPE_NAME), _ANSWER_VERSION)
_PULL_FLAGS = '"},"flag":%d,"language":%s,"opaque":' % (_ANSWER_FLAG, _ANSWER_LANGUAGE)


def encode_pull_answer(request: RemotingCommand, code: int, next_offset: int, min_offset: int,
                       max_offset: int, body: bytes, remark: str | None) -> bytes:
    """Return the frame of the answer to the pull C{request}: the bytes C{encode_response}
    gives for C{suggestWhichBrokerId} "0", C{nextBeginOffset}, C{minOffset} and
    C{maxOffset} (ints), C{body} and C{remark}, from a template per (code, remark)."""
    parts = _PULL_ANSWERS.get((code, remark))
    if parts is None or request.serialize_type != codes.SERIALIZE_JSON:
        if (request.serialize_type != codes.SERIALIZE_JSON or type(code) is not int
                or remark is not None and type(remark) is not str):
            return encode_response(request, code, {
                "suggestWhichBrokerId": "0", "nextBeginOffset": str(next_offset),
                "minOffset": str(min_offset), "maxOffset": str(max_offset)}, body, remark)
        parts = _pull_answer_parts(code, remark)
    header = (f'{parts[0]}{next_offset}","minOffset":"{min_offset}","maxOffset":"{max_offset}'
              f'{_PULL_FLAGS}{request.opaque}{parts[1]}').encode()
    n = len(header)
    return b"".join((FRAME_PREFIX_STRUCT.pack(WORD_SIZE + n + len(body), _JSON_TYPE_WORD | n),
                     header, body))


def _pull_answer_parts(code, remark):
    parts = (_PULL_HEAD % code,
             _PULL_TAIL % ("" if remark is None else ',"remark":' + _json_str(remark)))
    if len(_PULL_ANSWERS) < 64:  # the remarks are a few fixed texts
        _PULL_ANSWERS[(code, remark)] = parts
    return parts
