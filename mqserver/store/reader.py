"""The read path of the store: consume-queue entries, the records they point to, each
checked as it comes off the disk, and eventId lookups."""

import struct

from mqserver.store import format as fmt
from mqserver.store import native
from mqserver.store.logs import store_logger


#: The read-path record check (format.first_damaged, or its C speedup).
_first_damaged = native.first_damaged
_damage = fmt.record_damage
#: Fields of one consume-queue entry (log offset, size, tag hash), and their struct codes.
_ENTRY_FIELDS = len(fmt.CQ_ENTRY.unpack(bytes(fmt.CQ_ENTRY_SIZE)))
_ENTRY_CODES = fmt.CQ_ENTRY.format.lstrip("@=<>!")
_BYTE_ORDER = fmt.CQ_ENTRY.format[:len(fmt.CQ_ENTRY.format) - len(_ENTRY_CODES)]
#: Structs of n entries at once (n up to _RUN_MAX), made as reads of n entries come.
_RUN_STRUCTS = {}
_RUN_MAX = 64
#: The most bytes of other records one pread may read between two wanted ones: records
#: further apart get their own preads, so the bytes read for a batch stay near its own
#: size (a span of up to 1 MiB read for every pair of records a MiB apart made a batch
#: of 255 small records cost over 100 MiB).
_MAX_GAP = 16 << 10


def _unpack_entries(entries):
    """Return the fields of packed C{entries}, flat: one C{unpack} call, not one per entry."""
    n = len(entries) // fmt.CQ_ENTRY_SIZE
    run = _RUN_STRUCTS.get(n)
    if run is None:
        run = struct.Struct(_BYTE_ORDER + _ENTRY_CODES * n)
        if n <= _RUN_MAX:
            _RUN_STRUCTS[n] = run
    return run.unpack(entries)


