"""Every scenario shipped in contrib/scenarios/ run with ``mqctl fault run`` against the
real broker while a real client (the RocketMQ C++ client, pynsq, the repo's smss client)
does what the scenario tests, showing what the client sees."""

import json
import os
import subprocess
import sys

import pytest

from protocols.smss.client import SmssClient, SmssError
from tests.integration.test_ops_mqctl import mqctl
from tests.support.nsq import run_client
from tests.support.rmq import namesrv_addr, run_client as run_rmq, sends
from tests.support.faults import fault_broker
from tests.support.server import ROOT
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(300)
SCENARIOS = os.path.join(ROOT, "contrib", "scenarios")


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    with fault_broker(tmp_path_factory.mktemp("scenarios"), "broker", "namesrv", "nsqd_tcp",
                      "smss") as s:
        yield s


class Scenario:
    """A running ``mqctl fault run``, started once its first step's rules are set."""

    def __init__(self, srv, name):
        first = len(load(name)[0]["rules"])
        before = srv.current_log().count("fault rule")
        url = f"http://127.0.0.1:{srv.ports['AdminSite']}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "protocols.admin.ctl", "--url", url, "fault", "run",
             os.path.join(SCENARIOS, name), "--interval", "0.05"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin"})
        wait_until(lambda: srv.current_log().count("fault rule") >= before + first, 20,
                   f"the rules of {name}")

    def done(self):
        """Wait for the scenario's end; return its output (it must have succeeded)."""
        out, err = self.proc.communicate(timeout=200)
        assert self.proc.returncode == 0, out + err
        assert out.splitlines()[-1] == "scenario done"
        return out


def load(name):
    import yaml

    with open(os.path.join(SCENARIOS, name), encoding="utf-8") as f:
        return yaml.safe_load(f)


def test_every_shipped_scenario_is_tested():
    assert sorted(os.listdir(SCENARIOS)) == sorted(CLIENTS)


# -- RocketMQ: the C++ client -------------------------------------------------------------


def rocketmq_send(srv, topic):
    """Send one message with the C++ client (its route known first); return what
    send_sync gave."""
    ns = namesrv_addr(srv)
    return sends(run_rmq(srv.home, "produce", ns, topic, "--count", 1, "--group", "PG"))


def rocketmq_sends_once(srv, name, topic):
    rocketmq_send(srv, topic)  # the route is known: the scenario's rule sees the send
    s = Scenario(srv, name)
    got = [x for x in run_rmq(srv.home, "produce", namesrv_addr(srv), topic, "--count", 1, "--group", "PG")
           if "status" in x or "error" in x]  # fmt: skip
    assert [x.get("status") for x in got] == [0], got  # a failed send says what the client said
    s.done()
    assert len(json.loads(mqctl(srv, "--json", "peek", topic, "-n", "10")[1])) == 2


def rocketmq_route_changes(srv, name, topic):
    """A C++ producer starting while the nameserver answers TOPIC_NOT_EXIST to its route
    lookup, then one starting while the lookup is slow (each process looks its route up
    as it starts): the first falls back to the default topic's route (TBW102) and the
    second waits; both sends succeed."""
    rocketmq_send(srv, topic)  # the topic exists on the broker
    s = Scenario(srv, name)
    first = run_rmq(srv.home, "produce", namesrv_addr(srv), topic, "--count", 1, "--group", "PR1")
    second = run_rmq(srv.home, "produce", namesrv_addr(srv), topic, "--count", 1, "--group", "PR2")
    out = s.done()
    assert out.count(": used up") == 2
    assert [x["status"] for x in sends(first) + sends(second)] == [0, 0]


# -- NSQ: pynsq ---------------------------------------------------------------------------

