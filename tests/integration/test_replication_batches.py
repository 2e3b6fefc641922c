"""smss REPLICA batching: a PUB of several messages goes
out as one binlog record whose eventId is the first message's, with the PUB payload as
received; a REPLICA resume eventId inside a record's id range resumes after that record;
and our slave applies such records as before (one record per message, same eventIds)."""

import struct
import time

from protocols.smss import binlog
from protocols.smss import client_codec as cc
from protocols.smss.client import SmssClient
from protocols.smss.messages import AliveResponse, ReplicaBlock
from tests.integration.test_replication import SMALL, log_records, start_slave, status, wait_caught_up
from tests.support.wait import wait_until


def smss_records(messages):
    """The smss PUB payload of [(headers, body)]."""
    out = []
    for headers, body in messages:
        block = b"".join(struct.pack("<I", len(k)) + k + struct.pack("<I", len(v)) + v
                         for k, v in headers)
        out.append(struct.pack("<II", len(block) + len(body), len(headers)) + block + body)
    return b"".join(out)


def blocks(port, event_id, n):
    """The first n binlog records of a REPLICA stream from event_id, parsed."""
    with SmssClient("127.0.0.1", port) as feed:
        feed.send_raw(cc.encode_replica(event_id))
        out = []
        while len(out) < n:
            r = feed.read_response("replica", timeout=5)
            if isinstance(r, AliveResponse):
                raise AssertionError(f"ALIVE after {len(out)} blocks")
            assert isinstance(r, ReplicaBlock)
            out.append(binlog.parse_block(r.raw))
        return out


def test_a_multi_message_pub_is_one_binlog_record(server_factory):
    master = server_factory("master", config=SMALL)
    batch = [([(b"k", b"v1")], b"first"), ([], b"second"), ([(b"a", b"1"), (b"b", b"2")], b"third")]
    payload = smss_records(batch)
    before = int(time.time() * 1000)
    with SmssClient("127.0.0.1", master.smss_port) as c:
        c.create("b")  # eventId 1
        c.publish_raw("b", payload)  # eventIds 2, 3, 4
        c.publish("b", [b"single"])  # 5
    create, pub, single = blocks(master.smss_port, 0, 3)
    assert create.cmd == binlog.CMD_CREATE and create.event_id == 1
    assert (pub.cmd, pub.event_id, pub.topic) == (binlog.CMD_PUB, 2, "b")
    assert pub.payload == payload  # the PUB payload exactly as received
    assert pub.write_time >= before and pub.timestamp >= before
    assert (single.cmd, single.event_id, single.payload) == (binlog.CMD_PUB, 5, smss_records([([], b"single")]))


def test_replica_resume_inside_a_record_resumes_after_it(server_factory):
    master = server_factory("master", config=SMALL)
    with SmssClient("127.0.0.1", master.smss_port) as c:
        c.create("r")  # 1
        c.publish("r", [b"a", b"b", b"c"])  # 2..4, one record
        c.publish("r", [b"d", b"e"])  # 5..6, one record
    for resume in (2, 3, 4):  # the record's first id (a slave's own resume), or inside
        (nxt,) = blocks(master.smss_port, resume, 1)
        assert nxt.event_id == 5, resume
        assert [m.body for _, m in binlog.messages_of(nxt.payload, 0)] == [b"d", b"e"]


def test_slave_applies_batched_records_as_the_master_holds_them(server_factory):
    master = server_factory("master", config=SMALL)
    slave = start_slave(server_factory, master)
    with SmssClient("127.0.0.1", master.smss_port) as c:
        c.create("s")
        for i in range(20):
            c.publish("s", [([(b"i", b"%d" % i)], b"m%d-%d" % (i, j)) for j in range(i % 4 + 1)])
        c.delay("s", 1000, [b"later-1", b"later-2", b"later-3"])
    # the delayed three are written when their second is up
    wait_until(lambda: status(master.smss_port)["appliedEventId"] >= 1 + 50 + 1 + 3, 20,
               "the master to write the delayed messages", interval=0.1)
    wait_caught_up(master.smss_port, slave.smss_port)
    slave.stop()
    master.stop()
    assert log_records(slave.data) == log_records(master.data)
