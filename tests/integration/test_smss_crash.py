"""Crash tests: SIGKILL the broker while 4 connections publish, restart, read it all back.

Small commit-log segments (64 KiB) make the writers roll over to new segments while they
run. Every publisher records what it sent and what was acknowledged; after the restart a
SUB from 0 on each topic must give back every acknowledged message intact, nothing that
was never sent, no duplicates, and eventIds that are strictly increasing and globally
unique.
"""

import json
import os
import random
import threading
import time

import pytest

from protocols.smss.client import SmssError
from protocols.smss.messages import Batch
from mqserver.store import format as fmt
from tests.support.smss import connect, next_data, read_topic, unique_who, wait_until

TOPICS = ("crash-a", "crash-b")
THREADS = 4
SEGMENT = 65536
ALIVE_MS = 300


def config(flush_level):
    return {
        "store": {"flushLevel": flush_level, "maxLogSize": SEGMENT, "maxMessageSize": 16384},
        "timeout": {"server": {"alive": ALIVE_MS}},
    }


def segments(server):
    """Return the commit-log segment files of C{server}, oldest first."""
    d = os.path.join(server.data, "commitlog")
    return sorted(n for n in os.listdir(d) if len(n) == 20 and n.isdigit())


class Publisher(threading.Thread):
    """Publishes batches of 1..5 messages with headers and distinct bodies until its
    connection fails (the broker is killed) or it is told to stop.

    @ivar sent: body -> (topic, headers, (pub number, index in batch)) of every message
        it tried to publish.
    @ivar acked: bodies of the messages whose PUB was answered OK.
    """

    def __init__(self, server, tid):
        super().__init__(daemon=True, name=f"publisher-{tid}")
        self.server = server
        self.tid = tid
        self.rng = random.Random(1000 + tid)
        self.sent = {}
        self.acked = []
        self.error = None
        self.stopping = threading.Event()

    def batch(self, pub):
        rng = self.rng
        topic = TOPICS[rng.randrange(len(TOPICS))]
        msgs = []
        for j in range(rng.randint(1, 5)):
            headers = [(b"thread", str(self.tid).encode()), (b"pub", str(pub).encode())]
            if rng.random() < 0.3:
                headers.append((b"bin", bytes([1, 2, rng.randrange(256)])))  # stored framed
            body = f"t{self.tid}-p{pub}-m{j}|".encode() + rng.randbytes(rng.randint(0, 200))
            msgs.append((headers, body))
            self.sent[body] = (topic, headers, (pub, j))
        return topic, msgs

    def run(self):
        try:
            with connect(self.server, timeout=10.0) as c:
                pub = 0
                while not self.stopping.is_set():
                    topic, msgs = self.batch(pub)
                    c.publish(topic, msgs)
                    self.acked += [b for _, b in msgs]
                    pub += 1
        except (ConnectionError, OSError, SmssError) as e:
            self.error = e


def publish_then_kill(server, min_seconds, want_segments):
    """Run the publishers, SIGKILL the broker mid-stream, and return them."""
    pubs = [Publisher(server, t) for t in range(THREADS)]
    start = time.monotonic()
    for p in pubs:
        p.start()
    try:
        wait_until(
            lambda: time.monotonic() - start >= min_seconds
            and len(segments(server)) >= want_segments,
            20.0, f"{want_segments} commit-log segments",
        )
        for p in pubs:
            assert p.is_alive(), f"publisher {p.tid} stopped early: {p.error!r}"
        server.kill()  # each publisher then fails on its connection and ends
    except BaseException:
        for p in pubs:
            p.stopping.set()
        raise
    finally:
        for p in pubs:
            p.join(15)
    assert not any(p.is_alive() for p in pubs)
    assert all(isinstance(p.error, (ConnectionError, OSError)) for p in pubs), [
        p.error for p in pubs
    ]
    return pubs


