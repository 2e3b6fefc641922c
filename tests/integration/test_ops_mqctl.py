"""mqctl against a real broker process (the admin door on a loopback port): topics,
consumers and lag, rewinding each kind of consumer, peek and tail, stats, and the error
when no broker answers."""

import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from protocols.remoting import codes
from protocols.smss.client import SmssClient
from tests.support.nsq import V2, nsq_listen
from tests.support.remoting_client import RemotingClient
from tests.support.server import ROOT, ServerProcess

pytestmark = pytest.mark.timeout(120)
LOOP = "tcp:0:interface=127.0.0.1"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    listen = dict(nsq_listen(), smss=LOOP, broker=LOOP, admin=LOOP, msgout=LOOP)
    s = ServerProcess(tmp_path_factory.mktemp("mqctl") / "broker", listen=listen).start()
    try:
        yield s
    finally:
        s.stop()
        s.close()


def mqctl(srv, *args, check=True):
    """Run mqctl; return (exit status, stdout, stderr)."""
    url = f"http://127.0.0.1:{srv.ports['AdminSite']}" if srv is not None else None
    cmd = [sys.executable, "-m", "protocols.admin.ctl"] + (["--url", url] if url else []) + list(args)
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin"})
    if check:
        assert p.returncode == 0, p.stderr
    return p.returncode, p.stdout, p.stderr


def mqctl_json(srv, *args):
    return json.loads(mqctl(srv, "--json", *args)[1])


def test_topics_create_info_delete(srv):
    """topic create/info/delete and topics, as tables and as JSON."""
    _, out, _ = mqctl(srv, "topic", "create", "ctl_t", "--queues", "2")
    assert out.strip() == "created ctl_t (2 queues)"
    smss = SmssClient("127.0.0.1", srv.smss_port)
    smss.publish("ctl_t", [b"a", b"b", b"c"])
    smss.close()
    _, out, _ = mqctl(srv, "topics")
    header, *rows = out.splitlines()
    assert header.split()[:3] == ["TOPIC", "QUEUES", "MESSAGES"]
    assert any(r.split()[:3] == ["ctl_t", "2", "3"] for r in rows)
    info = mqctl_json(srv, "topic", "info", "ctl_t")
    assert (info["in_msgs"], info["queues_count"]) == (3, 2)
    assert "MAX OFFSET" in mqctl(srv, "topic", "info", "ctl_t")[1]
    status, _, err = mqctl(srv, "topic", "create", "ctl_t", check=False)
    assert status == 1 and "exists" in err
    mqctl(srv, "topic", "delete", "ctl_t")
    assert "ctl_t" not in [t["name"] for t in mqctl_json(srv, "topics")]
    status, _, err = mqctl(srv, "topic", "info", "ctl_t", check=False)
    assert status == 1 and "not found" in err


def _apart(publish, bodies):
    # each message in a later millisecond than the one before (distinct store times)
    for b in bodies:
        now = int(time.time() * 1000)
        while int(time.time() * 1000) <= now + 1:
            time.sleep(0.001)
        publish(b)


