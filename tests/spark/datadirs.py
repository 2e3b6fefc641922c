"""Data directories for the audit tests: one written by the real broker, and the
crafted damage applied to copies of it (each function says exactly what it breaks).

The scenario (eventIds are dense from 1, one per record)::

    1-5      create orders, %RETRY%g1, %DLQ%g1, gone, ttl (ttl expires in an hour)
    6-605    600 messages to orders, 60 publishes of 10 bodies of 200 bytes
    606-608  3 messages to %RETRY%g1;   609-610  2 messages to %DLQ%g1
    611      1 message to gone;         612      delete gone
    613      1 message to ttl
    614      delay orders by 1 s ("soon");   615  delay orders by 1 h ("later")
    616      "soon" fires (MQ_DELAY_ID=614)
    617      one last message to orders

Segments are 64 KiB, so the log has three; consumerOffset.json is written beside it in
RocketMQ's layout (g1 committed 500 on orders, 3 on its retry topic).
"""

import glob
import json
import os
import shutil
import time

from mqserver.store import format as fmt
from protocols.smss.client import SmssClient
from tests.support.server import ServerProcess

SEGMENT = 65536
RECORDS = 617
MESSAGES = 609
ORDERS_MESSAGES = 602
LAST_EVENT = 617
TTL_MS = 3600_000


def write_broker_dir(base):
    """Run the broker through the scenario above; returns C{(data_dir, facts)}."""
    data = os.path.join(base, "master")
    server = ServerProcess(data, config={"store": {"maxLogSize": SEGMENT}})
    server.start()
    try:
        c = SmssClient("127.0.0.1", server.smss_port)
        ttl_expire = int(time.time() * 1000) + TTL_MS
        for name in ("orders", "%RETRY%g1", "%DLQ%g1", "gone"):
            c.create(name)
        c.create("ttl", expire_at=ttl_expire)
        for i in range(60):
            c.publish("orders", [bytes([65 + i % 26]) * 200 for _ in range(10)])
        c.publish("%RETRY%g1", [b"r" * 50] * 3)
        c.publish("%DLQ%g1", [b"d" * 40] * 2)
        c.publish("gone", [b"g"])
        c.delete("gone")
        c.publish("ttl", [b"t"])
        c.delay("orders", 1000, [b"soon"])
        c.delay("orders", TTL_MS, [b"later"])
        c.close()
        # Wait (bounded) for "soon" to fire: eventId 616, after the last of the 600.
        sub_client = SmssClient("127.0.0.1", server.smss_port, timeout=15)
        sub = sub_client.subscribe("orders", 605, batch=10, who="audit")
        deadline = time.monotonic() + 15
        seen = []
        while 616 not in seen and time.monotonic() < deadline:
            batch = sub.next_batch(15)
            seen += [m.event_id for m in getattr(batch, "messages", [])]
            if hasattr(batch, "messages"):
                sub.ack()
        assert 616 in seen, seen
        sub_client.close()
        c = SmssClient("127.0.0.1", server.smss_port)
        c.publish("orders", [b"last message"])
        c.close()
    finally:
        code = server.stop()
        server.close()
    assert code in (0, -15), server.read_log()
    with open(os.path.join(data, "consumerOffset.json"), "w") as f:
        json.dump({"offsetTable": {"orders@g1": {"0": 500}, "%RETRY%g1@g1": {"0": 3}}}, f)
    return data, {"ttl_expire": ttl_expire}


def copy_dir(src, dest):
    """Copy a data directory; returns C{dest}."""
    shutil.copytree(src, dest)
    return dest


def segments(data):
    """Return the segment paths of C{data}, oldest first."""
    return sorted(glob.glob(os.path.join(data, "commitlog", "[0-9]" * 20)))


def find_record(data, event_id):
    """Return C{(path, pos, view)} of the record with C{event_id}."""
    for path in segments(data):
        start = int(os.path.basename(path))
        with open(path, "rb") as f:
            buf = f.read()
        for offset, view in fmt.scan_buffer(buf, start, check_crc=False):
            if view.event_id == event_id:
                return path, offset - start, view
    raise KeyError(event_id)


