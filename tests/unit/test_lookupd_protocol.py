"""The nsqlookupd TCP (V1) protocol in process (StringTransport, a Clock, the broker's
embedded registry): bytewise and pipelined commands, fatal errors mid-stream, and the
producer going with its connection. Frames follow nsq-protocol.md §11.1."""

import json
import struct

import pytest
from twisted.internet.address import IPv4Address

from mqserver.cluster.lookupd import INACTIVE_TIMEOUT
from protocols.nsq.lookupd import make_factory
from protocols.nsq.node import get_node
from tests.support.inprocess import running

PEER = IPv4Address("TCP", "127.0.0.1", 40000)
INFO = json.dumps({"broadcast_address": "127.0.0.1", "tcp_port": 5150, "http_port": 5151,
                   "version": "1.3.0", "hostname": "fake"}).encode()
IDENTIFY = b"IDENTIFY\n" + struct.pack(">I", len(INFO)) + INFO
OK = b"\x00\x00\x00\x02OK"  # §11.1: <i32 size><data>, no frame type


def reply(data):
    return struct.pack(">I", len(data)) + data


def replies(data):
    out, pos = [], 0
    while pos < len(data):
        (n,) = struct.unpack_from(">I", data, pos)
        out.append(data[pos + 4:pos + 4 + n])
        pos += 4 + n
    assert pos == len(data)
    return out


@pytest.fixture
def node(tmp_path):
    with running(tmp_path / "data", make_factory) as n:
        n.registry = get_node(n.broker, n.config, n.clock).lookupd
        yield n


def producers(node, topic):
    """The TCP ports of the live producers of C{topic} other than the node itself."""
    found = node.registry.lookup(topic)
    return [] if found is None else [p["tcp_port"] for p in found[1] if p["tcp_port"] == 5150]


def test_identify_register_ping_fed_one_byte_at_a_time(node):
    c = node.connect(node.factory, PEER)
    c.send_bytewise(b"  V1" + IDENTIFY + b"REGISTER t ch\n" + b"PING\n")
    ident, ok1, ok2 = replies(c.take())
    assert json.loads(ident)["version"] == "1.3.0"
    assert (ok1, ok2) == (b"OK", b"OK")
    assert producers(node, "t") == [5150]


def test_pipelined_commands_in_one_read(node):
    c = node.connect(node.factory, PEER)
    c.send(b"  V1" + IDENTIFY + b"REGISTER a\nREGISTER b c\nUNREGISTER a\nPING\n")
    out = c.take()
    assert out.endswith(OK * 4)
    assert producers(node, "a") == [] and producers(node, "b") == [5150]
    assert c.connected


@pytest.mark.parametrize("bad, error", [
    (b"REGISTER bad!name\n", b"E_BAD_TOPIC REGISTER topic name 'bad!name' is not valid"),
    (b"BOGUS\n", b"E_INVALID invalid command BOGUS"),
    (IDENTIFY, b"E_INVALID cannot IDENTIFY again"),
], ids=["bad-topic", "unknown-verb", "second-identify"])
def test_fatal_error_after_good_commands_closes(node, bad, error):
    c = node.connect(node.factory, PEER)
    c.send(b"  V1" + IDENTIFY + b"REGISTER t\n" + bad + b"REGISTER u\n")
    assert replies(c.take())[1:] == [b"OK", error]
    assert not c.connected
    assert producers(node, "u") == [], "nothing after the fatal error runs"
    assert producers(node, "t") == [], "the producer went with its connection"


def test_register_before_identify_and_bad_magic_are_fatal(node):
    c = node.connect(node.factory, PEER)
    c.send(b"  V1REGISTER t\n")
    assert c.take() == reply(b"E_INVALID client must IDENTIFY")
    assert not c.connected
    d = node.connect(node.factory, PEER)
    d.send_bytewise(b"  V2PING\n")
    assert d.take() == reply(b"E_BAD_PROTOCOL")
    assert not d.connected


def test_producer_goes_with_its_connection(node):
    c = node.connect(node.factory, PEER)
    c.send(b"  V1" + IDENTIFY + b"REGISTER t ch\n")
    c.take()
    assert producers(node, "t") == [5150]
    c.lose()
    assert producers(node, "t") == []


def test_producer_silent_past_the_inactive_timeout_is_not_listed_until_ping(node):
    c = node.connect(node.factory, PEER)
    c.send(b"  V1" + IDENTIFY + b"REGISTER t\n")
    node.clock.advance(INACTIVE_TIMEOUT - 1)
    assert producers(node, "t") == [5150]
    node.clock.advance(2)
    assert producers(node, "t") == []
    c.send(b"PING\n")
    assert producers(node, "t") == [5150]
