"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310), SEND_BATCH_MESSAGE (320) and
CONSUMER_SEND_MSG_BACK (36): turning requests into store messages (as RocketMQ 4.9.4's
SendMessageProcessor)."""

import socket
import struct

from mqserver import message as fmt
from mqserver.message import Message

from protocols.remoting import codes
from protocols.remoting.inflate import InflateError, InflateLimitError, inflate
from protocols.remoting.props import decode_batch_body
from protocols.remoting.server import BadRequest, to_int
from protocols.remoting.topicview import DLQ_PREFIX, RETRY_PREFIX

#: SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE short field names (SendMessageRequestHeaderV2).
SHORT_NAMES = {
    "a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums",
    "e": "queueId", "f": "sysFlag", "g": "bornTimestamp", "h": "flag", "i": "properties",
    "j": "reconsumeTimes", "k": "unitMode", "l": "maxReconsumeTimes", "m": "batch",
}
_HOST_FLAGS = 0x10 | 0x20  # born/store host IPv6 bits: we store IPv4 hosts only
#: A send's sysFlag & NO_HOST_FLAGS: what is stored of it.
NO_HOST_FLAGS = ~_HOST_FLAGS
NO_HOST = fmt.NO_HOST


def send_header(cmd):
    """Return the send header with long field names, whatever form the client used."""
    ext = cmd.ext_fields
    if "b" in ext and "topic" not in ext:
        return {SHORT_NAMES.get(k, k): v for k, v in ext.items()}
    return ext


def header_int(ext, name, default=None):
    """Return ext field C{name} of a send header dict as an int (see L{to_int})."""
    return to_int(ext.get(name), name, default)


def header_bool(ext, name):
    return (ext.get(name) or "").lower() in ("true", "1")


def host_bytes(address):
    """Return the 8-byte BORNHOST/STOREHOST of a Twisted IPv4 address (zeros otherwise)."""
    try:
        return socket.inet_aton(address.host) + address.port.to_bytes(4, "big")
    except (OSError, AttributeError):
        return NO_HOST


def normalize_properties(text):
    """Return the property string as stored bytes, always ending in 0x02 so that
    properties appended later (the broker's delay marker) stay separate."""
    if not text:
        return b""
    data = text.encode("utf-8")
    return data if data.endswith(b"\x02") else data + b"\x02"


def property_value(props, name):
    """Return the value of C{name} (bytes) in a stored property string, or None."""
    key = name + b"\x01"
    if key not in props:
        return None
    for k, v in fmt.decode_properties(props):
        if k == name:
            return v
    return None


_REAL = (b"REAL_TOPIC", b"REAL_QID")


def with_real_queue(props, topic, qid):
    """Return the stored property string C{props} with C{REAL_TOPIC}/C{REAL_QID} naming
    (C{topic}, C{qid}), as 4.9 marks a delayed message."""
    pairs = [(k, v) for k, v in fmt.decode_properties(props) if k not in _REAL]
    pairs += [(b"REAL_TOPIC", topic.encode("utf-8")), (b"REAL_QID", str(qid).encode())]
    return fmt.encode_properties(pairs)


#: The Java types of a send header's sysFlag, flag, bornTimestamp and reconsumeTimes: packing
#: them checks their ranges.
NUMBERS = _NUMBERS = struct.Struct("<iiqi")
_INT32 = (-2**31, 2**31 - 1)
_INT64 = (-2**63, 2**63 - 1)


def _ranged(ext, name, bounds):
    """Return send header field C{name} (default 0) as an int within C{bounds}, the range
    of the Java field (a larger number fails to parse there too)."""
    value = header_int(ext, name, 0)
    if not bounds[0] <= value <= bounds[1]:
        raise BadRequest(codes.SYSTEM_ERROR, f"the custom field <{name}> is out of range: {value}")
    return value


def _numbers(ext):
    """Return the sysFlag, flag, bornTimestamp and reconsumeTimes of a send header."""
    get = ext.get
    try:
        # the usual header, in one go: all four present (or empty) and in their Java
        # ranges, which packing them as int, int, long, int checks
        numbers = (int(get("sysFlag") or 0), int(get("flag") or 0),
                   int(get("bornTimestamp") or 0), int(get("reconsumeTimes") or 0))
        _NUMBERS.pack(*numbers)
        return numbers
    except (ValueError, struct.error):
        # one is bad: name it, in the order 4.9 reads them
        return (_ranged(ext, "sysFlag", _INT32), _ranged(ext, "flag", _INT32),
                _ranged(ext, "bornTimestamp", _INT64), _ranged(ext, "reconsumeTimes", _INT32))


def build_messages(ext, body, born_host, max_size):
    """Return the L{Message}s of a send request (one, or a batch's).

    A compressed batch is inflated to at most C{max_size} bytes (the store's maximum
    message size); a single message keeps its compressed body, as in RocketMQ."""
    sys_flag, flag, born_ts, reconsume = _numbers(ext)
    sys_flag &= ~_HOST_FLAGS
    if header_bool(ext, "batch"):
        if sys_flag & codes.MSG_COMPRESSED_FLAG:
            # C++ deflates a whole batch of 4 KiB or more
            try:
                body = inflate(body, max_size)
            except InflateLimitError:
                raise BadRequest(codes.MESSAGE_ILLEGAL,
                                 f"the message body size over max value, MAX: {max_size}") from None
            except InflateError as e:
                raise BadRequest(codes.MESSAGE_ILLEGAL, f"batch body does not inflate: {e}") from None
            sys_flag &= ~codes.MSG_COMPRESSED_FLAG
        try:
            items = decode_batch_body(body)
        except ValueError as e:
            raise BadRequest(codes.MESSAGE_ILLEGAL, f"bad batch body: {e}") from None
        if not items:
            raise BadRequest(codes.MESSAGE_ILLEGAL, "empty batch")
        out = []
        for item in items:
            props = fmt.encode_properties(item.properties.items())
            out.append(Message(item.body, props, item.flag, sys_flag, reconsume, born_ts, born_host))
        return out
    props = normalize_properties(ext.get("properties"))
    return [Message(body, props, flag, sys_flag, reconsume, born_ts, born_host)]


def offset_msg_ids(store_host, offsets):
    """Return the offset message ids (as MessageDecoder.createMessageId: store IP, 4-byte
    port, 8-byte commit-log offset, uppercase hex) of records at C{offsets}, comma-joined.

    C{store_host} is the 8-byte STOREHOST field, which is already IP + port."""
    return ",".join((store_host + o.to_bytes(8, "big")).hex().upper() for o in offsets)


_DROP_ON_RETRY = {b"MQ_DELAY_ID", b"DELAY"}


def retry_copy(view, offset_id):
    """Return the L{Message} that CONSUMER_SEND_MSG_BACK stores for the record C{view}:
    same body, flag and born fields, RETRY_TOPIC and ORIGIN_MESSAGE_ID set when
    missing, reconsumeTimes + 1 (as consumerSendMsgBack)."""
    pairs = [(k, v) for k, v in fmt.decode_properties(view.properties) if k not in _DROP_ON_RETRY]
    keys = {k for k, _ in pairs}
    if b"RETRY_TOPIC" not in keys:
        pairs.append((b"RETRY_TOPIC", view.topic.encode("utf-8")))
    if b"ORIGIN_MESSAGE_ID" not in keys:
        uniq = dict(pairs).get(b"UNIQ_KEY")
        pairs.append((b"ORIGIN_MESSAGE_ID", uniq or offset_id.encode()))
    return Message(
        body=bytes(view.body), properties=fmt.encode_properties(pairs), flag=view.flag,
        sys_flag=view.sys_flag & ~_HOST_FLAGS, reconsume_times=view.reconsume_times + 1,
        born_ts=view.born_ts, born_host=bytes(view.born_host),
    )


def retry_topic(group):
    return RETRY_PREFIX + group


def dlq_topic(group):
    return DLQ_PREFIX + group
