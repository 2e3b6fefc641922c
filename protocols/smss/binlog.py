"""Translation between mqserver's commit-log records and smss binlog records (spec §11.4).

The replication stream is smss's: each record becomes one binlog block, so a reference
smss slave can follow an mqserver master and the reverse. Our log keeps one message per
record, so a PUB block always holds one message; DelayApply (101) blocks are built from
messages carrying the ``MQ_DELAY_ID`` property.

What smss has no field for travels where smss keeps opaque bytes, so a reference smss
slave stores it unchanged and an mqserver slave restores it:

- a message's RocketMQ fields (queue id, flag, sysflag, reconsume times), when any is not
  the default, as the header ``MQ_REC`` = ``"qid,flag,sysflag,reconsume"``;
- a topic's queue count, permissions and attributes, when not smss's defaults, as JSON
  after the 8-byte expireAt of a CREATE payload (an UPDATE is such a CREATE with
  ``"update": true``).
"""

import json
import struct
from dataclasses import dataclass

from mqserver.broker.topics import create_body
from mqserver.store import format as fmt
from mqserver.store.store import Message

from protocols.smss import wire
from protocols.smss.errors import InvalidPayload
from protocols.smss.payload import parse_record, record_spans
from protocols.smss.views import message_record

CMD_PUB, CMD_CREATE, CMD_DELETE, CMD_DELAY, CMD_DELAY_APPLY = 1, 2, 3, 16, 101
REC_HEADER = b"MQ_REC"
_I64 = struct.Struct("<q")
_DELAY_PREFIX = struct.Struct("<qq")  # trigger time, delay eventId


def _smss_record(body, properties, sys_flag, extra):
    if sys_flag & fmt.SYSFLAG_SMSS_FRAMED:
        return bytes(body)
    headers = [(k, v) for k, v in fmt.decode_properties(properties) if k != fmt.DELAY_PROPERTY]
    if extra is not None:
        headers.append((REC_HEADER, extra))
    return message_record(headers, body)


def _extra(queue_id, flag, sys_flag, reconsume):
    if queue_id == 0 and flag == 0 and reconsume == 0 and not (sys_flag & ~fmt.SYSFLAG_SMSS_FRAMED):
        return None
    return b"%d,%d,%d,%d" % (queue_id, flag, sys_flag, reconsume)


def _block(write_time, cmd, event_id, timestamp, topic, raw):
    payload_len = len(raw) + 1 if raw is not None else 0
    line = wire.encode_binlog_cmd_line(write_time, cmd, event_id, timestamp, topic, payload_len)
    parts = [wire.U32.pack(len(line)), line]
    if raw is not None:
        parts += [raw, b"\n"]
    return b"".join(parts)


def record_to_block(view):
    """Return the smss binlog block (cmdLen, cmdLine, payload) of one commit-log record."""
    topic = view.topic.encode("utf-8")
    if view.magic == fmt.MESSAGE_MAGIC:
        extra = _extra(view.queue_id, view.flag, view.sys_flag, view.reconsume_times)
        rec = _smss_record(view.body, view.properties, view.sys_flag, extra)
        if fmt.DELAY_PROPERTY in view.properties:
            for k, v in fmt.decode_properties(view.properties):
                if k == fmt.DELAY_PROPERTY:
                    eid, trigger = fmt.parse_delay_marker(v)
                    raw = _DELAY_PREFIX.pack(trigger, eid) + rec
                    return _block(view.store_ts, CMD_DELAY_APPLY, view.event_id, view.born_ts, topic, raw)
        return _block(view.store_ts, CMD_PUB, view.event_id, view.born_ts, topic, rec)
    op = view.flag
    if op in (fmt.OP_CREATE, fmt.OP_UPDATE):
        spec = json.loads(bytes(view.body))
        raw = _I64.pack(spec.get("expireAt", 0))
        more = {k: spec[k] for k in ("queues", "perm", "attrs") if k in spec}
        if op == fmt.OP_UPDATE or more != {"queues": 1, "perm": 6, "attrs": {}}:
            more["update"] = op == fmt.OP_UPDATE
            raw += json.dumps(more, separators=(",", ":")).encode()
        return _block(view.store_ts, CMD_CREATE, view.event_id, view.store_ts, topic, raw)
    if op == fmt.OP_DELETE:
        return _block(view.store_ts, CMD_DELETE, view.event_id, view.store_ts, topic, None)
    if op == fmt.OP_DELAY:
        (trigger,) = fmt.DELAY_PREFIX.unpack_from(view.body, 0)
        recs = [
            _smss_record(body, props, sysf, _extra(0, flag, sysf, rc))
            for flag, sysf, rc, body, props in fmt.decode_message_list(view.body, fmt.DELAY_PREFIX.size)
        ]
        raw = _DELAY_PREFIX.pack(trigger, view.event_id) + b"".join(recs)
        return _block(view.store_ts, CMD_DELAY, view.event_id, view.store_ts, topic, raw)
    raise ValueError(f"unknown admin operation {op}")


