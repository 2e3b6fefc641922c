"""What goes into a store write and what comes out of it: L{Message}, L{PutResult}, and
L{NullState}, the state machine of a store that has no broker over it."""

from dataclasses import dataclass

from mqserver.store import format as fmt


@dataclass(slots=True)
class Message:
    """A message to store. C{properties} is a RocketMQ properties string (bytes)."""

    body: bytes
    properties: bytes = b""
    flag: int = 0
    sys_flag: int = 0
    reconsume_times: int = 0
    born_ts: int = 0
    born_host: bytes = fmt.NO_HOST


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


class NullState:
    """A state machine that ignores admin records (for store-only use and tests)."""

    def apply_record(self, view, replaying):
        pass

    def snapshot_state(self):
        return {}

    def restore_state(self, state):
        pass

    def begin_full_replay(self):
        pass

    def forget_after(self, event_id):
        pass
