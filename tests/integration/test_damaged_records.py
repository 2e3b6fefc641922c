"""Damaged records with real broker processes: one byte flipped in a message
body in an older segment is never served to a subscriber nor copied to a slave, and the
records after it stay reachable; a damaged checkpoint is rebuilt from the log."""

import os
import shutil

from mqserver.store import format as fmt
from tests.integration.test_replication import log_records, status, wait_caught_up
from tests.support.smss import read_topic

SEGMENT = 65536
CONFIG = {"store": {"maxLogSize": SEGMENT}, "timeout": {"server": {"alive": 300}}}


def records_of(data):
    """(offset, view) of every record in a data directory, in log order."""
    d = os.path.join(data, "commitlog")
    out = []
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            buf = f.read()
        out += list(fmt.scan_buffer(memoryview(buf), int(name), check_crc=False))
    return out


def flip_body(data, offset):
    """Flip one byte in the body of the record at commit-log C{offset}."""
    seg = offset - offset % SEGMENT
    path = os.path.join(data, "commitlog", fmt.segment_name(seg))
    with open(path, "r+b") as f:
        f.seek(offset - seg + fmt.HEADER_SIZE + 3)
        b = f.read(1)
        f.seek(offset - seg + fmt.HEADER_SIZE + 3)
        f.write(bytes([b[0] ^ 0x01]))


def fill_and_damage(server, n=600):
    """Publish n messages to topic 'd' (several segments), stop, flip a body byte of a
    message in the first segment; return (bodies, damaged body, its eventId)."""
    from tests.support.smss import connect

    bodies = [b"body-%04d-" % i + b"z" * 200 for i in range(n)]
    with connect(server) as c:
        c.create("d")
        for i in range(0, n, 50):
            c.publish("d", bodies[i:i + 50])
    server.stop()
    recs = [(o, v) for o, v in records_of(server.data) if v.magic == fmt.MESSAGE_MAGIC]
    assert recs[-1][0] >= 2 * SEGMENT, "the damage must sit in an older segment"
    off, view = recs[20]
    flip_body(server.data, off)
    return bodies, bytes(view.body), view.event_id


def test_subscriber_and_slave_never_get_a_damaged_body(server_factory):
    master = server_factory("master", config=CONFIG)
    bodies, damaged, eid = fill_and_damage(master)
    master.start()
    got = read_topic(master, "d", count=len(bodies) - 1, batch=7)
    assert [m.body for m in got] == [b for b in bodies if b != damaged]
    log = master.current_log()
    assert log.count("damaged record skipped") == 1, log
    assert f"eventId {eid}" in log and fmt.segment_name(0) in log
    assert "Traceback" not in log

    slave = server_factory("slave", config=CONFIG, extra_args=[
        "--role", "slave", "--master", f"127.0.0.1:{master.smss_port}"])
    wait_caught_up(master.smss_port, slave.smss_port)
    assert status(slave.smss_port)["appliedEventId"] == status(master.smss_port)["appliedEventId"]
    got = read_topic(slave, "d", count=len(bodies) - 1, batch=50)
    assert [m.body for m in got] == [b for b in bodies if b != damaged]
    slave_log = slave.current_log()
    assert f"eventIds {eid}..{eid} are missing" in slave_log, slave_log
    assert "Traceback" not in slave_log
    slave.stop()
    master.stop()
    # The slave's log holds every sound record of the master's, the damaged one not at
    # all (and is itself sound).
    slave_recs = records_of(slave.data)
    assert all(v.crc_ok() for _, v in slave_recs)
    assert eid not in {v.event_id for _, v in slave_recs}


def test_rebuild_after_damage_lost_checkpoint_and_queues(server_factory):
    """The damage plus a lost checkpoint and lost consume queues: start-up names the
    damaged record, and a subscriber from 0 gets every intact message without being
    disconnected."""
    server = server_factory(config=CONFIG)
    bodies, damaged, eid = fill_and_damage(server)
    os.remove(os.path.join(server.data, "metadata.json"))
    shutil.rmtree(os.path.join(server.data, "consumequeue"))
    server.start()
    log = server.current_log()
    assert "damaged record skipped" in log and f"eventId {eid}" in log, log
    assert "recovery found 1 damaged records" in log
    for batch in (1, 255):
        got = read_topic(server, "d", count=len(bodies) - 1, batch=batch)
        assert [m.body for m in got] == [b for b in bodies if b != damaged]
    assert "Traceback" not in server.current_log()


