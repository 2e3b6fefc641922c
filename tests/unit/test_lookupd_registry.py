"""The lookupd registration client and registry in process."""

import struct

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from mqserver.cluster.lookupd import LookupRegistry
from protocols.nsq.lookupd_client import LookupdClients, _LookupdPeer


class Node:
    broadcast_address = "127.0.0.1"
    hostname = "h"
    tcp_port = 4150
    http_port = 4151

    def __init__(self, regs):
        self.reactor = Clock()
        self.regs = regs

    def registrations(self):
        return self.regs


def reply(data):
    return struct.pack(">I", len(data)) + data


def connect(owner):
    peer = _LookupdPeer(owner)
    transport = StringTransport()
    peer.makeConnection(transport)
    return peer, transport


def test_a_refused_registration_is_not_sent_again_and_the_others_are():
    owner = LookupdClients(Node({"a": [], "b": ["c"]}), [])
    peer, transport = connect(owner)
    assert transport.value().endswith(b"REGISTER a\nREGISTER b\nREGISTER b c\n")
    peer.dataReceived(reply(b'{"version":"1.3.0"}') + reply(b"E_BAD_TOPIC REGISTER topic name 'a' is not valid"))
    assert owner.refused == {("a", "")}
    # the lookupd closes after a fatal error; the next connection skips the refused name
    peer.connectionLost(None)
    _, transport = connect(owner)
    assert b"REGISTER a\n" not in transport.value()
    assert transport.value().endswith(b"REGISTER b\nREGISTER b c\n")


def test_replies_are_matched_to_what_they_answer():
    owner = LookupdClients(Node({"a": []}), [])
    peer, _ = connect(owner)
    peer.ping()
    peer.dataReceived(reply(b"{}") + reply(b"OK") + reply(b"E_INVALID something"))
    assert owner.refused == set()  # the error answered the PING, not the REGISTER


def test_a_node_registered_with_its_own_embedded_lookupd_is_listed_once():
    info = {"broadcast_address": "127.0.0.1", "tcp_port": 4150, "http_port": 4151, "hostname": "h",
            "remote_address": "127.0.0.1:4150", "version": "1.3.0"}
    registry = LookupRegistry(clock=lambda: 0.0)
    registry.local_source = lambda: (info, {"t": []})
    registry.identify("peer1", dict(info, remote_address="127.0.0.1:50000"))
    registry.register("peer1", "t")
    assert len(registry.lookup("t")[1]) == 1
    assert len(registry.nodes()) == 1
    # another nsqd on the same lookupd is still listed
    registry.identify("peer2", dict(info, tcp_port=5150, http_port=5151))
    registry.register("peer2", "t")
    assert sorted(p["tcp_port"] for p in registry.lookup("t")[1]) == [4150, 5150]
