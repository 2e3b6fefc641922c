"""The leader's feed turns plain records (one message of one write, queue 0, no fields
set, no properties, an ASCII topic) into REPLICA frames in C (C{_feed.c}), byte for byte
the frames of the Python path (L{binlog.record_to_block}), and leaves every other record
to that path: generated records of every kind, a buffer cut inside a record, a record
naming another offset; a real log written through the smss door sent both ways; records
not trusted or a store that knows damage, never offered to C."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqserver.replication.logreader import LogReader
from mqserver.store import format as fmt
from protocols.smss import binlog, replica, wire
from protocols.smss.codec import replica_frame as frame
from protocols.smss import client_codec as cc
from protocols.smss.factory import make_factory
from protocols.smss.payload import encode_payload
from tests.support.inprocess import Node

plain_frames = replica.plain_frames
pytestmark = pytest.mark.skipif(plain_frames is None, reason="the C speedup _feed is not built")

BASE = 3 << 30  # a commit-log offset past 2^31: offsets are 64-bit


def is_plain(view):
    """What the C path claims to take."""
    return (view.magic == fmt.MESSAGE_MAGIC and view.sys_flag == 0 and view.queue_id == 0
            and view.flag == 0 and view.reconsume_times == 0 and view.born_host == fmt.NO_HOST
            and view.properties == b"" and view.topic.isascii())


records = st.fixed_dictionaries({
    "magic": st.sampled_from([fmt.MESSAGE_MAGIC] * 6 + [fmt.ADMIN_MAGIC]),
    "queue_id": st.sampled_from([0, 0, 0, 3]),
    "flag": st.sampled_from([0, 0, 0, 7]),
    "sys_flag": st.sampled_from([0, 0, 0, fmt.SYSFLAG_BATCH_MORE, fmt.SYSFLAG_SMSS_FRAMED, 4]),
    "reconsume_times": st.sampled_from([0, 0, 0, 2]),
    "born_host": st.sampled_from([fmt.NO_HOST] * 3 + [fmt.HOST.pack(b"\x7f\0\0\1", 9876)]),
    "born_ts": st.integers(-(2**40), 2**45),
    "store_ts": st.integers(-(2**40), 2**45),
    "event_id": st.integers(1, 2**62),
    "body": st.binary(max_size=300),
    "topic": st.sampled_from([b"t", b"orders", b"a" * 255, "bestellungen-\u00fc".encode()]),
    "properties": st.sampled_from([b""] * 4 + [b"k\x01v\x02", b"k\x01v"]),
})


def pack(items, base=BASE):
    buf = b""
    for r in items:
        buf += fmt.pack_record(**r, queue_offset=5, physical_offset=base + len(buf),
                               store_host=fmt.NO_HOST)
    return buf


def python_frames(buf, base):
    """The plain records at the start of buf, as the Python path frames them."""
    views = []
    for _, view in fmt.scan_buffer(memoryview(buf), base, check_crc=False):
        if not is_plain(view):
            break
        views.append(view)
    return views, b"".join(frame(binlog.record_to_block(v)) for v in views)


@settings(max_examples=300, deadline=None)
@given(st.lists(records, min_size=1, max_size=12), st.data())
def test_plain_records_make_the_python_paths_frames_and_nothing_else(items, data):
    buf = pack(items)
    cut = data.draw(st.integers(0, len(buf)), label="cut")
    whole = buf[:cut]
    # the records that fit whole before the cut
    fit, end = [], 0
    for r in items:
        size = fmt.record_size(len(r["body"]), len(r["topic"]), len(r["properties"]))
        if end + size > cut:
            break
        fit.append(r)
        end += size
    views, expected = python_frames(pack(fit), BASE)
    made = plain_frames(whole, BASE)
    if not views:
        assert made is None
        return
    out, length, count, last = made
    assert out == expected
    assert count == len(views)
    assert length == sum(v.size for v in views)
    assert last == views[-1].event_id


def test_a_record_naming_another_offset_ends_the_plain_run():
    r = dict(magic=fmt.MESSAGE_MAGIC, queue_id=0, flag=0, sys_flag=0, reconsume_times=0,
             born_host=fmt.NO_HOST, born_ts=1, store_ts=2, event_id=7, body=b"x",
             topic=b"t", properties=b"")
    buf = pack([r, dict(r, event_id=8)])
    assert plain_frames(buf, BASE)[2] == 2
    assert plain_frames(buf, BASE + 1) is None  # the first names BASE, not BASE + 1
    moved = buf[: len(buf) // 2] + pack([dict(r, event_id=8)], base=BASE + 4096)
    assert plain_frames(moved, BASE)[2] == 1


def node_with_writes(tmp_path):
    """A node whose log holds every kind of smss write: creates, single messages, a
    batch, messages with headers, a delete, a non-ASCII topic."""
    n = Node(tmp_path / "m")
    door = n.door(make_factory)
    p = n.connect(door)
    topic2 = "bestellungen-\u00fc".encode()
    p.send(cc.encode_create(b"t") + cc.encode_create(topic2) + cc.encode_create(b"gone"))
    n.clock.advance(0.001)
    for i in range(40):
        p.send(cc.encode_pub(b"t", encode_payload([b"m%d" % i])))
    p.send(cc.encode_pub(b"t", encode_payload([b"b1", b"b2", b"b3"])))
    p.send(cc.encode_pub(b"t", encode_payload([([(b"k", b"v")], b"h")])))
    p.send(cc.encode_pub(topic2, encode_payload([b"u"])))
    p.send(cc.encode_delete(b"gone"))
    for i in range(40):
        p.send(cc.encode_pub(b"t", encode_payload([b"n%d" % i])))
    n.clock.advance(0.001)
    p.take()
    return n


def feed_bytes(store, encode, max_bytes=1 << 20, start=None):
    """Everything a feed from C{start} (the log's start) sends, read max_bytes at a
    time: the C path for what it takes (encode), the Python path for the rest; and how
    many records went the C way."""
    reader = LogReader(store, store.commitlog.min_offset if start is None else start)
    feed = replica.ReplicaFeed.__new__(replica.ReplicaFeed)
    feed._write, feed.confirms = [], True
    out, by_c = [], 0
    while True:
        made, views = reader.read_encoded(None if feed._write else encode, max_bytes)
        if made is not None:
            out.append(made[0])
            by_c += made[2]
            continue
        if not views:
            return b"".join(out), by_c
        out += [frame(b) for b in feed._blocks(views)]


@pytest.mark.parametrize("chunk, least", [(1 << 20, 40), (700, 75)],
                         ids=["one read", "small reads"])
@pytest.mark.parametrize("where", ["log start", "first message"])
def test_a_feed_sends_the_same_bytes_with_the_c_path(tmp_path, chunk, least, where):
    n = node_with_writes(tmp_path)
    try:
        start = None
        if where == "first message":
            start = next(v.offset for v in LogReader(n.store, 0).read()
                         if v.magic == fmt.MESSAGE_MAGIC)
        python, none = feed_bytes(n.store, None, chunk, start)
        both, by_c = feed_bytes(n.store, plain_frames, chunk, start)
        assert none == 0
        assert both == python
        # a read the Python path takes up goes to its end: the 40 single messages
        # before the batch go the C way from the first message on, or in small reads
        if where == "first message" or chunk < 1000:
            assert by_c >= least
    finally:
        n.close()


def test_records_not_trusted_or_known_damaged_are_not_offered(tmp_path):
    n = node_with_writes(tmp_path)
    offered = []

    def encode(buf, offset):
        offered.append(offset)
        return plain_frames(buf, offset)

    try:
        python, _ = feed_bytes(n.store, None)
        n.store.reader.trusted_from = n.store.commitlog.end  # as after a recovery
        assert feed_bytes(n.store, encode) == (python, 0)
        assert offered == []
        n.store.reader.trusted_from = 0
        n.store.reader.damaged_offsets.add(n.store.commitlog.min_offset)
        reader = LogReader(n.store, n.store.commitlog.min_offset + 1)  # past that record
        reader.read_encoded(encode)
        assert offered == []
        n.store.reader.damaged_offsets.clear()
        assert feed_bytes(n.store, encode)[0] == python
        assert offered
    finally:
        n.close()


# -- the follower's side: runs of plain writes parsed in C --------------------------------

plain_run = binlog.plain_run
LIMIT = 1 << 20


def pub_frame(write_time, event_id, born_ts, topic, messages, cmd=wire.CMD_PUB):
    """A REPLICA frame of one PUB write: C{messages} are bodies, or (headers, body)."""
    payload = encode_payload(messages) + b"\n"
    line = wire.encode_binlog_cmd_line(write_time, cmd, event_id, born_ts, topic, len(payload))
    return frame(wire.U32.pack(len(line)) + line + payload)


writes = st.lists(st.fixed_dictionaries({
    "kind": st.sampled_from(["plain"] * 6 + ["headers", "commit", "empty", "other topic",
                                            "next ms", "gap", "non-ascii"]),
    "bodies": st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=3),
    "born_ts": st.integers(-(2**40), 2**45),
}), min_size=1, max_size=10)


def stream_of(items):
    """The bytes of a stream of writes, and the eventId after the last."""
    out, eid, ms = b"", 100, 1_700_000_000_000
    for w in items:
        kind, bodies = w["kind"], w["bodies"]
        topic = {"other topic": b"u", "non-ascii": "\u00fc".encode()}.get(kind, b"t")
        if kind == "commit":
            out += frame(binlog.commit_block(eid - 1, ms))
            continue
        if kind == "empty":
            out += wire.REPLICA_FRAME_HEADER_STRUCT.pack(wire.STATUS_OK, 0)
            continue
        ms += kind == "next ms"
        eid += 5 * (kind == "gap")
        messages = [([(b"k", b"v")], b) for b in bodies] if kind == "headers" else bodies
        out += pub_frame(ms, eid, w["born_ts"], topic, messages)
        eid += len(bodies)
    return out


def python_run(buf, pos):
    """What the Python path makes of the run of plain writes at pos (None: none)."""
    from protocols.smss.client_codec import Expect, ResponseDecoder
    from protocols.smss.messages import ReplicaBlock
    dec = ResponseDecoder(Expect.REPLICA, LIMIT)
    run, at = None, pos
    while True:
        one = dec._frame(buf, at, len(buf))
        if one is None or not isinstance(one[1], ReplicaBlock) or not one[1].raw:
            break
        rec = binlog.parse_block(one[1].raw)
        if rec.cmd != binlog.CMD_PUB or not rec.topic.isascii():
            break
        items = binlog.messages_of(rec.payload, rec.timestamp)
        if any(m.properties or m.sys_flag for _, m in items):
            break  # headers
        if run is None:
            run = [rec.topic, rec.write_time, rec.event_id, [], bytearray()]
        elif (rec.event_id != run[2] + len(run[3]) or rec.write_time != run[1]
              or rec.topic != run[0]):
            break
        run[3] += [(m.born_ts, m.body) for _, m in items]
        run[4] += bytes(len(items) - 1) + b"\x01"
        at = one[0]
    return None if run is None else (at, *run)


@settings(max_examples=300, deadline=None)
@given(writes, st.data())
def test_a_run_of_plain_writes_is_what_the_python_path_makes_of_it(items, data):
    buf = stream_of(items)
    buf = buf[: data.draw(st.integers(0, len(buf)), label="cut")]
    pos = 0
    while pos <= len(buf):
        expected = python_run(buf, pos)
        got = plain_run(buf, pos, LIMIT)
        if expected is None:
            assert got is None
            # the Python path reads the frame at pos; go on after it
            try:
                status, n = wire.REPLICA_FRAME_HEADER_STRUCT.unpack_from(buf, pos)
            except Exception:
                return
            pos += wire.REPLICA_FRAME_HEADER_STRUCT.size + n
            continue
        assert got[:5] == expected[:5]
        assert bytes(got[5]) == bytes(expected[5])
        pos = got[0]


def test_a_frame_over_the_limit_is_left_to_the_decoder():
    buf = pub_frame(1, 7, 1, b"t", [b"x" * 100])
    assert plain_run(buf, 0, LIMIT)[4] == [(1, b"x" * 100)]
    assert plain_run(buf, 0, 50) is None  # the decoder refuses it, with its error


@pytest.mark.parametrize("path", ["C", "Python"])
@pytest.mark.parametrize("chunk", [1, 7, 100, 4096])
def test_a_follower_fed_in_any_pieces_holds_the_masters_log(tmp_path, monkeypatch, path, chunk):
    """The master's stream, cut into reads of C{chunk} bytes (frames split anywhere),
    applied by a follower with the C runs and without: its log equals the master's and
    it confirms the master's last eventId."""
    from tests.integration.test_replication_fields import records
    from tests.unit.test_follower_runs import connect_follower
    if path == "Python":
        monkeypatch.setattr(binlog, "plain_run", None)
    master = Node(tmp_path / "master")
    fnode = Node(tmp_path / "follower")
    fnode.broker.is_master = False
    try:
        master.broker.require_replicas(1, 60_000)
        door = master.door(make_factory)
        proto, to_master, stream = connect_follower(master, door, fnode)
        p = master.connect(door)
        p.send(cc.encode_create(b"t") + cc.encode_create(b"u"))
        master.clock.advance(0)
        sent = stream.take()
        for i in range(60):
            topic = b"u" if i % 17 == 5 else b"t"
            msgs = [b"m%d" % i] if i % 11 else [b"a%d" % i, b"b%d" % i]
            if i % 13 == 7:
                msgs = [([(b"k", b"v%d" % i)], b"h%d" % i)]
            p.send(cc.encode_pub(topic, encode_payload(msgs)))
            if i % 9 == 0:
                master.clock.advance(0.001)
        master.clock.advance(0.001)
        sent += stream.take()
        for i in range(0, len(sent), chunk):
            proto.dataReceived(sent[i:i + chunk])
            fnode.clock.advance(0)
        assert records(fnode.store.path) == records(master.store.path)
        assert to_master.value().endswith(cc.encode_replica(master.store.next_event_id - 1))
    finally:
        fnode.close()
        master.close()


@settings(max_examples=500, deadline=None)
@given(writes, st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=6),
       st.integers(0, 64))
def test_damaged_bytes_never_go_further_than_the_python_path(items, flips, start):
    """Bytes changed anywhere in a stream (a master that sends garbage): the C run reads
    nothing outside the buffer and takes at most what the Python path takes, as it takes
    it (it may stop sooner: the Python path goes on from there); given the same bytes
    as a log, the leader's side takes only whole records."""
    buf = bytearray(stream_of(items))
    for at, value in flips:
        if buf:
            buf[at % len(buf)] = value
    buf = bytes(buf)
    pos = min(start, len(buf))
    got = plain_run(buf, pos, LIMIT)
    if got is not None:
        # what C took, the Python path takes the same way from those bytes alone
        alone = python_run(buf[: got[0]], pos)
        assert alone[:5] == got[:5] and bytes(alone[5]) == bytes(got[5])
        try:
            whole = python_run(buf, pos)
        except Exception:
            whole = None  # a later frame the Python path refuses
        if whole is not None:
            assert got[0] <= whole[0]
    made = plain_frames(buf, BASE)
    if made is not None:
        assert 0 < made[1] <= len(buf)
