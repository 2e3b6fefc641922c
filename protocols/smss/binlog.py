"""Translation between mqserver's commit-log records and smss binlog records.

The replication stream is smss's, so a reference smss slave can follow an mqserver master
and the reverse. Our log keeps one message per record; the records of one write (a PUB,
MPUB or batch send of several messages, marked by ``SYSFLAG_BATCH_MORE`` on all but the
last) become one PUB block whose eventId is the first message's, as smss writes it
(as the smss server replicates them). DelayApply (101) blocks are built from messages carrying the
``MQ_DELAY_ID`` property, one block per firing write too.

What smss has no field for travels where smss keeps opaque bytes, so a reference smss
slave stores it unchanged and an mqserver slave restores it, and its records equal the
master's field for field (physical offset and store host aside):

- a message's RocketMQ fields (queue id, flag, sysflag, reconsume times), when any is not
  the default, as the header ``MQ_REC`` = ``"qid,flag,sysflag,reconsume"``, extended to
  ``"qid,flag,sysflag,reconsume,bornTimestamp,bornHostHex"`` when the message's born
  time is not the block's timestamp or it has a born host (RocketMQ producers);
- properties that the headers would not give back byte for byte (no trailing separator,
  empty items), as the header ``MQ_PROPS`` holding them in hex;
- a message whose body is a whole smss record (headers no properties string can hold:
  ``SYSFLAG_SMSS_FRAMED``) and whose fields are not the defaults (a queue other than 0):
  as a record of its own whose headers are ``MQ_REC`` and an empty ``MQ_FRAMED`` and whose
  body is the stored record, byte for byte (its headers may not even parse);
- a topic's queue count, permissions and attributes, when not smss's defaults, as JSON
  after the 8-byte expireAt of a CREATE payload (an UPDATE is such a CREATE with
  ``"update": true``).
"""

import json
from dataclasses import dataclass

from mqserver import speedups
from mqserver.broker.topics import create_body
from mqserver import message as fmt
from mqserver.message import Message

from protocols.smss import wire
from protocols.smss.errors import InvalidPayload
from protocols.smss.payload import parse_record, record_spans
from protocols.smss.views import message_record

CMD_PUB, CMD_CREATE, CMD_DELETE = wire.CMD_PUB, wire.CMD_CREATE, wire.CMD_DELETE
CMD_DELAY, CMD_DELAY_APPLY = wire.CMD_DELAY, wire.CMD_DELAY_APPLY
CMD_EPOCH = wire.CMD_EPOCH
CMD_COMMIT = wire.CMD_COMMIT
REC_HEADER = b"MQ_REC"
_I64 = wire.BINLOG_CREATE_STRUCT  # expireAt
_DELAY_PREFIX = wire.BINLOG_DELAY_STRUCT  # trigger time, delay eventId
_u32_from = wire.U32.unpack_from
_PREFIX = wire.MESSAGE_PREFIX_STRUCT  # a message record's S and H
_prefix_from = _PREFIX.unpack_from


_feed = speedups.load("protocols.smss._feed")
if _feed is not None:
    _feed.configure(
        fmt.HEADER_SIZE,
        *((fmt.HEADER_LAYOUT.offset(name), fmt.HEADER_LAYOUT.field_size(name)) for name in (
            "magic", "queue_id", "flag", "physical_offset", "sys_flag", "born_timestamp",
            "born_host", "store_timestamp", "reconsume_times", "event_id", "body_length")),
        fmt.MESSAGE_MAGIC, wire.CMD_PUB,
        wire.REPLICA_FRAME_HEADER_STRUCT.pack(wire.STATUS_OK, 0), wire.REPLICA_FRAME_LENGTH_AT,
    )
    #: The REPLICA frames of the plain records at a buffer's start (C{_feed.c}): what
    #: the leader's Python path (L{record_to_block} in frames) sends for them, byte for
    #: byte.
    plain_frames = _feed.frames
    #: The plain PUB writes of one run at a position of a REPLICA stream (C{_feed.c}):
    #: what the follower's Python path (L{parse_block}, L{messages_of}) makes of them.
    plain_run = _feed.run
