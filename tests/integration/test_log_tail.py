"""A zero-filled commit-log tail with real broker processes: publish, SIGKILL, zeros
appended to the last segment (a crash that extended the file but never wrote it),
restart, a rebuild without metadata.json, publish again. The zeros are cut, no eventId
is handed out twice, and a slave of such a master catches up."""

import os

import pytest

from tests.integration.test_replication import start_slave, status, wait_caught_up
from tests.support.smss import connect, read_topic

ZEROS = 4096


def last_segment(server):
    d = os.path.join(server.data, "commitlog")
    return os.path.join(d, max(n for n in os.listdir(d) if len(n) == 20 and n.isdigit()))


def publish(server, topic, start, n):
    with connect(server) as c:
        for i in range(start, start + n):
            c.publish(topic, [b"m%04d" % i])


def crash_with_zero_tail(server):
    """SIGKILL C{server}, append ZEROS zero bytes to its last segment; return the size
    the segment had (where its last record ends)."""
    server.kill()
    seg = last_segment(server)
    size = os.path.getsize(seg)
    with open(seg, "ab") as f:
        f.write(bytes(ZEROS))
    return size


def event_ids(server, topic, count):
    got = read_topic(server, topic, count=count)
    return [m.event_id for m in got], [m.body for m in got]


@pytest.mark.parametrize("flush", [0, 1, 2])
def test_zero_tail_never_makes_an_event_id_reused(server_factory, flush):
    """The report: 100 messages, SIGKILL, 4,096 zeros appended, restart, 110 more,
    metadata.json deleted, restart, 10 more. The zeros are cut at the first restart (one
    line: segment, offset, bytes), and every message keeps a distinct eventId, in
    order, up to 221."""
    server = server_factory(config={"store": {"flushLevel": flush}})
    with connect(server) as c:
        c.create("z")  # eventId 1
    publish(server, "z", 0, 100)  # 2..101
    end = crash_with_zero_tail(server)
    server.start()
    log = server.current_log()
    seg = os.path.basename(last_segment(server))
    assert (f"truncating the commit log at {int(seg) + end}: cut {ZEROS} bytes after the"
            f" last sound record of segment {seg}") in log, log
    assert "next eventId 102" in log, log
    assert os.path.getsize(last_segment(server)) == end
    publish(server, "z", 100, 110)  # 102..211
    server.stop()
    os.remove(os.path.join(server.data, "metadata.json"))
    server.start()
    assert "next eventId 212" in server.current_log(), server.current_log()
    publish(server, "z", 210, 10)  # 212..221
    ids, bodies = event_ids(server, "z", 220)
    assert ids == list(range(2, 222))
    assert bodies == [b"m%04d" % i for i in range(220)]


def test_slave_of_a_master_with_a_zero_tail_catches_up(server_factory):
    """A master restarted over a zero-filled tail, and a slave following it: the slave
    applies everything written before and after the restart with the master's
    eventIds, with no gap, and is never reported stalled."""
    master = server_factory("master", config={"timeout": {"server": {"alive": 500}}})
    with connect(master) as c:
        c.create("z")
    publish(master, "z", 0, 100)
    crash_with_zero_tail(master)
    master.start()
    slave = start_slave(server_factory, master)
    publish(master, "z", 100, 110)
    assert wait_caught_up(master.smss_port, slave.smss_port) == 211
    s = status(slave.smss_port)
    assert s["connected"] and s["gaps"] == 0 and not s["stalled"], s
    ids, bodies = event_ids(slave, "z", 210)
    assert ids == list(range(2, 212))
    assert bodies == [b"m%04d" % i for i in range(210)]
