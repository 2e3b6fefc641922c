"""What a PULL_MESSAGE serves (protocols/remoting/pulling.py), on a real store: which
entries a pull takes (count, the 1 MiB body limit, queues interleaved in the log,
segment and consume-queue file boundaries, tags) and the body built from their records.
"""

import pytest
from twisted.internet.task import Clock

from mqserver.broker.storeviews import MessageLog
from mqserver.store import format as fmt
from mqserver.store.store import Message, MessageStore
from protocols.remoting import codes
from protocols.remoting.codec import encode
from protocols.remoting.framing import FrameDecoder
from protocols.remoting.messages import RemotingCommand
from protocols.remoting.props import tag_hash_code
from protocols.remoting.pulling import MAX_BYTES, pull_once

from tests.unit.test_rocketmq_door import Door, pull_fields, send
from tests.support.inprocess import FillingTransport
from tests.support.remoting_client import records

HOST = b"\x0a\x00\x00\x07\x00\x00\x27\x9b"  # not the host the records were stored with


class CountingStore:
    """The real store, with a bound on how often a pull may read consume-queue entries
    (a pull that reads the same entries forever fails here instead of hanging)."""

    def __init__(self, store, limit=100):
        self._store = store
        self.reads = 0
        self.limit = limit

    def read_entries(self, *args):
        self.reads += 1
        assert self.reads <= self.limit, "the pull keeps reading the same entries"
        return self._store.read_entries(*args)

    def __getattr__(self, name):
        return getattr(self._store, name)


def _store(path, **kw):
    clock = Clock()
    s = MessageStore(str(path), clock, clock=lambda: 1_700_000_000.0, flush_level=0, **kw)
    s.open()
    return s


def _put(store, topic, qid, bodies, tags=b"A"):
    got = []
    store.put_messages(topic, qid, [Message(body=b, properties=b"TAGS\x01" + tags + b"\x02")
                                    for b in bodies]).addBoth(got.append)
    assert not hasattr(got[0], "value"), got[0]


def _expected(store, topic, qid, start, end):
    """The body a pull of [start, end) serves: each record as stored, STOREHOST set."""
    entries = store.read_entries(topic, qid, start, end - start)
    parts = []
    for off, size, _ in fmt.CQ_ENTRY.iter_unpack(entries):
        rec = bytearray(store.commitlog.read(off, size))
        rec[fmt.OFF_STORE_HOST:fmt.OFF_STORE_HOST + 8] = HOST
        parts.append(bytes(rec))
    return b"".join(parts)


@pytest.fixture
def store(tmp_path):
    s = _store(tmp_path / "s", segment_size=1 << 22, cq_entries_per_file=64)
    yield s
    s.close()


def test_pull_stops_before_the_record_that_would_pass_the_limit(store):
    """Records of 300 kB: three fit in a pull's 1 MiB, the fourth starts the next pull,
    and the pull after that takes the rest (it used to read the same entry forever)."""
    big = [bytes([65 + i]) * 300_000 for i in range(5)]
    _put(store, "big", 0, big)
    spy = CountingStore(MessageLog(store))
    r = pull_once(spy, HOST, "big", 0, 0, 32, None)
    assert (r.code, r.count, r.next_offset) == (codes.SUCCESS, 3, 3)
    assert len(r.body) <= MAX_BYTES
    assert r.body == _expected(store, "big", 0, 0, 3)
    r = pull_once(spy, HOST, "big", 0, 3, 32, None)
    assert (r.code, r.count, r.next_offset) == (codes.SUCCESS, 2, 5)
    assert [bytes(v.body) for v in records(r.body)] == big[3:]


def test_a_record_larger_than_the_limit_is_served_alone(store):
    """A pull returns at least one message even when it alone passes 1 MiB."""
    _put(store, "huge", 0, [b"h" * (MAX_BYTES + 10), b"small"])
    r = pull_once(CountingStore(MessageLog(store)), HOST, "huge", 0, 0, 32, None)
    assert (r.code, r.count, r.next_offset) == (codes.SUCCESS, 1, 1)
    assert r.body == _expected(store, "huge", 0, 0, 1)


