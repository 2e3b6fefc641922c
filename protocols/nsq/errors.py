"""The error frames nsqd v1.3.0 sends on its TCP protocol, as exception constructors.

Every constructor returns an :class:`NsqError` whose ``data`` is the exact payload of
the type-1 frame nsqd would send (``<CODE> <description>``) and whose ``fatal`` flag
says whether nsqd closes the connection after sending it. Only E_FIN_FAILED,
E_REQ_FAILED and E_TOUCH_FAILED are non-fatal.
"""
from __future__ import annotations

__all__ = [
    "NsqError", "go_quote",
    "REASON_NOT_IN_FLIGHT", "REASON_NOT_OWNER", "REASON_EXITING",
    "bad_protocol", "line_too_long", "invalid", "invalid_command", "cannot_in_state",
    "tls_required", "sub_heartbeats_disabled", "insufficient_params",
    "auth_invalid_params", "auth_already_set", "invalid_message_id",
    "rdy_parse", "rdy_range", "req_parse", "dpub_parse", "dpub_range",
    "bad_topic", "bad_channel", "bad_body", "bad_message",
    "body_size_invalid", "body_too_big", "mpub_invalid_count",
    "mpub_message_size_invalid", "mpub_message_too_big",
    "identify_decode_failed", "identify_setting_invalid", "identify_failed",
    "identify_both_compressions",
    "pub_failed", "mpub_failed", "dpub_failed", "sub_failed",
    "fin_failed", "req_failed", "touch_failed",
    "auth_disabled", "auth_failed", "auth_no_authorizations", "unauthorized",
    "auth_first", "auth_error",
]

# Reasons nsqd's channel reports; they end up after "FIN <id> failed ".
REASON_NOT_IN_FLIGHT = "ID not in flight"
REASON_NOT_OWNER = "client does not own message"
REASON_EXITING = "exiting"


def _b(x: bytes | str | int) -> bytes:
    if isinstance(x, bytes):
        return x
    if isinstance(x, (bytearray, memoryview)):
        return bytes(x)
    # surrogateescape round-trips bytes that came from the wire as str
    return str(x).encode("utf-8", "surrogateescape")


class NsqError(Exception):
    """An nsqd client error: ``code`` (e.g. ``E_INVALID``), ``desc`` bytes and ``fatal``.

    ``send_frame`` is False for the one case where nsqd closes the socket without
    writing any frame (a command line that overflows its 16 KiB read buffer).
    """

    def __init__(self, code: str, desc: bytes | str = b"", *, fatal: bool = True,
                 send_frame: bool = True) -> None:
        self.code = code
        self.desc = _b(desc)
        self.fatal = fatal
        self.send_frame = send_frame
        super().__init__(self.data.decode("utf-8", "replace"))

    @property
    def data(self) -> bytes:
        """The payload of the error frame nsqd sends (``CODE`` or ``CODE desc``)."""
        code = self.code.encode("ascii")
        return code + b" " + self.desc if self.desc else code

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, NsqError) and self.data == other.data
                and self.fatal == other.fatal and self.send_frame == other.send_frame)

    def __hash__(self) -> int:
        return hash((self.data, self.fatal))

    def __repr__(self) -> str:
        return f"NsqError({self.data!r}, fatal={self.fatal})"


_ESCAPES = {7: "\\a", 8: "\\b", 12: "\\f", 10: "\\n", 13: "\\r", 9: "\\t", 11: "\\v",
            0x22: '\\"', 0x5C: "\\\\"}


def go_quote(value: bytes | str) -> bytes:
    """Quote like Go's ``%q`` / strconv.Quote (nsqd uses it for topic/channel names)."""
    if isinstance(value, str):
        value = value.encode("utf-8", "surrogateescape")
    if value.isascii() and value.isalnum():  # the overwhelmingly common case
        return b'"' + value + b'"'
    out = ['"']
    for ch in value.decode("utf-8", "surrogateescape"):
        cp = ord(ch)
        if cp in _ESCAPES:
            out.append(_ESCAPES[cp])
        elif 0xDC80 <= cp <= 0xDCFF:  # an invalid UTF-8 byte
            out.append("\\x%02x" % (cp - 0xDC00))
        elif ch.isprintable():
            out.append(ch)
        elif cp < 0x20 or cp == 0x7F:
            out.append("\\x%02x" % cp)
        elif cp < 0x10000:
            out.append("\\u%04x" % cp)
        else:
            out.append("\\U%08x" % cp)
    out.append('"')
    return "".join(out).encode("utf-8")


# -- framing / command errors (all fatal) ------------------------------------

def bad_protocol() -> NsqError:
    """Wrong 4-byte magic: the bare code, no description."""
    return NsqError("E_BAD_PROTOCOL")