else:
    plain_frames = plain_run = None


PROPS_HEADER = b"MQ_PROPS"
FRAMED_HEADER = b"MQ_FRAMED"
#: SysFlag bits the writer sets itself: never carried.
_OWN_BITS = fmt.SYSFLAG_SMSS_FRAMED | fmt.SYSFLAG_BATCH_MORE


def _smss_record(body, properties, sys_flag, extra):
    if sys_flag & fmt.SYSFLAG_SMSS_FRAMED:
        if extra is None:
            return bytes(body)
        # the stored record stays whole, as the body of one carrying its fields
        return message_record([(REC_HEADER, extra), (FRAMED_HEADER, b"")], body)
    if not properties and extra is None:
        return _PREFIX.pack(len(body), 0) + body  # no headers: most replicated messages
    headers = []
    if properties:
        pairs = fmt.decode_properties(properties)
        headers = [(k, v) for k, v in pairs if k != fmt.DELAY_PROPERTY]
        marker = [(k, v) for k, v in pairs if k == fmt.DELAY_PROPERTY]
        # The slave rebuilds the properties from the headers (and the delay marker at
        # the end); when that would not give these bytes back, they travel whole.
        if fmt.encode_properties(headers + marker[-1:]) != bytes(properties):
            headers.append((PROPS_HEADER, bytes(properties).hex().encode()))
    if extra is not None:
        headers.append((REC_HEADER, extra))
    return message_record(headers, body)


def _extra(queue_id, flag, sys_flag, reconsume, born_ts=0, born_host=fmt.NO_HOST, block_ts=0):
    sys_flag &= ~fmt.SYSFLAG_BATCH_MORE
    born = born_ts != block_ts or born_host != fmt.NO_HOST
    if (queue_id == 0 and flag == 0 and reconsume == 0 and not (sys_flag & ~_OWN_BITS)
            and not born):
        return None
    rec = b"%d,%d,%d,%d" % (queue_id, flag, sys_flag, reconsume)
    if born:
        rec += b",%d,%s" % (born_ts, bytes(born_host).hex().encode())
    return rec


def _view_record(view, block_ts):
    # The smss message record of one message record of the log.
    extra = _extra(view.queue_id, view.flag, view.sys_flag, view.reconsume_times,
                   view.born_ts, view.born_host, block_ts)
    return _smss_record(view.body, view.properties, view.sys_flag, extra)


def _block(write_time, cmd, event_id, timestamp, topic, raw):
    payload_len = len(raw) + 1 if raw is not None else 0
    line = wire.encode_binlog_cmd_line(write_time, cmd, event_id, timestamp, topic, payload_len)
    parts = [wire.U32.pack(len(line)), line]
    if raw is not None:
        parts += [raw, b"\n"]
    return b"".join(parts)


def continues(view):
    """Return True when the record C{view} is followed by another message record of the
    same write (they go out as one block)."""
    return view.magic == fmt.MESSAGE_MAGIC and bool(view.sys_flag & fmt.SYSFLAG_BATCH_MORE)


def records_to_block(views):
    """Return the smss binlog block of the message records of one write (C{views}, in
    log order): one PUB or DelayApply record whose eventId is the first message's."""
    first = views[0]
    topic = first.topic.encode("utf-8")
    if len(views) == 1:  # a write of one message: what nearly every write of a busy master is
        recs = _view_record(first, first.born_ts)
    else:
        recs = b"".join(_view_record(v, first.born_ts) for v in views)
    if fmt.DELAY_PROPERTY in first.properties:
        for k, v in fmt.decode_properties(first.properties):
            if k == fmt.DELAY_PROPERTY:
                eid, trigger = fmt.parse_delay_marker(v)
                raw = _DELAY_PREFIX.pack(trigger, eid) + recs
                return _block(first.store_ts, CMD_DELAY_APPLY, first.event_id, first.born_ts, topic, raw)
    return _block(first.store_ts, CMD_PUB, first.event_id, first.born_ts, topic, recs)


