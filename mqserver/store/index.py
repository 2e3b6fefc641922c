"""Index files: message keys -> commit-log offsets, for RocketMQ's QUERY_MESSAGE.

The layout is RocketMQ's IndexFile (seed 000 §1.5, defined in L{mqserver.store.format}):
a header, a hash-slot table and chained entries (C{format.INDEX_*_SCHEMA}). Keys are the
space-separated C{KEYS} property and C{UNIQ_KEY}. The store calls
L{IndexService.dispatch} for every message record it writes and for every record it
replays at start-up; records at or below the newest indexed offset are skipped, so
replay is idempotent. Files are mapped into memory; a full file is sealed and a new one
started (named by its first commit-log offset). Like consume queues, index files are
derived data.
"""

import mmap
import os

from mqserver.store import format as fmt


# Module-level names for what every indexed send uses (IndexFile.put).
_HEADER_SIZE = fmt.INDEX_HEADER_SIZE
_SLOT_SIZE = fmt.INDEX_SLOT.size
_ENTRY_SIZE = fmt.INDEX_ENTRY_SIZE
_SLOT_UNPACK = fmt.INDEX_SLOT.unpack_from
_SLOT_PACK = fmt.INDEX_SLOT.pack_into
_ENTRY_PACK = fmt.INDEX_ENTRY.pack_into
_HEADER_PACK = fmt.INDEX_HEADER.pack_into
_index_key_hash = fmt.index_key_hash


class IndexFile:
    """One mapped index file."""

    def __init__(self, path, slots, max_entries):
        self.path = path
        size = fmt.index_file_size(slots, max_entries)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)
            self.map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        (self.begin_ts, self.end_ts, self.begin_offset, self.end_offset, slot_count,
         self.count) = fmt.INDEX_HEADER.unpack_from(self.map, 0)
        new = slot_count == 0
        self.slots = slots if new else slot_count
        self._entries_at = fmt.INDEX_HEADER_SIZE + self.slots * fmt.INDEX_SLOT.size
        self.max_entries = (size - self._entries_at) // fmt.INDEX_ENTRY_SIZE
        if new:
            self.begin_offset = self.end_offset = -1
            self.count = 1
            self.finish_batch()

    def _slot_at(self, key_hash):
        return fmt.INDEX_HEADER_SIZE + (key_hash % self.slots) * fmt.INDEX_SLOT.size

    def full(self):
        return self.count > self.max_entries

    def put(self, key_hash, offset, ts):
        """Add one key; return False when the file is full."""
        n = self.count
        if n > self.max_entries:
            return False
        if n == 1:
            self.begin_ts = ts
            self.begin_offset = offset
        m = self.map
        slot_pos = _HEADER_SIZE + (key_hash % self.slots) * _SLOT_SIZE
        (prev,) = _SLOT_UNPACK(m, slot_pos)
        diff = (ts - self.begin_ts) // 1000
        _ENTRY_PACK(m, self._entries_at + (n - 1) * _ENTRY_SIZE, key_hash, offset,
                    diff if diff > 0 else 0, prev)
        _SLOT_PACK(m, slot_pos, n)
        self.count = n + 1
        self.end_ts = ts
        self.end_offset = offset
        return True

    def put_one(self, key_hash, offset, ts):
        """L{put} and L{finish_batch} of a record with one key (a send's UNIQ_KEY);
        return False when the file is full."""
        if not self.put(key_hash, offset, ts):
            return False
        _HEADER_PACK(self.map, 0, self.begin_ts, ts, self.begin_offset, offset, self.slots,
                     self.count)
        return True

    def finish_batch(self):
        """Write the header (after a run of L{put}s)."""
        fmt.INDEX_HEADER.pack_into(self.map, 0, self.begin_ts, self.end_ts, self.begin_offset,
                                   self.end_offset, self.slots, self.count)

    def lookup(self, key_hash, max_num, begin_ms, end_ms, out):
        """Append to C{out} the offsets (newest first) of entries with C{key_hash}."""
        if self.count <= 1 or self.end_ts < begin_ms or self.begin_ts > end_ms:
            return
        (n,) = fmt.INDEX_SLOT.unpack_from(self.map, self._slot_at(key_hash))
        seen = 0
        while 0 < n < self.count and len(out) < max_num and seen < self.count:
            h, offset, diff, prev = fmt.INDEX_ENTRY.unpack_from(self.map, self._entries_at + (n - 1) * fmt.INDEX_ENTRY_SIZE)
            ts = self.begin_ts + diff * 1000
            if h == key_hash and begin_ms - 999 <= ts <= end_ms + 999:
                out.append(offset)
            if prev >= n:
                break
            n = prev
            seen += 1

    def flush(self):
        self.map.flush()

    def close(self):
        self.finish_batch()
        self.map.flush()
        self.map.close()


