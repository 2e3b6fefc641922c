"""Synchronous replication between real broker processes on loopback: a write is
acknowledged only once the follower holds it, on every protocol."""

import json
import os
import random
import signal
import threading
import time

import pytest

from mqserver.store import format as fmt
from protocols.remoting import codes
from protocols.smss.client import SmssClient, SmssError
from tests.support.msgout import Api, Console
from tests.support.nsq import V2
from tests.support.remoting_client import RemotingClient
from tests.support.rmq import namesrv_addr, run_client, sends
from tests.integration.test_replication import log_records
from tests.support.etcd import free_port
from tests.support.server import ServerProcess
from tests.support.smss import read_topic
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(240)

ALIVE = {"timeout": {"server": {"alive": 300}}}


def master_config(replicas=1, timeout_ms=1500, **extra):
    cfg = dict(ALIVE, replication={"syncReplicas": replicas, "syncTimeoutMs": timeout_ms})
    cfg.update(extra)
    return cfg


def status(port):
    with SmssClient("127.0.0.1", port) as c:
        return c.topic_info("$replication")


def wait_confirming(master, n=1, timeout=30.0):
    """Wait until C{n} followers confirm to C{master} and are caught up."""
    wait_until(lambda: len(status(master.smss_port)["sync"]["confirming"]) >= n
               and status(master.smss_port)["sync"]["available"],
               timeout, f"{n} confirming followers", interval=0.1)


def start_follower(server_factory, master_port, name="follower", **kw):
    return server_factory(name, config=ALIVE, extra_args=[
        "--role", "slave", "--master", f"127.0.0.1:{master_port}"], **kw)


def test_no_follower_no_acknowledgement(server_factory):
    """Without a follower a publish fails with smss's error at once; the message stays
    in the master's log, unseen by consumers, and reaches both once a follower holds it."""
    master = server_factory("master", config=master_config())
    with SmssClient("127.0.0.1", master.smss_port) as c:
        with pytest.raises(SmssError) as e:
            c.create("t")
        assert "replicas" in str(e.value)
        with pytest.raises(SmssError) as e:
            c.publish("t", [b"not acknowledged"])
        assert "store error" in str(e.value) and "0 of 1 replicas" in str(e.value)
    assert read_topic(master, "t", until_alive=True) == []
    follower = start_follower(server_factory, master.smss_port)
    wait_confirming(master)
    with SmssClient("127.0.0.1", master.smss_port) as c:
        c.publish("t", [b"acknowledged"])
    for server in (master, follower):
        assert [m.body for m in read_topic(server, "t", until_alive=True)] == [
            b"not acknowledged", b"acknowledged"]
    # the master's first term's epoch record, the CREATE and the PUB
    assert status(master.smss_port)["sync"]["unavailable"] == 3


def test_acknowledged_means_on_the_follower(server_factory):
    """Every acknowledged publish is on the follower when its answer arrives."""
    master = server_factory("master", config=master_config())
    follower = start_follower(server_factory, master.smss_port)
    wait_confirming(master)
    with SmssClient("127.0.0.1", master.smss_port) as c:
        c.create("t")
        for i in range(200):
            c.publish("t", [b"m%d" % i, b"n%d" % i])
            assert status(follower.smss_port)["appliedEventId"] >= status(master.smss_port)["appliedEventId"]
    assert len(read_topic(follower, "t", count=400)) == 400


def test_a_stopped_follower_times_the_write_out(server_factory):
    """A follower that stops answering (SIGSTOP) makes a publish fail within the timeout;
    once it runs again the next publish succeeds and the failed one is readable."""
    master = server_factory("master", config=master_config(timeout_ms=800))
    follower = start_follower(server_factory, master.smss_port)
    wait_confirming(master)
    with SmssClient("127.0.0.1", master.smss_port) as c:
        c.create("t")
        os.kill(follower.proc.pid, signal.SIGSTOP)
        try:
            start = time.monotonic()
            with pytest.raises(SmssError) as e:
                c.publish("t", [b"timed out"])
            took = time.monotonic() - start
            assert "within 800 ms" in str(e.value)
            assert took >= 0.7, took
        finally:
            os.kill(follower.proc.pid, signal.SIGCONT)
        wait_until(lambda: status(master.smss_port)["sync"]["available"], 20, "the follower back")
        c.publish("t", [b"after"])
    assert [m.body for m in read_topic(master, "t", until_alive=True)] == [b"timed out", b"after"]
    assert status(master.smss_port)["sync"]["timeouts"] == 1


