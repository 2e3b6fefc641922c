"""Whether the broker process loads Twisted's TLS stack (pyOpenSSL and cryptography).

Twisted's TCP and reactor modules import pyOpenSSL, when it is installed, the first time
they are imported; treq (the etcd and push client) needs it installed. Loaded, the stack
holds about 12 MB resident that a broker using no TLS never touches. Such a broker runs
as Twisted runs where pyOpenSSL is not installed: before Twisted's TCP module is first
imported, C{sys.modules["OpenSSL"]} is set to None, Python's documented way of making an
import fail, and Twisted takes its own no-TLS path (plain TCP transports, no
C{listenSSL}). Nothing else changes.

The choice is made once, from the configuration, before anything listens (L{choose}).
The stack loads when the configuration uses TLS anywhere (L{uses}): an C{ssl:} or other
non-plain listener, C{masterTls} or a C{tls:}/C{ssl:} master, an C{https://} etcd URL,
or what a front door's config module says of its own keys (its optional
C{tls_uses(values, listen)}, returning the reasons). C{server.tlsStack: always} loads it
in any case (the fallback); so does any process where Twisted's TCP module or pyOpenSSL
is already imported (a test process, C{twistd --reactor}), which then stays as it is.
"""

import importlib
import sys

from mqserver.config import etcd_endpoints

#: Listener kinds that carry no TLS of their own.
PLAIN_LISTENERS = ("tcp", "tcp6", "unix", "systemd")


def uses(config, doors):
    """Return the reasons C{config} needs TLS (empty when it needs none): one short
    phrase each, naming the key or door. C{doors}: front door name -> L{FrontDoor}."""
    reasons = []
    for name, desc in sorted(config.listen.items()):
        kind = (desc or "").split(":", 1)[0]
        if desc and kind not in PLAIN_LISTENERS:
            reasons.append(f"door {name} listens on {kind}:")
    master = config["master"]
    if config["masterTls"]:
        reasons.append("masterTls")
    elif master.startswith(("tls:", "ssl:")):
        reasons.append(f"master {master.split(':', 1)[0]}:")
    if any(url.startswith("https:") for url in etcd_endpoints(config["cluster.etcd"])):
        reasons.append("cluster.etcd https://")
    seen = set()
    for door in doors.values():
        if not door.config or door.config in seen:
            continue
        seen.add(door.config)
        tls_uses = getattr(importlib.import_module(door.config), "tls_uses", None)
        if tls_uses is not None:
            reasons.extend(tls_uses(config.values, config.listen))
    return reasons


class Choice:
    """What L{choose} decided.

    @ivar loaded: whether the process has (or will load) the TLS stack.
    @ivar why: one line for the start-up log.
    """

    def __init__(self, loaded, why):
        self.loaded = loaded
        self.why = why


def choose(config, doors):
    """Leave the TLS stack out of this process when nothing in C{config} uses TLS and
    Twisted's TCP module is not imported yet; return a L{Choice}."""
    if config["server.tlsStack"] == "always":
        return Choice(True, "TLS stack loaded (server.tlsStack: always)")
    reasons = uses(config, doors)
    if reasons:
        return Choice(True, "TLS stack loaded for " + ", ".join(reasons))
    if "OpenSSL" not in sys.modules and "twisted.internet.tcp" not in sys.modules:
        sys.modules["OpenSSL"] = None
    if sys.modules.get("OpenSSL", False) is None:  # left out, now or by an earlier choice
        return Choice(False, "TLS stack left out (the configuration uses no TLS)")
    return Choice(True, "TLS stack loaded before the configuration was read")
