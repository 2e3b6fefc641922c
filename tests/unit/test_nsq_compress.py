"""Snappy framing and raw deflate stream transforms used after IDENTIFY upgrades."""
import os
import random
import zlib

import pytest

from protocols.nsq.codec import OK, CommandDecoder, encode_command
from protocols.nsq.compress import (SNAPPY_STREAM_IDENTIFIER, CompressionError,
                                    DeflateCompressor, DeflateDecompressor, SnappyCompressor,
                                    SnappyDecompressor)
from protocols.nsq.messages import Nop, Pub

# observed right after nsqd's IDENTIFY JSON frame
SNAPPY_OK = bytes.fromhex("ff 06 00 00 73 4e 61 50 70 59 01 0e 00 00 26 98 2b cf"
                          "00 00 00 06 00 00 00 00 4f 4b")
DEFLATE_OK = bytes.fromhex("62 60 60 60 63 60 60 60 f0 f7 06 00 00 00 ff ff 00 00 00 ff ff")

PAYLOADS = [b"", OK, b"hello" * 3, os.urandom(5000), b"a" * 200000,
            bytes(random.Random(1).randrange(4) for _ in range(150000))]


def pieces(data, sizes=(1, 2, 3, 7, 100, 4096)):
    """Split ``data`` into irregular chunks."""
    out, i, k = [], 0, 0
    while i < len(data):
        n = sizes[k % len(sizes)]
        out.append(data[i:i + n])
        i, k = i + n, k + 1
    return out


def test_snappy_ok_frame_matches_observed_bytes():
    """Compressing the OK frame first gives nsqd's exact bytes (stream id + uncompressed chunk)."""
    assert SnappyCompressor().compress(OK) == SNAPPY_OK


def test_snappy_observed_bytes_decompress_bytewise():
    """The observed snappy bytes decompress to OK even when fed one byte at a time."""
    dec = SnappyDecompressor()
    assert b"".join(dec.decompress(bytes([b])) for b in SNAPPY_OK) == OK


def test_snappy_stream_id_only_once():
    """Later writes continue the stream without repeating the stream identifier."""
    comp = SnappyCompressor()
    first, second = comp.compress(b"x" * 10), comp.compress(b"y" * 10)
    assert first.startswith(SNAPPY_STREAM_IDENTIFIER)
    assert not second.startswith(SNAPPY_STREAM_IDENTIFIER)
    assert comp.compress(b"") == b""


@pytest.mark.parametrize("index", range(len(PAYLOADS)))
def test_snappy_round_trip_over_split_chunks(index):
    """Several writes, fed to the reader in irregular pieces, come back intact."""
    comp, dec = SnappyCompressor(), SnappyDecompressor()
    writes = [PAYLOADS[index], b"tail", PAYLOADS[index][:777]]
    stream = b"".join(comp.compress(w) for w in writes)
    assert b"".join(dec.decompress(p) for p in pieces(stream)) == b"".join(writes)


def test_snappy_large_payload_compresses():
    """Compressible input really is compressed (compressed chunks, 64 KiB blocks)."""
    data = b"a" * 200000
    assert len(SnappyCompressor().compress(data)) < len(data) // 10


def test_snappy_skips_padding_and_skippable_chunks():
    """Padding (0xfe) and skippable (0x80-0xfd) chunks are ignored, even when split."""
    comp = SnappyCompressor()
    stream = comp.compress(b"abc") + b"\xfe\x03\x00\x00xyz" + b"\x99\x00\x01\x00" + b"q" * 256
    stream += comp.compress(b"def")
    dec = SnappyDecompressor()
    assert b"".join(dec.decompress(p) for p in pieces(stream, (1, 5, 50))) == b"abcdef"


@pytest.mark.parametrize("bad", [
    SNAPPY_OK[:14] + b"\x00\x00\x00\x00" + SNAPPY_OK[18:],  # wrong CRC
    SNAPPY_OK[10:],                                           # no stream identifier
    b"\xff\x06\x00\x00sNaPpZ",                                # bad identifier
    SNAPPY_STREAM_IDENTIFIER + b"\x02\x01\x00\x00x",          # reserved unskippable chunk
    SNAPPY_STREAM_IDENTIFIER + b"\x00\xff\xff\xff",           # oversized chunk
])
def test_snappy_corrupt_streams_raise(bad):
    """Corrupt or unsupported snappy input raises CompressionError."""
    with pytest.raises(CompressionError):
        SnappyDecompressor().decompress(bad)


def test_deflate_observed_bytes_inflate_to_ok():
    """nsqd's observed deflate bytes inflate to the OK frame, whole and bytewise."""
    assert DeflateDecompressor().decompress(DEFLATE_OK) == OK
    dec = DeflateDecompressor()
    assert b"".join(dec.decompress(bytes([b])) for b in DEFLATE_OK) == OK


@pytest.mark.parametrize("level", [1, 6, 9])
@pytest.mark.parametrize("index", range(len(PAYLOADS)))
def test_deflate_round_trip_over_split_chunks(level, index):
    """Each write is flushed: the reader gets it all back at once, pieces in any split."""
    comp, dec = DeflateCompressor(level), DeflateDecompressor()
    for write in (PAYLOADS[index], b"more", PAYLOADS[index][::-1]):
        out = comp.compress(write)
        assert b"".join(dec.decompress(p) for p in pieces(out)) == write


def test_deflate_is_raw_and_uses_level():
    """Output is raw DEFLATE (no zlib header) decodable with wbits -15; levels differ."""
    data = bytes(random.Random(2).randrange(16) for _ in range(100000))
    fast, best = DeflateCompressor(1).compress(data), DeflateCompressor(9).compress(data)
    assert zlib.decompressobj(-15).decompress(best) == data
    assert len(best) < len(fast)
    with pytest.raises(ValueError):
        DeflateCompressor(0)


def test_deflate_corrupt_raises():
    """Garbage deflate input raises CompressionError."""
    with pytest.raises(CompressionError):
        DeflateDecompressor().decompress(b"\xff\xff\xff\xff")


def test_decompressed_commands_feed_the_decoder():
    """Commands sent through a snappy stream decode normally after decompression."""
    comp, dec, cmds = SnappyCompressor(), SnappyDecompressor(), CommandDecoder(expect_magic=False)
    stream = comp.compress(encode_command("PUB", "t", body=b"x" * 70000)) + comp.compress(b"NOP\n")
    out = []
    for p in pieces(stream, (333,)):
        out += cmds.feed(dec.decompress(p))
    assert out == [Pub("t", b"x" * 70000), Nop()]
