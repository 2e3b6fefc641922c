"""Find the records of one byte range of a commit-log segment (executor side, scalar).

A segment is split into byte ranges so a task's memory does not depend on the segment
size (L{spark.audit.ranges}). Each range owns the records that I{start} inside it:

- the range at the segment's start begins at offset 0;
- any other range finds its first record boundary by scanning for a record whose magic,
  sizes and physical offset (which must equal the record's own position: eight bytes
  that rarely match by chance) are valid, and whose successor is valid too, or is the
  end of the segment;
- it then walks record by record (C{pos += TotalSize}) until a record starts at or past
  the range's end, reading past the end to finish the last record.

The walk stops early, exactly where L{mqserver.store.format.scan_buffer} stops: a BLANK
record, an all-zero tail, the end of the file, or a torn or corrupt record (the same
details as C{scan_buffer} gives). The record at the end of a range is checked too, so
damage at a range boundary is reported by the range before it. The job keeps, per
segment, only what comes before the first stop (L{spark.audit.ranges.consolidate}).

Imports only the format module, numpy and the standard library.

test-case-name: tests.spark.test_ranges
"""

import re

import numpy as np

from mqserver.store import format as fmt
from spark.audit import records as rec

try:
    from mqserver.store.native import walk as _walk
except ImportError:  # the zip shipped to a cluster (spark.audit.package) holds no C code
    _walk = None

_MIN_SIZE = fmt.HEADER_SIZE + 3
_MAGICS = (fmt.MESSAGE_MAGIC, fmt.ADMIN_MAGIC)
#: Either record magic, as bytes, for finding candidate boundaries.
_MAGIC_RE = re.compile(
    re.escape(fmt.MESSAGE_MAGIC.to_bytes(4, "big")) + b"|" + re.escape(fmt.ADMIN_MAGIC.to_bytes(4, "big"))
)
_ZERO_WINDOW = 4096


class Chunk:
    """The bytes C{[lo, lo + len(buf))} of one segment file, extended on demand.

    @ivar seg_start: the segment's commit-log offset (its file name).
    @ivar length: the file's length.
    """

    def __init__(self, read_at, seg_start, length, lo, hi):
        self.read_at = read_at
        self.seg_start = seg_start
        self.length = length
        self.lo = lo
        data = read_at(lo, hi - lo) if hi > lo else bytearray()
        # A bytearray is taken as it is (L{spark.audit.ranges.Reader} reads into one).
        self.buf = data if type(data) is bytearray else bytearray(data)

    @property
    def hi(self):
        """The file position after the last byte held."""
        return self.lo + len(self.buf)

    def need(self, upto):
        """Make sure the bytes up to file position C{upto} (capped at the file's end)
        are held."""
        upto = min(upto, self.length)
        if upto > self.hi:
            # Read ahead a little so a run of large records does not read one by one.
            upto = min(self.length, max(upto, self.hi + (1 << 20)))
            self.buf += self.read_at(self.hi, upto - self.hi)


def check_record(chunk, pos):
    """Check the record (or end marker) at file position C{pos}.

    Returns C{("record", size)} for a readable record, C{("blank", declared_size)},
    C{("zeros", None)}, C{("eof", None)}, or C{(kind, detail)} with kind C{"torn"} or
    C{"corrupt"} and the detail L{fmt.scan_buffer} gives."""
    end = chunk.length
    if pos >= end:
        return "eof", None
    chunk.need(pos + max(_ZERO_WINDOW, fmt.HEADER_SIZE))
    buf, r = chunk.buf, pos - chunk.lo
    if end - pos < fmt.BLANK_SIZE:
        if not any(buf[r : r + end - pos]):
            return "zeros", None
        return "torn", "fewer than 8 bytes left"
    size, magic = fmt.BLANK.unpack_from(buf, r)
    if magic == fmt.BLANK_MAGIC:
        return "blank", pos + size
    if size == 0 and magic == 0 and not any(buf[r : r + min(end - pos, _ZERO_WINDOW)]):
        return "zeros", None
    if magic not in _MAGICS:
        return "corrupt", f"bad magic {magic:#x}"
    if size < _MIN_SIZE:
        return "corrupt", f"bad size {size}"
    if pos + size > end:
        return "torn", f"size {size} runs past the end"
    chunk.need(pos + size)
    if not _inner_ok(chunk.buf, r, size):
        return "corrupt", "inner lengths disagree with size"
    (phys,) = fmt.I64.unpack_from(chunk.buf, r + fmt.OFF_PHYSICAL_OFFSET)
    if phys != chunk.seg_start + pos:
        return "corrupt", f"physical offset {phys}"
    if magic == fmt.MESSAGE_MAGIC:
        damaged = rec.header_damage(chunk.buf, r)
        if damaged:
            return "corrupt", damaged
    return "record", size


def _inner_ok(buf, r, size):
    (body_len,) = fmt.I32.unpack_from(buf, r + fmt.OFF_BODY_LEN)
    if body_len < 0 or fmt.HEADER_SIZE + body_len + 3 > size:
        return False
    t = r + fmt.HEADER_SIZE + body_len
    tlen = buf[t]
    if fmt.HEADER_SIZE + body_len + 1 + tlen + 2 > size:
        return False
    plen = int.from_bytes(buf[t + 1 + tlen : t + 3 + tlen], "big")
    return fmt.record_size(body_len, tlen, plen) == size


