"""Pure IDENTIFY negotiation, reproducing nsqd v1.3.0.

:func:`negotiate` takes the raw IDENTIFY body and the server settings and returns the
connection's effective settings, the transport upgrades to perform and the reply
(``OK`` or the JSON object), or raises the exact :class:`NsqError` nsqd sends.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from . import errors as E

__all__ = ["ServerSettings", "ClientSettings", "IdentifyResult", "negotiate",
           "decode_identify_body"]


@dataclass(frozen=True)
class ServerSettings:
    """The nsqd options IDENTIFY depends on (durations in ms), with nsqd's defaults."""

    version: str = "1.3.0"
    max_rdy_count: int = 2500
    msg_timeout_ms: int = 60000
    max_msg_timeout_ms: int = 900000
    heartbeat_interval_ms: int = 30000        # client timeout (60 s) / 2
    max_heartbeat_interval_ms: int = 60000
    output_buffer_size: int = 16384
    max_output_buffer_size: int = 65536
    output_buffer_timeout_ms: int = 250
    min_output_buffer_timeout_ms: int = 25
    max_output_buffer_timeout_ms: int = 30000
    tls_available: bool = False               # nsqd has a certificate
    snappy_enabled: bool = True
    deflate_enabled: bool = True
    max_deflate_level: int = 6
    auth_required: bool = False               # nsqd has auth servers configured


@dataclass(frozen=True)
class ClientSettings:
    """A connection's effective settings; 0 heartbeat / buffer timeout means disabled."""

    client_id: str = ""
    hostname: str = ""
    user_agent: str = ""
    heartbeat_interval_ms: int = 30000
    output_buffer_size: int = 16384
    output_buffer_timeout_ms: int = 250
    sample_rate: int = 0
    msg_timeout_ms: int = 60000

    @classmethod
    def defaults(cls, server: ServerSettings) -> "ClientSettings":
        """Settings of a connection that has not sent IDENTIFY."""
        return cls(heartbeat_interval_ms=server.heartbeat_interval_ms,
                   output_buffer_size=server.output_buffer_size,
                   output_buffer_timeout_ms=server.output_buffer_timeout_ms,
                   msg_timeout_ms=server.msg_timeout_ms)


@dataclass(frozen=True)
class IdentifyResult:
    """Outcome of one IDENTIFY.

    ``response`` is None when the client did not ask for feature negotiation (reply a
    plain ``OK``); otherwise the JSON object to send. ``tls_v1``, ``snappy`` and
    ``deflate`` are the upgrades to perform after the reply, in that order, each
    followed by an ``OK`` frame sent through the upgraded transport.
    """

    client: ClientSettings
    feature_negotiation: bool
    tls_v1: bool
    snappy: bool
    deflate: bool
    deflate_level: int
    response: dict[str, Any] | None

    def reply(self) -> bytes:
        """Payload of the response frame: ``OK`` or compact JSON in nsqd's key order."""
        if self.response is None:
            return b"OK"
        return json.dumps(self.response, separators=(",", ":")).encode()


# JSON key -> Go type of nsqd's identify struct field
_FIELDS = {
    "client_id": "string", "hostname": "string", "user_agent": "string",
    "heartbeat_interval": "int", "output_buffer_size": "int", "output_buffer_timeout": "int",
    "feature_negotiation": "bool", "tls_v1": "bool", "deflate": "bool", "snappy": "bool",
    "deflate_level": "int", "sample_rate": "int32", "msg_timeout": "int",
}
_FOLDED = {key.casefold(): key for key in _FIELDS}
_INT_RANGE = {"int": (-(1 << 63), (1 << 63) - 1), "int32": (-(1 << 31), (1 << 31) - 1)}


class _Object(list):
    """A JSON object kept as its (key, value) pairs, in document order."""


class _Float(float):
    """A JSON number written with a fraction or exponent (Go won't put it in an int)."""


def _reject_constant(name: str) -> None:
    raise ValueError(f"invalid JSON constant {name}")


