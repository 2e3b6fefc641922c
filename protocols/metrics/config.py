"""The metrics front door's config keys, declared for L{mqserver.config.KeySet} by the
``metrics`` plugin. Its endpoint is ``listen.metrics`` (default
``tcp:9464:interface=127.0.0.1``; ``off`` turns it off)."""

KEYS = {
    "metrics.perConsumer": (bool, True, None, None),
}

#: What each key does (docs/configuration.md is generated from it).
DOCS = {
    "metrics.perConsumer": "one series per consumer in `/metrics` (turn off with very many "
                           "consumers)",
}