class IndexService:
    """Every index file of a store, newest last."""

    def __init__(self, directory, slots=500_000, max_entries=2_000_000):
        self.directory = directory
        self.slots = slots
        self.max_entries = max_entries
        self.closed = False
        self.files = []
        # The directory is made with the first file, not here: this runs before the
        # store takes the data directory's lock, and a refused broker changes nothing.
        names = sorted(os.listdir(directory)) if os.path.isdir(directory) else ()
        for name in names:
            if name.isdigit():
                self.files.append(IndexFile(os.path.join(directory, name), slots, max_entries))

    def last_offset(self):
        return self.files[-1].end_offset if self.files else -1

    def last_ts(self):
        return self.files[-1].end_ts if self.files else 0

    def _current(self, offset):
        if not self.files or self.files[-1].full():
            if self.files:
                self.files[-1].finish_batch()
            os.makedirs(self.directory, exist_ok=True)
            path = os.path.join(self.directory, fmt.segment_name(offset))
            self.files.append(IndexFile(path, self.slots, self.max_entries))
        return self.files[-1]

    def dispatch(self, offset, topic, properties, store_ts):
        """Index the keys of the message record at C{offset} (store dispatch listener)."""
        files = self.files
        if self.closed or offset <= (files[-1].end_offset if files else -1):
            return
        if b"KEYS\x01" not in properties:
            # the common case (only the client's UNIQ_KEY): no full properties decode
            at = properties.find(b"UNIQ_KEY\x01")
            if at < 0 or (at and properties[at - 1] != 2):
                return
            at += 9
            end = properties.find(b"\x02", at)
            key = properties[at:] if end < 0 else properties[at:end]
            if key:
                h = _index_key_hash(topic, key.decode("utf-8", "replace"))
                f = files[-1] if files else None
                if f is None or not f.put_one(h, offset, store_ts):
                    self._current(offset).put_one(h, offset, store_ts)
            return
        keys = []
        for k, v in fmt.decode_properties(properties):
            if k == b"KEYS":
                keys.extend(x for x in v.split(b" ") if x)
            elif k == b"UNIQ_KEY" and v:
                keys.append(v)
        if keys:
            self._put(offset, topic, keys, store_ts)

    def _put(self, offset, topic, keys, store_ts):
        f = self._current(offset)
        for key in keys:
            h = fmt.index_key_hash(topic, key.decode("utf-8", "replace"))
            if not f.put(h, offset, store_ts):
                f = self._current(offset)
                f.put(h, offset, store_ts)
        f.finish_batch()

    def lookup(self, topic, key, max_num, begin_ms, end_ms):
        """Return commit-log offsets of messages that may carry C{key} in C{topic} (hash
        collisions included: callers check the record), newest first."""
        h = fmt.index_key_hash(topic, key)
        out = []
        for f in reversed(self.files):
            f.lookup(h, max_num, begin_ms, end_ms, out)
            if len(out) >= max_num:
                break
        return out

    def close(self):
        """Write the headers and unmap; later dispatches are ignored."""
        self.closed = True
        for f in self.files:
            f.close()
        self.files = []