def decode_identify_body(body: bytes) -> dict[str, Any]:
    """Decode an IDENTIFY body the way Go's encoding/json fills nsqd's struct.

    Returns only the known fields that were present and non-null, keyed by their
    canonical JSON name. Keys match case-insensitively (exact match preferred), the
    last occurrence wins, unknown keys are ignored, and a wrong JSON type, a
    non-integral number in an integer field or an overflow is an error.
    Raises the fatal ``E_BAD_BODY IDENTIFY failed to decode JSON body``.
    """
    try:
        doc = json.loads(body.decode("utf-8", "replace"), object_pairs_hook=_Object,
                         parse_float=_Float, parse_constant=_reject_constant)
    except ValueError:
        raise E.identify_decode_failed() from None
    if doc is None:  # Go: unmarshalling null into a struct is a no-op
        return {}
    if not isinstance(doc, _Object):
        raise E.identify_decode_failed()
    found: dict[str, Any] = {}
    for key, value in doc:
        name = key if key in _FIELDS else _FOLDED.get(key.casefold())
        if name is None or value is None:
            continue
        kind = _FIELDS[name]
        if kind == "string":
            ok = isinstance(value, str)
        elif kind == "bool":
            ok = isinstance(value, bool)
        else:
            low, high = _INT_RANGE[kind]
            ok = type(value) is int and low <= value <= high
        if not ok:
            raise E.identify_decode_failed()
        found[name] = value
    return found


def _pick(value: int, current: int, low: int, high: int, disabled: int, setting: str) -> int:
    # nsqd's shared rule: -1 disables, 0 keeps the current value, else low..high.
    if value == -1:
        return disabled
    if value == 0:
        return current
    if low <= value <= high:
        return value
    raise E.identify_setting_invalid(setting, value)


def negotiate(body: bytes, server: ServerSettings = ServerSettings(),
              current: ClientSettings | None = None) -> IdentifyResult:
    """Apply one IDENTIFY body to the connection's ``current`` settings, as nsqd does.

    Checks run in nsqd's order (heartbeat interval, output buffer timeout, output
    buffer size, sample rate, msg timeout); the first failure raises
    ``E_BAD_BODY IDENTIFY <setting> (<value>) is invalid``. With feature negotiation,
    granting both snappy and deflate raises ``E_IDENTIFY_FAILED``.
    """
    cur = current if current is not None else ClientSettings.defaults(server)
    data = decode_identify_body(body)
    get = data.get
    heartbeat = _pick(get("heartbeat_interval", 0), cur.heartbeat_interval_ms, 1000,
                      server.max_heartbeat_interval_ms, 0, "heartbeat interval")
    buffer_timeout = _pick(get("output_buffer_timeout", 0), cur.output_buffer_timeout_ms,
                           server.min_output_buffer_timeout_ms,
                           server.max_output_buffer_timeout_ms, 0, "output buffer timeout")
    buffer_size = _pick(get("output_buffer_size", 0), cur.output_buffer_size, 64,
                        server.max_output_buffer_size, 1, "output buffer size")
    if get("output_buffer_size") == -1:
        buffer_timeout = 0  # unbuffered: every write goes straight out
    sample_rate = get("sample_rate", 0)
    if not 0 <= sample_rate <= 99:
        raise E.identify_setting_invalid("sample rate", sample_rate)
    msg_timeout = get("msg_timeout", 0)
    if msg_timeout != 0 and not 1000 <= msg_timeout <= server.max_msg_timeout_ms:
        raise E.identify_setting_invalid("msg timeout", msg_timeout)
    client = replace(cur, client_id=get("client_id", ""), hostname=get("hostname", ""),
                     user_agent=get("user_agent", ""), heartbeat_interval_ms=heartbeat,
                     output_buffer_size=buffer_size, output_buffer_timeout_ms=buffer_timeout,
                     sample_rate=sample_rate,
                     msg_timeout_ms=msg_timeout or cur.msg_timeout_ms)

    tls_v1 = server.tls_available and get("tls_v1", False)
    deflate = server.deflate_enabled and get("deflate", False)
    snappy = server.snappy_enabled and get("snappy", False)
    deflate_level = 6
    if deflate and get("deflate_level", 0) > 0:
        deflate_level = data["deflate_level"]
    deflate_level = min(deflate_level, server.max_deflate_level)

    if not get("feature_negotiation", False):
        # nsqd answers OK and performs no upgrade at all in this case
        return IdentifyResult(client, False, False, False, False, deflate_level, None)
    if deflate and snappy:
        raise E.identify_both_compressions()
    response = {
        "max_rdy_count": server.max_rdy_count,
        "version": server.version,
        "max_msg_timeout": server.max_msg_timeout_ms,
        "msg_timeout": client.msg_timeout_ms,
        "tls_v1": tls_v1,
        "deflate": deflate,
        "deflate_level": deflate_level,
        "max_deflate_level": server.max_deflate_level,
        "snappy": snappy,
        "sample_rate": client.sample_rate,
        "auth_required": server.auth_required,
        "output_buffer_size": client.output_buffer_size,
        "output_buffer_timeout": client.output_buffer_timeout_ms,
    }
    return IdentifyResult(client, True, tls_v1, snappy, deflate, deflate_level, response)
