"""Reading the whole commit log in order: the source of the replication feed.

Every record (message or admin) has one eventId and records sit in the log in eventId
order, so "after eventId E" is a position in the log: find the segment whose first record
is at or below E, then walk its record headers.
"""

from mqserver.broker.cursor import EventNotFound
from mqserver.store import format as fmt

_CHUNK = 1 << 20


def _first_event_id(store, seg):
    """Return the eventId of the first record of segment C{seg}, or None if it has none."""
    head = store.commitlog.read(seg, fmt.HEADER_SIZE)
    if len(head) < fmt.HEADER_SIZE:
        return None
    size, magic = fmt.BLANK.unpack_from(head, 0)
    if magic not in (fmt.MESSAGE_MAGIC, fmt.ADMIN_MAGIC):
        return None
    return fmt.I64.unpack_from(head, fmt.OFF_EVENT_ID)[0]


class LogReader:
    """A position in the commit log that reads whole records forward.

    @ivar offset: commit-log offset of the next record to read.
    """

    def __init__(self, store, offset):
        self._store = store
        self.offset = offset

    @classmethod
    def after_event(cls, store, event_id):
        """Return a reader just after the write holding C{event_id} (0: from the oldest
        retained record): the records of one write go out as one smss binlog record, and a
        slave names one by its first eventId, or (a reference slave after a multi-message
        PUB) by its last; either way it resumes after the whole write. Raises
        L{EventNotFound}."""
        log = store.commitlog
        if event_id == 0:
            return cls(store, log.min_offset)
        if event_id >= store.next_event_id:
            raise EventNotFound(below=False)
        starts = [(s, _first_event_id(store, s)) for s in log.segments]
        starts = [(s, e) for s, e in starts if e is not None]
        if not starts or event_id < starts[0][1]:
            raise EventNotFound(below=True)
        seg = max(s for s, e in starts if e <= event_id)
        reader = cls(store, seg)
        while True:
            views = reader.read()
            if not views:
                raise EventNotFound(below=False)
            for view in views:
                if view.event_id == event_id:
                    return cls._after_write(store, view)
                if view.event_id > event_id:
                    # event_id is not in the log (a damaged record skipped, or a gap the
                    # master had): resume with the next record there is.
                    return cls(store, view.offset)

    @classmethod
    def _after_write(cls, store, view):
        # A reader after the last record of the write that view belongs to.
        reader = cls(store, view.offset + view.size)
        last = view
        while last.sys_flag & fmt.SYSFLAG_BATCH_MORE and last.magic == fmt.MESSAGE_MAGIC:
            views = reader.read()
            if not views:
                return cls(store, last.offset + last.size)
            for v in views:
                if v.event_id != last.event_id + 1:  # the write ends in a gap
                    return cls(store, v.offset)
                last = v
                if not v.sys_flag & fmt.SYSFLAG_BATCH_MORE:
                    return cls(store, v.offset + v.size)
        return cls(store, last.offset + last.size)

    def read(self, max_bytes=_CHUNK):
        """Return the next readable records as L{fmt.RecordView}s (at least one if any is
        readable, even when it is larger than C{max_bytes}) and move past them."""
        return self.read_encoded(None, max_bytes)[1]

    def read_encoded(self, encode, max_bytes=_CHUNK):
        """Like L{read}, offering the records to C{encode} first: return C{(made,
        None)} when C{encode(buffer, offset)} made something of the whole records at the
        start of the next readable bytes (it returns C{(made, length, ...)}, or None
        when it takes none of them) and move past those bytes; else C{(None, views)}
        as L{read} returns them. C{encode} is offered only records this process wrote
        or recovery checked, and no record recovery found damaged: it need check no
        CRC. With C{encode} None, this is L{read}."""
        store = self._store
        log = store.commitlog
        while True:
            end = store.replicable_end
            if self.offset < log.min_offset:
                self.offset = log.min_offset
            if self.offset >= end:
                return None, []
            seg = log.segment_start(self.offset)
            limit = min(end, seg + log.segment_size) - self.offset
            data = log.read(self.offset, min(max_bytes, limit))
            if len(data) >= fmt.BLANK_SIZE:
                size, magic = fmt.BLANK.unpack_from(data, 0)
                if magic == fmt.BLANK_MAGIC:
                    self.offset = seg + log.segment_size
                    continue
                if size > len(data) and size <= limit:
                    data = log.read(self.offset, size)
            else:
                if limit >= fmt.BLANK_SIZE:
                    # The segment file ends before what is readable in it: a region
                    # with no records where records should be.
                    store.report_damage(self.offset, "the segment file ends early")
                self.offset = seg + log.segment_size
                continue
            if (encode is not None and self.offset >= store.trusted_from
                    and not store.damaged_offsets):
                made = encode(data, self.offset)
                if made is not None:
                    self.offset += made[1]
                    return made, None
            views, skip_to = self._scan(data, end, seg)
            if views:
                last = views[-1]
                self.offset = last.offset + last.size
            if skip_to is not None and skip_to > self.offset:
                self.offset = skip_to
                if not views:
                    continue
            return None, views

    def _scan(self, data, end, seg):
        # The sound records of data (starting at self.offset) and, when damaged records
        # were stepped over, the offset after the last of them (None otherwise). A
        # damaged record is never returned: it is reported, and the feed goes on with
        # the next sound one (the slave sees the eventId gap).
        store = self._store
        views = []
        skip_to = None
        lost = []  # framing damage with no sound record after it in data

        def damaged(offset, detail, view):
            nonlocal skip_to
            store.report_damage(offset, detail, None if view is None else view.event_id)
            if view is not None:
                skip_to = max(skip_to or 0, offset + view.size)
            else:
                lost.append(offset)

        # Records recovery checked, or this process wrote, need no CRC check again; the
        # damaged ones recovery found there are known by offset.
        known = store.damaged_offsets
        check = self.offset < store.trusted_from
        try:
            for off, view in fmt.scan_buffer(memoryview(data), self.offset, check_crc=check,
                                             on_damage=damaged):
                if known and off in known:
                    skip_to = max(skip_to or 0, off + view.size)
                    continue
                views.append(view)
        except fmt.ScanError as e:
            # The chunk ends inside a record: the next read starts there. Unless the
            # chunk held all of it there is to read (the record runs past what is
            # readable in its segment, or is the first one, read whole): that is damage.
            stop = min(end, seg + self._store.commitlog.segment_size)
            if e.offset == self.offset or self.offset + len(data) >= stop:
                damaged(e.offset, f"{e.kind} record: {e.detail}", None)
        if lost and (not views or views[-1].offset < lost[-1]):
            skip_to = self._next_sound(lost[-1], end, seg)
        return views, skip_to

    def _next_sound(self, offset, end, seg):
        # The first sound record header after the damaged framing at offset, searched to
        # the end of what is readable in its segment; past that, where the next record
        # will be written (the end of what is readable) or the next segment.
        log = self._store.commitlog
        stop = min(end, seg + log.segment_size)
        pos = offset
        while pos < stop:
            data = log.read(pos, min(_CHUNK + fmt.HEADER_SIZE, stop - pos))
            found = fmt.next_record(data, 0, pos)
            if found is not None:
                return pos + found
            pos += max(1, len(data) - fmt.HEADER_SIZE)
            if len(data) < fmt.HEADER_SIZE + 1:
                break
        return stop if stop < seg + log.segment_size else seg + log.segment_size
