"""Test support for the RocketMQ front doors: a broker process with the nameserver and
broker doors on ephemeral ports, and the real C++ client run in subprocesses."""

import json
import os
import re
import subprocess
import sys
import time

from protocols.remoting import codes
from tests.support.remoting_client import RemotingClient
from tests.support.server import ROOT, ServerProcess, Standalone
from tests.support.wait import wait_until

CLIENT = os.path.join(ROOT, "tests", "support", "rmq_client.py")
#: Every delay level is 1 s, so retries (level 3 + reconsumeTimes) come back quickly.
FAST_DELAYS = " ".join(["1s"] * 18)


def rocket_server(data, config=None, namesrv=True, broker=True, smss=True):
    """Return an unstarted L{ServerProcess} with the RocketMQ doors on port 0."""
    listen = {}
    if smss:
        listen["smss"] = "tcp:0:interface=127.0.0.1"
    if namesrv:
        listen["namesrv"] = "tcp:0:interface=127.0.0.1"
    if broker:
        listen["broker"] = "tcp:0:interface=127.0.0.1"
    return ServerProcess(data, config=config, listen=listen)


def namesrv_addr(server):
    return f"127.0.0.1:{server.ports['NamesrvFactory']}"


def broker_port(server):
    return server.ports["BrokerDoor"]


def wait_members(server, group, n, timeout=30.0):
    """Wait until consumer group C{group} of C{server}'s broker door has C{n} consumers
    registered (bounded)."""
    c = RemotingClient("127.0.0.1", broker_port(server))

    def members():
        r = c.call(codes.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
        return r.code == codes.SUCCESS and len(json.loads(r.body)["consumerIdList"]) >= n

    try:
        wait_until(members, timeout, f"group {group} to have {n} members", interval=0.2)
    finally:
        c.close()


def usable_route(namesrv, topic):
    """Return the route the nameserver at C{namesrv} (``host:port``) gives for C{topic}
    if clients can use it (queues on a broker whose master address it knows), else
    None."""
    host, _, port = namesrv.rpartition(":")
    c = RemotingClient(host, int(port))
    try:
        r = c.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    finally:
        c.close()
    if r.code != codes.SUCCESS:
        return None
    route = json.loads(r.body)
    masters = {b["brokerName"] for b in route.get("brokerDatas", []) if "0" in (b.get("brokerAddrs") or {})}
    return route if any(q["brokerName"] in masters for q in route.get("queueDatas", [])) else None


def wait_route(namesrv, topic, timeout=30.0):
    """Wait until the nameserver gives a usable route for C{topic}, as a client's first
    lookup needs: before a producer sends to a new topic (TBW102's route, which
    auto-creation goes by) or a consumer starts (the topic's own, else it finds no queue
    until its next route poll, 30 s later)."""
    return wait_until(lambda: usable_route(namesrv, topic), timeout,
                      f"the nameserver's route of {topic}", interval=0.1)


class ClientProc:
    """One run of tests/support/rmq_client.py."""

    def __init__(self, home, command, namesrv, topic, *args, timeout=60.0):
        self.timeout = timeout
        self.home = str(home)
        self.cmdline = [sys.executable, CLIENT, command, "--namesrv", namesrv, "--topic", topic, *map(str, args)]
        env = dict(os.environ, HOME=str(home), PYTHONPATH=ROOT)
        os.makedirs(str(home), exist_ok=True)
        self.proc = subprocess.Popen(self.cmdline, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=str(home))
        self.started_at = time.monotonic()

    def result(self):
        """Wait (bounded) for the process; return its JSON lines. Kills it on timeout."""
        left = max(1.0, self.timeout - (time.monotonic() - self.started_at))
        try:
            out, err = self.proc.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate(timeout=10)
            raise AssertionError(f"client timed out: {self.cmdline}\n{out.decode()[-2000:]}\n{err.decode()[-2000:]}")
        lines = [json.loads(x) for x in out.decode().splitlines() if x.startswith("{")]
        if self.proc.returncode != 0:
            raise AssertionError(f"client failed ({self.proc.returncode}): {self.cmdline}\n{err.decode()[-3000:]}")
        return lines

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate(timeout=10)


#: What the C++ push consumer logs as it takes a queue (with the offset it starts at),
#: takes a dropped one back, or drops one (RebalancePush::updateRequestTableInRebalance).
_QUEUE_LOG = re.compile(
    r"\((?:info)\):(add mq|after resume the pull handle of this pullRequest, its mq is|drop mq):"
    r"MessageQueue \[topic=([^,]*), brokerName=([^,]*), queueId=(\d+)\]")


def held_queues(client, topic):
    """Return the queues of C{topic} the push consumer C{client} (a L{ClientProc} of
    ``consume``) pulls from now, as {(broker name, queue id)}: read from the C++ client's
    own log, where it records each queue it takes (after its start offset is known) or
    drops at a rebalance. Empty before its first rebalance."""
    path = os.path.join(client.home, "logs", "rocketmq-cpp", f"{client.proc.pid}_rocketmq-cpp.log.0")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except FileNotFoundError:
        return set()
    held = set()
    for what, t, broker, qid in _QUEUE_LOG.findall(text):
        if t == topic:
            (held.discard if what == "drop mq" else held.add)((broker, int(qid)))
    return held


def wait_split(clients, topic, queues, timeout=30.0):
    """Wait until the push consumers C{clients} of one group hold disjoint shares of
    C{topic}'s C{queues} (a set of (broker name, queue id)) that together cover them all,
    with their start offsets known: from then on every message sent is consumed once."""
    def split():
        held = [held_queues(c, topic) for c in clients]
        return all(held) and sum(map(len, held)) == len(queues) and set().union(*held) == queues

    wait_until(split, timeout, f"consumers to share the queues of {topic}", interval=0.1)


def wait_held_by_each(clients, topic, queues, timeout=30.0):
    """Wait until every push consumer of C{clients} (broadcasting) holds all C{queues}
    of C{topic} with its start offsets known."""
    wait_until(lambda: all(held_queues(c, topic) == queues for c in clients), timeout,
               f"each consumer to hold every queue of {topic}", interval=0.1)


def run_client(home, command, namesrv, topic, *args, timeout=60.0):
    return ClientProc(home, command, namesrv, topic, *args, timeout=timeout).result()


def messages(lines):
    return [x for x in lines if "body" in x]


def sends(lines):
    return [x for x in lines if "status" in x]


class NamesrvProcess(Standalone):
    """A standalone ``twistd -n mqnamesrv`` on an ephemeral port."""

    def __init__(self, log_path):
        super().__init__("mqnamesrv", ["--listen", "tcp:0:interface=127.0.0.1"], log_path)

    @property
    def port(self):
        return self.ports["namesrv"]

    @property
    def addr(self):
        return f"127.0.0.1:{self.port}"
