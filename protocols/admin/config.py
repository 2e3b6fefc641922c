"""The admin front door's config keys, declared for L{mqserver.config.KeySet} by the
``admin`` plugin. Its endpoint is ``listen.admin`` (default
``tcp:9465:interface=127.0.0.1``; ``off`` turns it off)."""

KEYS = {
    "admin.maxPeek": (int, 1000, lambda v: 1 <= v <= 100_000, "1..100000"),
    # requests must carry "Authorization: Bearer <token>" when set (docs/security.md)
    "admin.token": (str, "", None, None),
    # fault rules (docs/sdk-testing.md) may be set through this door only when true
    "admin.faults": (bool, False, None, None),
}

#: What each key does (docs/configuration.md is generated from it).
DOCS = {
    "admin.maxPeek": "most messages one `mqctl peek`/`tail` request reads",
    "admin.token": "bearer token every admin API request (and so `mqctl --token`) must carry; "
                   "empty: none (docs/security.md)",
    "admin.faults": "allow fault rules (`mqctl fault`) through the admin API: for testing "
                    "client libraries only (docs/sdk-testing.md)",
}