#: pynsq's Writer publishing one message, again after each error (0.2 s later), until OK
#: or five tries; prints what each try got.
PYNSQ_RETRY = """
import nsq, tornado.ioloop
loop = tornado.ioloop.IOLoop.current()
loop.call_later(60, loop.stop)
w = nsq.Writer(["127.0.0.1:%d" % PARAMS["port"]], reconnect_interval=0.5)
seen = []
def answered(conn, data):
    seen.append(str(data) if isinstance(data, Exception) else data.decode())
    if seen[-1] == "OK" or len(seen) >= 5:
        loop.stop()
    else:
        loop.call_later(0.2, pub)
def pub():
    w.pub(PARAMS["topic"], b"m", callback=answered)
loop.call_later(1.0, pub)
loop.start()
print(json.dumps(seen))
"""


def nsq_publishes(srv, name, topic):
    s = Scenario(srv, name)
    seen = run_client(PYNSQ_RETRY, port=srv.ports["NsqdFactory"], topic=topic)
    s.done()
    assert seen[-1] == "OK"
    assert [m["body"] for m in json.loads(mqctl(srv, "--json", "peek", topic)[1])] == ["m"]
    return seen


def nsq_retries(srv, name, topic):
    seen = nsq_publishes(srv, name, topic)
    assert len(seen) == 3 and all("E_PUB_FAILED" in x for x in seen[:2]), seen


def nsq_reconnects(srv, name, topic):
    seen = nsq_publishes(srv, name, topic)
    assert len(seen) >= 2 and "OK" not in seen[:-1], seen  # an error, then OK


def nsq_once(srv, name, topic):
    assert nsq_publishes(srv, name, topic) == ["OK"]


# -- smss: the repo's client --------------------------------------------------------------


def smss_publish_retrying(srv, topic):
    """Publish one message, reconnecting after a closed connection and retrying after an
    ERR, until stored or five tries; return what each try raised (None: stored)."""
    seen = []
    c = SmssClient("127.0.0.1", srv.smss_port)
    try:
        while len(seen) < 5:
            try:
                c.publish(topic, [b"m"])
                seen.append(None)
                break
            except SmssError as e:
                seen.append(f"ERR {e}")
            except ConnectionError as e:
                seen.append(f"closed: {e}")
                c.close()
                c = SmssClient("127.0.0.1", srv.smss_port)
    finally:
        c.close()
    return seen


def smss_publishes(srv, name, topic, expect):
    c = SmssClient("127.0.0.1", srv.smss_port)
    c.create(topic)
    c.close()
    s = Scenario(srv, name)
    seen = smss_publish_retrying(srv, topic)
    s.done()
    assert seen == expect
    assert [m["body"] for m in json.loads(mqctl(srv, "--json", "peek", topic)[1])] == ["m"]


def smss_alive(srv, name, topic):
    s = Scenario(srv, name)
    c = SmssClient("127.0.0.1", srv.smss_port)
    try:
        c.alive()  # answered 2 s late: the client waits for it
    finally:
        c.close()
    out = s.done()
    assert "applied 1 times" in out


CLIENTS = {
    "rocketmq-system-busy.yaml": rocketmq_sends_once,
    "rocketmq-dropped-connection.yaml": rocketmq_sends_once,
    "rocketmq-half-frame.yaml": rocketmq_sends_once,
    "rocketmq-slow-heartbeat.yaml": rocketmq_sends_once,
    "rocketmq-route-changes.yaml": rocketmq_route_changes,
    "nsq-pub-failed.yaml": nsq_retries,
    "nsq-dropped-connection.yaml": nsq_reconnects,
    "nsq-half-frame.yaml": nsq_once,
    "nsq-slow-answers.yaml": nsq_once,
    "smss-busy.yaml": lambda srv, name, topic: smss_publishes(
        srv, name, topic, ["ERR store busy, try again"] * 2 + [None]),
    "smss-dropped-connection.yaml": lambda srv, name, topic: smss_publishes(
        srv, name, topic, ["closed: smss server closed the connection", None]),
    "smss-half-frame.yaml": lambda srv, name, topic: smss_publishes(srv, name, topic, [None]),
    "smss-slow-alive.yaml": smss_alive,
}


@pytest.mark.parametrize("name", sorted(CLIENTS))
def test_scenario(srv, name):
    """The scenario runs to its end with the client doing what it tests."""
    topic = "S" + name.split(".")[0].replace("-", "_")
    CLIENTS[name](srv, name, topic)
