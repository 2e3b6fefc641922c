"""Segments as byte ranges: planning (driver), decoding (executors), consolidation (driver).

A task decodes one byte range of one segment (C{--split-mb}, 64 MiB by default), so its
memory depends on the range, never on the segment size. It reads the file itself by its
absolute URI (as listed by Hadoop's file system on the driver): C{file:} URIs with
C{os.pread}, anything else through C{pyarrow.fs}, so executors need not share the
driver's working directory. Output is Arrow batches of items (L{spark.audit.columns}),
plus one C{"range"} item per range that says where its walk ended and why.

The driver then joins the ranges of each segment back together (L{consolidate}): the
first range that stopped (BLANK, zeros, end of file, torn or corrupt record) ends the
segment, as a record-by-record scan would, and ranges after it are dropped. Where a
range's first record is not where the range before it ended (its boundary scan was
misled by damage next to the boundary), the range is walked again from the right place.

test-case-name: tests.spark.test_ranges
"""

import gc
import json
import os
import sys
import zipimport
import zlib
from urllib.parse import unquote, urlparse

import numpy as np

from mqserver.store import format as fmt
from spark.audit import columns as C
from spark.audit import scan

#: One task: a byte range of a segment file; C{start_at} a known record boundary or None.
RANGE_FIELDS = ("uri", "seg_start", "file_length", "range_start", "range_end", "start_at", "digest", "live")
#: Consume-queue files, grouped into tasks: C{uris}; for the compact form the durable
#: queue lengths (JSON C{[[topic, queue_id, length]]}) and log offset, when C{--live}.
CQ_TASK_FIELDS = ("uris", "durable", "log_limit")
BATCH = 65536
_READ_PAD = 64 << 10
DEFAULT_SPLIT = 64 << 20


def plan(files, split=DEFAULT_SPLIT, digest=True, live=None, begin=None):
    """Return the ranges (tuples of L{RANGE_FIELDS}) of C{files}, C{[(name, uri, length)]} of
    the segment files whose names are 20 digits; C{digest}: compute record digests;
    C{live}: the compact form (L{spark.audit.columns.compact_batches}) for these live
    topics (JSON C{{topic: create_event_id}}), else one item per record. C{begin}:
    C{{name: offset}}, a record boundary of the file to decode from (a resumed
    segment), else its start."""
    out = []
    for name, uri, length in files:
        start = int(name)
        first = (begin or {}).get(name, 0)
        for a in range(first, max(length, first + 1), split):
            out.append((uri, start, length, a, min(a + split, length), first if a == first and first else None,
                        digest, live))  # fmt: skip
    return out


def group_files(files, target=DEFAULT_SPLIT):
    """Group C{[(uri, length)]} into lists of URIs of about C{target} bytes each."""
    groups, cur, size = [], [], 0
    for uri, length in files:
        if cur and size + length > target:
            groups.append(cur)
            cur, size = [], 0
        cur.append(uri)
        size += length
    if cur:
        groups.append(cur)
    return groups


#: Hadoop's names for S3, which pyarrow calls C{s3}.
_ARROW_SCHEMES = {"s3a": "s3", "s3n": "s3"}


def arrow_uri(uri):
    """Return C{uri} (as Hadoop lists it) in the scheme pyarrow's file systems know."""
    scheme, sep, rest = uri.partition("://")
    return _ARROW_SCHEMES.get(scheme.lower(), scheme) + sep + rest if sep else uri


class Reader:
    """Reads byte ranges of one file given by URI."""

    def __init__(self, uri):
        u = urlparse(uri)
        self.fd = self.file = None
        if u.scheme in ("", "file"):
            self.fd = os.open(unquote(u.path), os.O_RDONLY)
        else:
            from pyarrow import fs

            filesystem, path = fs.FileSystem.from_uri(arrow_uri(uri))
            self.file = filesystem.open_input_file(path)

    def read_at(self, offset, n):
        """Return up to C{n} bytes at C{offset}: a C{bytearray} for local files, read in
        place (a range is tens of MiB: reading into one buffer, rather than joining
        C{pread} results and copying them into the scan's buffer, saves two copies)."""
        if self.fd is not None:
            buf = bytearray(n)
            got = 0
            with memoryview(buf) as view:
                while got < n:
                    k = os.preadv(self.fd, [view[got:]], offset + got)
                    if not k:
                        break
                    got += k
            if got < n:
                del buf[got:]
            return buf
        return self.file.read_at(n, offset)

    def read_all(self):
        """Return the whole file."""
        if self.fd is not None:
            return self.read_at(0, os.fstat(self.fd).st_size)
        return self.file.read_at(self.file.size(), 0)

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
        else:
            self.file.close()


