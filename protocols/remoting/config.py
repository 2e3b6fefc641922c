"""The RocketMQ front doors' config keys (``rocketmq.*``, names as in RocketMQ's
broker.conf), declared for L{mqserver.config.KeySet} by the ``namesrv`` and ``broker``
plugins."""

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(text):
    """Return the delay of each RocketMQ delay level (level 1 first) in ms, from a
    C{messageDelayLevel} string such as C{"1s 5s 10s 2m 1h"}. Raises ValueError."""
    out = []
    for item in text.split():
        for unit in ("ms", "s", "m", "h", "d"):
            if item.endswith(unit) and item[: -len(unit)].isdigit():
                out.append(int(item[: -len(unit)]) * _UNITS_MS[unit])
                break
        else:
            raise ValueError(f"bad delay level {item!r}")
    if not out:
        raise ValueError("no delay levels")
    return out


def _delay_levels_ok(text):
    try:
        parse_delay_levels(text)
    except ValueError:
        return False
    return True


def _is_ipv4(text):
    parts = text.split(".")
    return len(parts) == 4 and all(p.isdigit() and int(p) < 256 for p in parts)


KEYS = {
    "rocketmq.brokerName": (str, "broker-a", lambda v: bool(v), "a non-empty name"),
    "rocketmq.brokerClusterName": (str, "DefaultCluster", lambda v: bool(v), "a non-empty name"),
    "rocketmq.brokerId": (int, 0, lambda v: v >= 0, ">= 0 (0 is the master)"),
    "rocketmq.brokerIP": (str, "", lambda v: v == "" or _is_ipv4(v),
                          "an IPv4 address (clients connect to it)"),
    "rocketmq.namesrvAddr": (str, "", None, None),
    # 4.9's replication role: SYNC_MASTER answers a send once a slave holds it too
    "rocketmq.brokerRole": (str, "ASYNC_MASTER",
                            lambda v: v in ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE"),
                            "ASYNC_MASTER, SYNC_MASTER or SLAVE"),
    "rocketmq.syncFlushTimeout": (int, 5000, lambda v: v >= 1, ">= 1 (ms)"),
    "rocketmq.haSlaveFallbehindMax": (int, 256 * 1024 * 1024, lambda v: v >= 0, ">= 0 (bytes)"),
    "rocketmq.autoCreateTopicEnable": (bool, True, None, None),
    "rocketmq.autoCreateSubscriptionGroup": (bool, True, None, None),
    "rocketmq.defaultTopicQueueNums": (int, 4, lambda v: 1 <= v <= 1024, "1..1024"),
    "rocketmq.messageDelayLevel": (
        str,
        "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h",
        _delay_levels_ok,
        "space-separated durations like 1s 5m 2h",
    ),
    "rocketmq.maxReconsumeTimes": (int, 16, lambda v: v >= 0, ">= 0"),
    "rocketmq.registerIntervalMs": (int, 30000, lambda v: v >= 100, ">= 100"),
    "rocketmq.brokerExpireMs": (int, 120000, lambda v: v >= 100, ">= 100"),
    "rocketmq.scanIntervalMs": (int, 10000, lambda v: v >= 100, ">= 100"),
    "rocketmq.longPollMaxMs": (int, 60000, lambda v: v >= 0, ">= 0"),
    "rocketmq.longPollBatchMs": (int, 1, lambda v: 0 <= v <= 1000, "0..1000"),
    "rocketmq.transactionTimeoutMs": (int, 6000, lambda v: v >= 0, ">= 0"),
    "rocketmq.transactionCheckMax": (int, 15, lambda v: v >= 0, ">= 0"),
    "rocketmq.transactionCheckIntervalMs": (int, 60000, lambda v: v >= 10, ">= 10"),
    # the broker's plain ACL (aclEnable in broker.conf; the file in plain_acl.yml format)
    "rocketmq.aclEnable": (bool, False, None, None),
    "rocketmq.aclFile": (str, "", None, None),
    "rocketmq.aclCheckIntervalMs": (int, 5000, lambda v: v >= 0, ">= 0"),
    # RocketMQ's idle handler closes a channel with no traffic for this long
    "rocketmq.serverChannelMaxIdleTimeSeconds": (int, 120, lambda v: v >= 0, ">= 0 (0: never)"),
}

