"""zope.interface contracts between the protocols and the broker core.

L{IBroker} is what the front doors under C{protocols/} call on the broker (and nothing
more): its own operations, and through four of its attributes what doors read of the
store, each behind an interface of its own (L{IMessageLog}, L{IReplicationLog},
L{IStoreStats}, L{IDataFiles}), so that the store's own API can change under them;
L{IWatcher} is what the broker calls on whoever waits for a topic's messages;
L{IChannelConsumer} is what a channel (C{mqserver/broker/channels.py}) reads and calls
on a connection it delivers to. C{tests/unit/test_interfaces.py} checks every
implementation with C{zope.interface.verify.verifyObject}.
"""

from zope.interface import Attribute, Interface


class IBroker(Interface):
    """What every protocol may ask of the broker core."""

    messages = Attribute("The IMessageLog: stored messages read by queue offset or "
                         "commit-log offset, and the log's bounds.")
    replication_log = Attribute("The IReplicationLog: the whole log in eventId order, for "
                                "replication's feed and follower.")
    store_stats = Attribute("The IStoreStats: read-only figures of the store.")
    files = Attribute("The IDataFiles: a front door's own JSON files in the data directory.")
    is_master = Attribute("False on a replication slave, which refuses writes.")
    registry = Attribute("The TopicRegistry: every topic by name, deleted ones included "
                         "(smss reads it for its VALID and follower checks).")
    channels = Attribute("The ChannelRegistry: NSQ-style channels over the topics.")
    offsets = Attribute("The ConsumerOffsets: committed (group, topic, queue) offsets.")
    stats = Attribute("The BrokerStats: per-queue, consumer and connection counters.")
    queues = Attribute("The QueueService: msgout's queues, receipts and subscriptions.")
    wiretap = Attribute("The WireTap: fault rules, and whether a front door looks at each "
                        "request (its one switch, 'active').")
    extensions = Attribute("A dict a front door keeps per-broker state in, by its own "
                           "key; the core never reads it.")

    def now_ms():
        """Return the current time in ms."""

    def topic(name):
        """Return the valid Topic called name, or None."""

    def topics():
        """Return every topic, sorted by name bytes."""

    def create_topic(name, expire_at=0, queues=1, perm=6, attrs=None):
        """Create a topic; Deferred firing with the Topic."""

    def update_topic(name, queues=None, perm=None, attrs=None):
        """Create or change a topic; Deferred firing with the Topic."""

    def delete_topic(name):
        """Delete a topic; Deferred."""

    def publish(topic, messages, queue_id=None):
        """Store messages in one write; Deferred firing with a PutResult."""

    def publish_now(topic, messages, queue_id=None, answer=None):
        """As publish, but the PutResult itself when the write is already as durable as
        asked (else a Deferred of it); raises BrokerError when refused or failed. With
        answer, a write that completes at once calls answer(PutResult) as soon as it is
        written, before the broker's bookkeeping of it, and returns None."""

    def delay(topic, delay_ms, messages):
        """Store messages to publish later; Deferred firing with the delay's eventId."""

    def open_cursor(topic, after_event_id):
        """Return a TopicCursor after an eventId."""

    def track_cursor(cursor):
        """Count a cursor made elsewhere in the retention floor until closed."""

    def register_state(name, obj):
        """Keep obj's snapshot_state()/restore_state(data) in the checkpoint under name."""

    def state_changed():
        """State kept with register_state changed: have the next checkpoint take it."""

    def close_cursor(cursor):
        """Forget a cursor."""

    def claim(topic, who, subscriber):
        """Claim the one live subscription of (topic, who); False when taken."""

    def release(topic, who, subscriber):
        """Give up a claim."""

    def watch(topic, watcher):
        """Tell watcher (an IWatcher) about arrivals in and deletion of topic."""

    def unwatch(topic, watcher):
        """Stop telling watcher."""


class ILogBounds(Interface):
    """Where the commit log stands."""

    next_event_id = Attribute("The eventId the next record gets.")
    min_offset = Attribute("Commit-log offset of the oldest retained record.")
    end = Attribute("Commit-log offset after the last record written.")