def decode_range(read_at, seg_start, length, a, b, start_at=None, digest=True, live=None, batch=BATCH):
    """Yield the item batches of the range C{[a, b)} of a segment (see the module
    docstring); the last one is the C{"range"} summary. With C{live} (JSON, see
    L{plan}) the records come in the compact form.

    Damage does not end the walk while a sound record follows it in the segment: as the
    broker's recovery does (L{fmt.scan_buffer} with C{on_damage}), the walk goes on at
    the next record header that names its own offset (L{scan.resync}), and the damaged
    bytes become one C{"problem"} item: C{offset} and C{size} the byte range,
    C{min_eid}/C{max_eid} the eventIds of the sound records before and after it (null
    when that record is in another range or segment). Damage with no sound record after
    it ends the segment (the problem's size is the rest of the file)."""
    if isinstance(live, str):
        live = json.loads(live)
    chunk = scan.Chunk(read_at, seg_start, length, a if start_at is None else start_at, min(length, b + _READ_PAD))
    if start_at is None:
        positions, stop = scan.walk(chunk, a, b)
    else:
        positions, stop = scan.walk_from(chunk, start_at, b)
    first = positions[0] if positions else None
    count = 0
    ids = []
    last_eid = None
    pending = positions
    while True:
        buf = chunk.buf
        arr = np.frombuffer(buf, dtype=np.uint8)
        pos = np.asarray(pending, dtype=np.int64)
        damage = None
        for i in range(0, len(pos), batch):
            part = pos[i : i + batch]
            layout = C.Layout(arr, part - chunk.lo)
            bad, detail = C.first_invalid(layout, part, seg_start, arr)
            if bad is not None:
                damage = ("corrupt", int(part[bad]), detail)
                part = part[:bad]
                layout = C.Layout(arr, part - chunk.lo)
            if len(part):
                if live is not None:
                    yield from C.compact_batches(buf, layout, seg_start, a, live)
                else:
                    yield C.record_batch(buf, layout, seg_start, a, digest)
                eids = layout.h["event_id"].astype(np.int64)
                ids.append(eids)
                last_eid = int(eids[-1])
                count += len(part)
            if bad is not None:
                break
        del arr
        if damage is None:
            if stop[0] not in ("torn", "corrupt"):
                break
            damage = stop
        kind, at, detail = damage
        nxt = scan.resync(chunk, at)
        if nxt is None:  # nothing sound after it: the segment ends here
            stop = damage
            yield C.single_item(kind="problem", segment=seg_start, offset=seg_start + at, size=length - at,
                                problem=kind, detail=detail, range_start=a, min_eid=last_eid)  # fmt: skip
            break
        (after,) = fmt.I64.unpack_from(chunk.buf, nxt - chunk.lo + fmt.OFF_EVENT_ID)
        yield C.single_item(kind="problem", segment=seg_start, offset=seg_start + at, size=nxt - at,
                            problem="corrupt", detail=detail if kind == "corrupt" else f"bad size ({detail})",
                            range_start=a, min_eid=last_eid, max_eid=after)  # fmt: skip
        pending, stop = scan.walk_from(chunk, nxt, b)
    if ids:
        yield C.run_batch(np.concatenate(ids), seg_start, a)
    kind, at, detail = stop
    # The CRC-32 of the bytes from the range's first record to where its walk ended: the
    # driver chains those of a segment's ranges into the segment's (L{crc32_combine}).
    crc = span = None
    if first is not None and at is not None and at >= first:
        with memoryview(chunk.buf) as view:
            crc, span = zlib.crc32(view[first - chunk.lo : at - chunk.lo]), at - first
    yield C.single_item(
        kind="range", segment=seg_start, offset=start_at, size=length, range_start=a, range_end=b, range_first=first,
        seg_records=count, seg_end=at, problem=kind, seg_sealed=kind == "blank", sig_lo=crc, sig_hi=span,
        seg_declared_size=detail if kind == "blank" else None,
        detail=None if kind == "blank" else detail,
    )  # fmt: skip