def read_back_and_check(server, pubs):
    """Read both topics from 0 and check them against what the publishers sent; return
    {topic: [PushedMessage]}."""
    sent = {}
    for p in pubs:
        sent.update(p.sent)
    got = {t: read_topic(server, t, until_alive=True, timeout=30.0) for t in TOPICS}
    bodies = set()
    all_ids = []
    for topic, msgs in got.items():
        ids = [m.event_id for m in msgs]
        assert all(a < b for a, b in zip(ids, ids[1:])), f"{topic}: eventIds not increasing"
        all_ids += ids
        for m in msgs:
            assert m.body in sent, f"{topic}: a message nobody sent: {m.body[:40]!r}"
            assert m.body not in bodies, f"duplicate message {m.body[:40]!r}"
            bodies.add(m.body)
            want_topic, want_headers, _ = sent[m.body]
            assert (topic, m.headers) == (want_topic, want_headers), m.body[:40]
    assert len(all_ids) == len(set(all_ids)), "an eventId in both topics"
    # CREATE took eventIds 1 and 2; the messages that survived are dense after them.
    assert sorted(all_ids) == list(range(3, 3 + len(all_ids)))
    for p in pubs:
        missing = [b for b in p.acked if b not in bodies]
        assert not missing, f"publisher {p.tid}: {len(missing)} acknowledged messages lost"
        # One connection's messages keep their order across both topics.
        mine = sorted(
            (m.event_id, p.sent[m.body][2]) for t in TOPICS for m in got[t] if m.body in p.sent
        )
        order = [o for _, o in mine]
        assert all(a < b for a, b in zip(order, order[1:])), f"publisher {p.tid}: order changed"
    return got


def assert_no_corruption_logged(server):
    """The current run's log reports no corruption (a truncated torn tail is fine)."""
    log = server.current_log()
    for word in ("corrupt", "damaged", "Traceback", "#error", "#critical"):
        assert word not in log, f"{word!r} in the broker log:\n{log}"
    for line in log.splitlines():
        if "truncating the commit log" in line:
            assert "torn record" in line, line


def scan_commit_log(server):
    """Scan every segment (broker stopped), checking each record's CRC; return the
    message records per topic."""
    d = os.path.join(server.data, "commitlog")
    found = {}
    for name in segments(server):
        with open(os.path.join(d, name), "rb") as f:
            data = f.read()
        for _, view in fmt.scan_buffer(memoryview(data), int(name), check_crc=True):
            assert view.crc_ok()
            if view.magic == fmt.MESSAGE_MAGIC:
                found.setdefault(view.topic, []).append(view.event_id)
    return found


def test_crash_at_flush_level_2_keeps_every_acknowledged_message(server_factory):
    """With fsync before every answer (flush level 2), a SIGKILL mid-stream loses no
    acknowledged message, and the restart reads back a clean, dense, duplicate-free log."""
    server = server_factory(config=config(2))
    with connect(server) as c:
        for t in TOPICS:
            c.create(t)
    pubs = publish_then_kill(server, min_seconds=1.5, want_segments=2)
    acked = sum(len(p.acked) for p in pubs)
    assert acked > 0
    server.start()
    got = read_back_and_check(server, pubs)
    assert sum(len(v) for v in got.values()) >= acked
    assert_no_corruption_logged(server)


def test_crash_at_flush_level_1_restarts_clean_and_continues(server_factory):
    """With the once-a-second fsync (flush level 1), a SIGKILL while publishing leaves a
    log that restarts cleanly, reads back intact (CRC-valid, no duplicates), and takes
    new messages with eventIds right after the last one."""
    server = server_factory(config=config(1))
    with connect(server) as c:
        for t in TOPICS:
            c.create(t)
    pubs = publish_then_kill(server, min_seconds=1.0, want_segments=2)
    server.start()
    got = read_back_and_check(server, pubs)
    assert_no_corruption_logged(server)
    last = max(m.event_id for msgs in got.values() for m in msgs)
    last_a = got[TOPICS[0]][-1].event_id
    with connect(server) as c:
        c.publish(TOPICS[0], [([(b"after", b"restart")], b"new-1"), b"new-2"])
        sub = c.subscribe(TOPICS[0], last_a, batch=10, who=unique_who())
        ev = next_data(sub, 5.0)
        assert isinstance(ev, Batch)
        assert [(m.event_id, m.headers, m.body) for m in ev.messages] == [
            (last + 1, [(b"after", b"restart")], b"new-1"),
            (last + 2, [], b"new-2"),
        ]
        sub.ack_end()
    assert server.stop() is not None
    on_disk = scan_commit_log(server)
    for t in TOPICS:
        want = [m.event_id for m in got[t]] + ([last + 1, last + 2] if t == TOPICS[0] else [])
        assert on_disk.get(t, []) == want


