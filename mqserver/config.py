"""config.yaml -> typed settings.

Key names follow smss's config.yaml (spec §13) where smss has them; ``listen:`` holds one
Twisted endpoint string (or ``off``) per front door. Unknown keys, wrong types and values
out of range are errors that name the key, so a typo never silently becomes a default.
"""

import yaml

from mqserver.errors import BrokerError


class ConfigError(BrokerError):
    """The configuration is invalid; the text names the key."""


#: The front doors when no plugin list is given (the plugins in twisted/plugins say more).
LISTEN_DEFAULTS = {
    "smss": "tcp:12301:interface=127.0.0.1",
}

# dotted key -> (type, default, check or None, what the check wants)
SCHEMA = {
    "port": (int, None, lambda v: 0 <= v <= 65535, "a port number"),
    "role": (str, "master", lambda v: v in ("master", "slave"), "master or slave"),
    "master": (str, "", lambda v: v == "" or (":" in v and v.rpartition(":")[2].isdigit()), "HOST:PORT"),
    "event": (int, 0, lambda v: v >= 0, ">= 0"),
    "store.path": (str, "data", None, None),
    "store.maxLogSize": (int, 1 << 30, lambda v: 4096 <= v <= 1 << 30, "4096..1073741824"),
    "store.flushLevel": (int, 1, lambda v: v in (0, 1, 2), "0, 1 or 2"),
    "store.maxDays": (int, 7, lambda v: v >= 0, ">= 0 (0 keeps files forever)"),
    "store.clearInterval": (int, 7200, lambda v: v >= 1, ">= 1"),
    "store.waitDelLockTimeoutMs": (int, 3000, lambda v: v >= 0, ">= 0"),
    "store.noCache": (bool, False, None, None),
    "store.folderCount": (int, 10, lambda v: v >= 1, ">= 1"),
    "store.maxMessageSize": (int, 4 << 20, lambda v: 1 <= v <= 64 << 20, "1..67108864"),
    "store.maxPubPayload": (int, 64 << 20, lambda v: 9 <= v <= 1 << 30, "9..1073741824"),
    "store.cqEntriesPerFile": (int, 300_000, lambda v: v >= 1, ">= 1"),
    "server.spinMicros": (int, 200, lambda v: 0 <= v <= 10_000, "0..10000 (0: never busy-poll)"),
    "log.path": (str, "stdout", None, None),
    "log.sample": (int, 10000, lambda v: v >= 1, ">= 1"),
    "log.withGid": (bool, True, None, None),
    "log.level": (str, "info", lambda v: v in ("debug", "info", "warn", "error"), "debug/info/warn/error"),
    "log.rotate.maxSize": (int, 500, lambda v: v >= 1, ">= 1"),
    "log.rotate.maxBackups": (int, 10, lambda v: v >= 0, ">= 0"),
    "log.rotate.maxAge": (int, 14, lambda v: v >= 0, ">= 0"),
    "timeout.net.write": (int, 1000, lambda v: v >= 1, ">= 1"),
    "timeout.server.alive": (int, 30000, lambda v: v >= 10, ">= 10"),
    "worker.buffSize": (int, 1000, lambda v: v >= 1, ">= 1"),
    "worker.waitMsgTimeout": (int, 1000, lambda v: v >= 1, ">= 1"),
    "worker.waitMsgTimeoutLogSample": (int, 30, lambda v: v >= 1, ">= 1"),
    "background.defaultScanSecond": (int, 7200, lambda v: v >= 1, ">= 1"),
    "background.firstExecSecond": (int, 1, lambda v: v >= 0, ">= 0"),
    # RocketMQ front doors (protocols/remoting): names as in RocketMQ's broker.conf
    "rocketmq.brokerName": (str, "broker-a", lambda v: bool(v), "a non-empty name"),
    "rocketmq.brokerClusterName": (str, "DefaultCluster", lambda v: bool(v), "a non-empty name"),
    "rocketmq.brokerId": (int, 0, lambda v: v >= 0, ">= 0 (0 is the master)"),
    "rocketmq.brokerIP": (str, "", lambda v: v == "" or _is_ipv4(v), "an IPv4 address (clients connect to it)"),
    "rocketmq.namesrvAddr": (str, "", None, None),
    "rocketmq.autoCreateTopicEnable": (bool, True, None, None),
    "rocketmq.autoCreateSubscriptionGroup": (bool, True, None, None),
    "rocketmq.defaultTopicQueueNums": (int, 4, lambda v: 1 <= v <= 1024, "1..1024"),
    "rocketmq.messageDelayLevel": (
        str,
        "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h",
        lambda v: _delay_levels_ok(v),
        "space-separated durations like 1s 5m 2h",
    ),
    "rocketmq.maxReconsumeTimes": (int, 16, lambda v: v >= 0, ">= 0"),
    "rocketmq.registerIntervalMs": (int, 30000, lambda v: v >= 100, ">= 100"),
    "rocketmq.brokerExpireMs": (int, 120000, lambda v: v >= 100, ">= 100"),
    "rocketmq.scanIntervalMs": (int, 10000, lambda v: v >= 100, ">= 100"),
    "rocketmq.longPollMaxMs": (int, 15000, lambda v: v >= 0, ">= 0"),
    # NSQ front doors (names follow nsqd's flags)
    "nsq.lookupdTcpAddresses": (list, [], lambda v: all(isinstance(a, str) and ":" in a for a in v),
                                "a list of host:port strings"),
    "nsq.broadcastAddress": (str, "127.0.0.1", None, None),
    "nsq.msgTimeout": (int, 60000, lambda v: 1000 <= v <= 900000, "1000..900000 (ms)"),
    "nsq.maxRdyCount": (int, 2500, lambda v: 1 <= v <= 1_000_000, "1..1000000"),
    "nsq.maxMsgSize": (int, 1048576, lambda v: 1 <= v <= 64 << 20, "1..67108864"),
    "nsq.maxBodySize": (int, 5242880, lambda v: 1 <= v <= 1 << 30, "1..1073741824"),
}