def settle_worker():
    """Make a reused PySpark worker's housekeeping between tasks cheap. Every task
    function of the audit calls it first.

    A PySpark worker calls C{importlib.invalidate_caches()} before each task and
    C{gc.collect()} after it. Before Python 3.12 the first makes each zip finder in
    C{sys.path_importer_cache} read its archive's whole directory again
    (python/cpython#103200): one for pyspark.zip, py4j's zip and Spark's core jar, which
    Spark puts on the workers' path, and one for each package imported from them; so
    those finders are dropped (an import still to come finds its archive again). The
    full collection walks every object the worker holds, numpy, pyarrow and pyspark's
    modules included; at its first task C{gc.freeze()} puts the objects alive then out
    of its reach, so it looks only at what tasks make, and frees that as before (once
    only: what a later task holds as it starts is garbage after it). Each took some
    20-100 ms of a worker's CPU per task."""
    if sys.version_info < (3, 12):
        cache = sys.path_importer_cache
        for entry, finder in list(cache.items()):
            if isinstance(finder, zipimport.zipimporter):
                del cache[entry]
    if not gc.get_freeze_count():
        gc.freeze()


def numbered(tasks, fields, batches):
    """Yield, as dicts of C{fields}, the C{tasks} whose numbers the first column of the
    Arrow C{batches} holds (the C{id} of C{spark.range}: the job numbers the tasks in the
    JVM and ships the list with the function, so no Python worker turns the driver's
    rows into a DataFrame first). Calls L{settle_worker} first."""
    settle_worker()
    for rb in batches:
        for i in rb.column(0).to_pylist():
            yield dict(zip(fields, tasks[i]))


#: The mark of a capped task that left rows out (L{decode_ranges}, L{decode_cq_compact}).
OVERFLOW = C.OVERFLOW


def capped(batches, cap, keep, marker):
    """Yield the Arrow C{batches} of one task while they hold at most C{cap} rows in all
    (None: no cap). Past it the rest are left out, but those C{keep(batch)} says to keep,
    and the task ends with C{marker(rows it made)} (one row saying it overflowed)."""
    n, over = 0, False
    for b in batches:
        n += b.num_rows
        if cap is None or n <= cap or keep(b):
            yield b
        else:
            over = True
    if over:
        yield marker(n)


def decode_ranges(tasks, batches, cap=None):
    """The C{mapInArrow} function (with C{tasks} bound): task numbers in (L{numbered},
    L{RANGE_FIELDS}), item batches out. With C{cap} a range that makes more items leaves
    out all but its C{"range"} summary and ends with an L{OVERFLOW} item."""
    for r in numbered(tasks, RANGE_FIELDS, batches):
        reader = Reader(r["uri"])
        try:
            items = decode_range(reader.read_at, r["seg_start"], r["file_length"], r["range_start"],
                                 r["range_end"], r["start_at"], r["digest"], r["live"])  # fmt: skip
            summary = lambda b: b.num_rows == 1 and b.column(0)[0].as_py() == "range"  # noqa: E731
            yield from capped(items, cap, summary, lambda n: C.single_item(
                kind=OVERFLOW, segment=r["seg_start"], range_start=r["range_start"], n=n))
        finally:
            reader.close()


def _read_whole(uri):
    reader = Reader(uri)
    try:
        return reader.read_all()
    finally:
        reader.close()


def decode_cq_groups(tasks, batches):
    """The C{mapInArrow} function for consume queues (with C{tasks} bound): task numbers
    in (L{numbered}, L{CQ_TASK_FIELDS}), entries out."""
    for r in numbered(tasks, CQ_TASK_FIELDS, batches):
        for uri in r["uris"]:
            yield C.cq_batch(uri, _read_whole(uri))


