"""config.yaml -> typed settings.

Key names follow smss's config.yaml where smss has them; ``listen:`` holds one
Twisted endpoint string (or ``off``) per front door. Unknown keys, wrong types and values
out of range are errors that name the key, so a typo never silently becomes a default.

The core owns the keys below (the store, the process, smss's general keys); each front
door owns its own keys and declares them in a module its plugin names (L{KeySet}), so a
new door never means editing this file.
"""

import ipaddress
import re

import yaml
from twisted.python.reflect import namedModule

from mqserver.errors import BrokerError


class ConfigError(BrokerError):
    """The configuration is invalid; the text names the key."""


#: Client endpoint strings a slave may name its master by (see protocols.smss.follower).
MASTER_ENDPOINT_PREFIXES = ("tcp:", "tls:", "ssl:", "unix:")


def _valid_networks(v):
    from mqserver.security import valid_networks

    return valid_networks(v)


def _is_master(v):
    if v.startswith(MASTER_ENDPOINT_PREFIXES):
        return True
    return host_port(v) is not None


_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)\Z")


def host_port(text):
    """Return C{(host, port)} from C{HOST:PORT}, or None when it is not one: HOST a host
    name (RFC 1123 labels) or a dotted IPv4 address, PORT 1..65535."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
        return None
    if not host or len(host) > 253:
        return None
    labels = host[:-1].split(".") if host.endswith(".") else host.split(".")
    if not all(_HOST_LABEL.match(label) for label in labels):
        return None
    if all(label.isdigit() for label in labels):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return None
    return host, int(port)


_GROUP_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}\Z")
_ETCD_URL = re.compile(r"https?://([^/:]+):(\d+)\Z")


def etcd_endpoints(value):
    """The etcd client URLs of C{cluster.etcd} (a list, or a comma-separated string);
    a bare C{HOST:PORT} means C{http://HOST:PORT}."""
    items = value.split(",") if isinstance(value, str) else list(value)
    out = []
    for item in items:
        item = item.strip().rstrip("/") if isinstance(item, str) else item
        if item:
            out.append(item if "://" in item else f"http://{item}")
    return out


def _valid_etcd(value):
    if not isinstance(value, (str, list)) or not all(isinstance(v, str) for v in
                                                      ([value] if isinstance(value, str) else value)):
        return False
    for url in etcd_endpoints(value):
        m = _ETCD_URL.match(url)
        if m is None or not 1 <= int(m.group(2)) <= 65535:
            return False
    return True


#: The core's keys: dotted key -> (type, default, check or None, what the check wants).
SCHEMA = {
    "port": (int, None, lambda v: 0 <= v <= 65535, "a port number"),
    "role": (str, "master", lambda v: v in ("master", "slave"), "master or slave"),
    "master": (str, "", lambda v: v == "" or _is_master(v),
               "HOST:PORT (HOST a host name or IPv4 address, PORT 1..65535) or a client "
               "endpoint string (tcp:, tls:, unix:)"),
    "masterTls": (bool, False, None, None),
    "masterCa": (str, "", None, None),
    "event": (int, 0, lambda v: v >= 0, ">= 0"),
    # synchronous replication (on a master): followers that must hold a write before it
    # is acknowledged, and how long a write waits for them
    "replication.syncReplicas": (int, 0, lambda v: 0 <= v <= 64, "0..64 (0: asynchronous)"),
    "replication.syncTimeoutMs": (int, 5000, lambda v: v >= 1, ">= 1"),
    # a replica group (mqserver.cluster.group): etcd decides who leads
    "cluster.etcd": (object, "", lambda v: _valid_etcd(v),
                     "a list or a comma-separated string of etcd client URLs "
                     "(http://HOST:PORT), empty for no group"),
    "cluster.group": (str, "", lambda v: v == "" or _GROUP_NAME.match(v) is not None,
                      "1..64 of A-Z a-z 0-9 . _ -"),
    "cluster.name": (str, "", lambda v: v == "" or _GROUP_NAME.match(v) is not None,
                     "1..64 of A-Z a-z 0-9 . _ -"),
    "cluster.leaseMs": (int, 3000, lambda v: 2000 <= v <= 60_000, "2000..60000"),
    "cluster.members": (int, 3, lambda v: 1 <= v <= 15, "1..15"),
    "security.allow": (list, [], _valid_networks, "a list of CIDRs (e.g. 10.0.0.0/8, ::1/128)"),
    "store.path": (str, "data", None, None),
    "store.maxLogSize": (int, 1 << 30, lambda v: 4096 <= v <= 1 << 30, "4096..1073741824"),
    "store.flushLevel": (int, 1, lambda v: v in (0, 1, 2), "0, 1 or 2"),
    "store.maxDays": (int, 7, lambda v: v >= 0, ">= 0 (0 keeps files forever)"),
    "store.clearInterval": (int, 7200, lambda v: v >= 1, ">= 1"),
    "store.waitDelLockTimeoutMs": (int, 3000, lambda v: v >= 0, ">= 0"),
    "store.noCache": (bool, False, None, None),
    "store.maxMessageSize": (int, 4 << 20, lambda v: 1 <= v <= 64 << 20, "1..67108864"),
    "store.cqEntriesPerFile": (int, 300_000, lambda v: v >= 1, ">= 1"),
    "store.diskMaxUsedRatio": (float, 0.90, lambda v: 0.0 < v <= 1.0, "0 < ratio <= 1 (1: no limit)"),
    "server.reactor": (str, "spinning", lambda v: v in ("spinning", "standard"),
                       "spinning or standard"),
    "server.spinMicros": (int, 200, lambda v: 0 <= v <= 10_000, "0..10000 (0: never busy-poll)"),
    "server.spinProbe": (bool, True, None, None),
    "server.tlsStack": (str, "auto", lambda v: v in ("auto", "always"), "auto or always"),
    "log.path": (str, "stdout", None, None),
    "log.sample": (int, 10000, lambda v: v >= 1, ">= 1"),
    "log.withGid": (bool, True, None, None),
    "log.rotate.maxSize": (int, 500, lambda v: v >= 1, ">= 1"),
    "log.rotate.maxBackups": (int, 10, lambda v: v >= 0, ">= 0"),
    "log.rotate.maxAge": (int, 14, lambda v: v >= 0, ">= 0"),
    "worker.buffSize": (int, 1000, lambda v: v >= 1, ">= 1"),
    "worker.waitMsgTimeout": (int, 1000, lambda v: v >= 1, ">= 1"),
    "worker.waitMsgTimeoutLogSample": (int, 30, lambda v: v >= 1, ">= 1"),
    "background.defaultScanSecond": (int, 7200, lambda v: v >= 1, ">= 1"),
    "background.firstExecSecond": (int, 1, lambda v: v >= 0, ">= 0"),
}


#: What each core key does (docs/configuration.md is generated from it).
DOCS = {
    "port": "shorthand for `listen.smss: tcp:PORT:interface=127.0.0.1`",
    "role": "`master` or `slave` (also `--role`)",
    "master": "the master a slave follows: `HOST:PORT` of its smss door, or a client "
              "endpoint string such as `tls:HOST:PORT:trustRoots=DIR`; required for a "
              "slave (also `--master`)",
    "masterTls": "the slave reaches `HOST:PORT` over TLS (also `--master-tls`; "
                 "docs/security.md)",
    "masterCa": "CA file (PEM) the master's certificate must chain to; empty: the "
                "system's trust roots",
    "event": "eventId a slave starts after when it holds nothing newer (0: the master's "
             "oldest record; also `--event`)",
    "replication.syncReplicas": "on a master: mqserver followers that must hold a write "
                                "before it is acknowledged (0: asynchronous; "
                                "docs/replication.md)",
    "cluster.etcd": "etcd client URLs (`http://HOST:PORT`, a list or comma-separated) of "
                    "a replica group, whose members take their role from etcd (no `role: "
                    "slave` or `master` then); empty: no group (docs/replication.md, "
                    "\"Replica groups\")",
    "cluster.group": "the replica group's name (required with `cluster.etcd`)",
    "cluster.name": "this member's name, unique in the group (required with "
                    "`cluster.etcd`)",
    "cluster.leaseMs": "the leader's etcd lease in ms; a leader that cannot renew it for "
                       "two thirds of this steps down",
    "cluster.members": "the group's size: an election needs a majority of it, and "
                       "`replication.syncReplicas` must be at least a majority minus one",
    "replication.syncTimeoutMs": "ms a write waits for those followers before it fails "
                                 "with the protocol's error",
    "security.allow": "CIDRs of the peers every door accepts; others are closed at "
                      "accept and logged once a minute per address (empty: everyone; "
                      "docs/security.md)",
    "store.path": "data directory (relative to the working directory; also `--data`); "
                  "one broker per directory",
    "store.maxLogSize": "commit-log segment size, bytes",
    "store.flushLevel": "0: the OS cache only; 1: fsync once a second; 2: fsync (group "
                        "commit) before a write is answered, and no consumer sees a "
                        "message before it is durable",
    "store.maxDays": "retention of sealed segments, days",
    "store.clearInterval": "seconds between retention runs",
    "store.maxMessageSize": "largest message body, bytes (at most what a segment holds)",
    "store.cqEntriesPerFile": "20-byte entries per consume-queue file",
    "store.diskMaxUsedRatio": "publishes are refused while the data directory's file "
                              "system is fuller than this (as df shows it), accepted "
                              "again below it",
    "server.reactor": "`spinning`: the busy-polling reactor and direct socket writes "
                      "(where this Twisted has the internals they read); `standard`: "
                      "Twisted's epoll reactor",
    "server.spinMicros": "µs the reactor keeps polling after traffic before it sleeps",
    "server.spinProbe": "spin only where it pays: probes compare the CPU per byte read "
                        "with and without the spin",
    "server.tlsStack": "`auto`: load Twisted's TLS stack (pyOpenSSL, about 12 MB resident) "
                       "only when the configuration uses TLS (docs/security.md); "
                       "`always`: load it in any case",
}

#: Keys of smss's config.yaml that mqserver accepts, so that an smss configuration starts
#: it unchanged, but does not read: key -> what smss does with it (and what mqserver does
#: instead, where that is not plain).
SMSS_ONLY = {
    "store.waitDelLockTimeoutMs": "smss waits this long (ms) for a topic's file lock before "
                                  "it deletes old files",
    "store.noCache": "smss drops each file it opens from the page cache "
                     "(`posix_fadvise(DONTNEED)`)",
    "log.path": "smss logs to `stdout`, `stderr` or `out.log` in this directory; twistd's "
                "`-l`/`--logfile` chooses mqserver's log",
    "log.sample": "smss logs one line every this many events",
    "log.withGid": "smss puts the goroutine id in its log lines",
    "log.rotate.maxSize": "smss rotates its `out.log` at this size (MB); twistd's `--logfile` "
                          "rotates on its own terms",
    "log.rotate.maxBackups": "rotated smss logs kept",
    "log.rotate.maxAge": "days smss keeps a rotated log",
    "worker.buffSize": "the queue length of smss's one writer thread",
    "worker.waitMsgTimeout": "ms smss's idle writer thread sleeps before it wakes up to look",
    "worker.waitMsgTimeoutLogSample": "smss logs one of this many of those wake-ups",
    "background.defaultScanSecond": "seconds between smss's scans for expired topics and "
                                    "due delayed messages (alias "
                                    "`background.life.defaultScanSec`); mqserver sets a "
                                    "timer for the next one due",
    "background.firstExecSecond": "seconds after start-up of smss's first such scan (alias "
                                  "`background.delay.firstExec`); mqserver looks at start-up",
}
#: How the docs of a key in smss's config.yaml that mqserver does not read begin.
UNUSED = "accepted for smss compatibility, not used: "
DOCS.update({key: UNUSED + what for key, what in SMSS_ONLY.items()})


#: Names the smss README uses for keys its code reads under another name.
ALIASES = {
    "background.life.defaultScanSec": "background.defaultScanSecond",
    "background.delay.firstExec": "background.firstExecSecond",
}


class KeySet:
    """The config keys one front door (or the core) owns.

    A front door declares its keys in a module of its own, named by its plugin
    (L{mqserver.frontdoor.IFrontDoor.config}), holding:
      - C{KEYS}: dotted key -> C{(type, default, check or None, what the check wants)};
      - C{DOCS}: dotted key -> what it does (one phrase, for docs/configuration.md);
      - C{ALIASES} (optional): other names of those keys;
      - C{validate(values)} (optional): checks across keys, raising L{ConfigError}.

    @ivar keys: dotted key -> (type, default, check, wants).
    @ivar docs: dotted key -> what it does.
    @ivar aliases: alternative name -> dotted key.
    @ivar validate: callable(values) or None.
    @ivar owner: who owns the keys (for error messages).
    """

    def __init__(self, keys, aliases=None, validate=None, owner="mqserver", docs=None):
        self.keys = dict(keys)
        self.aliases = dict(aliases or {})
        self.validate = validate
        self.owner = owner
        self.docs = dict(docs or {})

    @classmethod
    def from_module(cls, module):
        """Return the key set a front door's config module declares."""
        return cls(module.KEYS, getattr(module, "ALIASES", None),
                   getattr(module, "validate", None), owner=module.__name__,
                   docs=getattr(module, "DOCS", None))


def _core_validate(values):
    if values["role"] == "slave" and not values["master"]:
        raise ConfigError("config key 'master' (HOST:PORT) is required when role is slave")
    if etcd_endpoints(values["cluster.etcd"]):
        _group_validate(values)


def _group_validate(values):
    for key in ("cluster.group", "cluster.name"):
        if not values[key]:
            raise ConfigError(f"config key {key!r} is required with cluster.etcd")
    if values["role"] == "slave" or values["master"]:
        raise ConfigError("config keys 'role: slave' and 'master' do not go with "
                          "cluster.etcd: etcd decides which member leads and which follow")
    members = values["cluster.members"]
    # a write held by the leader and syncReplicas followers must be on a majority, so
    # that every majority that can elect a leader includes a member holding it
    least = members // 2
    if values["replication.syncReplicas"] < least:
        raise ConfigError(
            f"config key 'replication.syncReplicas' must be at least {least} in a replica "
            f"group of {members} (cluster.members), so that a majority holds every "
            f"acknowledged write; it is {values['replication.syncReplicas']}")


CORE = KeySet(SCHEMA, ALIASES, _core_validate, docs=DOCS)


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


def _check(schema, key, value):
    check_value(key, value, schema[key])


def _flatten(data, prefix, out):
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and key != "listen":
            _flatten(v, key + ".", out)
        else:
            out[key] = v
    return out


def check_value(key, value, spec):
    """Raise L{ConfigError} unless C{value} suits C{spec}, a C{(type, default, check,
    wants)} tuple of L{KeySet.keys}."""
    typ, _, check, wants = spec
    if typ is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"config key {key!r} must be an integer, not {value!r}")
    if typ is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ConfigError(f"config key {key!r} must be a number, not {value!r}")
    if typ is bool and not isinstance(value, bool):
        raise ConfigError(f"config key {key!r} must be true or false, not {value!r}")
    if typ is list and not isinstance(value, list):
        raise ConfigError(f"config key {key!r} must be a list, not {value!r}")
    if typ is str and not isinstance(value, str):
        raise ConfigError(f"config key {key!r} must be a string, not {value!r}")
    if check is not None and not check(value):
        raise ConfigError(f"config key {key!r} must be {wants}, not {value!r}")