def find_boundary(chunk, a, b):
    """Return the file position of the first record that starts in C{[a, b)} (see the
    module docstring), or None when none does."""
    search_from = a
    while True:
        chunk.need(min(b, chunk.length) + 8)
        m = _MAGIC_RE.search(chunk.buf, max(0, search_from + 4 - chunk.lo))
        if m is None:
            if chunk.hi >= min(b, chunk.length) + 8 or chunk.hi >= chunk.length:
                return None
            continue
        pos = chunk.lo + m.start() - 4
        if pos >= b:
            return None
        search_from = pos + 1
        if pos < a:
            continue
        kind, size = check_record(chunk, pos)
        if kind != "record":
            continue
        after, _ = check_record(chunk, pos + size)
        if after in ("record", "blank", "zeros", "eof"):
            return pos


def walk(chunk, a, b):
    """Walk the records starting in C{[a, b)}.

    Returns C{(positions, stop)}: the file positions of the records, and why the walk
    ended: C{("pass", pos, None)} when the next record starts at C{pos >= b}, else
    C{(kind, pos, detail)} with kind C{blank} (detail: the declared segment size),
    C{zeros}, C{eof}, C{torn} or C{corrupt}.

    The loop checks only what it needs to move on (magic, size, the file's end), in C
    where the store's speedups are built (C{mqserver.store.native.walk}); the
    inner lengths and physical offsets of the records it returns are checked in bulk by
    the caller (L{spark.audit.columns.first_invalid}), which cuts the list at the first
    bad one, as a record-by-record scan would have stopped there."""
    positions = []
    pos = 0 if a == 0 else find_boundary(chunk, a, b)
    if pos is None:
        return positions, ("pass", None, None)
    end, unpack, append = chunk.length, fmt.BLANK.unpack_from, positions.append
    chunk.need(min(b, end) + _ZERO_WINDOW)
    buf, lo = chunk.buf, chunk.lo
    last = -1
    while pos < b:
        if _walk is not None:  # the C step, up to what needs this loop's care
            found, at = _walk(buf, pos - lo, b - lo, end - lo)
            if found:
                positions.extend((np.frombuffer(found, dtype=np.int64) + lo).tolist())
            pos = at + lo
            if pos >= b:
                break
        if pos + fmt.BLANK_SIZE > lo + len(buf):
            break
        size, magic = unpack(buf, pos - lo)
        if (magic == fmt.MESSAGE_MAGIC or magic == fmt.ADMIN_MAGIC) and size >= _MIN_SIZE and pos + size <= end:
            if pos + size > lo + len(buf):
                chunk.need(pos + size)
                buf = chunk.buf
            if size == last:
                n = same_size_run(buf, lo, pos, size, b, end)
                if n:
                    positions.extend(range(pos, pos + n * size, size))
                    pos += n * size
                    continue
            append(pos)
            pos += size
            last = size
        else:
            break
    kind, detail = check_record(chunk, pos)
    if kind != "record":
        return positions, (kind, pos, detail)
    if pos < b:  # only when the buffer ran out just before a valid record
        more, stop = walk_from(chunk, pos, b)
        return positions + more, stop
    return positions, ("pass", pos, None)


_RUN_MAX = 1 << 16


def same_size_run(buf, lo, pos, size, b, end):
    """Return how many records of C{size} follow one another from C{pos} (each with a
    record magic and that TotalSize, each starting before C{b}, ending in the file and
    in C{buf}), checked with numpy: a broker writing messages of one size produces long
    such runs. 0 when the run would be too short to be worth it.

    The run is probed in windows growing eightfold (8, 64, 512 ... records), so the
    work is proportional to the run found: on a log where publishers interleave, two
    records of one size in a row are common and the run after them short, and checking
    the longest possible run each time cost more than the whole walk."""
    held = lo + len(buf)
    k_max = min(-(-(b - pos) // size), (min(end, held) - pos) // size, _RUN_MAX)
    if k_max < 8:
        return 0
    arr = np.frombuffer(buf, dtype=np.uint8)
    try:
        done, k = 0, 8
        while True:
            k = min(k, k_max)
            starts = pos - lo + size * np.arange(done, k)
            heads = arr[starts[:, None] + _HEAD_BYTES].view(">u4")
            magic = heads[:, 1]
            ok = (heads[:, 0] == size) & ((magic == fmt.MESSAGE_MAGIC) | (magic == fmt.ADMIN_MAGIC))
            if not ok.all():
                return done + int(np.argmin(ok))
            if k == k_max:
                return k
            done, k = k, k * 8
    finally:
        del arr


_HEAD_BYTES = np.arange(8)


def walk_from(chunk, pos, b):
    """Go on walking from the known record boundary C{pos} (see L{walk})."""
    positions = []
    while pos < b:
        kind, detail = check_record(chunk, pos)
        if kind != "record":
            return positions, (kind, pos, detail)
        positions.append(pos)
        pos += detail
    kind, detail = check_record(chunk, pos)
    if kind != "record":
        return positions, (kind, pos, detail)
    return positions, ("pass", pos, None)


def resync(chunk, pos):
    """Return the file position of the first record after the damaged bytes at C{pos}
    that recovery would step to (L{fmt.next_record}: a record header naming its own
    offset, with a known magic and sizes that fit), checked whole as L{check_record}
    does; None when the segment holds none (the damage runs to its end). Reads on
    from C{pos} a window at a time, so a record close to the damage does not need the
    rest of the segment read."""
    search, window = pos, _RESYNC_WINDOW
    while True:
        chunk.need(min(chunk.length, pos + window))
        nxt = fmt.next_record(chunk.buf, search - chunk.lo, chunk.seg_start + chunk.lo)
        if nxt is not None:
            at = chunk.lo + nxt
            if check_record(chunk, at)[0] == "record":
                return at
            search = at
        elif chunk.hi >= chunk.length:
            return None
        else:
            window *= 2


#: The bytes L{resync} first reads past damage looking for the next record.
_RESYNC_WINDOW = 1 << 20
