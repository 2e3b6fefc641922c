"""The NSQ front doors' config keys (``nsq.*``, named after nsqd's flags), declared for
L{mqserver.config.KeySet} by the nsqd and nsqlookupd plugins."""

KEYS = {
    "nsq.lookupdTcpAddresses": (list, [], lambda v: all(isinstance(a, str) and ":" in a for a in v),
                                "a list of host:port strings"),
    "nsq.broadcastAddress": (str, "127.0.0.1", None, None),
    "nsq.msgTimeout": (int, 60000, lambda v: 1000 <= v <= 1 << 40, ">= 1000 (ms)"),
    "nsq.maxRdyCount": (int, 2500, lambda v: 1 <= v <= 1_000_000, "1..1000000"),
    "nsq.maxMsgSize": (int, 1048576, lambda v: 1 <= v <= 64 << 20, "1..67108864"),
    "nsq.maxBodySize": (int, 5242880, lambda v: 1 <= v <= 1 << 30, "1..1073741824"),
    # nsqd's --max-msg-timeout and --max-req-timeout (ms): the most a consumer may ask of
    # IDENTIFY msg_timeout and TOUCH, and of REQ and DPUB delays
    "nsq.maxMsgTimeout": (int, 900000, lambda v: 1000 <= v <= 1 << 40, ">= 1000 (ms)"),
    "nsq.maxReqTimeout": (int, 3600000, lambda v: 0 <= v <= 1 << 40, ">= 0 (ms)"),
    # nsqd's client-overridable bounds (ms and bytes): what IDENTIFY may ask for, and the
    # output buffer's flush interval of a client that does not ask
    "nsq.maxHeartbeatInterval": (int, 60000, lambda v: 1000 <= v <= 1 << 40, ">= 1000 (ms)"),
    "nsq.outputBufferTimeout": (int, 250, lambda v: 1 <= v <= 1 << 40, ">= 1 (ms)"),
    "nsq.minOutputBufferTimeout": (int, 25, lambda v: 1 <= v <= 1 << 40, ">= 1 (ms)"),
    "nsq.maxOutputBufferTimeout": (int, 30000, lambda v: 1 <= v <= 1 << 40, ">= 1 (ms)"),
    "nsq.maxOutputBufferSize": (int, 65536, lambda v: 64 <= v <= 64 << 20, "64..67108864"),
    # nsqd's --max-channel-consumers: SUBs one channel may have at once (0: no limit)
    "nsq.maxChannelConsumers": (int, 0, lambda v: 0 <= v <= 1 << 31, ">= 0 (0: no limit)"),
    # nsqd's --deflate, --max-deflate-level and --snappy (IDENTIFY's compression)
    "nsq.deflate": (bool, True, None, None),
    "nsq.maxDeflateLevel": (int, 6, lambda v: 1 <= v <= 9, "1..9"),
    "nsq.snappy": (bool, True, None, None),
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

#: What each key does (docs/configuration.md is generated from it).
DOCS = {
    "nsq.lookupdTcpAddresses": "nsqlookupd TCP addresses (`host:port`) the broker registers its "
                               "topics and channels with (`--lookupd-tcp-address`)",
    "nsq.broadcastAddress": "address given to lookupds and in nsqd's `/info` "
                            "(`--broadcast-address`)",
    "nsq.msgTimeout": "default in-flight timeout, ms (`--msg-timeout`)",
    "nsq.maxRdyCount": "RDY ceiling (`--max-rdy-count`)",
    "nsq.maxMsgSize": "largest message body, bytes (`--max-msg-size`)",
    "nsq.maxBodySize": "largest MPUB/IDENTIFY body, bytes (`--max-body-size`)",
    "nsq.maxMsgTimeout": "most a consumer may ask of IDENTIFY `msg_timeout` and of TOUCH, ms "
                         "(`--max-msg-timeout`)",
    "nsq.maxReqTimeout": "longest REQ delay (longer ones are cut to it) and DPUB delay (longer "
                         "ones are `E_INVALID`), ms (`--max-req-timeout`)",
    "nsq.maxHeartbeatInterval": "most a consumer may ask of IDENTIFY `heartbeat_interval`, ms "
                                "(`--max-heartbeat-interval`)",
    "nsq.outputBufferTimeout": "flush interval of a consumer's output buffer when it asks for "
                               "none, ms (`--output-buffer-timeout`)",
    "nsq.minOutputBufferTimeout": "least IDENTIFY `output_buffer_timeout` may ask for, ms "
                                  "(`--min-output-buffer-timeout`)",
    "nsq.maxOutputBufferTimeout": "most IDENTIFY `output_buffer_timeout` may ask for, ms "
                                  "(`--max-output-buffer-timeout`)",
    "nsq.maxOutputBufferSize": "most IDENTIFY `output_buffer_size` may ask for, bytes "
                               "(`--max-output-buffer-size`)",
    "nsq.maxChannelConsumers": "most consumers one channel may have at once; 0: no limit "
                               "(`--max-channel-consumers`)",
    "nsq.deflate": "IDENTIFY may turn on deflate (`--deflate`)",
    "nsq.maxDeflateLevel": "highest deflate level IDENTIFY may ask for (`--max-deflate-level`)",
    "nsq.snappy": "IDENTIFY may turn on snappy (`--snappy`)",
    "nsq.tlsCert": "certificate (PEM) for IDENTIFY `tls_v1` (`--tls-cert`; needs `nsq.tlsKey`)",
    "nsq.tlsKey": "private key (PEM) of `nsq.tlsCert` (`--tls-key`)",
    "nsq.tlsRequired": "clients must upgrade to TLS before anything else (`--tls-required`)",
    "nsq.authHttpAddresses": "auth servers for `AUTH` (`--auth-http-address`; docs/security.md)",
    "nsq.httpIdleTimeout": "ms before an idle nsqd or lookupd HTTP connection is closed; 0: never",
    "nsq.lookupdIdleTimeout": "ms without input before a lookupd TCP connection is closed (nsqd "
                              "PINGs every 15 s); 0: never",
}


def tls_uses(values, listen):
    """Why these keys need the broker's TLS stack (L{mqserver.runtime.tlsstack}): a
    certificate for IDENTIFY C{tls_v1}, or an auth server reached over https."""
    reasons = ["nsq.tlsCert"] if values["nsq.tlsCert"] else []
    if any(a.lower().startswith("https:") for a in values["nsq.authHttpAddresses"]):
        reasons.append("nsq.authHttpAddresses https://")
    return reasons


def validate(values):
    """nsqd's start-up checks: a certificate needs its key, TLS-required needs both."""
    from mqserver.config import ConfigError

    if bool(values["nsq.tlsCert"]) != bool(values["nsq.tlsKey"]):
        raise ConfigError("config keys 'nsq.tlsCert' and 'nsq.tlsKey' go together")
    if values["nsq.tlsRequired"] and not values["nsq.tlsCert"]:
        raise ConfigError("config key 'nsq.tlsRequired' needs 'nsq.tlsCert' and 'nsq.tlsKey'")
    # nsqd starts with any of these; a default no client could keep, or bounds that admit
    # nothing, are refused here instead of failing every IDENTIFY later
    low, high = values["nsq.minOutputBufferTimeout"], values["nsq.maxOutputBufferTimeout"]
    if low > high:
        raise ConfigError(f"config key 'nsq.minOutputBufferTimeout' ({low}) is above"
                          f" 'nsq.maxOutputBufferTimeout' ({high})")
    default = values["nsq.outputBufferTimeout"]
    if not low <= default <= high:
        raise ConfigError(f"config key 'nsq.outputBufferTimeout' ({default}) is outside"
                          f" 'nsq.minOutputBufferTimeout'..'nsq.maxOutputBufferTimeout'"
                          f" ({low}..{high})")
    if values["nsq.msgTimeout"] > values["nsq.maxMsgTimeout"]:
        raise ConfigError(f"config key 'nsq.msgTimeout' ({values['nsq.msgTimeout']}) is"
                          f" above 'nsq.maxMsgTimeout' ({values['nsq.maxMsgTimeout']})")