def _merge(keysets):
    schema, aliases = {}, {}
    for ks in keysets:
        for key in ks.keys:
            if key in schema:
                raise ConfigError(f"config key {key!r} is declared twice ({ks.owner})")
        schema.update(ks.keys)
        aliases.update(ks.aliases)
    return schema, aliases


def build_config(data=None, overrides=None, doors=None):
    """Validate C{data} (the parsed YAML mapping) plus C{overrides} (dotted keys) and
    return a L{Config}.

    C{doors} maps each front door's name to its L{mqserver.frontdoor.IFrontDoor}
    (None: every installed one). The core validates its own keys; each door's keys
    come from the door's config module, so a door the plugins do not name cannot be
    configured. Raises L{ConfigError}.
    """
    if doors is None:
        from mqserver.frontdoor import front_doors

        doors = front_doors()
    keysets = [CORE] + door_keysets(doors)
    schema, aliases = _merge(keysets)
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError("config must be a mapping")
    flat = _flatten(data, "", {})
    listen_in = flat.pop("listen", None) or {}
    if not isinstance(listen_in, dict):
        raise ConfigError("config key 'listen' must be a mapping of front door to endpoint")
    values = {k: spec[1] for k, spec in schema.items()}
    given = set()
    for key, value in list(flat.items()) + list((overrides or {}).items()):
        key = aliases.get(key, key)
        if key not in schema:
            raise ConfigError(f"unknown config key {key!r}")
        _check(schema, key, value)
        values[key] = value
        given.add(key)
    listen = {name: d.default_endpoint for name, d in doors.items()}
    if values["port"] is not None and "smss" in listen:
        listen["smss"] = f"tcp:{values['port']}:interface=127.0.0.1"
    for name, desc in listen_in.items():
        if name not in doors:
            known = ", ".join(doors)
            raise ConfigError(f"unknown config key 'listen.{name}' (known: {known})")
        if desc is False or desc == "off":
            listen[name] = None
        elif isinstance(desc, str) and desc:
            listen[name] = desc
        else:
            raise ConfigError(f"config key 'listen.{name}' must be an endpoint string or 'off'")
    room = values["store.maxLogSize"] - 512
    if values["store.maxMessageSize"] > room:
        if "store.maxMessageSize" in given:
            raise ConfigError("config key 'store.maxMessageSize' must fit in store.maxLogSize")
        # Small segments (tests) cap the default message size rather than refuse it.
        values["store.maxMessageSize"] = room
    for ks in keysets:
        if ks.validate is not None:
            ks.validate(values)
    return Config(values, listen)


def door_keysets(doors):
    """Return the L{KeySet} of every config module the front doors name (each once)."""
    out, seen = [], set()
    for door in doors.values():
        name = getattr(door, "config", None)
        if name and name not in seen:
            seen.add(name)
            out.append(KeySet.from_module(namedModule(name)))
    return out


def _yaml_problem(error):
    """One line for a YAML error: what is wrong and where (PyYAML's own text spans
    several lines)."""
    problem = getattr(error, "problem", None)
    mark = getattr(error, "problem_mark", None)
    if problem and mark is not None:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(error).split())


def load_config(path=None, overrides=None, doors=None):
    """Read C{path} (YAML; None for the defaults) and return a L{Config}."""
    data = None
    if path is not None:
        try:
            with open(path, "rb") as f:
                data = yaml.safe_load(f)
        except OSError as e:
            raise ConfigError(f"cannot read config {path}: {e.strerror}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"config {path} is not valid YAML: {_yaml_problem(e)}") from None
    return build_config(data, overrides, doors)