def line_too_long(max_line: int) -> NsqError:
    """A command line overflowing nsqd's read buffer: nsqd just closes, sending no frame."""
    return NsqError("E_INVALID", f"command line longer than {max_line} bytes", send_frame=False)


def invalid(desc: bytes | str) -> NsqError:
    """Generic fatal ``E_INVALID <desc>``."""
    return NsqError("E_INVALID", desc)


def invalid_command(verb: bytes | str) -> NsqError:
    """Unknown verb: ``E_INVALID invalid command <VERB>``."""
    return NsqError("E_INVALID", b"invalid command " + _b(verb))


def cannot_in_state(verb: bytes | str) -> NsqError:
    """Command not allowed in the connection's state."""
    return NsqError("E_INVALID", b"cannot " + _b(verb) + b" in current state")


def tls_required(verb: bytes | str) -> NsqError:
    """Any command but IDENTIFY on a plain connection when nsqd has --tls-required."""
    return NsqError("E_INVALID", b"cannot " + _b(verb) + b" in current state (TLS required)")


def sub_heartbeats_disabled() -> NsqError:
    """SUB after IDENTIFY heartbeat_interval -1."""
    return NsqError("E_INVALID", "cannot SUB with heartbeats disabled")


def insufficient_params(verb: str) -> NsqError:
    """Missing parameters; nsqd words it "params" for FIN/REQ/TOUCH, "parameters" otherwise."""
    word = "params" if verb in ("FIN", "REQ", "TOUCH") else "parameters"
    return NsqError("E_INVALID", f"{verb} insufficient number of {word}")


def auth_invalid_params() -> NsqError:
    """AUTH with parameters on its line."""
    return NsqError("E_INVALID", "AUTH invalid number of parameters")


def auth_already_set() -> NsqError:
    """A second AUTH on a connection that already has authorizations."""
    return NsqError("E_INVALID", "AUTH already set")


def invalid_message_id() -> NsqError:
    """FIN/REQ/TOUCH id that is not exactly 16 bytes."""
    return NsqError("E_INVALID", "invalid message ID")


def rdy_parse(raw: bytes) -> NsqError:
    """RDY count that is not all decimal digits (the raw parameter is echoed)."""
    return NsqError("E_INVALID", b"RDY could not parse count " + _b(raw))


def rdy_range(count: int, max_rdy: int) -> NsqError:
    """RDY count outside 0..max-rdy-count."""
    return NsqError("E_INVALID", f"RDY count {count} out of range 0-{max_rdy}")


def req_parse(raw: bytes) -> NsqError:
    """REQ timeout that is not all decimal digits."""
    return NsqError("E_INVALID", b"REQ could not parse timeout " + _b(raw))


def dpub_parse(raw: bytes) -> NsqError:
    """DPUB defer that is not all decimal digits."""
    return NsqError("E_INVALID", b"DPUB could not parse timeout " + _b(raw))


def dpub_range(timeout_ms: int, max_ms: int) -> NsqError:
    """DPUB defer outside 0..max-req-timeout (REQ clamps instead)."""
    return NsqError("E_INVALID", f"DPUB timeout {timeout_ms} out of range 0-{max_ms}")


def bad_topic(verb: str, name: bytes | str) -> NsqError:
    """Invalid topic name; MPUB repeats the code inside its description, as nsqd does."""
    prefix = b"E_BAD_TOPIC " if verb == "MPUB" else b""
    return NsqError("E_BAD_TOPIC",
                    prefix + _b(verb) + b" topic name " + go_quote(name) + b" is not valid")


def bad_channel(verb: str, name: bytes | str) -> NsqError:
    """Invalid channel name on SUB."""
    return NsqError("E_BAD_CHANNEL",
                    _b(verb) + b" channel name " + go_quote(name) + b" is not valid")


def bad_body(desc: bytes | str) -> NsqError:
    """Generic fatal ``E_BAD_BODY <desc>``."""
    return NsqError("E_BAD_BODY", desc)


def bad_message(desc: bytes | str) -> NsqError:
    """Generic fatal ``E_BAD_MESSAGE <desc>``."""
    return NsqError("E_BAD_MESSAGE", desc)


def body_size_invalid(verb: str, size: int) -> NsqError:
    """Body length <= 0; PUB/DPUB say "message body" and use E_BAD_MESSAGE."""
    if verb in ("PUB", "DPUB"):
        return bad_message(f"{verb} invalid message body size {size}")
    return bad_body(f"{verb} invalid body size {size}")


