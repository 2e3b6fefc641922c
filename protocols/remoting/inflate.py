"""Inflating zlib bodies (compressed batches, compressed REGISTER_BROKER bodies) with a
bound on the result, so a small body cannot expand into gigabytes in the broker."""

import zlib


class InflateError(ValueError):
    """A body that does not inflate, or would inflate past its limit."""


class InflateLimitError(InflateError):
    """A body that would inflate to more than the limit."""

    def __init__(self, limit):
        super().__init__(f"inflates to more than {limit} bytes")
        self.limit = limit


def inflate(data, limit):
    """Return the zlib stream C{data} inflated; raise L{InflateLimitError} as soon as the
    result would pass C{limit} bytes (no more than C{limit} + 1 are ever produced) and
    L{InflateError} for a stream that is corrupt or ends early."""
    d = zlib.decompressobj()
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as exc:
        raise InflateError(str(exc)) from None
    if len(out) > limit:
        raise InflateLimitError(limit)
    if not d.eof:
        raise InflateError("incomplete or truncated stream")
    return out