def test_a_restarted_master_shows_only_confirmed_writes(server_factory, tmp_path):
    """A write no follower confirmed stays hidden from consumers across a restart of the
    master, and shows once a follower holds it."""
    port = free_port()
    master = ServerProcess(tmp_path / "master", config=master_config(),
                           listen={"smss": f"tcp:{port}:interface=127.0.0.1"})
    try:
        master.start()
        follower = start_follower(server_factory, port)
        wait_confirming(master)
        with SmssClient("127.0.0.1", port) as c:
            c.create("t")
            c.publish("t", [b"confirmed"])
        follower.stop()
        with SmssClient("127.0.0.1", port) as c:
            with pytest.raises(SmssError):
                c.publish("t", [b"unconfirmed"])
        master.stop()
        master.start()
        assert "1 writes after eventId" in master.current_log()
        assert [m.body for m in read_topic(master, "t", until_alive=True)] == [b"confirmed"]
        follower.start()
        wait_until(lambda: status(port)["sync"]["committedEventId"] >= 3, 30, "the confirmation")
        assert [m.body for m in read_topic(master, "t", until_alive=True)] == [
            b"confirmed", b"unconfirmed"]
    finally:
        master.close()


def test_a_follower_shows_its_consumers_only_what_the_master_committed(server_factory):
    """A follower holds records its master wrote but did not commit (two replicas wanted,
    one connected: nothing confirms) back from its consumers, across a restart of the
    follower too, and shows them once the master commits them."""
    master = server_factory("master", config=master_config(replicas=2))
    first = start_follower(server_factory, master.smss_port, "first")
    wait_until(lambda: len(status(master.smss_port)["sync"]["confirming"]) == 1, 30,
               "the first follower confirming")
    with SmssClient("127.0.0.1", master.smss_port) as c:
        with pytest.raises(SmssError):
            c.create("t")
        with pytest.raises(SmssError) as e:
            c.publish("t", [b"unconfirmed"])
        assert "1 of 2 replicas" in str(e.value)
    last = status(master.smss_port)["appliedEventId"]
    assert status(master.smss_port)["sync"]["committedEventId"] < last

    def holds_all():
        return status(first.smss_port)["appliedEventId"] == last

    wait_until(holds_all, 30, "the follower holding the master's writes")
    assert read_topic(first, "t", until_alive=True) == []
    first.stop()
    first.start()
    wait_until(holds_all, 30, "the restarted follower holding the master's writes")
    assert read_topic(first, "t", until_alive=True) == []
    second = start_follower(server_factory, master.smss_port, "second")
    wait_until(lambda: status(master.smss_port)["sync"]["committedEventId"] >= last, 30,
               "the master committing its writes")
    for server in (first, second):
        assert [m.body for m in read_topic(server, "t", count=1)] == [b"unconfirmed"]
    with SmssClient("127.0.0.1", master.smss_port) as c:
        c.publish("t", [b"confirmed"])
    for server in (first, second):
        assert [m.body for m in read_topic(server, "t", count=2)] == [
            b"unconfirmed", b"confirmed"]


def test_nsq_pub_fails_without_follower(server_factory):
    """NSQ's PUB answers E_PUB_FAILED when no follower confirms."""
    master = server_factory("master", config=master_config(),
                            listen={"smss": "tcp:0:interface=127.0.0.1",
                                    "nsqd_tcp": "tcp:0:interface=127.0.0.1"})
    conn = V2(master.ports["NsqdFactory"])
    try:
        conn.send(b"PUB t\n" + len(b"hello").to_bytes(4, "big") + b"hello")
        kind, data = conn.frame()
    finally:
        conn.close()
    assert kind == 1 and data.startswith(b"E_PUB_FAILED"), (kind, data)
    assert b"replicas" in data


def test_msgout_and_console_fail_without_follower(server_factory):
    """msgout answers 503 with its JSON error, the console ERR, when no follower confirms;
    with one they publish."""
    loop = "tcp:0:interface=127.0.0.1"
    master = server_factory("master", config=master_config(),
                            listen={"smss": loop, "msgout": loop, "console": loop})
    api = Api(master.ports["MsgoutSite"])
    console = Console(master.ports["ConsoleFactory"])
    try:
        status_code, body = api.call("PUT", "/v1/queues/q", {})
        assert status_code == 503, (status_code, body)  # stored, not acknowledged
        status_code, body = api.call("POST", "/v1/queues/q/messages",
                                     {"messages": [{"body": "hello"}]})
        assert status_code == 503 and "replicas" in json.dumps(body), (status_code, body)
        console.send(b"PUB q hello")
        line = console.line()
        assert line.startswith(b"ERR") and b"replicas" in line, line
        start_follower(server_factory, master.smss_port)
        wait_confirming(master)
        assert len(api.publish("q", "again")) == 1
        console.send(b"PUB q again")
        assert console.line().startswith(b"OK")
    finally:
        api.close()
        console.close()