def test_rewind_nsq_channel_and_smss_who(srv):
    """mqctl rewind moves a live NSQ channel by time and a live smss who by eventId: the
    messages from the point come again, none before it; consumers and lag show them."""
    smss = SmssClient("127.0.0.1", srv.smss_port)
    smss.create("rw")
    sub_conn = V2(srv.ports["NsqdFactory"])
    sub_conn.send(b"SUB rw ch\nRDY 10\n")
    assert sub_conn.frame() == (0, b"OK")
    _apart(lambda b: smss.publish("rw", [b]), [b"m1", b"m2", b"m3"])
    m1, m2, m3 = sub_conn.messages(3)
    for m in (m1, m2, m3):
        sub_conn.send(b"FIN " + m.msg_id + b"\n")
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(m2.timestamp / 1e9))
    when += ".%03d" % (m2.timestamp // 1_000_000 % 1000)
    _, out, _ = mqctl(srv, "rewind", "rw@ch", "--time", when)
    assert "rewound channel ch on rw" in out
    assert [m.body for m in sub_conn.messages(2)] == [b"m2", b"m3"]
    who_conn = SmssClient("127.0.0.1", srv.smss_port)
    sub = who_conn.subscribe("rw", event_id=0, batch=10, who="w9")
    assert [m.body for m in sub.next_batch(5).messages] == [b"m1", b"m2", b"m3"]
    rows = mqctl_json(srv, "consumers", "--topic", "rw")
    kinds = {(r["kind"], r["name"]) for r in rows}
    assert {("channel", "ch"), ("smss", "w9")} <= kinds
    r = mqctl_json(srv, "rewind", "w9", "--topic", "rw", "--kind", "smss",
                   "--event", str(int(m3.msg_id, 16)))
    assert r["positions"] == {"0": 2}
    sub.ack()
    assert [m.body for m in sub.next_batch(5).messages] == [b"m3"]
    _, out, _ = mqctl(srv, "lag", "--topic", "rw")
    assert out.splitlines()[0].split()[:2] == ["LAG", "TOPIC"]
    status, _, err = mqctl(srv, "rewind", "rw@nobody", "--event", "1", check=False)
    assert status == 1 and "no consumer nobody on rw" in err
    sub_conn.sock.close()
    who_conn.close()
    smss.close()


def test_rewind_rocketmq_group_offsets(srv):
    """A RocketMQ group's committed offsets move back to the eventId."""
    rmq = RemotingClient("127.0.0.1", srv.ports["BrokerDoor"])
    smss = SmssClient("127.0.0.1", srv.smss_port)
    smss.create("grp_t")
    smss.publish("grp_t", [b"x", b"y", b"z"])
    smss.close()
    assert rmq.call(codes.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": "G9", "topic": "grp_t", "queueId": 0, "commitOffset": 3}).code == 0
    first = mqctl_json(srv, "peek", "grp_t", "-n", "3")[1]["event_id"]
    r = mqctl_json(srv, "rewind", "grp_t@G9", "--event", str(first))
    assert (r["kind"], r["positions"], r["lag"]) == ("rocketmq", {"0": 1}, 2)
    off = rmq.call(codes.QUERY_CONSUMER_OFFSET, {"consumerGroup": "G9", "topic": "grp_t",
                                                 "queueId": 0}).ext_fields["offset"]
    assert off == "1"
    rmq.close()


def test_peek_tail_and_stats(srv):
    """peek shows the last messages; tail prints new ones as they come; stats the totals
    and connections."""
    smss = SmssClient("127.0.0.1", srv.smss_port)
    smss.create("pk")
    smss.publish("pk", [b"p1", b"p2", b"p3"])
    msgs = mqctl_json(srv, "peek", "pk", "-n", "2")
    assert [m["body"] for m in msgs] == ["p2", "p3"]
    assert "p3" in mqctl(srv, "peek", "pk")[1]
    url = f"http://127.0.0.1:{srv.ports['AdminSite']}"
    tail = subprocess.Popen([sys.executable, "-m", "protocols.admin.ctl", "--url", url, "--json",
                             "tail", "pk", "-n", "1", "--count", "2", "--interval", "0.05"],
                            cwd=ROOT, env={"PYTHONPATH": ROOT}, stdout=subprocess.PIPE, text=True)
    try:
        first = json.loads(tail.stdout.readline())
        assert first["body"] == "p3"
        smss.publish("pk", [b"p4"])
        out, _ = tail.communicate(timeout=30)
    finally:
        tail.kill()
    assert json.loads(out)["body"] == "p4"
    stats = mqctl_json(srv, "stats")
    assert stats["in_msgs"] >= 4 and "smss" in stats["connections"]
    assert "DOOR" in mqctl(srv, "stats")[1]
    smss.close()


def test_no_broker_answers():
    """A clear message and exit status 2 when nothing listens."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    p = subprocess.run([sys.executable, "-m", "protocols.admin.ctl", "--url",
                        f"http://127.0.0.1:{port}", "topics"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60, env={"PYTHONPATH": ROOT})
    assert p.returncode == 2
    assert p.stderr.startswith(f"mqctl: no broker answers at http://127.0.0.1:{port}")


def msgout(srv, method, path, body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{srv.ports['MsgoutSite']}{path}",
                                 data=json.dumps(body).encode() if body is not None else None,
                                 method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def test_rewind_msgout_subscription(srv):
    """A msgout topic-mode subscription is a consumer of kind msgout: rewound to an
    eventId, its next fetch starts there, nothing before it."""
    msgout(srv, "PUT", "/v1/queues/news", {"mode": "topic"})
    msgout(srv, "POST", "/v1/queues/news/messages",
           {"messages": [{"body": "n1"}, {"body": "n2"}, {"body": "n3"}]})
    got = msgout(srv, "POST", "/v1/queues/news/fetch", {"max": 10, "sub_id": "s1"})["messages"]
    assert [m["body"] for m in got] == ["n1", "n2", "n3"]
    msgout(srv, "POST", "/v1/ack", {"receipts": [m["receipt"] for m in got]})
    rows = mqctl_json(srv, "consumers", "--topic", "news")
    assert [(r["kind"], r["lag"], r["in_flight"]) for r in rows] == [("msgout", 0, 0)]
    r = mqctl_json(srv, "rewind", "news@s1", "--kind", "msgout", "--event", str(got[1]["id"]))
    assert r["lag"] == 2
    again = msgout(srv, "POST", "/v1/queues/news/fetch", {"max": 10, "sub_id": "s1"})["messages"]
    assert [m["body"] for m in again] == ["n2", "n3"]
