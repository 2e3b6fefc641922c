"""Incremental stream transforms for nsqd's IDENTIFY compression upgrades.

* snappy: the snappy *framing format* (stream identifier, then chunks carrying a
  masked CRC-32C), as nsqd's snappy upgrade uses in both directions. Block
  compression and CRC checking are done by ``cramjam``.
* deflate: raw DEFLATE (RFC 1951, no zlib header) with a sync flush after every
  write, as nsqd's deflate upgrade uses, at the negotiated level.

Every object has ``compress(bytes) -> bytes`` (output decodable by the peer as soon
as it arrives) or ``decompress(bytes) -> bytes`` (returns what the bytes fed so far
complete, at most ``max_output`` bytes a call; ``pending`` then says more is ready
without further input: call ``decompress(b"")`` for it). Bounding each call keeps a
small stream that inflates to gigabytes from ever being held in memory: the caller
hands each piece to its decoder, whose size limits apply before anything is buffered.
Corrupt input raises :class:`CompressionError`.
"""
from __future__ import annotations

import zlib


class _LoadedOnUse:
    """Stands for the C{cramjam} module until an attribute is first read, then imports
    it: cramjam adds about 1.5 MB to the broker's resident size, and only a client
    that negotiates snappy needs it (bench/idle_rss.py)."""

    def __getattr__(self, name):
        import cramjam as module

        globals()["cramjam"] = module
        return getattr(module, name)


cramjam = _LoadedOnUse()

__all__ = ["CompressionError", "SnappyCompressor", "SnappyDecompressor",
           "DeflateCompressor", "DeflateDecompressor", "SNAPPY_STREAM_IDENTIFIER"]

SNAPPY_STREAM_IDENTIFIER = b"\xff\x06\x00\x00sNaPpY"
_MAX_BLOCK = 65536
# limits of nsqd's snappy reader: encoded chunk <= max encoded len of a 64 KiB block
# (32 + n + n/6) plus the 4-byte CRC; uncompressed chunk <= 64 KiB plus the CRC
_MAX_COMPRESSED_CHUNK = 32 + _MAX_BLOCK + _MAX_BLOCK // 6 + 4
_MAX_UNCOMPRESSED_CHUNK = _MAX_BLOCK + 4
#: Default bound on what one decompress call returns.
MAX_OUTPUT = 1 << 20


class CompressionError(ValueError):
    """The peer's compressed stream is corrupt or unsupported."""


class SnappyCompressor:
    """Snappy framing-format writer; the first non-empty output starts with the stream id."""

    def __init__(self) -> None:
        self._started = False

    def compress(self, data: bytes) -> bytes:
        """Frame ``data`` as chunks of at most 64 KiB (uncompressed chunks when it doesn't pay)."""
        if not data:
            return b""
        out = bytes(cramjam.snappy.compress(data))
        if self._started:
            # cramjam frames each call as a whole stream; continue ours instead
            return out[len(SNAPPY_STREAM_IDENTIFIER):]
        self._started = True
        return out


class SnappyDecompressor:
    """Incremental snappy framing-format reader (verifies each chunk's CRC-32C)."""

    def __init__(self, max_output: int = MAX_OUTPUT) -> None:
        self._buf = bytearray()
        self._seen_identifier = False
        self._skip = 0  # bytes of a skippable chunk still to discard
        # a data chunk inflates to at most 64 KiB: count chunks, not bytes
        self._max_chunks = max(1, max_output // _MAX_BLOCK)
        self.pending = False

    def decompress(self, data: bytes) -> bytes:
        """Feed ``data``; return the bytes of the chunks it completes, up to
        ``max_output`` bytes (``pending`` is then true if whole chunks are left)."""
        if self._skip:
            n = min(self._skip, len(data))
            self._skip -= n
            data = data[n:]
        buf = self._buf
        buf += data
        pos, end = 0, len(buf)
        chunks = []
        self.pending = False
        while end - pos >= 4:
            if len(chunks) == self._max_chunks:
                self.pending = True
                break
            kind = buf[pos]
            length = buf[pos + 1] | buf[pos + 2] << 8 | buf[pos + 3] << 16
            if not self._seen_identifier and kind != 0xFF:
                raise CompressionError("snappy stream does not start with its identifier")
            if kind == 0x00 or kind == 0x01:
                limit = _MAX_COMPRESSED_CHUNK if kind == 0 else _MAX_UNCOMPRESSED_CHUNK
                if length < 4 or length > limit:
                    raise CompressionError(f"snappy chunk length {length} out of range")
            elif kind == 0xFF:
                if length != 6:
                    raise CompressionError("bad snappy stream identifier")
            elif kind < 0x80:
                raise CompressionError(f"unsupported snappy chunk type {kind:#04x}")
            else:  # padding / skippable: drop without buffering it
                if end - pos - 4 < length:
                    self._skip = length - (end - pos - 4)
                    pos = end
                    break
                pos += 4 + length
                continue
            if end - pos - 4 < length:
                break
            if kind == 0xFF:
                if buf[pos:pos + 10] != SNAPPY_STREAM_IDENTIFIER:
                    raise CompressionError("bad snappy stream identifier")
                self._seen_identifier = True
            else:
                chunks.append(buf[pos:pos + 4 + length])
            pos += 4 + length
        del buf[:pos]
        if not chunks:
            return b""
        try:
            # cramjam decodes a whole framed stream and checks every CRC
            out = cramjam.snappy.decompress(SNAPPY_STREAM_IDENTIFIER + b"".join(chunks))
        except cramjam.DecompressionError as exc:
            raise CompressionError(str(exc)) from None
        return bytes(out)


class DeflateCompressor:
    """Raw DEFLATE writer at ``level`` (1..9); each call ends with a sync flush."""

    def __init__(self, level: int = 6) -> None:
        if not 1 <= level <= 9:
            raise ValueError(f"deflate level {level} not in 1..9")
        self.level = level
        self._c = zlib.compressobj(level, zlib.DEFLATED, -15)

    def compress(self, data: bytes) -> bytes:
        """Compress ``data`` and sync-flush so the peer can inflate all of it now."""
        return self._c.compress(data) + self._c.flush(zlib.Z_SYNC_FLUSH)


class DeflateDecompressor:
    """Raw DEFLATE reader."""

    def __init__(self, max_output: int = MAX_OUTPUT) -> None:
        self._d = zlib.decompressobj(-15)
        self._max_output = max_output
        self.pending = False

    def decompress(self, data: bytes) -> bytes:
        """Feed ``data``; return what it inflates to so far, up to ``max_output`` bytes
        (``pending`` is then true: the rest of the input is kept for the next call)."""
        d = self._d
        if d.unconsumed_tail:
            data = d.unconsumed_tail + data
        try:
            out = d.decompress(data, self._max_output)
        except zlib.error as exc:
            raise CompressionError(str(exc)) from None
        # a full piece may leave output inside zlib even with no input left over
        self.pending = bool(d.unconsumed_tail) or len(out) == self._max_output
        return out
