"""Decoded smss frames as immutable value objects.

The first group are the events the server-side ``RequestDecoder`` yields, one
per request (plus error events for requests the server must answer without
closing the connection).  The second group are the replies the client-side
``ResponseDecoder`` yields.  All byte fields are ``bytes``.
"""

from dataclasses import dataclass, field

# -- requests (server side) -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pub:
    """PUB (1): publish the message records in ``payload`` (section 5) to ``topic``.

    ``messages`` is what ``views.payload_to_messages`` makes of the payload when the
    decoder already read it (a payload of one record without headers: ``[body]``, what
    the SDKs send), else None. It is derived from ``payload``, so equality ignores it.
    """

    topic: bytes
    trace: bytes
    payload: bytes
    messages: list | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Delay:
    """DELAY (16): publish ``payload`` to ``topic`` after ``delay_ms`` milliseconds.

    The payload is passed through unchecked, even when it is 8 bytes or less:
    the reference server checks the role before the payload size (section 6.2).
    """

    topic: bytes
    trace: bytes
    delay_ms: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Create:
    """CREATE (2): create ``topic``; ``expire_at`` is absolute Unix ms, 0 = never."""

    topic: bytes
    trace: bytes
    expire_at: int


@dataclass(frozen=True, slots=True)
class Delete:
    """DELETE (3): delete ``topic``."""

    topic: bytes
    trace: bytes


@dataclass(frozen=True, slots=True)
class Alive:
    """ALIVE (17): liveness probe, answered with a bare 201."""

    trace: bytes


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """TOPIC INFO (65): the JSON object describing ``topic``."""

    topic: bytes
    trace: bytes


@dataclass(frozen=True, slots=True)
class List:
    """LIST (100): the JSON array of every topic."""

    trace: bytes


@dataclass(frozen=True, slots=True)
class ValidList:
    """VALID LIST (99): live topics with createEventId <= ``event_id`` (0 = all)."""

    trace: bytes
    event_id: int


@dataclass(frozen=True, slots=True)
class Sub:
    """SUB (0): stream ``topic`` to group ``who`` starting after ``event_id``.

    ``batch`` is already normalised (0 on the wire becomes 1).  ``ack_timeout_ns``
    is None when the client sent no timeout or a value <= 0; both mean the
    3 s default (section 7.1).
    """

    topic: bytes
    trace: bytes
    event_id: int
    batch: int
    ack_timeout_ns: int | None
    who: bytes


@dataclass(frozen=True, slots=True)
class Replica:
    """REPLICA (64): stream binlog records after ``event_id`` (0 = from the start).
    ``trace`` is the request's traceId: an mqserver follower names its confirmations
    there (``wire.CONFIRM_TRACE``)."""

    event_id: int
    trace: bytes = b""


@dataclass(frozen=True, slots=True)
class Confirm:
    """An mqserver follower's confirmation on its replication connection: it holds every
    record up to ``event_id`` durably (a REPLICA request's frame, read in confirm mode)."""

    event_id: int


@dataclass(frozen=True, slots=True)
class Ack:
    """A 2-byte ack read in ack mode: 0 = next batch, 1 = end, others are invalid."""

    value: int


@dataclass(frozen=True, slots=True)
class Unsupported:
    """An unknown or refused command code; answer ``don't support action``.

    The header, topic and trace were consumed; no body was read.
    """

    code: int
    topic: bytes
    trace: bytes


@dataclass(frozen=True, slots=True)
class TooLarge:
    """A PUB/DELAY whose payload ``size`` is over ``limit``; answer with an ERR.

    The decoder skips the announced body bytes without buffering them.
    """

    code: int
    topic: bytes
    trace: bytes
    size: int
    limit: int


@dataclass(frozen=True, slots=True)
class PayloadTooSmall:
    """A PUB with payload length <= 8; answer ``invalid request, payload size must
    be more than 8``.  Unlike the reference server, the payload bytes are consumed."""

    code: int
    topic: bytes
    trace: bytes


# -- responses (client side) -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OkResponse:
    """200: ``body`` is None for simple commands, the JSON bytes (maybe b"") otherwise."""

    body: bytes | None = None


@dataclass(frozen=True, slots=True)
class ErrResponse:
    """400 with the server's error text."""

    text: str


@dataclass(frozen=True, slots=True)
class AliveResponse:
    """201: liveness reply, or the keep-alive of an idle SUB/REPLICA stream."""


@dataclass(frozen=True, slots=True)
class SubEnd:
    """255: the subscribed topic was deleted or expired; sub mode is over."""


@dataclass(frozen=True, slots=True)
class PushedMessage:
    """One message of a SUB push batch (section 7.3), headers parsed."""

    ts: int
    event_id: int
    next_file_id: int
    next_pos: int
    headers: list = field(default_factory=list)  # list[tuple[bytes, bytes]]
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class Batch:
    """One SUB push batch; the client must ack it."""

    messages: list  # list[PushedMessage]


@dataclass(frozen=True, slots=True)
class ReplicaBlock:
    """One REPLICA frame: ``raw`` is a byte-for-byte binlog record (section 8.2)."""

    raw: bytes
