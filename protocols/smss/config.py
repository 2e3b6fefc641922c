"""The smss front door's own config keys, under the names smss's config.yaml gives them,
declared for L{mqserver.config.KeySet} by the ``smss`` plugin."""

from mqserver.config import UNUSED

KEYS = {
    "store.maxPubPayload": (int, 64 << 20, lambda v: 9 <= v <= 1 << 30, "9..1073741824"),
    "store.folderCount": (int, 10, lambda v: v >= 1, ">= 1"),
    "timeout.net.write": (int, 1000, lambda v: v >= 1, ">= 1"),
    "timeout.server.alive": (int, 30000, lambda v: v >= 10, ">= 10"),
    # smss closes a connection after 360 header reads of 5 s time out: 30 minutes
    "timeout.net.idle": (int, 1_800_000, lambda v: v >= 0, ">= 0 (ms, 0: never)"),
}

#: What each key does (docs/configuration.md is generated from it).
DOCS = {
    "store.maxPubPayload": "largest smss PUB/DELAY payload, bytes, refused before it is buffered",
    "store.folderCount": "smss's hash-bucket count; only used for `topicRoot` in topic JSON",
    "timeout.net.write": UNUSED + "smss's write timeout (ms) for its ALIVE replies (its "
                         "other writes wait a fixed 5 s)",
    "timeout.server.alive": "ms without a write before an idle subscription or REPLICA stream "
                            "gets ALIVE, repeated while it stays idle (alias `time.server.alive`)",
    "timeout.net.idle": "ms without a request before an smss connection is closed (SUB and "
                        "REPLICA streams are exempt)",
}

#: The smss README's name for the alive interval its code reads as timeout.server.alive.
ALIASES = {"time.server.alive": "timeout.server.alive"}
