"""The msgout HTTP front door's config keys (``msgout.*``), declared for
L{mqserver.config.KeySet} by the ``msgout`` plugin."""

#: The door's name (its key under C{listen:}), which fault rules name.
DOOR = "msgout"

KEYS = {
    "msgout.maxBodySize": (int, 5 << 20, lambda v: 1024 <= v <= 1 << 30, "1024..1073741824"),
    "msgout.maxFetch": (int, 1000, lambda v: 1 <= v <= 100_000, "1..100000"),
    "msgout.maxWaitMs": (int, 60000, lambda v: 0 <= v <= 3_600_000, "0..3600000"),
    "msgout.pushTimeoutMs": (int, 10000, lambda v: 100 <= v <= 600_000, "100..600000"),
    "msgout.pushMaxBackoffMs": (int, 30000, lambda v: 10 <= v <= 3_600_000, "10..3600000"),
    # requests must carry "Authorization: Bearer <token>" when set (docs/security.md)
    "msgout.token": (str, "", None, None),
}

#: What each key does (docs/configuration.md is generated from it).
DOCS = {
    "msgout.maxBodySize": "largest HTTP request body, bytes, refused from the head",
    "msgout.maxFetch": "largest `max` of a fetch",
    "msgout.maxWaitMs": "longest `wait_ms` of a long poll, ms",
    "msgout.pushTimeoutMs": "a push POST that takes longer fails, ms",
    "msgout.pushMaxBackoffMs": "the longest wait between push retries, ms",
    "msgout.token": "bearer token every HTTP request must carry; empty: none (docs/security.md)",
}


def tls_uses(values, listen):
    """Why the door needs the broker's TLS stack (L{mqserver.runtime.tlsstack}): while
    it listens, a push subscription may name an https:// URL at any time."""
    return [f"door {DOOR} (pushes to https:// URLs)"] if listen.get(DOOR) else []