def _patch(path, pos, data):
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(data)


def flip_body_byte(data, event_id):
    """Flip the first body byte of record C{event_id}: one CRC failure."""
    path, pos, view = find_record(data, event_id)
    at = pos + fmt.HEADER_SIZE
    _patch(path, at, bytes([view.body[0] ^ 0xFF]))


def truncate_tail(data, nbytes):
    """Cut C{nbytes} off the end of the last segment (inside its last record)."""
    path = segments(data)[-1]
    os.truncate(path, os.path.getsize(path) - nbytes)


def cut_log_at(data, event_id):
    """Remove record C{event_id} and everything after it (a slave that is behind)."""
    path, pos, _ = find_record(data, event_id)
    os.truncate(path, pos)
    for later in [p for p in segments(data) if p > path]:
        os.unlink(later)


def rewrite_body(data, event_id):
    """Replace record C{event_id}'s body with other bytes of the same length and a
    valid CRC: a record that differs without being corrupt."""
    path, pos, view = find_record(data, event_id)
    body = bytes(b ^ 0x5A for b in view.body)
    _patch(path, pos + fmt.HEADER_SIZE, body)
    _patch(path, pos + 8, fmt.I32.pack(fmt.body_crc(body)))


def set_event_id(data, event_id, new_id):
    """Give record C{event_id} the eventId C{new_id} (a gap plus a duplicate)."""
    path, pos, _ = find_record(data, event_id)
    _patch(path, pos + fmt.OFF_EVENT_ID, fmt.I64.pack(new_id))


def set_store_lag(data, event_id, lag_ms):
    """Make record C{event_id} born C{lag_ms} before it was stored (a store lag)."""
    path, pos, view = find_record(data, event_id)
    _patch(path, pos + fmt.HEADER_LAYOUT.offset("born_timestamp"), fmt.I64.pack(view.store_ts - lag_ms))
    return view


def cq_file(data, topic, qid=0):
    """Return the first consume-queue file of (topic, qid)."""
    return sorted(glob.glob(os.path.join(glob.escape(os.path.join(data, "consumequeue", topic, str(qid))), "*")))[0]


def drop_last_cq_entry(data, topic):
    """Remove the last consume-queue entry of C{topic}/0: one entry missing."""
    path = cq_file(data, topic)
    os.truncate(path, os.path.getsize(path) - fmt.CQ_ENTRY_SIZE)


def swap_cq_entries(data, topic, a, b):
    """Swap entries C{a} and C{b} of C{topic}/0: two entries pointing at the wrong record."""
    path = cq_file(data, topic)
    with open(path, "r+b") as f:
        f.seek(a * 20)
        ea = f.read(20)
        f.seek(b * 20)
        eb = f.read(20)
        f.seek(a * 20)
        f.write(eb)
        f.seek(b * 20)
        f.write(ea)


def nth_record(path, n):
    """The file position of the C{n}th record (from 0) of the segment file C{path}."""
    with open(path, "rb") as f:
        buf = f.read()
    pos = 0
    for _ in range(n):
        pos += int.from_bytes(buf[pos : pos + 4], "big")
    return pos