def _send(client, topic, body, queue_id=0, timeout=10.0):
    header = {"producerGroup": "PG", "topic": topic, "defaultTopic": "TBW102",
              "defaultTopicQueueNums": "4", "queueId": str(queue_id), "sysFlag": "0",
              "bornTimestamp": str(int(time.time() * 1000)), "flag": "0",
              "properties": "UNIQ_KEY\x01K%s\x02WAIT\x01true\x02" % body.decode(),
              "reconsumeTimes": "0", "unitMode": "false", "batch": "false"}
    return client.call(codes.SEND_MESSAGE, header, body, timeout=timeout)


def test_rocketmq_sync_master_answers_as_4_9(server_factory):
    """rocketmq.brokerRole SYNC_MASTER: SLAVE_NOT_AVAILABLE (11) without a slave,
    SEND_OK with one, FLUSH_SLAVE_TIMEOUT (12) when it does not confirm in time; each
    carries the stored message's id and queue offset, as 4.9's do."""
    listen = {"smss": "tcp:0:interface=127.0.0.1", "broker": "tcp:0:interface=127.0.0.1"}
    master = server_factory("master", listen=listen, config=dict(
        ALIVE, rocketmq={"brokerRole": "SYNC_MASTER", "syncFlushTimeout": 800}))
    port = master.ports["BrokerDoor"]
    with SmssClient("127.0.0.1", master.smss_port) as c:
        with pytest.raises(SmssError):
            c.create("T")  # the topic is stored all the same
    client = RemotingClient("127.0.0.1", port)
    try:
        r = _send(client, "T", b"one")
        assert r.code == codes.SLAVE_NOT_AVAILABLE, (r.code, r.remark)
        assert r.ext_fields["msgId"] and r.ext_fields["queueOffset"] == "0"
        follower = start_follower(server_factory, master.smss_port)
        wait_confirming(master)
        r = _send(client, "T", b"two")
        assert r.code == codes.SUCCESS and r.ext_fields["queueOffset"] == "1"
        os.kill(follower.proc.pid, signal.SIGSTOP)
        try:
            r = _send(client, "T", b"three")
            assert r.code == codes.FLUSH_SLAVE_TIMEOUT and r.ext_fields["queueOffset"] == "2"
        finally:
            os.kill(follower.proc.pid, signal.SIGCONT)
        config = client.call(codes.GET_BROKER_CONFIG, {})
        assert "brokerRole=SYNC_MASTER" in config.body.decode()
    finally:
        client.close()


def test_cpp_producer_reports_the_sync_master_statuses(server_factory, tmp_path):
    """The RocketMQ C++ client against a SYNC_MASTER without a slave: every try of a send
    is answered SLAVE_NOT_AVAILABLE, which its sync send retries and then reports as
    "No route info of this topic" (rocketmq-client-cpp's sendAutoRetrySelectImpl /
    sendDefaultImpl, as against a 4.9.4 broker); each try is stored. With a slave its
    sends are SEND_OK, and the tries stored before reach the slave too."""
    loop = "tcp:0:interface=127.0.0.1"
    master = server_factory("master", listen={"smss": loop, "namesrv": loop, "broker": loop},
                            config=dict(ALIVE, rocketmq={"brokerRole": "SYNC_MASTER"}))
    with SmssClient("127.0.0.1", master.smss_port) as c:
        with pytest.raises(SmssError):
            c.create("CppSync")
    home, ns = tmp_path / "home", namesrv_addr(master)
    namesrv = RemotingClient("127.0.0.1", master.ports["NamesrvFactory"])
    try:  # the broker registers the new topic with its nameserver on its next round
        wait_until(lambda: namesrv.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "CppSync"}).code
                   == codes.SUCCESS, 60, "the topic's route", interval=0.2)
    finally:
        namesrv.close()
    lines = run_client(home, "produce", ns, "CppSync", "--count", 1, "--group", "PS1")
    errors = [x["error"] for x in lines if "error" in x]
    assert errors and "No route info of this topic" in errors[-1], lines
    follower = start_follower(server_factory, master.smss_port)
    wait_confirming(master)
    lines = run_client(home, "produce", ns, "CppSync", "--count", 3, "--group", "PS2",
                       "--body", "after-{i}")
    assert [x["status"] for x in sends(lines)] == [0, 0, 0], lines  # SEND_OK
    bodies = [m.body for m in read_topic(follower, "CppSync", until_alive=True)]
    assert bodies[-3:] == [b"after-0", b"after-1", b"after-2"]
    assert len(bodies) > 3 and set(bodies[:-3]) == {b"msg-0"}  # the tries of the first send


