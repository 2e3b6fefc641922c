"""The binlog blocks a master makes of its records (L{protocols.smss.binlog}): a write of
one message with nothing but its body takes a shorter way to the same bytes, and every
record comes back from its block as the message it holds, in its queue (a message whose
body is a whole smss record too)."""

import itertools
import struct

from twisted.internet.task import Clock

from mqserver import message as fmt
from mqserver.message import Message
from mqserver.replication.logreader import LogReader
from mqserver.store.store import MessageStore
from protocols.smss import binlog
from protocols.smss.views import message_record

HOST = bytes.fromhex("7f00000100001f90")  # 127.0.0.1:8080


def _stored(tmp_path, messages):
    store = MessageStore(str(tmp_path), Clock(), flush_level=1)
    store.open()
    try:
        for qid, m in messages:
            store.put("t", qid, [m])
        reader, views = LogReader(store, store.commitlog.min_offset), []
        while batch := reader.read():
            views += [v for v in batch if v.magic == fmt.MESSAGE_MAGIC]
        return views
    finally:
        store.close()


def test_a_write_of_one_message_makes_the_block_its_parts_make(tmp_path):
    """Whether a message takes the shorter way (a body alone, framed or not) or not (a
    queue, a flag, properties, a born host, retries), its block is the one built from
    its smss record, and the follower reads the message back from it, fields and queue
    included."""
    variants = itertools.product((0, 3), (0, 7), (b"", b"KEYS\x01k\x02"), (0, fmt.SYSFLAG_SMSS_FRAMED),
                                 (fmt.NO_HOST, HOST), (0, 2))
    messages = [(qid, Message(body=_body(i, sysf), flag=flag, properties=props, sys_flag=sysf,
                              born_host=host, reconsume_times=rc, born_ts=1700000000000 + i))
                for i, (qid, flag, props, sysf, host, rc) in enumerate(variants)
                if not (sysf and props)]  # a framed record is its headers: no properties
    views = _stored(tmp_path, messages)
    assert len(views) == len(messages) == 48
    for v in views:
        made = binlog._block(v.store_ts, binlog.CMD_PUB, v.event_id, v.born_ts,
                             v.topic.encode(), binlog._view_record(v, v.born_ts))
        assert binlog.records_to_block([v]) == binlog.record_to_block(v) == made
        rec = binlog.parse_block(made)
        ((qid, m),) = binlog.messages_of(rec.payload, rec.timestamp)
        assert (qid, m.body, m.properties, m.flag, m.reconsume_times, m.born_ts, m.born_host,
                m.sys_flag) == (v.queue_id, bytes(v.body), v.properties, v.flag,
                                v.reconsume_times, v.born_ts, v.born_host, v.sys_flag)


def _body(i, sys_flag):
    # a framed message's body is a whole smss record whose headers a properties string
    # cannot hold, or that do not even parse (H 3 in 12 bytes)
    body = b"body-%d" % i
    if not sys_flag:
        return body
    if i % 2:
        return struct.pack("<II", 12, 3) + b"twelve bytes"
    return message_record([(b"h", b"x\x01y")], body)


def test_a_write_of_several_messages_comes_back_whole(tmp_path):
    """The messages of one write (a batch: bodies, whole smss records, properties) in a
    queue other than 0 make one block, and the follower reads each back in that queue
    with its fields."""
    batch = [Message(body=_body(i, sysf), properties=props, sys_flag=sysf, born_ts=1700000000000)
             for i, (sysf, props) in enumerate([(0, b""), (fmt.SYSFLAG_SMSS_FRAMED, b""),
                                                (fmt.SYSFLAG_SMSS_FRAMED, b""), (0, b"K\x01v\x02")])]
    store = MessageStore(str(tmp_path), Clock(), flush_level=1)
    store.open()
    try:
        store.put("t", 2, batch)
        views = LogReader(store, store.commitlog.min_offset).read()
    finally:
        store.close()
    assert [v.sys_flag & fmt.SYSFLAG_BATCH_MORE for v in views] == [fmt.SYSFLAG_BATCH_MORE] * 3 + [0]
    rec = binlog.parse_block(binlog.records_to_block(views))
    assert rec.event_id == views[0].event_id
    got = binlog.messages_of(rec.payload, rec.timestamp)
    assert [(qid, m.body, m.properties, m.sys_flag) for qid, m in got] == [
        (2, bytes(v.body), v.properties, v.sys_flag & ~fmt.SYSFLAG_BATCH_MORE) for v in views]