def record_to_block(view):
    """Return the smss binlog block (cmdLen, cmdLine, payload) of one commit-log record."""
    topic = view.topic.encode("utf-8")
    if view.magic == fmt.MESSAGE_MAGIC:
        return records_to_block([view])
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
    if op == fmt.OP_EPOCH:
        return _block(view.store_ts, CMD_EPOCH, view.event_id, view.store_ts, topic, bytes(view.body))
    raise ValueError(f"unknown admin operation {op}")


def commit_block(event_id, now_ms):
    """Return the block that tells a follower the master's commit point C{event_id}."""
    return _block(now_ms, CMD_COMMIT, event_id, now_ms, b"", None)


def is_epoch(view):
    """True when C{view} is an epoch record."""
    return view.magic == fmt.ADMIN_MAGIC and view.flag == fmt.OP_EPOCH


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
    (cmd_len,) = _u32_from(block, 0)
    start = 4 + cmd_len
    line = bytes(block[4:start])
    if not line.endswith(b"\n"):
        raise ValueError("binlog command line does not end in a newline")
    parts = line[:-1].split(b"\t")
    if len(parts) != 6:
        raise ValueError("binlog command line needs 6 fields")
    # every follower's every record: the fields one by one, not through a generator
    write_time, cmd, event_id, timestamp = int(parts[0]), int(parts[1]), int(parts[2]), int(parts[3])
    payload_len = int(parts[5])
    payload = bytes(block[start : start + payload_len])
    if len(payload) != payload_len:
        raise ValueError("binlog payload is shorter than its length")
    if payload_len:
        if not payload.endswith(b"\n"):
            raise ValueError("binlog payload does not end in a newline")
        payload = payload[:-1]
    return BinlogRecord(write_time, cmd, event_id, timestamp, parts[4].decode("utf-8"), payload)


def _message_from_record(payload, start, end, born_ts, extra_props=b""):
    if _prefix_from(payload, start)[1] == 0:
        # No headers (H 0), what most replicated messages carry: what the parse below
        # makes of them, without it.
        return 0, Message(body=bytes(payload[start + 8 : end]), properties=extra_props,
                          born_ts=born_ts)
    try:
        headers, body = parse_record(payload, start, end)
    except InvalidPayload:
        headers = None
    qid = flag = sysf = rc = 0
    born_host = fmt.NO_HOST
    exact = rec = None
    if headers:  # (none: most replicated messages)
        rec = [v for k, v in headers if k == REC_HEADER]
        if rec:
            fields = rec[0].split(b",")
            qid, flag, sysf, rc = (int(x) for x in fields[:4])
            if len(fields) >= 6:
                born_ts, born_host = int(fields[4]), bytes.fromhex(fields[5].decode())
        props = [v for k, v in headers if k == PROPS_HEADER]
        if props:
            exact = bytes.fromhex(props[0].decode())
        if rec or props:
            headers = [(k, v) for k, v in headers if k not in (REC_HEADER, PROPS_HEADER)]
    if rec and headers == [(FRAMED_HEADER, b"")]:  # a stored record whole, and its fields
        return qid, Message(body=body, properties=extra_props, flag=flag,
                            sys_flag=sysf | fmt.SYSFLAG_SMSS_FRAMED, reconsume_times=rc,
                            born_ts=born_ts, born_host=born_host)
    if headers is not None and (exact is not None or fmt.properties_safe(headers)):
        props = exact if exact is not None else fmt.encode_properties(headers) + extra_props
        return qid, Message(body=body, properties=props, flag=flag, sys_flag=sysf,
                            reconsume_times=rc, born_ts=born_ts, born_host=born_host)
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
    more = json.loads(payload[_I64.size:]) if len(payload) > _I64.size else {}
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
