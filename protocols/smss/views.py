"""How broker objects look on the smss wire: topic JSON, messages to and from records.

Headers of an smss message become RocketMQ properties of the stored message (so a
RocketMQ consumer sees them as user properties and a RocketMQ message's properties reach
an smss subscriber as headers). Headers that a properties string cannot carry (bytes
0x01/0x02, invalid UTF-8, empty keys) keep the whole smss message record as the stored
body, flagged with SYSFLAG_SMSS_FRAMED, so smss subscribers still get them byte for byte.
"""

import json

from mqserver import speedups
from mqserver import message as fmt
from mqserver.message import Message

from protocols.smss import wire
from protocols.smss.errors import InvalidPayload
from protocols.smss.payload import parse_record, record_spans

_U32 = wire.U32
_PREFIX = wire.MESSAGE_PREFIX_STRUCT  # S, H of a PUB record
_PUSHED = wire.PUSHED_RECORD_HEAD_STRUCT
_PUSHED_PREFIX = wire.PUSHED_PREFIX_STRUCT
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
#: Properties the broker adds for itself; smss subscribers do not see them as headers.
_HIDDEN = {fmt.DELAY_PROPERTY}


def fnv1a64(data):
    """Return the 64-bit FNV-1a hash of C{data}."""
    h = _FNV_OFFSET
    for b in data:
        h = ((h ^ b) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def topic_root(name, folder_count):
    """Return smss's C{topicRoot} for C{name}."""
    raw = name.encode("utf-8")
    p1 = fnv1a64(raw + b"talk is cheap, show me your code") % folder_count
    p2 = fnv1a64(raw + b"The world is beautiful") % folder_count
    return f"/{p1}/{p2}/{name}"


def _go_json(obj):
    # Go's encoding/json: compact, and <, >, & escaped inside strings.
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029").encode("utf-8")


def topic_dict(t, folder_count):
    """Return the smss JSON object of topic C{t}, fields in smss's order."""
    return {
        "name": t.name,
        "createTimeStamp": t.create_ts,
        "expireAt": t.expire_at,
        "createEventId": t.create_event_id,
        "stateChangeTime": t.state_change_ts,
        "stateChangeEventId": t.state_change_event_id,
        "state": t.state,
        "topicRoot": topic_root(t.name, folder_count),
    }


def topic_json(t, folder_count):
    """Return TOPIC INFO's body for topic C{t}."""
    return _go_json(topic_dict(t, folder_count))


def topics_json(topics, folder_count):
    """Return LIST's body: a JSON array, or b"" when there are no topics."""
    if not topics:
        return b""
    return _go_json([topic_dict(t, folder_count) for t in topics])


def payload_to_messages(payload, now_ms=None):
    """Turn a validated PUB payload into what the store takes: a record without headers
    is its body (bytes), one with headers a L{Message}. Raises InvalidPayload.

    C{now_ms}: the born time to give every message, as L{Message}s (a DELAY's, stored
    later); None leaves it to the store, which stamps the time of the write."""
    total = len(payload)
    if total > 8 and now_ms is None:
        size, h = _PREFIX.unpack_from(payload, 0)
        if h == 0 and size + 8 == total:
            # What the SDKs send for one message: a single record without headers,
            # which passes the walk rules of record_spans by construction.
            return [bytes(payload[8:])]
    born = now_ms or 0
    out = []
    for start, end in record_spans(payload):
        h = _U32.unpack_from(payload, start + 4)[0]
        if h == 0:
            body = bytes(payload[start + 8 : end])
            out.append(body if now_ms is None else Message(body=body, born_ts=born))
            continue
        try:
            headers, body = parse_record(payload, start, end)
        except InvalidPayload:
            # smss treats the record as opaque: keep malformed headers byte for byte.
            headers = None
        if headers is not None and fmt.properties_safe(headers):
            out.append(
                Message(body=body, properties=fmt.encode_properties(headers), born_ts=born)
            )
        else:
            out.append(
                Message(
                    body=bytes(payload[start:end]),
                    sys_flag=fmt.SYSFLAG_SMSS_FRAMED,
                    born_ts=born,
                )
            )
    return out


def _encode_headers(pairs):
    parts = []
    for k, v in pairs:
        parts.append(_U32.pack(len(k)))
        parts.append(k)
        parts.append(_U32.pack(len(v)))
        parts.append(v)
    return b"".join(parts)


def message_record(headers, body):
    """Return the smss message record (S, H, headers, body) of C{headers} and C{body}."""
    block = _encode_headers(headers)
    return _PREFIX.pack(len(block) + len(body), len(headers)) + block + bytes(body)


def _headers_block(properties):
    pairs = [(k, v) for k, v in fmt.decode_properties(properties) if k not in _HIDDEN]
    return len(pairs), _encode_headers(pairs)


def py_encode_records(buf, locs):
    """Encode the stored records at C{locs} (C{[(pos, size), ...]}) in C{buf} as the body
    of one pushed batch.

    This is the subscriber hot path: one struct unpack of the fields it needs, one pack
    of the 32-byte prefix (plus S and H), and the body slice, per message. The C speedup
    (C{_push.c}) does the same byte for byte."""
    fields = fmt.DELIVERY_FIELDS.unpack_from
    pack = _PUSHED.pack
    parts = []
    append = parts.append
    for pos, _ in locs:
        qid, qoff, sys_flag, ts, eid, blen = fields(buf, pos)
        b0 = pos + fmt.HEADER_SIZE
        b1 = b0 + blen
        p = b1 + 1 + buf[b1]
        plen = (buf[p] << 8) | buf[p + 1]
        if sys_flag & fmt.SYSFLAG_SMSS_FRAMED:
            append(_PUSHED_PREFIX.pack(ts, eid, qid, qoff + 1))
            append(buf[b0:b1])
        elif plen == 0:
            append(pack(ts, eid, qid, qoff + 1, blen, 0))
            append(buf[b0:b1])
        else:
            n, block = _headers_block(buf[p + 2 : p + 2 + plen])
            append(pack(ts, eid, qid, qoff + 1, len(block) + blen, n))
            append(block)
            append(buf[b0:b1])
    return b"".join(parts)


_push = speedups.load("protocols.smss._push")
if _push is not None:
    _push.configure(
        fmt.HEADER_SIZE, fmt.OFF_QUEUE_ID, fmt.OFF_QUEUE_OFFSET, fmt.OFF_SYS_FLAG,
        fmt.OFF_STORE_TS, fmt.OFF_EVENT_ID, fmt.OFF_BODY_LEN, fmt.SYSFLAG_SMSS_FRAMED,
        wire.PUSHED_HEAD_OFFSETS, wire.PUSHED_PREFIX_SIZE, _PUSHED.size,
    )
    _HIDDEN_KEYS = tuple(_HIDDEN)

    def encode_records(buf, locs):
        """Encode the stored records at C{locs} in C{buf} as the body of one pushed batch
        (the C speedup of L{py_encode_records})."""
        return _push.encode(buf, locs, _HIDDEN_KEYS)

else:
    encode_records = py_encode_records
