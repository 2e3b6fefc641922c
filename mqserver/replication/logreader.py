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
        """Return a reader just after the record holding C{event_id} (0: from the oldest
        retained record). Raises L{EventNotFound}."""
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
        pos = seg
        seg_end = seg + log.segment_size
        while pos < min(seg_end, log.end):
            data = log.read(pos, min(_CHUNK, seg_end - pos))
            p = 0
            while p + fmt.HEADER_SIZE <= len(data):
                size, magic = fmt.BLANK.unpack_from(data, p)
                if magic not in (fmt.MESSAGE_MAGIC, fmt.ADMIN_MAGIC) or size <= 0:
                    raise EventNotFound(below=False)
                if p + size > len(data) and p > 0:
                    break
                eid = fmt.I64.unpack_from(data, p + fmt.OFF_EVENT_ID)[0]
                if eid == event_id:
                    return cls(store, pos + p + size)
                if eid > event_id:
                    raise EventNotFound(below=False)
                p += size
            if p == 0:
                raise EventNotFound(below=False)
            pos += p
        raise EventNotFound(below=False)

    def read(self, max_bytes=_CHUNK):
        """Return the next readable records as L{fmt.RecordView}s (at least one if any is
        readable, even when it is larger than C{max_bytes}) and move past them."""
        store = self._store
        log = store.commitlog
        while True:
            end = store.visible_end
            if self.offset < log.min_offset:
                self.offset = log.min_offset
            if self.offset >= end:
                return []
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
            elif self.offset + len(data) >= seg + log.segment_size or not data:
                self.offset = seg + log.segment_size
                continue
            views = []
            try:
                for off, view in fmt.scan_buffer(memoryview(data), self.offset, check_crc=False):
                    views.append(view)
            except fmt.ScanError:
                pass  # the chunk ends inside a record: the next read starts there
            if views:
                last = views[-1]
                self.offset = last.offset + last.size
            return views