class IMessageLog(ILogBounds):
    """Reading stored messages: by (topic, queue) and consume-queue offset, by commit-log
    offset, or from an eventId; the log's bounds. Records are returned as stored (the
    layout of L{mqserver.message}); a damaged record is never returned (it is reported
    and counted once)."""

    visible_end = Attribute("Commit-log offset below which records may be read "
                            "(the written ones not yet durable or confirmed are above it).")
    max_message_size = Attribute("The largest message body a write takes, bytes.")
    store_host = Attribute("The STOREHOST of new records (IPv4 and port, 8 bytes); the door "
                           "that knows the broker's address sets it.")

    def queue(topic, queue_id):
        """Return the consume queue of (topic, queue_id), opening it when needed: an object
        with C{min_offset}, C{max_offset}, C{in_msgs}, C{in_bytes} and C{entry(qoffset)}
        (commit-log offset, size, tag hash). Raises StoreError for a name that cannot be
        stored."""

    def find_queue(topic, queue_id):
        """Return the open consume queue of (topic, queue_id) (as L{queue}), or None."""

    def open_queues():
        """Return [((topic, queue id), queue), ...] of every open consume queue."""

    def read_entries(topic, queue_id, qoffset, count):
        """Return up to count packed consume-queue entries from qoffset (readable ones)."""

    def read_records(entries):
        """Return (buffer, [(pos, size), ...]) holding the sound records of packed
        entries (damaged ones and those retention removed left out)."""

    def newest_record(topic, queue_id, qoffset):
        """The record at qoffset when it is the last one written and readable (bytes),
        b"" when qoffset is just past it, else None (read the queue)."""

    def message_at(offset, end=None):
        """Return the bytes of the sound message record at commit-log offset, ending below
        end (default: visible_end), or None when there is none there."""

    def store_ts_at(offset):
        """Return the store time (ms) of the record at commit-log offset, or 0 when it is
        not retained."""

    def cursor_at(topic, queue_ids, event_id):
        """Return a TopicCursor over queue_ids of topic at the first message whose eventId
        is at least event_id (one that reads once and is dropped: it does not hold back
        retention)."""

    def add_dispatch_listener(callback, topics=None):
        """Call callback(offset, topic, properties, store_ts) for every message record with
        properties (topics None) or of topics, written, replicated or replayed."""

    def open_key_index():
        """Open the index of message keys (RocketMQ KEYS and UNIQ_KEY properties), fed
        from now on by every message record with keys: an object with lookup(topic, key,
        max_num, begin_ms, end_ms) (commit-log offsets), last_ts(), last_offset() and
        close() (the caller closes it)."""


class IReplicationLog(ILogBounds):
    """The whole commit log in eventId order, every record (messages and admin records):
    what a master feeds its followers, and what a follower asks of its own log."""

    def reader_after(event_id):
        """Return a reader just after the write holding event_id (0: from the oldest
        record): C{read()} returns the next readable records (views, possibly []),
        C{read_encoded(encode)} offers them to C{encode(buffer, offset)} first (a door's
        own encoding of the records it knows: L{LogReader.read_encoded
        <mqserver.replication.logreader.LogReader.read_encoded>}) and C{offset} is
        where it stands; setting C{offset} to where another reader of this
        log stood after a read moves it past the same records. Raises EventNotFound."""

    def add_append_listener(callback):
        """Call callback() whenever any record becomes readable."""

    def remove_append_listener(callback):
        """Stop calling callback."""

    def durable_now():
        """Return a Deferred firing once everything written is as durable as the flush
        level asks."""

    def request_truncation(after_event_id):
        """Have the next start cut the log after the write holding after_event_id (a
        follower whose log goes on past where its new master's parts from it); durable
        when this returns."""


class IStoreStats(ILogBounds):
    """Read-only figures of the store (metrics, runtime information)."""

    path = Attribute("The data directory.")
    segments = Attribute("How many commit-log segment files there are.")
    write_latency = Attribute("The Latency of writes (one in 64 timed).")
    fsync_latency = Attribute("The Latency of commit-log fsyncs, or None before the "
                              "store is open.")
    disk_max_used_ratio = Attribute("The disk usage ratio over which writes are refused.")
    disk_errors = Attribute("Writes and fsyncs that failed since start.")
    disk_full_events = Attribute("Disk troubles since start.")
    damaged_records = Attribute("Damaged records found since start.")

    def disk_used_ratio():
        """Return the used share of the data directory's file system (raises OSError)."""

    def earliest_store_ts():
        """Return the store time (ms) of the oldest retained record, or 0."""


class IDataFiles(Interface):
    """A front door's own JSON files in the data directory (written atomically)."""

    path = Attribute("The data directory.")

    def read_json(name):
        """Return the data of file name, or None when it does not exist."""

    def write_json(name, data):
        """Write data as file name now (raises OSError)."""

    def save_json(name, data):
        """Write data as file name on the store's disk thread: a Deferred firing once
        written, or failing with the error."""

    def disk_failed(what, error):
        """Count and log the OSError error of what (a write of a file) as a disk error of
        the store; return the StoreError to answer a request with (DiskFullError for a
        full disk)."""


class IWatcher(Interface):
    """Something waiting for messages of a topic (a subscription, a long poll)."""

    def data_available(topic, queue_id):
        """New messages are readable in (topic, queue_id)."""

    def topic_deleted(topic):
        """The topic was deleted or expired."""


class IChannelConsumer(Interface):
    """A connection a channel delivers to (an NSQ consumer). The channel reads the
    attributes below on every pump and keeps C{in_flight} up to date itself."""

    rdy = Attribute("How many messages the consumer is ready to have in flight.")
    in_flight = Attribute("How many it has in flight; the channel adds and subtracts.")
    msg_timeout = Attribute("Seconds a delivered message may stay unfinished.")
    sample_rate = Attribute("0, or the percentage (1..99) of messages to deliver.")
    can_receive = Attribute("False while the consumer must get nothing (closing, "
                            "output buffer full).")
    defer_room = Attribute("While the consumer holds what it is handed for a flush it has "
                           "scheduled: how many more messages it could take before they "
                           "would leave at once; else 0. The channel may leave that many "
                           "arrivals in the store, and the consumer calls its "
                           "pump_deferred() before it flushes.")

    def deliver(items):
        """Send messages: a list of (timestamp ns, attempts, eventId, buffer, body start,
        body end) tuples."""

    def channel_closed():
        """The channel was deleted: stop consuming from it."""
