"""The console front door's config keys (``console.*``), declared for
L{mqserver.config.KeySet} by the ``console`` plugin."""

KEYS = {
    "console.maxLineLength": (int, 1 << 20, lambda v: 64 <= v <= 64 << 20, "64..67108864"),
    "console.window": (int, 100, lambda v: 1 <= v <= 100_000, "1..100000"),
    "console.peekMax": (int, 100, lambda v: 1 <= v <= 10_000, "1..10000"),
    # the first line must be "AUTH <token>" when set (docs/security.md)
    "console.token": (str, "", None, None),
}

#: What each key does (docs/configuration.md is generated from it).
DOCS = {
    "console.maxLineLength": "longest console line, bytes",
    "console.window": "un-acked messages one `SUB` may hold per queue",
    "console.peekMax": "most messages `PEEK` returns (`FETCH`: ten times as many)",
    "console.token": "the first console line must be `AUTH <token>`; empty: no authentication "
                     "(docs/security.md)",
}