@dataclass(slots=True)
class BinlogRecord:
    """One parsed binlog block."""

    write_time: int
    cmd: int
    event_id: int
    timestamp: int
    topic: str
    payload: bytes  # without the trailing newline; b"" when payload_len is 0


def parse_block(block):
    """Parse a binlog block. Raises ValueError when it is malformed."""
    (cmd_len,) = wire.U32.unpack_from(block, 0)
    line = bytes(block[4 : 4 + cmd_len])
    if not line.endswith(b"\n"):
        raise ValueError("binlog command line does not end in a newline")
    parts = line[:-1].split(b"\t")
    if len(parts) != 6:
        raise ValueError("binlog command line needs 6 fields")
    write_time, cmd, event_id, timestamp = (int(p) for p in parts[:4])
    payload_len = int(parts[5])
    payload = bytes(block[4 + cmd_len : 4 + cmd_len + payload_len])
    if len(payload) != payload_len:
        raise ValueError("binlog payload is shorter than its length")
    if payload_len:
        if not payload.endswith(b"\n"):
            raise ValueError("binlog payload does not end in a newline")
        payload = payload[:-1]
    return BinlogRecord(write_time, cmd, event_id, timestamp, parts[4].decode("utf-8"), payload)


def _message_from_record(payload, start, end, born_ts, extra_props=b""):
    try:
        headers, body = parse_record(payload, start, end)
    except InvalidPayload:
        headers = None
    qid = flag = sysf = rc = 0
    if headers is not None:
        rec = [v for k, v in headers if k == REC_HEADER]
        if rec:
            qid, flag, sysf, rc = (int(x) for x in rec[0].split(b","))
            headers = [(k, v) for k, v in headers if k != REC_HEADER]
    if headers is not None and fmt.properties_safe(headers):
        props = fmt.encode_properties(headers) + extra_props
        return qid, Message(body=body, properties=props, flag=flag, sys_flag=sysf,
                            reconsume_times=rc, born_ts=born_ts)
    return 0, Message(body=bytes(payload[start:end]), properties=extra_props,
                      sys_flag=fmt.SYSFLAG_SMSS_FRAMED, born_ts=born_ts)


def messages_of(payload, born_ts, extra_props=b""):
    """Return [(queue id, Message)] for the smss message records of a PUB/DELAY payload."""
    return [
        _message_from_record(payload, s, e, born_ts, extra_props)
        for s, e in record_spans(payload)
    ]


def create_spec(payload):
    """Return (expireAt, queues, perm, attrs, is_update) of a CREATE payload."""
    (expire_at,) = _I64.unpack_from(payload, 0)
    more = json.loads(payload[8:]) if len(payload) > 8 else {}
    return (
        expire_at,
        more.get("queues", 1),
        more.get("perm", 6),
        more.get("attrs", {}),
        bool(more.get("update", False)),
    )


def create_record_body(payload):
    """Return (admin op, body) for the admin record a CREATE payload becomes."""
    expire_at, queues, perm, attrs, update = create_spec(payload)
    op = fmt.OP_UPDATE if update else fmt.OP_CREATE
    return op, create_body(queues, expire_at, perm, attrs)