#: What each key does (docs/configuration.md is generated from it).
DOCS = {
    "rocketmq.brokerName": "broker name in routes",
    "rocketmq.brokerClusterName": "cluster name",
    "rocketmq.brokerId": "0: master",
    "rocketmq.brokerIP": "address advertised and written as STOREHOST; empty: the host's address",
    "rocketmq.namesrvAddr": "`host:port;host:port` of nameservers to register with; empty: the "
                            "embedded one",
    "rocketmq.autoCreateTopicEnable": "TBW102 template and topic auto-creation",
    "rocketmq.autoCreateSubscriptionGroup": "groups created on first use",
    "rocketmq.defaultTopicQueueNums": "queues of auto-created topics (capped by TBW102)",
    "rocketmq.messageDelayLevel": "delay of each delay level, level 1 first",
    "rocketmq.maxReconsumeTimes": "default `retryMaxTimes` of new groups",
    "rocketmq.registerIntervalMs": "broker re-registration period, ms",
    "rocketmq.brokerExpireMs": "embedded nameserver: a broker silent this long is dropped, ms",
    "rocketmq.scanIntervalMs": "embedded nameserver: period of its liveness scan, ms",
    "rocketmq.longPollMaxMs": "upper bound on the client's `suspendTimeoutMillis`, ms",
    "rocketmq.longPollBatchMs": "an arrival wakes a pull parked less than this long before up to "
                                "this long later, with what came meanwhile (0: at once), ms",
    "rocketmq.transactionTimeoutMs": "age of a half message before it is checked back, ms",
    "rocketmq.transactionCheckMax": "checks before a half message is discarded",
    "rocketmq.transactionCheckIntervalMs": "period of the transaction check, ms",
    "rocketmq.aclEnable": "the broker's plain ACL (`aclEnable` in broker.conf; docs/security.md)",
    "rocketmq.aclFile": "the ACL file, in `plain_acl.yml` format",
    "rocketmq.aclCheckIntervalMs": "how often the ACL file is reloaded when it changed, ms",
    "rocketmq.serverChannelMaxIdleTimeSeconds": "close a nameserver or broker connection that "
                                                "sent nothing for this long (clients heartbeat "
                                                "every 30 s); 0: never",
    "rocketmq.brokerRole": "SYNC_MASTER answers a send once a slave holds it, with 4.9.4's "
                           "FLUSH_SLAVE_TIMEOUT / SLAVE_NOT_AVAILABLE otherwise "
                           "(docs/replication.md)",
    "rocketmq.syncFlushTimeout": "ms a SYNC_MASTER send waits for the slave",
    "rocketmq.haSlaveFallbehindMax": "bytes of log a slave may be behind and still count",
}


def validate(values):
    """ACL needs its file, which must load (a broken one stops the start, as in 4.9);
    a SLAVE broker role is a replication slave's."""
    from mqserver.config import ConfigError

    if values["rocketmq.brokerRole"] == "SLAVE" and values["role"] != "slave":
        raise ConfigError("config key 'rocketmq.brokerRole' is SLAVE but 'role' is not slave"
                          " (a slave follows its master: role: slave, master: HOST:PORT)")
    if not values["rocketmq.aclEnable"]:
        return
    if not values["rocketmq.aclFile"]:
        raise ConfigError("config key 'rocketmq.aclEnable' needs 'rocketmq.aclFile' (a plain_acl.yml)")
    from protocols.remoting.acl import AclConfigError, load_file

    try:
        load_file(values["rocketmq.aclFile"])
    except (OSError, ValueError, AclConfigError) as e:
        raise ConfigError(f"config key 'rocketmq.aclFile': {e}") from None