def damage(data, kind):
    """Damage the copy C{data} of a broker directory in the way named C{kind} (one of
    L{DAMAGES}, or C{"all"}: crc, relabel, cq and torn together; C{"others"}: cq_torn,
    rewrite and corrupt together; C{"exact"}: cut and header together; C{"none"}: leave
    it sound)."""
    second = segments(data)[1]
    if kind == "none":
        return
    if kind == "all":
        for k in ("crc", "relabel", "cq", "torn"):
            damage(data, k)
    elif kind == "others":
        for k in ("cq_torn", "rewrite", "corrupt"):
            damage(data, k)
    elif kind == "exact":
        for k in ("cut", "header"):
            damage(data, k)
    elif kind == "crc":
        flip_body_byte(data, 100)
    elif kind == "relabel":
        set_event_id(data, 200, 201)
    elif kind == "torn":
        truncate_tail(data, 10)
    elif kind == "rewrite":
        rewrite_body(data, 300)
    elif kind == "cq":
        swap_cq_entries(data, "orders", 10, 11)
        drop_last_cq_entry(data, "orders")
    elif kind == "cq_torn":
        with open(cq_file(data, "orders"), "ab") as f:
            f.write(b"\1\2\3")
    elif kind == "corrupt":  # the second segment's first record gets a bad magic
        _patch(second, 4, b"\0\0\0\1")
    elif kind == "bad_magic":
        _patch(second, nth_record(second, 40) + 4, b"\0\0\0\1")
    elif kind == "bad_size":
        _patch(second, nth_record(second, 7), (50).to_bytes(4, "big"))
    elif kind == "physical_offset":
        _patch(second, nth_record(second, 90) + fmt.OFF_PHYSICAL_OFFSET, (12345).to_bytes(8, "big"))
    elif kind == "zero_tail":
        _patch(second, nth_record(second, 100), bytes(5000))
    elif kind == "cut":
        overwrite_records(data, 60, 100)
    elif kind == "header":
        damage_header(data, 30)
    elif kind == "not_a_segment":
        with open(os.path.join(data, "commitlog", "12345"), "wb") as f:
            f.write(b"junk")
    else:
        raise ValueError(kind)


#: The kinds of damage L{damage} makes, one at a time.
DAMAGES = ("crc", "relabel", "torn", "rewrite", "cq", "cq_torn", "corrupt", "bad_magic", "bad_size",
           "physical_offset", "zero_tail", "not_a_segment", "cut", "header")


#: The consumers of L{write_consumers_dir}, each over a topic of ten messages:
#: C{(kind, topic, consumer): (committed, finished_ahead, delivered_unfinished, lag)}.
CONSUMERS = {
    ("rocketmq group", "rq", "G1"): (4, 0, 0, 6),
    ("nsq channel", "nt", "ch"): (2, 2, 2, 6),
    ("msgout queue", "mq", "(queue)"): (1, 1, 1, 8),
    ("msgout subscription", "mt", "reader"): (3, 0, 0, 7),
    ("msgout subscription", "mt", "push"): (0, 0, 0, 10),
}
#: Where the push subscription of L{write_consumers_dir} posts (nothing listens there).
PUSH_URL = "http://127.0.0.1:9/audit-push"