def body_too_big(verb: str, size: int, limit: int) -> NsqError:
    """Body length above max-msg-size (PUB/DPUB) or max-body-size (IDENTIFY/AUTH/MPUB)."""
    if verb in ("PUB", "DPUB"):
        return bad_message(f"{verb} message too big {size} > {limit}")
    return bad_body(f"{verb} body too big {size} > {limit}")


def mpub_invalid_count(count: int) -> NsqError:
    """MPUB message count <= 0 or above (max-body-size - 4) / 5."""
    return bad_body(f"MPUB invalid message count {count}")


def mpub_message_size_invalid(index: int, size: int) -> NsqError:
    """MPUB inner message length <= 0 (index is 0-based)."""
    return bad_message(f"MPUB invalid message({index}) body size {size}")


def mpub_message_too_big(size: int, limit: int) -> NsqError:
    """MPUB inner message above max-msg-size."""
    return bad_message(f"MPUB message too big {size} > {limit}")


def identify_decode_failed() -> NsqError:
    """IDENTIFY body that does not decode as nsqd's JSON struct."""
    return bad_body("IDENTIFY failed to decode JSON body")


def identify_setting_invalid(setting: str, value: int) -> NsqError:
    """Out-of-range IDENTIFY value; ``setting`` is the prose name, e.g. "heartbeat interval"."""
    return bad_body(f"IDENTIFY {setting} ({value}) is invalid")


def identify_failed(reason: str) -> NsqError:
    """Transport upgrade (TLS/snappy/deflate) or reply write failed."""
    return NsqError("E_IDENTIFY_FAILED", f"IDENTIFY failed {reason}")


def identify_both_compressions() -> NsqError:
    """IDENTIFY asking for (and granted) both snappy and deflate."""
    return NsqError("E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression")


# -- storage-side failures ----------------------------------------------------

def pub_failed(reason: str) -> NsqError:
    """The topic refused a PUB (exiting, disk write failure)."""
    return NsqError("E_PUB_FAILED", f"PUB failed {reason}")


def mpub_failed(reason: str) -> NsqError:
    """The topic refused an MPUB."""
    return NsqError("E_MPUB_FAILED", f"MPUB failed {reason}")


def dpub_failed(reason: str) -> NsqError:
    """The topic refused a DPUB."""
    return NsqError("E_DPUB_FAILED", f"DPUB failed {reason}")


def sub_failed(reason: str) -> NsqError:
    """Channel exiting or --max-channel-consumers reached."""
    return NsqError("E_SUB_FAILED", f"SUB failed {reason}")


def fin_failed(msg_id: bytes, reason: str = REASON_NOT_IN_FLIGHT) -> NsqError:
    """Non-fatal: ``FIN <id> failed <reason>``."""
    return NsqError("E_FIN_FAILED", b"FIN " + msg_id + b" failed " + _b(reason), fatal=False)


def req_failed(msg_id: bytes, reason: str = REASON_NOT_IN_FLIGHT) -> NsqError:
    """Non-fatal: ``REQ <id> failed <reason>``."""
    return NsqError("E_REQ_FAILED", b"REQ " + msg_id + b" failed " + _b(reason), fatal=False)


def touch_failed(msg_id: bytes, reason: str = REASON_NOT_IN_FLIGHT) -> NsqError:
    """Non-fatal: ``TOUCH <id> failed <reason>``."""
    return NsqError("E_TOUCH_FAILED", b"TOUCH " + msg_id + b" failed " + _b(reason), fatal=False)


# -- auth -----------------------------------------------------------------------

def auth_disabled() -> NsqError:
    """AUTH sent to a server without auth configured."""
    return NsqError("E_AUTH_DISABLED", "AUTH disabled")


def auth_failed() -> NsqError:
    """Auth server unreachable or gave an invalid answer (details are not leaked)."""
    return NsqError("E_AUTH_FAILED", "AUTH failed")


def auth_no_authorizations() -> NsqError:
    """The auth server granted nothing for this secret."""
    return NsqError("E_UNAUTHORIZED", "AUTH no authorizations found")


def unauthorized(verb: str, topic: bytes | str, channel: bytes | str = b"") -> NsqError:
    """No permission for VERB on topic/channel."""
    return NsqError("E_UNAUTHORIZED", b"AUTH failed for " + _b(verb) + b" on "
                    + go_quote(topic) + b" " + go_quote(channel))


def auth_first(verb: str) -> NsqError:
    """PUB/MPUB/DPUB/SUB before AUTH when auth is enabled."""
    return NsqError("E_AUTH_FIRST", f"AUTH required before {verb}")


def auth_error(reason: str) -> NsqError:
    """Internal failure serialising the AUTH reply."""
    return NsqError("E_AUTH_ERROR", f"AUTH error {reason}")
