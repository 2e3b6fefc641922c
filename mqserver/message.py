"""What front doors hand the broker and get back: L{Message}, L{PutResult}, and the
names of the stored record format a door reads and writes.

The doors depend on this module, not on the store: the record format is defined once,
in L{mqserver.store.format} (shared with the Spark audit job); the names below are the
part of it a door may use (a RocketMQ pull ships stored records as they are, smss and
NSQ frames are encoded from them). Import it as C{from mqserver import message as fmt}.
"""

from dataclasses import dataclass

from mqserver.store.format import (
    ADMIN_MAGIC,
    BLANK,
    CQ_ENTRY,
    CQ_ENTRY_SIZE,
    DELAY_PREFIX,
    DELAY_PROPERTY,
    DELIVERY_FIELDS,
    EPOCH_RECORD_NAME,
    HEADER_LAYOUT,
    HEADER_SIZE,
    I32,
    I64,
    MESSAGE_MAGIC,
    NO_HOST,
    OFF_BODY_LEN,
    OFF_EVENT_ID,
    OFF_QUEUE_ID,
    OFF_QUEUE_OFFSET,
    OFF_STORE_HOST,
    OFF_STORE_TS,
    OFF_SYS_FLAG,
    OP_CREATE,
    OP_DELAY,
    OP_DELETE,
    OP_EPOCH,
    OP_UPDATE,
    SYSFLAG_BATCH_MORE,
    SYSFLAG_COMPRESSED,
    SYSFLAG_MULTI_TAGS,
    SYSFLAG_SMSS_FRAMED,
    RecordView,
    decode_message_list,
    decode_properties,
    delay_marker,
    encode_message_list,
    encode_properties,
    java_string_hash,
    parse_delay_marker,
    properties_safe,
)


# The doors' view of the format, and the value types defined here.
__all__ = ["ADMIN_MAGIC", "BLANK", "CQ_ENTRY", "CQ_ENTRY_SIZE", "DELAY_PREFIX",
           "DELAY_PROPERTY", "DELIVERY_FIELDS", "EPOCH_RECORD_NAME", "HEADER_LAYOUT",
           "HEADER_SIZE", "I32", "I64", "MESSAGE_MAGIC", "NO_HOST", "OFF_BODY_LEN",
           "OFF_EVENT_ID", "OFF_QUEUE_ID", "OFF_QUEUE_OFFSET", "OFF_STORE_HOST",
           "OFF_STORE_TS", "OFF_SYS_FLAG", "OP_CREATE", "OP_DELAY", "OP_DELETE",
           "OP_EPOCH", "OP_UPDATE", "SYSFLAG_BATCH_MORE", "SYSFLAG_COMPRESSED",
           "SYSFLAG_MULTI_TAGS", "SYSFLAG_SMSS_FRAMED", "RecordView",
           "decode_message_list", "decode_properties", "delay_marker",
           "encode_message_list", "encode_properties", "java_string_hash",
           "parse_delay_marker", "properties_safe", "Message", "PutResult"]


@dataclass(slots=True)
class Message:
    """A message to store. C{properties} is a RocketMQ properties string (bytes)."""

    body: bytes
    properties: bytes = b""
    flag: int = 0
    sys_flag: int = 0
    reconsume_times: int = 0
    born_ts: int = 0
    born_host: bytes = NO_HOST


class PutResult:
    """Where a put landed: the first eventId and, per message, its offsets.

    @ivar log_offsets: commit-log offset of each record.
    @ivar queue_offsets: consume-queue offset of each message (-1 for admin records).
    @ivar sizes: bytes of each record.
    """

    # A plain class, not a dataclass: it is built on every publish, and a dataclass's
    # default factories cost that path about as much as the rest of its bookkeeping.
    __slots__ = ("event_id", "queue_id", "log_offsets", "queue_offsets", "sizes", "store_ts")

    def __init__(self, event_id, queue_id, store_ts, log_offsets, queue_offsets, sizes):
        self.event_id = event_id
        self.queue_id = queue_id
        self.store_ts = store_ts
        self.log_offsets = log_offsets
        self.queue_offsets = queue_offsets
        self.sizes = sizes

    def __repr__(self):
        return (f"PutResult(event_id={self.event_id}, queue_id={self.queue_id}, "
                f"log_offsets={self.log_offsets}, queue_offsets={self.queue_offsets}, "
                f"sizes={self.sizes}, store_ts={self.store_ts})")
