"""Stored message records served whole by the broker door (view and query by key)."""

import os

from mqserver.store import format as fmt
from mqserver.store.index import IndexService


class StoredRecords:
    """Owns the reading of whole stored records by commit-log offset (STOREHOST patched
    in) and the key index (L{IndexService}, fed by the store's dispatch) that finds them
    by message key."""

    def __init__(self, store):
        self.store = store
        self.index = IndexService(os.path.join(store.path, "index"))
        store.add_dispatch_listener(self.index.dispatch)

    def close(self):
        """Close the key index."""
        self.index.close()

    def raw_record_at(self, offset):
        """Return the stored message record at commit-log C{offset} (STOREHOST patched),
        or None when there is none."""
        log = self.store.commitlog
        if offset < log.min_offset or offset + fmt.HEADER_SIZE > self.store.visible_end:
            return None
        try:
            head = log.read(offset, 8)
            size, magic = fmt.BLANK.unpack_from(head, 0)
            if magic != fmt.MESSAGE_MAGIC or size < fmt.HEADER_SIZE or offset + size > self.store.visible_end:
                return None
            data = log.read(offset, size)
        except (OSError, ValueError):
            return None
        if self.store.damaged(data, offset):  # never served (reported by the store)
            return None
        data = bytearray(data)
        data[64:72] = self.store.store_host
        return bytes(data)

    def record_at(self, offset):
        data = self.raw_record_at(offset)
        return fmt.RecordView(data) if data is not None else None

    def query_by_key(self, topic, key, max_num, begin, end):
        """Return (body, last index ts, last index offset) of messages of C{topic} with
        key C{key} stored in [begin, end]."""
        offsets = self.index.lookup(topic, key, max_num, begin, end)
        parts = []
        for off in offsets:
            data = self.raw_record_at(off)
            if data is None:
                continue
            view = fmt.RecordView(data)
            if view.topic == topic and key_matches(view.properties, key):
                parts.append(data)
        return b"".join(parts), self.index.last_ts(), self.index.last_offset()


def key_matches(properties, key):
    for k, v in fmt.decode_properties(properties):
        if k == b"KEYS" and key.encode() in v.split(b" "):
            return True
        if k == b"UNIQ_KEY" and v == key.encode():
            return True
    return False
