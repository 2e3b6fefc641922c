"""Master/slave replication between two real broker processes on loopback."""

import os
import time

import pytest

from mqserver.store import format as fmt
from protocols.smss.client import SmssClient, SmssError
from tests.support.wait import wait_until

SMALL = {"store": {"maxLogSize": 1 << 20}, "timeout": {"server": {"alive": 500}}}


def log_records(data_dir):
    """Return every record of a data directory as comparable tuples, in log order."""
    d = os.path.join(data_dir, "commitlog")
    out = []
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            buf = f.read()
        for _, v in fmt.scan_buffer(memoryview(buf), int(name)):
            out.append((v.event_id, v.magic, v.flag, v.topic, v.queue_id, v.queue_offset,
                        bytes(v.body), v.properties, v.store_ts, v.born_ts))
    return out


def status(port):
    with SmssClient("127.0.0.1", port) as c:
        return c.topic_info("$replication")


def wait_caught_up(master_port, slave_port, timeout=60.0):
    """Wait until the slave holds every eventId the master has; return the master's last."""
    seen = {}

    def caught_up():
        seen["master"] = status(master_port)["appliedEventId"]
        seen["slave"] = status(slave_port)["appliedEventId"]
        return seen["slave"] == seen["master"]

    wait_until(caught_up, timeout, "the slave to apply every eventId of the master", interval=0.1)
    return seen["master"]


def start_slave(server_factory, master, name="slave", event=None):
    args = ["--role", "slave", "--master", f"127.0.0.1:{master.smss_port}"]
    if event is not None:
        args += ["--event", str(event)]
    return server_factory(name, config=SMALL, extra_args=args)


def publish_many(port, topic, count, batch=100, start=0):
    with SmssClient("127.0.0.1", port) as c:
        for i in range(start, start + count, batch):
            n = min(batch, start + count - i)
            c.publish(topic, [([(b"i", b"%d" % (i + j))], b"body-%d" % (i + j)) for j in range(n)])


def stop_both(master, slave):
    slave.stop()
    master.stop()


def test_slave_ends_identical_after_mixed_workload(server_factory):
    """100k messages with creates, deletes, lifetimes and delays in between: the slave's
    log and topics end identical to the master's."""
    master = server_factory("master", config=SMALL)
    slave = start_slave(server_factory, master)
    with SmssClient("127.0.0.1", master.smss_port) as c:
        c.create("a")
        c.create("temp")
        c.create("short", expire_at=int(time.time() * 1000) + 10_500)
        # published at once: on a loaded machine the bulk below outlasts the lifetime
        c.publish("short", [b"short lived"])
        publish_many(master.smss_port, "a", 40_000)
        c.publish("temp", [b"gone soon"])
        c.delay("a", 1000, [([(b"d", b"1")], b"delayed one"), b"delayed two"])
        c.delete("temp")
        c.create("b")
        publish_many(master.smss_port, "b", 30_000)
        publish_many(master.smss_port, "a", 30_000, start=40_000)
        wait_until(lambda: all(t["name"] != "short" for t in c.list()), 20, "topic short to expire",
                   interval=0.2)
        master_topics = c.list()
    assert {t["name"] for t in master_topics} == {"a", "b"}
    wait_caught_up(master.smss_port, slave.smss_port)
    with SmssClient("127.0.0.1", slave.smss_port) as s:
        assert s.list() == master_topics
    stop_both(master, slave)
    m, s = log_records(master.data), log_records(slave.data)
    assert len(m) > 100_000
    assert m == s
    assert [r[0] for r in m] == list(range(1, len(m) + 1))


def test_slave_refuses_writes(server_factory):
    """PUB, DELAY, CREATE and DELETE on a slave get smss's role errors."""
    master = server_factory("master", config=SMALL)
    slave = start_slave(server_factory, master)
    with SmssClient("127.0.0.1", master.smss_port) as c:
        c.create("t")
    wait_caught_up(master.smss_port, slave.smss_port)
    with SmssClient("127.0.0.1", slave.smss_port) as s:
        for call, text in [
            (lambda: s.publish("t", [b"x"]), "just master can pub message"),
            (lambda: s.delay("t", 2000, [b"x"]), "just master can pub message"),
            (lambda: s.create("u"), "just master can manage topic"),
            (lambda: s.delete("t"), "just master can manage topic"),
        ]:
            with pytest.raises(SmssError, match=text):
                call()
        s.alive()


def test_slave_killed_mid_stream_resumes_without_gaps(server_factory):
    """SIGKILL the slave while it catches up; after a restart it holds every record once."""
    master = server_factory("master", config=SMALL)
    with SmssClient("127.0.0.1", master.smss_port) as c:
        c.create("t")
    publish_many(master.smss_port, "t", 60_000, batch=200)
    slave = start_slave(server_factory, master)
    wait_until(lambda: status(slave.smss_port)["appliedEventId"] >= 5_000, 30,
               "the slave to apply 5000 eventIds")
    slave.kill()
    publish_many(master.smss_port, "t", 5_000, batch=100, start=60_000)
    slave.start()
    wait_caught_up(master.smss_port, slave.smss_port)
    stop_both(master, slave)
    assert log_records(master.data) == log_records(slave.data)