def test_unreadable_checkpoint_is_rebuilt_with_a_warning(server_factory):
    server = server_factory(config=CONFIG)
    from tests.support.smss import connect

    with connect(server) as c:
        c.create("k")
        c.publish("k", [b"one", b"two"])
        c.delay("k", 600_000, [b"later"])
    server.stop()
    with open(os.path.join(server.data, "metadata.json"), "wb") as f:
        f.write(b'{"version": 1, "logOff')
    server.start()
    log = server.current_log()
    assert "is unreadable" in log and "rebuilding from the commit log" in log, log
    assert "Traceback" not in log
    got = read_topic(server, "k", count=2)
    assert [m.body for m in got] == [b"one", b"two"]
    with connect(server) as c:
        assert [t["name"] for t in c.list()] == ["k"]


def test_nsq_channel_and_rocketmq_pull_skip_a_damaged_record(server_factory):
    """The other read paths with a real process: an NSQ channel delivers every message
    but the damaged one (and is not disconnected), a RocketMQ pull leaves it out and a
    pull of only it moves the client past it."""
    from protocols.remoting import codes
    from tests.support.nsq import V2, nsq_listen
    from tests.support.remoting_client import RemotingClient

    listen = dict(nsq_listen(), smss="tcp:0:interface=127.0.0.1",
                  broker="tcp:0:interface=127.0.0.1", namesrv="tcp:0:interface=127.0.0.1")
    server = server_factory(config=CONFIG, listen=listen)
    bodies, damaged, eid = fill_and_damage(server)
    server.start()
    nsq = V2(server.ports["NsqdFactory"])
    nsq.send(b"SUB d ch\n")
    assert nsq.frame() == (0, b"OK")
    nsq.send(b"RDY 1000\n")
    got = [m for m in nsq.messages(len(bodies) - 1)]
    assert [m.body for m in got] == [b for b in bodies if b != damaged]
    for m in got:
        nsq.send(b"FIN %s\n" % m.msg_id)
    nsq.send(b"NOP\n")
    nsq.close()

    rmq = RemotingClient("127.0.0.1", server.ports["BrokerDoor"])

    def pull(offset, n):
        return rmq.call(codes.PULL_MESSAGE, {
            "consumerGroup": "G", "topic": "d", "queueId": 0, "queueOffset": offset,
            "maxMsgNums": n, "sysFlag": 4, "commitOffset": 0, "suspendTimeoutMillis": 0,
            "subscription": "*", "subVersion": 0})

    p = pull(0, 32)
    assert p.code == codes.SUCCESS and p.ext_fields["nextBeginOffset"] == "32"
    views, pos = [], 0
    while pos < len(p.body):
        v = fmt.RecordView(p.body, pos)
        views.append(bytes(v.body))
        pos += v.size
    assert views == [b for b in bodies[:32] if b != damaged]
    p = pull(20, 1)  # only the damaged record (message 20 of the topic)
    assert p.code == codes.PULL_RETRY_IMMEDIATELY and p.ext_fields["nextBeginOffset"] == "21"
    rmq.close()
    assert "Traceback" not in server.current_log()


def test_rebuild_counts_each_damaged_header_once_at_its_place(server_factory):
    """Four records with a damaged header (magic), metadata.json and the consume queues
    removed (a full rebuild), every message read: four log lines, each naming
    its record's segment and offset, and the damaged-records counter at 4 (not 5 with
    one blamed on offset 0)."""
    from tests.integration.test_ops_metrics import LOOP, scrape
    from tests.support.smss import connect

    server = server_factory(config=CONFIG, listen={"smss": LOOP, "metrics": LOOP})
    bodies = [b"body-%04d-" % i + b"z" * 200 for i in range(600)]
    with connect(server) as c:
        c.create("d")
        for i in range(0, len(bodies), 50):
            c.publish("d", bodies[i:i + 50])
    server.stop()
    recs = [(o, v) for o, v in records_of(server.data) if v.magic == fmt.MESSAGE_MAGIC]
    hit = [recs[i] for i in (20, 150, 300, 500)]
    assert len({o - o % SEGMENT for o, _ in hit}) > 1, "the damage must span segments"
    for off, _ in hit:
        seg = off - off % SEGMENT
        with open(os.path.join(server.data, "commitlog", fmt.segment_name(seg)), "r+b") as f:
            f.seek(off - seg + 4)
            f.write(b"\x00\x00\x00\x00")  # the magic
    os.remove(os.path.join(server.data, "metadata.json"))
    shutil.rmtree(os.path.join(server.data, "consumequeue"))  # derived: rebuilt too
    server.start()
    lost = {bytes(v.body) for _, v in hit}
    for batch in (1, 255):
        got = read_topic(server, "d", count=len(bodies) - 4, batch=batch)
        assert [m.body for m in got] == [b for b in bodies if b not in lost]
    log = server.current_log()
    lines = [x for x in log.splitlines() if "damaged record skipped" in x]
    assert len(lines) == 4, log
    for line, (off, _) in zip(lines, hit):
        assert f"segment {fmt.segment_name(off - off % SEGMENT)} offset {off} " in line, line
    assert scrape(server)[("mqserver_store_damaged_records_total", ())] == 4