class Publisher(threading.Thread):
    """Publishes one message per round trip, over C{kind}'s protocol, to its own topic
    until its connection fails; an error answer (no follower confirmed) is not an
    acknowledgement."""

    TOPICS = {"smss": "t", "nsq": "n", "rocketmq": "r"}

    def __init__(self, ports, kind, name):
        super().__init__(daemon=True)
        self.ports = ports
        self.kind = kind
        self.prefix = name
        self.acked = []
        self.refused = 0

    def bodies(self):
        for i in range(10**9):
            yield b"%s-%d" % (self.prefix, i)

    def run(self):
        try:
            getattr(self, "_" + self.kind)()
        except (ConnectionError, OSError, SmssError):
            pass

    def _smss(self):
        with SmssClient("127.0.0.1", self.ports["smss"], timeout=10.0) as c:
            for body in self.bodies():
                try:
                    c.publish("t", [body])
                except SmssError:
                    self.refused += 1
                    continue
                self.acked.append(body)

    def _nsq(self):
        conn = V2(self.ports["nsqd_tcp"])
        try:
            for body in self.bodies():
                conn.send(b"PUB n\n" + len(body).to_bytes(4, "big") + body)
                kind, data = conn.frame()
                if kind == 0 and data == b"OK":
                    self.acked.append(body)
                else:
                    self.refused += 1  # E_PUB_FAILED: not acknowledged, connection kept
        finally:
            conn.close()

    def _rocketmq(self):
        client = RemotingClient("127.0.0.1", self.ports["broker"])
        try:
            for body in self.bodies():
                r = _send(client, "r", body)
                if r.code == codes.SUCCESS:
                    self.acked.append(body)
                else:
                    self.refused += 1  # SLAVE_NOT_AVAILABLE, FLUSH_SLAVE_TIMEOUT: stored, not acknowledged
        finally:
            client.close()


def held_bodies(server, topic):
    """The bodies of C{topic}'s messages in C{server}'s commit log (what it holds, shown
    to its consumers or not yet)."""
    return {r[6] for r in log_records(server.data)
            if r[1] == fmt.MESSAGE_MAGIC and r[3] == topic}


def test_master_sigkilled_loses_no_acknowledged_message(server_factory, tmp_path):
    """Publishers on smss, NSQ and RocketMQ; the master SIGKILLed at random moments,
    eight times: after each kill the follower holds every message the master
    acknowledged, on every protocol, and its consumers receive them all once the master
    is back and commits what the follower holds."""
    rng = random.Random(7)
    ports = {door: free_port() for door in ("smss", "nsqd_tcp", "broker")}
    config = master_config(timeout_ms=3000)
    config["rocketmq"] = {"brokerRole": "SYNC_MASTER", "syncFlushTimeout": 3000}
    master = ServerProcess(tmp_path / "master", config=config, listen={
        door: f"tcp:{port}:interface=127.0.0.1" for door, port in ports.items()})
    try:
        master.start()
        follower = start_follower(server_factory, ports["smss"])
        wait_confirming(master)
        with SmssClient("127.0.0.1", ports["smss"]) as c:
            for topic in Publisher.TOPICS.values():
                c.create(topic)
        acked = {kind: [] for kind in Publisher.TOPICS}
        for k in range(8):
            if k:
                master.start()
                wait_confirming(master)
            pubs = [Publisher(ports, kind, b"k%d-%d-%s" % (k, i, kind.encode()))
                    for i, kind in enumerate(("smss", "smss", "nsq", "rocketmq"))]
            for p in pubs:
                p.start()
            time.sleep(rng.uniform(0.2, 1.0))
            master.kill()
            for p in pubs:
                p.join(15)
                assert not p.is_alive()
                acked[p.kind] += p.acked
            for kind, topic in Publisher.TOPICS.items():
                held = held_bodies(follower, topic)
                lost = [b for b in acked[kind] if b not in held]
                assert not lost, (f"kill {k + 1}: {len(lost)} of {len(acked[kind])} messages"
                                  f" acknowledged over {kind} not on the follower")
        assert all(len(v) > 20 for v in acked.values()), {k: len(v) for k, v in acked.items()}
        master.start()
        wait_confirming(master)

        def all_committed():
            s = status(follower.smss_port)
            return (s["committedEventId"] or 0) >= s["appliedEventId"]

        wait_until(all_committed, 30, "the follower told that the master committed its log")
        for kind, topic in Publisher.TOPICS.items():
            shown = {m.body for m in read_topic(follower, topic, until_alive=True, timeout=60)}
            assert set(acked[kind]) <= shown, kind
    finally:
        master.close()