def decode_cq_compact(tasks, batches, cap=None):
    """The C{mapInArrow} function for the compact consume queues
    (L{spark.audit.columns.cq_compact_file}, with C{tasks} bound): task numbers in
    (L{numbered}, L{CQ_TASK_FIELDS}), problems and per-block signatures out, file by
    file. With C{cap} a task that makes more rows leaves them out and ends with one row
    whose problem is L{OVERFLOW}."""
    for r in numbered(tasks, CQ_TASK_FIELDS, batches):
        durable = None
        if r["durable"] is not None:
            durable = {(t, int(q)): int(n) for t, q, n in json.loads(r["durable"])}
        rows = (b for uri in r["uris"] for b in C.cq_compact_file(uri, _read_whole(uri), durable,
                                                                     r["log_limit"]).to_batches())  # fmt: skip
        yield from capped(rows, cap, lambda b: False, lambda n: C.cq_overflow(n))


def consolidate(rows, begin=None):
    """Join the C{"range"} items (dicts) of every segment back together.

    Returns C{(segments, keep, rewalk)}: the C{"segment"} items (dicts), the set of
    C{(segment, range_start)} whose items count, and the ranges to walk again from a
    known boundary, C{[(segment, range_start, start_at)]} (empty when all chained). A
    range item's C{offset} is the boundary it was walked from, when it was given one.
    C{begin}: C{{segment: (offset, records)}} of the segments decoded from a record
    boundary past their start (L{plan}), and the records before it."""
    by_seg = {}
    for r in rows:
        by_seg.setdefault(r["segment"], []).append(r)
    segments, keep, rewalk = [], set(), []
    for seg, ranges in sorted(by_seg.items()):
        ranges.sort(key=lambda r: r["range_start"])
        expected, records, crc = (begin or {}).get(seg, (0, 0, 0))
        end = None
        first = ranges[0]["range_start"]
        for r in ranges:
            a = r["range_start"]
            if a != first and expected is not None and r["offset"] != expected:
                want = expected if expected < r["range_end"] else None
                if r["range_first"] != want:
                    rewalk.append((seg, a, expected))
                    break
            keep.add((seg, a))
            records += r["seg_records"]
            if crc is not None and r["sig_hi"] is not None:
                crc = crc32_combine(crc, r["sig_lo"], r["sig_hi"])
            if r["problem"] != "pass":
                end = r
                break
            if r["seg_end"] is not None:
                expected = r["seg_end"]
        if rewalk and rewalk[-1][0] == seg:
            continue
        last = end or ranges[-1]
        segments.append({
            "kind": "segment", "segment": seg, "offset": seg, "size": last["size"], "seg_records": records,
            "seg_end": seg + (last["seg_end"] if last["seg_end"] is not None else last["size"]),
            "seg_sealed": bool(last["seg_sealed"]), "seg_declared_size": last["seg_declared_size"],
            "sig_lo": crc,
        })  # fmt: skip
    return segments, keep, rewalk


def _gf2_times(mat, vec):
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _gf2_square(mat):
    return [_gf2_times(mat, m) for m in mat]


def crc32_combine(crc1, crc2, len2):
    """Return the CRC-32 of C{A + B} from C{crc1 = crc32(A)}, C{crc2 = crc32(B)} and
    C{len2 = len(B)}, without the bytes (zlib's C{crc32_combine}, which Python's zlib
    does not expose): the CRC of C{A} is carried over C{len2} zero bytes by squaring
    the one-zero-bit operator, then C{crc2} is added."""
    if len2 <= 0:
        return crc1
    op = [0xEDB88320] + [1 << n for n in range(31)]  # appends one zero bit
    for _ in range(3):
        op = _gf2_square(op)  # two, four, then eight bits: one zero byte
    while len2:
        if len2 & 1:
            crc1 = _gf2_times(op, crc1)
        len2 >>= 1
        if len2:
            op = _gf2_square(op)  # twice as many zero bytes
    return crc1 ^ crc2


def segment_files(listing):
    """Split a commit-log listing C{[(name, uri, length)]} into segment files (20-digit
    names) and the others (which the old reader reported as problems)."""
    good = [f for f in listing if len(f[0]) == 20 and f[0].isdigit()]
    bad = [f for f in listing if not (len(f[0]) == 20 and f[0].isdigit())]
    return good, bad


def bad_name_item(name, length):
    """The problem item of a file in commitlog/ that is not a segment."""
    return {"kind": "problem", "size": length, "problem": "corrupt", "detail": f"not a segment name: {name}"}


__all__ = ["plan", "decode_range", "numbered", "decode_ranges", "decode_cq_groups", "decode_cq_compact",
           "consolidate", "fmt"]
