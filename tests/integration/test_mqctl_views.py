"""What mqctl shows, against real brokers: every listening door in stats from the start,
the replication state on a slave, every queue of a new topic, peek's header row, and a
msgout queue's consumer found once by its channel name."""

import json
import subprocess
import sys
import urllib.request

import pytest

from protocols.smss.client import SmssClient
from tests.support.server import ROOT
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(120)
LOOP = "tcp:0:interface=127.0.0.1"


def mqctl(server, *args):
    """Run mqctl against C{server}'s admin door; return its output (it must succeed)."""
    url = f"http://127.0.0.1:{server.ports['admin']}"
    p = subprocess.run([sys.executable, "-m", "protocols.admin.ctl", "--url", url, *args],
                       cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_stats_lists_every_listening_door_before_its_first_connection(server_factory):
    s = server_factory(listen={"smss": LOOP, "nsqd_tcp": LOOP, "msgout": LOOP, "admin": LOOP})
    stats = json.loads(mqctl(s, "--json", "stats"))
    conns = stats["connections"]
    assert set(conns) == {"smss", "nsqd_tcp", "msgout", "admin"}
    assert conns["smss"] == conns["nsqd_tcp"] == conns["msgout"] == []
    rows = [line.split() for line in mqctl(s, "stats").splitlines()]
    assert ["DOOR", "CONNECTIONS", "CLIENTS"] in rows
    for door in ("smss", "nsqd_tcp", "msgout"):
        assert [door, "0"] in rows
    # a master says nothing about following anyone
    assert "slave of" not in mqctl(s, "stats")


def test_stats_on_a_slave_shows_its_replication(server_factory):
    master = server_factory("m", listen={"smss": LOOP})
    slave = server_factory("s", listen={"smss": LOOP, "admin": LOOP}, extra_args=[
        "--role", "slave", "--master", f"127.0.0.1:{master.smss_port}"])
    with SmssClient("127.0.0.1", master.smss_port) as c:
        c.create("rep")
        c.publish("rep", [b"a", b"b"])
        head = c.topic_info("$replication")["appliedEventId"]

    def caught_up():
        rep = json.loads(mqctl(slave, "--json", "stats"))["replication"]
        return rep["connected"] and rep["appliedEventId"] == head and rep

    rep = wait_until(caught_up, 30, "the slave caught up")
    assert rep["role"] == "slave" and rep["master"] == f"127.0.0.1:{master.smss_port}"
    text = mqctl(slave, "stats")
    assert (f"slave of 127.0.0.1:{master.smss_port} (connected): applied eventId {head}, "
            f"lag {rep['lagMs']} ms, ") in text


def test_topic_info_of_a_new_topic_shows_every_queue(server_factory):
    s = server_factory(listen={"admin": LOOP})
    assert mqctl(s, "topic", "create", "four", "--queues", "4").strip() == \
        "created four (4 queues)"
    lines = mqctl(s, "topic", "info", "four").splitlines()
    head = lines.index(next(ln for ln in lines if ln.startswith("QUEUE")))
    assert lines[head].split() == ["QUEUE", "MIN", "OFFSET", "MAX", "OFFSET", "IN", "IN", "BYTES"]
    assert [ln.split() for ln in lines[head + 1:head + 5]] == [
        [str(q), "0", "0", "0", "0"] for q in range(4)]
    info = json.loads(mqctl(s, "--json", "topic", "info", "four"))
    assert sorted(info["queues"]) == ["0", "1", "2", "3"]


def test_peek_has_a_header_row(server_factory):
    s = server_factory(listen={"smss": LOOP, "admin": LOOP})
    with SmssClient("127.0.0.1", s.smss_port) as c:
        c.create("pk")
        c.publish("pk", [b"first", b"second"])
    header, *rows = mqctl(s, "peek", "pk").splitlines()
    assert header.split() == ["EVENTID", "QUEUE", "OFFSET", "STORED", "BODY", "PROPERTIES"]
    assert [r.split()[1:3] + r.split()[-1:] for r in rows] == [
        ["0", "0", "first"], ["0", "1", "second"]]


def test_rewind_a_msgout_queue_by_its_channel_name(server_factory):
    """``TOPIC@msgout:queue`` names one consumer (kind msgout), found once."""
    s = server_factory(listen={"msgout": LOOP, "admin": LOOP})

    def msgout(method, path, body=None):
        req = urllib.request.Request(
            f"http://127.0.0.1:{s.ports['msgout']}{path}", method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    msgout("PUT", "/v1/queues/jobs", {"ack_timeout_ms": 60000})
    msgout("POST", "/v1/queues/jobs/messages", {"messages": [{"body": "j1"}, {"body": "j2"}]})
    got = msgout("POST", "/v1/queues/jobs/fetch", {"max": 10})["messages"]
    assert [m["body"] for m in got] == ["j1", "j2"]
    msgout("POST", "/v1/ack", {"receipts": [m["receipt"] for m in got]})
    out = mqctl(s, "rewind", "jobs@msgout:queue", "--event", str(got[0]["id"]))
    assert out.startswith("rewound msgout msgout:queue on jobs: queue 0 at 0; lag now 2"), out
    again = msgout("POST", "/v1/queues/jobs/fetch", {"max": 10})["messages"]
    assert [m["body"] for m in again] == ["j1", "j2"]


def test_stats_counts_http_connections_while_they_are_open(server_factory):
    """A kept-alive HTTP connection to msgout (a twisted.web door) is counted while open,
    as an smss connection is, and forgotten once closed."""
    import http.client

    s = server_factory(listen={"smss": LOOP, "msgout": LOOP, "admin": LOOP})
    web = http.client.HTTPConnection("127.0.0.1", s.ports["msgout"], timeout=10)
    web.request("GET", "/v1/queues")
    web.getresponse().read()
    smss = SmssClient("127.0.0.1", s.smss_port)
    conns = json.loads(mqctl(s, "--json", "stats"))["connections"]
    assert len(conns["msgout"]) == 1 and conns["msgout"][0].startswith("127.0.0.1:")
    assert len(conns["smss"]) == 1
    web.close()
    smss.close()
    wait_until(lambda: json.loads(mqctl(s, "--json", "stats"))["connections"]["msgout"] == [],
               30, "the closed HTTP connection forgotten")
