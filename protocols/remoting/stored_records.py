"""Stored message records served whole by the broker door (view and query by key)."""

from mqserver import message as fmt


class StoredRecords:
    """Owns the reading of whole stored records by commit-log offset (STOREHOST patched
    in) and the key index (L{IMessageLog.open_key_index}) that finds them by message key.

    @ivar messages: the broker's L{mqserver.interfaces.IMessageLog}.
    """

    def __init__(self, messages):
        self.messages = messages
        self.index = messages.open_key_index()

    def close(self):
        """Close the key index."""
        self.index.close()

    def raw_record_at(self, offset):
        """Return the stored message record at commit-log C{offset} (STOREHOST patched),
        or None when there is none."""
        data = self.messages.message_at(offset)
        if data is None:
            return None
        data = bytearray(data)
        data[64:72] = self.messages.store_host
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