def test_master_killed_slave_reconnects_and_catches_up(server_factory):
    """SIGKILL the master; after it restarts the slave reconnects and catches up."""
    master = server_factory("master", config=SMALL)
    slave = start_slave(server_factory, master)
    with SmssClient("127.0.0.1", master.smss_port) as c:
        c.create("t")
    publish_many(master.smss_port, "t", 5_000)
    wait_caught_up(master.smss_port, slave.smss_port)
    port = master.smss_port
    master.kill()
    master.listen = {"smss": f"tcp:{port}:interface=127.0.0.1"}
    master.start()
    publish_many(master.smss_port, "t", 5_000, start=5_000)
    wait_caught_up(master.smss_port, slave.smss_port)
    stop_both(master, slave)
    assert log_records(master.data) == log_records(slave.data)


def test_slave_from_event_n_gets_exactly_the_records_after_n(server_factory):
    """A fresh slave started with --event N copies the topics and holds exactly the
    records after N."""
    master = server_factory("master", config=SMALL)
    with SmssClient("127.0.0.1", master.smss_port) as c:
        c.create("t")
        publish_many(master.smss_port, "t", 1_000)
        n = status(master.smss_port)["appliedEventId"]
        publish_many(master.smss_port, "t", 500, start=1_000)
        c.create("later")
    slave = start_slave(server_factory, master, event=n)
    wait_caught_up(master.smss_port, slave.smss_port)
    with SmssClient("127.0.0.1", slave.smss_port) as s:
        assert [t["name"] for t in s.list()] == ["later", "t"]
        sub = s.subscribe("t", 0, batch=255, who="check")
        got = []
        while len(got) < 500:
            batch = sub.next_batch(5)
            got += [m.event_id for m in batch.messages]
            sub.ack()
    assert got == list(range(n + 1, n + 501))
    stop_both(master, slave)
    # The slave numbers its consume queues from 0 (smss blocks carry no queue offset);
    # everything else is the master's.
    def strip(r):
        return r[:5] + r[6:]

    m = log_records(master.data)
    assert [strip(r) for r in log_records(slave.data)] == [strip(r) for r in m if r[0] > n]


def test_lag_is_visible_on_nsqd_http_stats(server_factory):
    """The slave's applied eventId and lag appear in nsqd's /stats JSON, the master's role
    too."""
    import json
    import urllib.request

    master = server_factory("master", config=SMALL, listen={
        "smss": "tcp:0:interface=127.0.0.1", "nsqd_http": "tcp:0:interface=127.0.0.1"})
    slave = server_factory("slave", config=SMALL, listen={
        "smss": "tcp:0:interface=127.0.0.1", "nsqd_http": "tcp:0:interface=127.0.0.1"},
        extra_args=["--role", "slave", "--master", f"127.0.0.1:{master.smss_port}"])
    with SmssClient("127.0.0.1", master.smss_port) as c:
        c.create("t")
        c.publish("t", [b"a", b"b"])
    head = wait_caught_up(master.smss_port, slave.smss_port)

    def stats(server):
        port = [p for name, p in server.ports.items() if "Http" in name or "Site" in name][0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats?format=json", timeout=10) as r:
            return json.loads(r.read())["replication"]

    s = stats(slave)
    assert s["role"] == "slave" and s["appliedEventId"] == head and s["connected"] is True
    assert s["lagMs"] >= 0
    assert stats(master) == {"role": "master", "appliedEventId": head}


def test_idle_replica_stream_gets_alive_then_new_records(server_factory):
    """A REPLICA stream with nothing new gets ALIVE every timeout.server.alive ms
    (SMALL: 500), keeps getting it after a burst of records, and the records still come."""
    from protocols.smss import client_codec as cc
    from protocols.smss.messages import AliveResponse, ReplicaBlock

    master = server_factory("m", config=SMALL)
    with SmssClient("127.0.0.1", master.smss_port) as c, \
            SmssClient("127.0.0.1", master.smss_port) as feed:
        c.create("idle")
        feed.send_raw(cc.encode_replica(0))
        assert isinstance(feed.read_response("replica", timeout=5), ReplicaBlock)  # the CREATE
        start = time.monotonic()
        kinds = [type(feed.read_response("replica", timeout=5)) for _ in range(2)]
        assert kinds == [AliveResponse, AliveResponse]
        assert time.monotonic() - start >= 2 * 0.5 - 0.05
        c.publish("idle", [b"a", b"b"])
        got = feed.read_response("replica", timeout=5)
        assert isinstance(got, ReplicaBlock)  # one PUB of two messages: one block
        assert isinstance(feed.read_response("replica", timeout=5), AliveResponse)
