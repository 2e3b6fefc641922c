"""Topics: their metadata, naming rules, and how admin records change them.

The registry is pure in-memory state with no reactor. It changes only by applying admin
records (create, update, delete) from the commit log, live or at replay, so the state
after a restart is exactly the state the log describes.
"""

import json
from dataclasses import asdict, dataclass, field

from mqserver.errors import InvalidTopicName

#: RocketMQ's permission bits: readable and writable.
PERM_READ = 4
PERM_WRITE = 2

_FORBIDDEN = set(" \t\r\n/\\\x00")
MAX_TOPIC_BYTES = 255


def validate_topic_name(name):
    """Raise L{InvalidTopicName} unless C{name} (str) is usable as a topic name.

    It must be 1..255 UTF-8 bytes (the commit log's one-byte length), hold no space, tab,
    line break, slash, backslash or NUL, and not start with a dot (so ``.`` and ``..``
    and hidden directory names are out): the name is also a directory name.
    """
    if not name:
        raise InvalidTopicName("topic name is required")
    if len(name.encode("utf-8")) > MAX_TOPIC_BYTES:
        raise InvalidTopicName("topic name is too long")
    if name[0] == "." or any(c in _FORBIDDEN for c in name):
        raise InvalidTopicName("topic name holds a forbidden character")


@dataclass(slots=True)
class Topic:
    """One topic.

    @ivar queues: number of queues (RocketMQ read/write queue count; smss topics have 1).
    @ivar expire_at: absolute ms at which the topic expires, 0 for never.
    @ivar state: 0 normal, 1 deleted (deleted topics are dropped from the registry).
    @ivar attrs: protocol-specific settings (RocketMQ perm, topic filter type, ...).
    """

    name: str
    queues: int = 1
    create_ts: int = 0
    expire_at: int = 0
    create_event_id: int = 0
    state_change_ts: int = 0
    state_change_event_id: int = 0
    state: int = 0
    perm: int = PERM_READ | PERM_WRITE
    attrs: dict = field(default_factory=dict)

    def valid(self, now_ms):
        """Return True when the topic takes writes and reads at C{now_ms}."""
        return self.state == 0 and (self.expire_at == 0 or self.expire_at > now_ms)


#: The most queues a topic may have (and the fewest is 1).
MAX_QUEUES = 1024


def valid_queue_count(queues):
    """Whether C{queues} is a queue count a topic may have: an int in 1..L{MAX_QUEUES}."""
    return type(queues) is int and 1 <= queues <= MAX_QUEUES


def create_body(queues=1, expire_at=0, perm=PERM_READ | PERM_WRITE, attrs=None):
    """Return the body of a CREATE or UPDATE admin record."""
    return json.dumps(
        {"queues": queues, "expireAt": expire_at, "perm": perm, "attrs": attrs or {}},
        separators=(",", ":"),
    ).encode()


class TopicRegistry:
    """All live topics, by name."""

    def __init__(self):
        self.topics = {}

    def get(self, name):
        """Return the L{Topic} called C{name}, or None."""
        return self.topics.get(name)

    def apply_create(self, name, body, event_id, ts):
        """Apply a CREATE record. A replayed CREATE of an existing name replaces it."""
        spec = json.loads(bytes(body))
        queues = spec.get("queues", 1)
        self.topics[name] = Topic(
            name=name,
            # a count no broker takes now (a record written before it checked, or by
            # hand) would have every reader of the topic walk its queues: one queue
            queues=queues if valid_queue_count(queues) else 1,
            create_ts=ts,
            expire_at=spec.get("expireAt", 0),
            create_event_id=event_id,
            state_change_ts=ts,
            state_change_event_id=event_id,
            perm=spec.get("perm", PERM_READ | PERM_WRITE),
            attrs=spec.get("attrs", {}),
        )

    def apply_update(self, name, body, event_id, ts):
        """Apply an UPDATE record (queue count, permissions, attributes)."""
        t = self.topics.get(name)
        if t is None:
            return self.apply_create(name, body, event_id, ts)
        spec = json.loads(bytes(body))
        queues = spec.get("queues", t.queues)
        if valid_queue_count(queues):  # else the count stays (see apply_create)
            t.queues = queues
        t.perm = spec.get("perm", t.perm)
        t.attrs = spec.get("attrs", t.attrs)
        t.state_change_ts = ts
        t.state_change_event_id = event_id

    def apply_delete(self, name):
        """Apply a DELETE record."""
        self.topics.pop(name, None)

    def snapshot(self):
        """Return the registry as JSON-ready data."""
        return [asdict(t) for t in self.topics.values()]

    def restore(self, data):
        """Replace the registry with what L{snapshot} returned."""
        self.topics = {d["name"]: Topic(**d) for d in data}