def write_consumers_dir(base):
    """Run a broker with every protocol's doors and leave one consumer of each kind at a
    known position (L{CONSUMERS}): a RocketMQ group commits 4 of ``rq``; an NSQ channel
    ``ch`` on ``nt`` takes 6, finishes the 1st, 2nd, 4th and 6th, defers the 5th and
    keeps the 3rd in flight; msgout's queue ``mq`` hands out 4 and gets the 1st and 3rd
    acked; topic-mode ``mt`` has a subscription ``reader`` that acks 3 and a push
    subscription ``push`` whose URL never answers; an smss subscriber ``w1`` reads
    ``sm`` (smss positions are not kept on disk). Returns the data directory."""
    from protocols.remoting import codes
    from tests.support.msgout import LOOPBACK, Api
    from tests.support.nsq import V2, http, http_json
    from tests.support.remoting_client import RemotingClient
    from tests.support.wait import wait_until

    data = os.path.join(base, "consumers")
    listen = {n: LOOPBACK for n in ("smss", "broker", "nsqd_tcp", "nsqd_http", "msgout")}
    server = ServerProcess(data, listen=listen).start()
    nsq = api = None
    try:
        c = SmssClient("127.0.0.1", server.smss_port)
        for topic in ("rq", "sm"):
            c.create(topic)
            c.publish(topic, [b"%s %d" % (topic.encode(), i) for i in range(10)])
        c.close()
        rmq = RemotingClient("127.0.0.1", server.ports["BrokerDoor"])
        ext = {"consumerGroup": "G1", "topic": "rq", "queueId": 0, "commitOffset": 4}
        assert rmq.call(codes.UPDATE_CONSUMER_OFFSET, ext).code == 0
        rmq.close()
        sc = SmssClient("127.0.0.1", server.smss_port, timeout=15)
        sub = sc.subscribe("sm", 0, batch=3, who="w1")
        assert len(sub.next_batch(15).messages) == 3
        sub.ack()
        sc.close()
        nsq_http = server.ports["NsqdHttpSite"]
        assert http(nsq_http, "POST", "/mpub?topic=nt", b"\n".join(b"n %d" % i for i in range(10)))[0] == 200
        nsq = V2(server.ports["NsqdFactory"])
        nsq.send(b"SUB nt ch\nRDY 6\n")
        assert nsq.frame() == (0, b"OK")
        got = nsq.messages(6)
        nsq.send(b"RDY 0\n")  # none delivered in place of the finished ones
        for i in (0, 1, 3, 5):
            nsq.send(b"FIN " + got[i].msg_id + b"\n")
        nsq.send(b"REQ " + got[4].msg_id + b" 3600000\n")

        def settled():
            topics = http_json(nsq_http, "GET", "/stats?format=json")[1]["topics"]
            ch = [c for t in topics if t["topic_name"] == "nt" for c in t["channels"]][0]
            return (ch["in_flight_count"], ch["deferred_count"]) == (1, 1)

        wait_until(settled, 15, "the NSQ channel's FIN and REQ")
        api = Api(server.ports["MsgoutSite"])
        api.put_queue("mq")
        api.publish("mq", *[f"m {i}" for i in range(10)])
        got = api.fetch("mq", max=4)
        assert len(got) == 4
        api.ack([got[0]["receipt"], got[2]["receipt"]])
        api.put_queue("mt", mode="topic")
        api.publish("mt", *[f"t {i}" for i in range(10)])
        got = api.fetch("mt", max=3, sub_id="reader")
        assert len(got) == 3
        api.ack([m["receipt"] for m in got])
        api.ok("POST", "/v1/queues/mt/subscriptions", {"url": PUSH_URL, "sub_id": "push", "batch": 5})
    finally:
        for conn in (nsq, api):
            if conn is not None:
                conn.close()
        code = server.stop()
        server.close()
    assert code in (0, -15), server.read_log()
    return data


def record_at(path, pos):
    """The record (a L{fmt.RecordView}) at file position C{pos} of segment C{path}."""
    with open(path, "rb") as f:
        buf = f.read()
    return fmt.RecordView(buf, pos)


def overwrite_records(data, n, count, segment=1):
    """Overwrite records C{n} to C{n + count - 1} (from 0) of the C{segment}th segment
    (from 0) with junk bytes, as if they were cut out and the hole filled: the records
    before and after stay where they were. Returns C{(log offset, bytes, eventId
    before, eventId after)} of the damaged range."""
    path = segments(data)[segment]
    start = int(os.path.basename(path))
    a, b = nth_record(path, n), nth_record(path, n + count)
    before, after = record_at(path, nth_record(path, n - 1)).event_id, record_at(path, b).event_id
    _patch(path, a, bytes([0xA5]) * (b - a))
    return start + a, b - a, before, after


def damage_header(data, n, segment=1):
    """Damage the header of record C{n} (from 0) of the C{segment}th segment, its
    framing intact: its queue id becomes 65535 and the third byte of its topic 0xFF
    (not UTF-8). Returns C{(log offset, size, eventId)} of the record."""
    path = segments(data)[segment]
    pos = nth_record(path, n)
    view = record_at(path, pos)
    _patch(path, pos + fmt.OFF_QUEUE_ID, fmt.I32.pack(65535))
    _patch(path, pos + fmt.HEADER_SIZE + len(view.body) + 1 + 2, b"\xff")
    return int(os.path.basename(path)) + pos, view.size, view.event_id
