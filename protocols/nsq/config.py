"""The NSQ front doors' config keys (``nsq.*``, named after nsqd's flags), declared for
L{mqserver.config.KeySet} by the nsqd and nsqlookupd plugins."""

KEYS = {
    "nsq.lookupdTcpAddresses": (list, [], lambda v: all(isinstance(a, str) and ":" in a for a in v),
                                "a list of host:port strings"),
    "nsq.broadcastAddress": (str, "127.0.0.1", None, None),
    "nsq.msgTimeout": (int, 60000, lambda v: 1000 <= v <= 900000, "1000..900000 (ms)"),
    "nsq.maxRdyCount": (int, 2500, lambda v: 1 <= v <= 1_000_000, "1..1000000"),
    "nsq.maxMsgSize": (int, 1048576, lambda v: 1 <= v <= 64 << 20, "1..67108864"),
    "nsq.maxBodySize": (int, 5242880, lambda v: 1 <= v <= 1 << 30, "1..1073741824"),
    # nsqd's --tls-cert/--tls-key (IDENTIFY tls_v1), --tls-required, --auth-http-address
    "nsq.tlsCert": (str, "", None, None),
    "nsq.tlsKey": (str, "", None, None),
    "nsq.tlsRequired": (bool, False, None, None),
    "nsq.authHttpAddresses": (list, [], lambda v: all(isinstance(a, str) and a for a in v),
                              "a list of host:port strings or URLs"),
    # nsqd TCP connections have nsqd's own deadline (2 heartbeat intervals); these are
    # for the HTTP doors (twisted.web's keep-alive timeout) and lookupd's TCP door
    "nsq.httpIdleTimeout": (int, 60000, lambda v: v >= 0, ">= 0 (ms, 0: never)"),
    "nsq.lookupdIdleTimeout": (int, 60000, lambda v: v >= 0, ">= 0 (ms, 0: never)"),
}


def validate(values):
    """nsqd's start-up checks: a certificate needs its key, TLS-required needs both."""
    from mqserver.config import ConfigError

    if bool(values["nsq.tlsCert"]) != bool(values["nsq.tlsKey"]):
        raise ConfigError("config keys 'nsq.tlsCert' and 'nsq.tlsKey' go together")
    if values["nsq.tlsRequired"] and not values["nsq.tlsCert"]:
        raise ConfigError("config key 'nsq.tlsRequired' needs 'nsq.tlsCert' and 'nsq.tlsKey'")
