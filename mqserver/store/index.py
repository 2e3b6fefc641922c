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

import functools
import mmap
import os

from mqserver.store import format as fmt
from mqserver.store import native


# Module-level names for what every indexed send uses.
_HEADER_SIZE = fmt.INDEX_HEADER_SIZE
_SLOT_SIZE = fmt.INDEX_SLOT.size
_ENTRY_SIZE = fmt.INDEX_ENTRY_SIZE
_SLOT_UNPACK = fmt.INDEX_SLOT.unpack_from
_SLOT_PACK = fmt.INDEX_SLOT.pack_into
_ENTRY_PACK = fmt.INDEX_ENTRY.pack_into
_HEADER_PACK = fmt.INDEX_HEADER.pack_into
_HEADER_UNPACK = fmt.INDEX_HEADER.unpack_from
_index_key_hash = fmt.index_key_hash

#: What L{put_uniq} returns: nothing to index (no UNIQ_KEY, or indexed already), the
#: key put, the file full (put nothing), or left to the Python path (L{put_uniq_py};
#: the C speedup leaves it records with KEYS and keys that are not ASCII).
PUT_NONE, PUT_DONE, PUT_FULL, PUT_ELSEWHERE = 0, 1, 2, 3


def put_key(m, key_hash, offset, ts):
    """Add an entry for the record at commit-log C{offset} stored at C{ts} with
    C{key_hash} to the mapped index file C{m}, header included; return False (and write
    nothing) when the file is full. The header is the file's whole state."""
    begin_ts, _, begin_offset, _, slots, n = _HEADER_UNPACK(m, 0)
    entries_at = _HEADER_SIZE + slots * _SLOT_SIZE
    if n > (len(m) - entries_at) // _ENTRY_SIZE:
        return False
    if n == 1:
        begin_ts = ts
        begin_offset = offset
    slot_pos = _HEADER_SIZE + (key_hash % slots) * _SLOT_SIZE
    (prev,) = _SLOT_UNPACK(m, slot_pos)
    diff = (ts - begin_ts) // 1000
    _ENTRY_PACK(m, entries_at + (n - 1) * _ENTRY_SIZE, key_hash, offset,
                diff if diff > 0 else 0, prev)
    _SLOT_PACK(m, slot_pos, n)
    _HEADER_PACK(m, 0, begin_ts, ts, begin_offset, offset, slots, n + 1)
    return True


def uniq_key(properties):
    """Return the UNIQ_KEY value of encoded C{properties} as the index reads it in
    short (the first C{UNIQ_KEY\x01}, at the start or after 0x02, to the next 0x02),
    or b"" when there is none."""
    at = properties.find(b"UNIQ_KEY\x01")
    if at < 0 or (at and properties[at - 1] != 2):
        return b""
    at += 9
    end = properties.find(b"\x02", at)
    return properties[at:] if end < 0 else properties[at:end]


def put_uniq_py(m, topic, properties, offset, ts):
    """Index the record at C{offset} in the mapped index file C{m} when its only key is
    its UNIQ_KEY (what a client's send carries): the reference of the C speedup
    C{_index.put_uniq}, which L{put_uniq} is when built. Returns a C{PUT_*}: a record
    with KEYS is C{PUT_ELSEWHERE}, for L{IndexService}'s general path."""
    if offset <= _HEADER_UNPACK(m, 0)[3]:
        return PUT_NONE  # indexed already: a replay
    if b"KEYS\x01" in properties:
        return PUT_ELSEWHERE
    key = uniq_key(properties)
    if not key:
        return PUT_NONE
    h = _index_key_hash(topic, key.decode("utf-8", "replace"))
    return PUT_DONE if put_key(m, h, offset, ts) else PUT_FULL


#: L{put_uniq_py}: the C speedup, or the reference.
put_uniq = put_uniq_py if native.index is None else native.index.put_uniq