@pytest.mark.parametrize("start, want", [(0, 32), (5, 7), (40, 30), (60, 32), (63, 2), (74, 32)])
def test_pull_of_interleaved_queues_across_files(tmp_path, start, want):
    """Two queues written in turn (their records interleaved in the log), over several
    commit-log segments and consume-queue files: a pull serves exactly its queue's
    records from its offset, in order, up to what it asks for."""
    s = _store(tmp_path / "s", segment_size=64 << 10, cq_entries_per_file=64)
    try:
        for i in range(150):
            _put(s, "mix", i % 2, [b"q%d-%d-" % (i % 2, i // 2) + b"x" * (100 + 37 * (i % 9))])
        spy = CountingStore(s)
        end = min(start + want, 75)
        r = pull_once(spy, HOST, "mix", 1, start, want, None)
        assert (r.code, r.next_offset, r.count) == (codes.SUCCESS, end, end - start)
        assert r.body == _expected(s, "mix", 1, start, end)
        assert [v.queue_offset for v in records(r.body)] == list(range(start, end))
    finally:
        s.close()


def test_tagged_pull_serves_only_matching_records(store):
    for i in range(40):
        _put(store, "tags", 0, [b"m%d" % i], tags=b"A" if i % 3 else b"B")
    r = pull_once(CountingStore(MessageLog(store)), HOST, "tags", 0, 0, 5, {tag_hash_code("B")})
    assert r.code == codes.SUCCESS
    assert [bytes(v.body) for v in records(r.body)] == [b"m0", b"m3", b"m6", b"m9", b"m12"]
    assert r.next_offset == 13


def test_pull_answer_through_the_door(tmp_path):
    """The broker door answers a PULL of 32 with the records as stored (its own
    STOREHOST) and the offsets after them."""
    d = Door(tmp_path / "s")
    try:
        for i in range(40):
            send(d, "door", body=b"body-%d" % i)
        r = d.call(codes.PULL_MESSAGE, pull_fields("door", 3, 0))
        assert r.code == codes.SUCCESS
        assert r.ext_fields["nextBeginOffset"] == "35"
        views = records(r.body)
        assert [bytes(v.body) for v in views] == [b"body-%d" % i for i in range(3, 35)]
        assert {bytes(v.store_host) for v in views} == {d.store.store_host}
    finally:
        d.close()



def test_pipelined_pulls_wait_while_the_peer_does_not_read(tmp_path):
    """50 PULLs of 32 x 32 KB (1 MiB answers) in one read from a client that does not
    read: the door answers until the transport's buffer is full and holds the rest of
    the read, instead of gathering 50 MiB of answers; as the client reads, the rest are
    answered in order."""
    d = Door(tmp_path / "s")
    try:
        for i in range(32):
            send(d, "big", body=b"%02d" % i + bytes(32 << 10))
        conn = d.door.buildProtocol(None)
        conn.makeConnection(FillingTransport())
        conn.decoder_out = FrameDecoder()
        frames = []
        for opaque in range(1, 51):
            cmd = RemotingCommand(code=codes.PULL_MESSAGE, language="JAVA", version=401, opaque=opaque,
                                  ext_fields={k: str(v) for k, v in pull_fields("big", 0, 0).items()})
            frames.append(encode(cmd))
        conn.dataReceived(b"".join(frames))
        first = conn.decoder_out.feed(conn.transport.value())
        assert len(first) == 1, "the first 1 MiB answer fills the buffer"
        answers = []
        while True:
            out = conn.transport.drain()
            if not out:
                break
            answers += conn.decoder_out.feed(out)
        assert [a.opaque for a in answers] == list(range(1, 51))
        assert {a.code for a in answers} == {codes.SUCCESS}
        assert {len(a.body) for a in answers} == {len(answers[0].body)} and len(answers[0].body) > 1000_000
    finally:
        d.close()


def test_a_pull_at_the_tail_serves_the_record_just_written_without_reading_it(store):
    """A consumer keeping up with a producer pulls the record the last send wrote: it is
    served from the store's memory (no read of the log) and is what reading it back
    serves; a pull further behind, or filtered by tag, reads the log as before."""
    reads = []
    log_read = store.commitlog.read

    def counted(offset, size):
        reads.append(offset)
        return log_read(offset, size)

    store.commitlog.read = counted
    _put(store, "T", 0, [b"first", b"second"])
    _put(store, "T", 0, [b"third"])
    got = pull_once(MessageLog(store), HOST, "T", 0, 2, 32, None)
    assert reads == [], "the newest record is not read back"
    assert (got.code, got.next_offset, got.count) == (codes.SUCCESS, 3, 1)
    assert got.body == _expected(store, "T", 0, 2, 3)
    reads.clear()
    behind = pull_once(MessageLog(store), HOST, "T", 0, 1, 32, None)
    assert reads and (behind.count, behind.next_offset) == (2, 3)
    assert behind.body == _expected(store, "T", 0, 1, 3)
    reads.clear()
    tagged = pull_once(MessageLog(store), HOST, "T", 0, 2, 32, {tag_hash_code("A")})
    assert reads and tagged.body == got.body
