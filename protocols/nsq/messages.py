"""Decoded client commands of the nsqd V2 protocol, as frozen dataclasses.

Each command class has a ``verb`` class attribute (the wire verb, e.g. ``"PUB"``) so a
front door can look up its state rules without isinstance chains.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from .errors import NsqError

__all__ = [
    "Command", "Identify", "Auth", "Sub", "Rdy", "Fin", "Req", "Touch", "Cls", "Nop",
    "Pub", "Mpub", "Dpub", "Invalid", "Message",
]


class Command:
    """Base class of every decoded command; each subclass has a ``verb``."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Identify(Command):
    """IDENTIFY: raw JSON body (decode with :func:`protocols.nsq.identify.negotiate`)."""

    body: bytes
    verb: ClassVar[str] = "IDENTIFY"


@dataclass(frozen=True, slots=True)
class Auth(Command):
    """AUTH: the secret body."""

    secret: bytes
    verb: ClassVar[str] = "AUTH"


@dataclass(frozen=True, slots=True)
class Sub(Command):
    """SUB topic channel (both names already validated)."""

    topic: str
    channel: str
    verb: ClassVar[str] = "SUB"


@dataclass(frozen=True, slots=True)
class Rdy(Command):
    """RDY count (already range-checked against max_rdy_count)."""

    count: int
    verb: ClassVar[str] = "RDY"


@dataclass(frozen=True, slots=True)
class Fin(Command):
    """FIN of a 16-byte message id."""

    msg_id: bytes
    verb: ClassVar[str] = "FIN"


@dataclass(frozen=True, slots=True)
class Req(Command):
    """REQ of a 16-byte id; timeout_ms already clamped to [0, max_req_timeout] as nsqd does."""

    msg_id: bytes
    timeout_ms: int
    verb: ClassVar[str] = "REQ"


@dataclass(frozen=True, slots=True)
class Touch(Command):
    """TOUCH of a 16-byte message id."""

    msg_id: bytes
    verb: ClassVar[str] = "TOUCH"


@dataclass(frozen=True, slots=True)
class Cls(Command):
    """CLS: start closing (reply CLOSE_WAIT)."""

    verb: ClassVar[str] = "CLS"


@dataclass(frozen=True, slots=True)
class Nop(Command):
    """NOP: no reply; answers heartbeats."""

    verb: ClassVar[str] = "NOP"


@dataclass(frozen=True, slots=True)
class Pub(Command):
    """PUB topic body (1..max_msg_size bytes)."""

    topic: str
    body: bytes
    verb: ClassVar[str] = "PUB"


@dataclass(frozen=True, slots=True)
class Mpub(Command):
    """MPUB topic with its message bodies in order (each 1..max_msg_size bytes)."""

    topic: str
    bodies: list[bytes]
    verb: ClassVar[str] = "MPUB"


@dataclass(frozen=True, slots=True)
class Dpub(Command):
    """DPUB topic defer_ms body; defer_ms already checked against max_req_timeout."""

    topic: str
    defer_ms: int
    body: bytes
    verb: ClassVar[str] = "DPUB"


@dataclass(frozen=True, slots=True)
class Invalid(Command):
    """A command nsqd would reject, carried in order with the commands around it.

    ``verb`` is the wire verb (latin-1 decoded) so the caller can apply nsqd's state
    checks first (nsqd checks state before parameters; it even ignores a malformed
    RDY after CLS). ``error`` is the exact error nsqd sends otherwise. ``in_sync`` is
    True when only the line's parameters were bad: the decoder keeps going and the
    caller may keep feeding it. When False the stream framing is lost (bad magic, bad
    body size, overlong line) and the decoder returns nothing more.
    """

    verb: str
    params: tuple[bytes, ...]
    error: NsqError
    in_sync: bool


class Message(NamedTuple):
    """A message as carried by a type-2 frame."""

    timestamp: int
    attempts: int
    msg_id: bytes
    body: bytes