class IndexFile:
    """One mapped index file. Its header, in the map, is its state (L{put_key} and
    L{put_uniq} keep it), so the attributes here read it."""

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
        slot_count = _HEADER_UNPACK(self.map, 0)[4]
        if slot_count == 0:  # new
            _HEADER_PACK(self.map, 0, 0, 0, -1, -1, slots, 1)
        self.slots = slots if slot_count == 0 else slot_count
        self._entries_at = _HEADER_SIZE + self.slots * _SLOT_SIZE
        self.max_entries = (size - self._entries_at) // _ENTRY_SIZE

    def header(self):
        """(begin ts, end ts, begin offset, end offset, slot count, entry count + 1)."""
        return _HEADER_UNPACK(self.map, 0)

    @property
    def end_offset(self):
        return self.header()[3]

    @property
    def end_ts(self):
        return self.header()[1]

    def full(self):
        return self.header()[5] > self.max_entries

    def put(self, key_hash, offset, ts):
        """Add one key (L{put_key}); return False when the file is full."""
        return put_key(self.map, key_hash, offset, ts)

    def lookup(self, key_hash, max_num, begin_ms, end_ms, out):
        """Append to C{out} the offsets (newest first) of entries with C{key_hash}."""
        begin_ts, end_ts, _, _, _, count = self.header()
        if count <= 1 or end_ts < begin_ms or begin_ts > end_ms:
            return
        (n,) = _SLOT_UNPACK(self.map, _HEADER_SIZE + (key_hash % self.slots) * _SLOT_SIZE)
        seen = 0
        while 0 < n < count and len(out) < max_num and seen < count:
            h, offset, diff, prev = fmt.INDEX_ENTRY.unpack_from(self.map, self._entries_at + (n - 1) * _ENTRY_SIZE)
            ts = begin_ts + diff * 1000
            if h == key_hash and begin_ms - 999 <= ts <= end_ms + 999:
                out.append(offset)
            if prev >= n:
                break
            n = prev
            seen += 1

    def flush(self):
        self.map.flush()

    def close(self):
        self.map.flush()
        self.map.close()


def _put_none(topic, properties, offset, store_ts):
    return PUT_NONE


class IndexService:
    """Every index file of a store, newest last."""

    def __init__(self, directory, slots=500_000, max_entries=2_000_000, put_uniq=put_uniq):
        """@param put_uniq: the usual put (L{put_uniq}: the C speedup when built, or
            L{put_uniq_py})."""
        self.directory = directory
        self._put_uniq_into = put_uniq
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
        self._aim()

    def _aim(self):
        # The usual put, bound to the newest file's map: one call per indexed send.
        if self.closed:
            self._put_uniq = _put_none
        elif self.files:
            self._put_uniq = functools.partial(self._put_uniq_into, self.files[-1].map)
        else:
            self._put_uniq = self._no_file_yet

    def last_offset(self):
        return self.files[-1].end_offset if self.files else -1

    def last_ts(self):
        return self.files[-1].end_ts if self.files else 0

    def _current(self, offset):
        if not self.files or self.files[-1].full():
            os.makedirs(self.directory, exist_ok=True)
            path = os.path.join(self.directory, fmt.segment_name(offset))
            self.files.append(IndexFile(path, self.slots, self.max_entries))
            self._aim()
        return self.files[-1]

    def dispatch(self, offset, topic, properties, store_ts):
        """Index the keys of the message record at C{offset} (store dispatch listener)."""
        # The usual record (a send's UNIQ_KEY alone) is put in this one call.
        if self._put_uniq(topic, properties, offset, store_ts) > PUT_DONE:
            self._dispatch_rest(offset, topic, properties, store_ts)

    def _no_file_yet(self, topic, properties, offset, store_ts):
        # A file is made for the first record with a key to index.
        if b"KEYS\x01" in properties:
            return PUT_ELSEWHERE
        return PUT_FULL if uniq_key(properties) else PUT_NONE

    def _dispatch_rest(self, offset, topic, properties, store_ts):
        # What the usual put left (after its replay check): a full (or no) file, which
        # _current replaces, or a key the C put leaves to the reference; or a record with
        # KEYS, whose keys the general path reads (a file only when there are some).
        if b"KEYS\x01" not in properties:
            put_uniq_py(self._current(offset).map, topic, properties, offset, store_ts)
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
        """Flush and unmap; later dispatches are ignored."""
        self.closed = True
        self._aim()
        for f in self.files:
            f.close()
        self.files = []
