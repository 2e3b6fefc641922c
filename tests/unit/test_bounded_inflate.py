"""Bounded decompression: NSQ's deflate and snappy stream readers hand out
at most one piece a call, the nsqd protocol takes a stream that inflates to far more
one piece per reactor turn with reading paused meanwhile, and RocketMQ's zlib bodies
stop inflating at their limit."""

import json
import struct
import zlib

import cramjam
import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from mqserver.broker.broker import Broker
from mqserver.store.store import MessageStore
from protocols.nsq import config as nsq_config
from protocols.nsq.compress import (SNAPPY_STREAM_IDENTIFIER, DeflateCompressor,
                                    DeflateDecompressor, SnappyDecompressor)
from protocols.nsq.node import NsqNode
from protocols.nsq.protocol import NsqdFactory
from protocols.remoting.inflate import InflateError, InflateLimitError, inflate

PIECE = 1 << 16


def raw_deflate(data):
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH)


def drain(dec, data):
    """Feed C{data} once, then empty calls while C{pending}; return the pieces."""
    out = [dec.decompress(data)]
    while dec.pending:
        out.append(dec.decompress(b""))
    return out


def test_deflate_decompressor_hands_out_bounded_pieces():
    """4 MiB of zeros in about 4 KiB come out 64 KiB at a time, all of them."""
    dec = DeflateDecompressor(max_output=PIECE)
    pieces = drain(dec, raw_deflate(bytes(4 << 20)))
    assert max(map(len, pieces)) == PIECE
    assert b"".join(pieces) == bytes(4 << 20)


def test_deflate_decompressor_keeps_order_when_fed_while_pending():
    """Input fed while output is still pending follows what was before it."""
    comp = DeflateCompressor()
    dec = DeflateDecompressor(max_output=PIECE)
    first = dec.decompress(comp.compress(b"a" * (3 * PIECE)))
    assert dec.pending
    rest = drain(dec, comp.compress(b"tail"))
    assert first + b"".join(rest) == b"a" * (3 * PIECE) + b"tail"


def test_snappy_decompressor_hands_out_bounded_pieces():
    """Many 64 KiB chunks fed at once come out a bounded number at a time."""
    chunk = bytes(cramjam.snappy.compress(bytes(65536)))[len(SNAPPY_STREAM_IDENTIFIER):]
    dec = SnappyDecompressor(max_output=4 * 65536)
    pieces = drain(dec, SNAPPY_STREAM_IDENTIFIER + chunk * 40)
    assert max(map(len, pieces)) <= 4 * 65536
    assert sum(map(len, pieces)) == 40 * 65536


# -- the nsqd protocol in process ---------------------------------------------------------


@pytest.fixture
def nsqd(tmp_path):
    clock = Clock()
    store = MessageStore(str(tmp_path), clock, clock=clock.seconds, segment_size=1 << 20)
    broker = Broker(store, clock)
    store.open()
    broker.start()
    config = {key: spec[1] for key, spec in nsq_config.KEYS.items()}
    node = NsqNode(broker, config, clock)
    yield NsqdFactory(node), clock
    store.close()


def connect(factory):
    proto = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 5000))
    transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 5000))
    proto.makeConnection(transport)
    return proto, transport


def test_nsqd_inflates_a_deflate_stream_one_piece_a_turn(nsqd):
    """A deflated stream of 8 MiB of NOPs (8 KiB on the wire) is not inflated in one
    go: reading stops, each reactor turn takes one piece, reading resumes at the end."""
    factory, clock = nsqd
    proto, transport = connect(factory)
    body = json.dumps({"feature_negotiation": True, "deflate": True, "deflate_level": 1}).encode()
    proto.dataReceived(b"  V2IDENTIFY\n" + struct.pack(">I", len(body)) + body)
    assert proto._decompressor is not None
    comp = zlib.compressobj(1, zlib.DEFLATED, -15)
    nops = 2 << 20  # NOP lines: 8 MiB
    stream = comp.compress(b"NOP\n" * nops) + comp.compress(b"PUB t\n\0\0\0\x01x") + comp.flush(zlib.Z_SYNC_FLUSH)
    seen = []
    real = proto.decoder.feed
    proto.decoder.feed = lambda data: seen.append(len(data)) or real(data)
    proto.dataReceived(stream)
    assert transport.producerState == "paused"
    turns = 0
    while proto._inflate_call is not None:
        clock.advance(0)
        turns += 1
        assert turns < 100
    assert transport.producerState == "producing"
    assert max(seen) <= 1 << 20  # one piece at a time
    assert sum(seen) == 4 * nops + 11
    clock.advance(0)
    assert proto.broker.topic("t") is not None  # the PUB after the NOPs was run


def test_nsqd_closes_on_a_bad_deflate_stream_and_drops_it(nsqd):
    factory, clock = nsqd
    proto, transport = connect(factory)
    body = json.dumps({"feature_negotiation": True, "deflate": True}).encode()
    proto.dataReceived(b"  V2IDENTIFY\n" + struct.pack(">I", len(body)) + body)
    proto.dataReceived(b"\xff" * 64)
    assert transport.disconnecting
    assert proto._decompressor is None


# -- RocketMQ zlib bodies -----------------------------------------------------------------


def test_inflate_stops_at_the_limit():
    bomb = zlib.compress(bytes(64 << 20))
    with pytest.raises(InflateLimitError):
        inflate(bomb, 1 << 20)


def test_inflate_returns_a_body_at_the_limit():
    assert inflate(zlib.compress(b"x" * 1000), 1000) == b"x" * 1000


@pytest.mark.parametrize("body", [b"not zlib", zlib.compress(b"x" * 1000)[:-6], b""])
def test_inflate_refuses_corrupt_and_truncated_streams(body):
    with pytest.raises(InflateError):
        inflate(body, 1 << 20)