class Reader:
    """Owns reading: visible entries of a queue, the records behind them, the checking
    of what is read, and the record of damaged records found (by reads and recovery).

    @ivar damaged_offsets: commit-log offsets of the damaged records reported so far.
    @ivar trusted_from: records at or above this offset were checked by recovery or
        written by this process: reads check their framing only. Below it, reads check
        body CRCs too.
    @ivar damaged_records: damaged records found since start (recovery and reads; each
        counted once).
    """

    def __init__(self, notifier):
        """
        @param notifier: the L{mqserver.store.notify.Notifier} (what is visible).
        """
        self.log = store_logger(self)
        self._notifier = notifier
        self.damaged_offsets = set()
        self.trusted_from = 0
        self.damaged_records = 0
        self.commitlog = None
        self._queues = None

    def open(self, commitlog, table):
        """Read C{commitlog} through the queues of the L{QueueTable} C{table}."""
        self.commitlog = commitlog
        self._queues = table.queues

    def read_entries(self, topic, queue_id, qoffset, count):
        """Return packed consume-queue entries from C{qoffset}, only readable ones."""
        q = self._queues.get((topic, queue_id))
        if q is None:
            return b""
        data = q.read(qoffset, count)
        if not data:
            return data
        vis = self._notifier.visible_end
        off, size, _ = fmt.CQ_ENTRY.unpack_from(data, len(data) - fmt.CQ_ENTRY_SIZE)
        if off + size <= vis:
            return data
        n = 0
        for off, size, _ in fmt.CQ_ENTRY.iter_unpack(data):
            if off + size > vis:
                break
            n += 1
        return data[: n * fmt.CQ_ENTRY_SIZE]

    def read_records(self, entries):
        """Return C{(buffer, [(pos, size), ...])} holding the records of packed C{entries}.

        Records that sit close together in one segment are read with one pread. Every
        record is checked (framing and body CRC) as it comes off the disk; a damaged one
        is left out (reported once, see L{report_damage}), so C{locs} may be shorter than
        C{entries}. Entries below the log start (retention) are left out too."""
        buf, locs = self._read_spans(entries)
        # Entries are in log order: the first is the lowest.
        bad = _first_damaged(buf, locs, fmt.I64.unpack_from(entries, 0)[0] < self.trusted_from)
        if bad < 0:
            return buf, locs
        return buf, self._drop_damaged(buf, locs, bad, entries)

    def _drop_damaged(self, buf, locs, first_bad, entries):
        # The rare path: the locs without the damaged records, each reported.
        offsets = []
        self._read_spans(entries, offsets)  # again, for the offsets of the locs
        keep = locs[:first_bad]
        for i in range(first_bad, len(locs)):
            p, s = locs[i]
            why = _damage(buf, p, s)
            if why is None:
                keep.append(locs[i])
            elif s == 0 and offsets[i] == 0:
                # An all-zero entry: a slot recovery never wrote, because the record that
                # had it was too damaged to name its queue. Recovery reported that record
                # where it found it; this slot is no record, and no other damage.
                continue
            else:
                eid = None
                if s >= fmt.HEADER_SIZE and 0 <= p and p + s <= len(buf):
                    eid = fmt.I64.unpack_from(buf, p + fmt.OFF_EVENT_ID)[0]
                self.report_damage(offsets[i], why, eid)
        return keep

    def report_damage(self, offset, detail, event_id=None):
        """Log a damaged record (once per record) and count it in L{damaged_records}.
        Returns True the first time C{offset} is reported."""
        if offset in self.damaged_offsets:
            return False
        self.damaged_offsets.add(offset)
        self.damaged_records += 1
        log = self.commitlog
        seg = fmt.segment_name(log.segment_start(offset)) if offset >= 0 else "?"
        self.log.error(
            "damaged record skipped: segment {segment} offset {offset} eventId {event_id}:"
            " {detail}",
            segment=seg, offset=offset, event_id="?" if event_id is None else event_id,
            detail=detail,
        )
        return True

    def _read_spans(self, entries, offsets=None):
        # (buffer, locs) of the records of entries; offsets, when given, gets the
        # commit-log offset of each loc.
        log = self.commitlog
        n = len(entries)
        if n == fmt.CQ_ENTRY_SIZE:
            # one record (a consumer keeping up with a publisher): no span to find
            off, size, _ = fmt.CQ_ENTRY.unpack(entries)
            if off < log.min_offset:
                return b"", []
            if offsets is not None:
                offsets.append(off)
            return log.read(off, size), [(0, size)]
        if n >= 2 * fmt.CQ_ENTRY_SIZE:
            # The common case: a queue's next records lie in one segment within 1 MiB
            # (their entries are in log order): one pread, positions in one pass.
            first = fmt.I64.unpack_from(entries, 0)[0]
            last, last_size, _ = fmt.CQ_ENTRY.unpack_from(entries, n - fmt.CQ_ENTRY_SIZE)
            span = last + last_size - first
            if (
                first >= log.min_offset
                and 0 < span <= 1 << 20
                and first // log.segment_size == last // log.segment_size
            ):
                # Entries of one queue are appended in log order, so first..last holds
                # them all.
                fields = _unpack_entries(entries)
                logged = fields[0::_ENTRY_FIELDS]
                if offsets is not None:
                    offsets.extend(logged)
                # (offset - first, size) of each entry, without a Python loop
                locs = list(zip(map(first.__rsub__, logged), fields[1::_ENTRY_FIELDS]))
                return log.read(first, span), locs
        parts, locs = [], []
        span_start = span_end = None
        base = 0
        seg = log.segment_size
        for off, size, _ in fmt.CQ_ENTRY.iter_unpack(entries):
            if off < log.min_offset:
                continue
            if offsets is not None:
                offsets.append(off)
            if (
                span_start is not None
                and span_end <= off <= span_end + _MAX_GAP
                and off + size - span_start <= 1 << 20
                and off // seg == span_start // seg
            ):
                span_end = off + size
                locs.append((base + off - span_start, size))
                continue
            if span_start is not None:
                parts.append(log.read(span_start, span_end - span_start))
                base += span_end - span_start
            span_start, span_end = off, off + size
            locs.append((base, size))
        if span_start is not None:
            parts.append(log.read(span_start, span_end - span_start))
        buf = parts[0] if len(parts) == 1 else b"".join(parts)
        return buf, locs

    def read_record(self, offset, size):
        """Return the decoded record at C{offset} as a L{fmt.RecordView}."""
        return fmt.RecordView(self.commitlog.read(offset, size))

    def damaged(self, buf, offset):
        """Return True (and report it) when the message record in C{buf} (read from
        commit-log C{offset}) fails its framing or body CRC check."""
        why = _damage(buf, 0, len(buf))
        if why is None:
            return False
        eid = fmt.I64.unpack_from(buf, fmt.OFF_EVENT_ID)[0] if len(buf) >= fmt.HEADER_SIZE else None
        self.report_damage(offset, why, eid)
        return True

    def read_sound_record(self, offset, size):
        """Return the message record at C{offset} as a L{fmt.RecordView}, or None when it
        is damaged (reported as L{read_records} does)."""
        buf = self.commitlog.read(offset, size)
        why = _damage(buf, 0, size, offset < self.trusted_from)
        if why is None:
            return fmt.RecordView(buf)
        eid = fmt.I64.unpack_from(buf, fmt.OFF_EVENT_ID)[0] if len(buf) >= fmt.HEADER_SIZE else None
        self.report_damage(offset, why, eid)
        return None

    def event_id_at(self, offset):
        """Return the eventId of the record at commit-log C{offset}."""
        return fmt.I64.unpack(self.commitlog.read(offset + fmt.OFF_EVENT_ID, 8))[0]

    def find_event(self, topic, queue_id, event_id):
        """Binary-search (topic, queue) for C{event_id}.

        Returns C{(qoffset, exact)}: the offset of the first entry whose eventId is >=
        C{event_id}, and whether it is equal."""
        q = self._queues.get((topic, queue_id))
        if q is None:
            return 0, False
        lo, hi = q.min_offset, q.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            off, _, _ = q.entry(mid)
            if off < self.commitlog.min_offset or self.event_id_at(off) < event_id:
                lo = mid + 1
            else:
                hi = mid
        exact = lo < q.max_offset and self.event_id_at(q.entry(lo)[0]) == event_id
        return lo, exact
