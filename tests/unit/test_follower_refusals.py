"""What a follower tells clients, in process (real stores, StringTransports): its write
refusals name the master on msgout and the console, only a master registers its topics
with nsqlookupd; and a master that lost its leadership acknowledges nothing more (the
sync gate's fail_all)."""

import json

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from mqserver.errors import ReplicationError
from mqserver.replication.sync import SyncGate
from protocols.console.factory import make_factory as console_factory
from protocols.nsq.factory import make_factory as nsq_factory
from protocols.nsq.lookupd_client import LookupdClients, _LookupdPeer
from protocols.nsq.node import get_node
from protocols.smss import client_codec as cc
from protocols.smss.factory import make_factory as smss_factory
from protocols.smss.payload import encode_payload
from tests.support.inprocess import failure_of, result_of, running
from tests.unit.test_msgout_http import connect, request, site
from tests.unit.test_sync_replication import Follower

LEADER_ADDRESS = "10.0.0.2:12301"


def test_fail_all_fails_the_waiting_writes_and_every_later_one():
    clock = Clock()
    gate = SyncGate(clock, 1, 1000)
    f = Follower()
    gate.attach(f)
    first, second = gate.wait(3), gate.wait(5)
    gate.fail_all("leadership lost")
    for d in (first, second):
        assert str(failure_of(d, ReplicationError).value) == "leadership lost"
    assert clock.getDelayedCalls() == []  # their timeouts are cancelled
    assert str(failure_of(gate.wait(6), ReplicationError).value) == "leadership lost"


def test_msgout_names_the_master_in_a_refused_write(tmp_path):
    clock, store, broker, s = site(tmp_path)
    t, ch = connect(s)
    assert request(ch, t, clock, b"PUT", b"/v1/queues/q", b"{}")[0] == 200
    broker.set_role(False, LEADER_ADDRESS)
    status, body = request(ch, t, clock, b"POST", b"/v1/queues/q/messages",
                           json.dumps({"messages": [{"body": "x"}]}).encode())
    assert status == 503
    assert body["master"] == LEADER_ADDRESS and LEADER_ADDRESS in body["error"]
    store.close()


def test_the_console_names_the_master_in_a_refused_write(tmp_path):
    with running(tmp_path / "data", console_factory) as node:
        result_of(node.broker.queues.declare("t", {}))
        node.broker.set_role(False, LEADER_ADDRESS)
        c = node.connect(node.factory)
        c.send(b"PUB t hello\r\n")
        assert c.take() == f"ERR pub message (master: {LEADER_ADDRESS})\r\n".encode()


def test_only_a_master_registers_its_topics_with_nsqlookupd(tmp_path):
    with running(tmp_path / "data", nsq_factory) as node:
        node.broker.create_topic("t")
        nsq = get_node(node.broker, node.config, node.clock)
        nsq.tcp_port = 4150
        clients = LookupdClients(nsq, [])
        nsq.lookupd_clients.append(clients)
        peer = _LookupdPeer(clients)
        t = StringTransport()
        peer.makeConnection(t)
        assert b"REGISTER t\n" in t.value()
        t.clear()
        node.broker.set_role(False, LEADER_ADDRESS)  # told at once, not at the next resync
        assert t.value() == b"UNREGISTER t\n"
        assert nsq.registrations() == {}
        t.clear()
        node.broker.set_role(True)
        assert t.value() == b"REGISTER t\n"


def test_smss_names_the_master_in_a_refused_write(tmp_path):
    with running(tmp_path / "data", smss_factory) as node:
        node.broker.set_role(False, LEADER_ADDRESS)
        c = node.connect(node.factory)
        c.send(cc.encode_create("t") + cc.encode_pub("t", encode_payload([b"x"])))
        answers = cc.ResponseDecoder(cc.Expect.SIMPLE).feed(c.take())
        assert [a.text for a in answers] == [
            f"just master can manage topic (master: {LEADER_ADDRESS})",
            f"just master can pub message (master: {LEADER_ADDRESS})"]
