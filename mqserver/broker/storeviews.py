"""What front doors read of the store, one object per interface: L{MessageLog}
(L{IMessageLog}), L{ReplicationLog} (L{IReplicationLog}), L{StoreStats}
(L{IStoreStats}) and L{DataFiles} (L{IDataFiles}). The broker owns one of each; doors
reach the store only through them, so its own API can change under them."""

import os
import struct

from zope.interface import implementer

from mqserver.broker.cursor import EventNotFound, TopicCursor
from mqserver.broker.stats import positions_at_event
from mqserver.interfaces import IDataFiles, IMessageLog, IReplicationLog, IStoreStats
from mqserver.replication.logreader import LogReader
from mqserver.store import format as fmt
from mqserver.store.flush import read_json
from mqserver.store.index import IndexService

#: The key index's directory in the data directory.
INDEX_DIR = "index"


def _store_ts_at(log, offset):
    # The store time of the record at offset of commit log log, 0 when it is not there.
    if offset < log.min_offset or offset + fmt.HEADER_SIZE > log.end:
        return 0
    try:
        return fmt.I64.unpack(log.read(offset + fmt.OFF_STORE_TS, fmt.I64.size))[0]
    except (OSError, ValueError, struct.error):
        return 0


class _LogBounds:
    """Where the commit log stands (L{mqserver.interfaces.ILogBounds})."""

    def __init__(self, store):
        self._store = store

    @property
    def next_event_id(self):
        return self._store.next_event_id

    @property
    def min_offset(self):
        return self._store.commitlog.min_offset

    @property
    def end(self):
        return self._store.commitlog.end


@implementer(IMessageLog)
class MessageLog(_LogBounds):
    """Stored messages read by queue offset, commit-log offset or eventId."""

    def __init__(self, store):
        super().__init__(store)
        # Called on every pull and delivery: straight to the store's part (one call, not two).
        self.read_entries = store.read_entries
        self.read_records = store.read_records
        self.newest_record = store.newest_record
        self.find_queue = store.find_queue

    @property
    def visible_end(self):
        return self._store.visible_end

    @property
    def max_message_size(self):
        return self._store.max_message_size

    @property
    def store_host(self):
        return self._store.store_host

    @store_host.setter
    def store_host(self, value):
        self._store.store_host = value

    def queue(self, topic, queue_id):
        return self._store.queue(topic, queue_id)

    def open_queues(self):
        return self._store.open_queues()

    def message_at(self, offset, end=None):
        store = self._store
        log = store.commitlog
        if end is None:
            end = store.visible_end
        if offset < log.min_offset or offset + fmt.HEADER_SIZE > end:
            return None
        try:
            size, magic = fmt.BLANK.unpack_from(log.read(offset, fmt.BLANK_SIZE), 0)
            if magic != fmt.MESSAGE_MAGIC or size < fmt.HEADER_SIZE or offset + size > end:
                return None
            data = log.read(offset, size)
        except (OSError, ValueError, struct.error):
            return None
        if store.damaged(data, offset):  # never served (reported by the store)
            return None
        return data

    def store_ts_at(self, offset):
        return _store_ts_at(self._store.commitlog, offset)

    def cursor_at(self, topic, queue_ids, event_id):
        store = self._store
        return TopicCursor(store, topic, positions_at_event(store, topic, queue_ids, event_id))

    def add_dispatch_listener(self, callback, topics=None):
        self._store.add_dispatch_listener(callback, topics)

    def open_key_index(self):
        index = IndexService(os.path.join(self._store.path, INDEX_DIR))
        self._store.add_dispatch_listener(index.dispatch)
        return index


@implementer(IReplicationLog)
class ReplicationLog(_LogBounds):
    """The whole log in eventId order, for replication's feed and follower."""

    def reader_after(self, event_id):
        return LogReader.after_event(self._store, event_id)

    def add_append_listener(self, callback):
        self._store.add_append_listener(callback)

    def remove_append_listener(self, callback):
        self._store.remove_append_listener(callback)

    def durable_now(self):
        return self._store.durable_now()

    def request_truncation(self, after_event_id):
        store = self._store
        try:
            offset = LogReader.after_event(store, after_event_id).offset
        except EventNotFound as e:
            # below the oldest retained record: every retained record comes after it, so
            # all of them go; at or past the log's end: nothing comes after it to cut
            offset = store.commitlog.min_offset if e.below else store.commitlog.end
        store.request_truncation(after_event_id, offset)


@implementer(IStoreStats)
class StoreStats(_LogBounds):
    """Read-only figures of the store."""

    @property
    def path(self):
        return self._store.path

    @property
    def segments(self):
        return len(self._store.commitlog.segments)

    @property
    def write_latency(self):
        return self._store.write_latency

    @property
    def fsync_latency(self):
        flusher = self._store.flusher
        return None if flusher is None else flusher.fsync_latency

    @property
    def disk_max_used_ratio(self):
        return self._store.disk_max_used_ratio

    @property
    def disk_errors(self):
        return self._store.disk_errors

    @property
    def disk_full_events(self):
        return self._store.disk_full_events

    @property
    def damaged_records(self):
        return self._store.damaged_records

    def disk_used_ratio(self):
        return self._store.disk_used_ratio()

    def earliest_store_ts(self):
        log = self._store.commitlog
        return _store_ts_at(log, log.min_offset)


@implementer(IDataFiles)
class DataFiles:
    """A front door's own JSON files in the data directory."""

    def __init__(self, store):
        self._store = store

    @property
    def path(self):
        return self._store.path

    def read_json(self, name):
        return read_json(os.path.join(self._store.path, name))

    def write_json(self, name, data):
        self._store.io.write_json(os.path.join(self._store.path, name), data)

    def save_json(self, name, data):
        store = self._store
        return store.runner.run(store.io.write_json, os.path.join(store.path, name), data)

    def disk_failed(self, what, error):
        return self._store.disk.failed(what, error)