def test_torn_tail_is_truncated_at_restart(server_factory):
    """A commit log ending in half a record (a torn write) is cut back at restart with a
    'torn' warning; everything before it is intact and eventIds continue after it."""
    server = server_factory(config=config(1))
    with connect(server) as c:
        c.create("torn")  # eventId 1
        for i in range(20):
            c.publish("torn", [f"m{i}".encode()])  # 2..21
    server.kill()
    last_seg = os.path.join(server.data, "commitlog", segments(server)[-1])
    with open(last_seg, "rb") as f:
        data = f.read()
    records = list(fmt.scan_buffer(memoryview(data), int(os.path.basename(last_seg))))
    offset, view = records[-1]
    base = int(os.path.basename(last_seg))
    whole = data[offset - base : offset - base + view.size]
    with open(last_seg, "ab") as f:
        f.write(whole[: len(whole) // 2])
    server.start()
    assert os.path.getsize(last_seg) == len(data)  # the torn half is gone
    log = server.current_log()
    assert "truncating the commit log" in log and "torn record" in log, log
    assert_no_corruption_logged(server)
    got = read_topic(server, "torn", count=20)
    assert [(m.event_id, m.body) for m in got] == [(i + 2, f"m{i}".encode()) for i in range(20)]
    with connect(server) as c:
        c.publish("torn", [b"after"])
    got = read_topic(server, "torn", after=21, count=1)
    assert [(m.event_id, m.body) for m in got] == [(22, b"after")]


def test_crash_right_after_delete_keeps_topics_older_than_the_retained_log(server_factory):
    """A crash after a DELETE but before the next checkpoint restarts from the checkpoint,
    not from a full rebuild, so topics whose CREATE records retention already removed
    from the commit log survive the restart."""
    server = server_factory(config={
        "store": {"maxLogSize": SEGMENT, "maxMessageSize": 16384, "maxDays": 1, "clearInterval": 1},
        "timeout": {"server": {"alive": ALIVE_MS}},
    })
    meta_path = os.path.join(server.data, "metadata.json")

    def checkpoint():
        try:
            with open(meta_path, "rb") as f:
                return json.loads(f.read())
        except (FileNotFoundError, ValueError):
            return None

    with connect(server) as c:
        c.create("keep")  # 1
        c.create("gone")  # 2
        c.publish("gone", [b"g1", b"g2"])  # 3, 4
        c.create("filler")  # 5
        for i in range(50):
            c.publish("filler", [b"%02d" % i + b"f" * 4000])  # 6..55
        keep_info = c.topic_info("keep")
        segs = segments(server)
        assert len(segs) >= 3
        old = time.time() - 3 * 86400
        for name in segs[:-1]:
            os.utime(os.path.join(server.data, "commitlog", name), (old, old))
        wait_until(lambda: segments(server)[0] != segs[0], 10.0, "retention to drop old segments")
        # The checkpoint taken after the last PUB still counts 2 messages in 'gone'.
        snap = wait_until(
            lambda: (cp := checkpoint()) and cp["nextEventId"] == 56 and cp, 10.0, "a checkpoint"
        )
        assert snap["queues"]["gone"] == {"0": 2}
        with open(meta_path, "rb") as f:
            saved = f.read()
        c.delete("gone")  # 56
    server.kill()
    # The broker may have checkpointed after the DELETE; put back the one from before it,
    # which is exactly what a crash just before that checkpoint leaves on disk.
    with open(meta_path, "wb") as f:
        f.write(saved)
    server.start()
    assert "rebuilding" not in server.current_log(), server.current_log()
    assert_no_corruption_logged(server)
    with connect(server) as c:
        assert [t["name"] for t in c.list()] == ["filler", "keep"]
        assert c.topic_info("keep") == keep_info
        c.publish("keep", [b"k"])  # 57
    assert [(m.event_id, m.body) for m in read_topic(server, "keep", count=1)] == [(57, b"k")]
    with pytest.raises(SmssError):
        read_topic(server, "gone")