def _is_ipv4(text):
    parts = text.split(".")
    return len(parts) == 4 and all(p.isdigit() and int(p) < 256 for p in parts)


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

#: Names the smss README uses for keys its code reads under another name.
ALIASES = {
    "time.server.alive": "timeout.server.alive",
    "background.life.defaultScanSec": "background.defaultScanSecond",
    "background.delay.firstExec": "background.firstExecSecond",
}


class Config:
    """Validated settings.

    @ivar values: dotted key -> value, every key of L{SCHEMA} present.
    @ivar listen: front door -> endpoint string, or None when it is off.
    """

    def __init__(self, values, listen):
        self.values = values
        self.listen = listen

    def __getitem__(self, key):
        return self.values[key]


def _flatten(data, prefix, out):
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and key != "listen":
            _flatten(v, key + ".", out)
        else:
            out[key] = v
    return out


def _check(key, value):
    typ, _, check, wants = SCHEMA[key]
    if typ is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"config key {key!r} must be an integer, not {value!r}")
    if typ is bool and not isinstance(value, bool):
        raise ConfigError(f"config key {key!r} must be true or false, not {value!r}")
    if typ is list and not isinstance(value, list):
        raise ConfigError(f"config key {key!r} must be a list, not {value!r}")
    if typ is str and not isinstance(value, str):
        raise ConfigError(f"config key {key!r} must be a string, not {value!r}")
    if check is not None and not check(value):
        raise ConfigError(f"config key {key!r} must be {wants}, not {value!r}")


def build_config(data=None, overrides=None, listen_defaults=None):
    """Validate C{data} (the parsed YAML mapping) plus C{overrides} (dotted keys) and
    return a L{Config}. C{listen_defaults} maps each known front door to its default
    endpoint. Raises L{ConfigError}."""
    if listen_defaults is None:
        listen_defaults = LISTEN_DEFAULTS
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError("config must be a mapping")
    flat = _flatten(data, "", {})
    listen_in = flat.pop("listen", None) or {}
    if not isinstance(listen_in, dict):
        raise ConfigError("config key 'listen' must be a mapping of front door to endpoint")
    values = {k: spec[1] for k, spec in SCHEMA.items()}
    for key, value in list(flat.items()) + list((overrides or {}).items()):
        key = ALIASES.get(key, key)
        if key not in SCHEMA:
            raise ConfigError(f"unknown config key {key!r}")
        _check(key, value)
        values[key] = value
    listen = dict(listen_defaults)
    if values["port"] is not None and "smss" in listen:
        listen["smss"] = f"tcp:{values['port']}:interface=127.0.0.1"
    for name, desc in listen_in.items():
        if name not in listen_defaults:
            known = ", ".join(listen_defaults)
            raise ConfigError(f"unknown config key 'listen.{name}' (known: {known})")
        if desc is False or desc == "off":
            listen[name] = None
        elif isinstance(desc, str) and desc:
            listen[name] = desc
        else:
            raise ConfigError(f"config key 'listen.{name}' must be an endpoint string or 'off'")
    if values["role"] == "slave" and not values["master"]:
        raise ConfigError("config key 'master' (HOST:PORT) is required when role is slave")
    room = values["store.maxLogSize"] - 512
    if values["store.maxMessageSize"] > room:
        if "store.maxMessageSize" in flat or "store.maxMessageSize" in (overrides or {}):
            raise ConfigError("config key 'store.maxMessageSize' must fit in store.maxLogSize")
        # Small segments (tests) cap the default message size rather than refuse it.
        values["store.maxMessageSize"] = room
    return Config(values, listen)


def load_config(path=None, overrides=None, listen_defaults=None):
    """Read C{path} (YAML; None for the defaults) and return a L{Config}."""
    data = None
    if path is not None:
        try:
            with open(path, "rb") as f:
                data = yaml.safe_load(f)
        except OSError as e:
            raise ConfigError(f"cannot read config {path}: {e.strerror}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"config {path} is not valid YAML: {e}") from None
    return build_config(data, overrides, listen_defaults)
