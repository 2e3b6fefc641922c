"""twistd options and service construction for C{twistd mqserver}."""

import os
import sys

from twisted.logger import Logger
from twisted.python import usage

from mqserver.config import ConfigError, etcd_endpoints, load_config
from mqserver.errors import StartupError
from mqserver.frontdoor import front_doors
from mqserver.listen import check_description, probe_bind
from mqserver.runtime import tlsstack
from mqserver.store.lock import check_directory
from mqserver.version import version

# Nothing imported above imports Twisted's TCP module: whether it comes with the TLS stack
# is chosen from the configuration (mqserver.runtime.tlsstack) before makeService imports
# the reactor, the service and the doors.

log = Logger()


def refuse_start(why, stream=None):
    """End start-up: write the one line saying C{why} to stderr and exit with status 1.

    twistd answers an option error with its whole usage text before the error; an
    operator needs the one line (the usage text is for C{--help})."""
    line = " ".join(str(why).splitlines())
    (stream or sys.stderr).write(f"mqserver cannot start: {line}\n")
    raise SystemExit(1)


class Options(usage.Options):
    """Command line of C{twistd mqserver}.

    C{--listen NAME=ENDPOINT} may be given several times; it overrides C{listen:} in the
    config (C{NAME=off} turns a front door off).
    """

    optFlags = [
        ["master-tls", None, "A slave reaches its master over TLS (sets masterTls)."],
    ]

    optParameters = [
        ["config", "c", None, "Path of config.yaml (default: built-in defaults)."],
        ["data", "d", None, "Data directory (overrides store.path)."],
        ["role", None, None, "master or slave (overrides role)."],
        ["master", None, None, "HOST:PORT of the master a slave follows (overrides master)."],
        ["event", None, None, "eventId a slave starts after (overrides event; 0 = all)."],
        ["ready-file", None, None,
         "Once every front door listens, write PATH (JSON: version, pid, each door's "
         "endpoint, host and port; replaced atomically)."],
    ]

    def __init__(self):
        super().__init__()
        self["listen"] = {}

    def parseOptions(self, options=None):
        """Parse the command line; an error in it, in the config, or in what can be
        checked before anything starts (the data directory, endpoint strings) ends the
        process with one line (L{refuse_start})."""
        try:
            super().parseOptions(options)
        except (usage.UsageError, StartupError) as e:
            refuse_start(e)

    def opt_version(self):
        """Display mqserver's version (and Twisted's) and exit."""
        from twisted import __version__ as twisted_version

        print(f"mqserver {version()} (Twisted {twisted_version})")
        raise SystemExit(0)

    def opt_listen(self, value):
        """NAME=ENDPOINT: where front door NAME listens (repeatable)."""
        name, sep, desc = value.partition("=")
        if not sep or not name or not desc:
            raise usage.UsageError(f"--listen wants NAME=ENDPOINT, not {value!r}")
        self["listen"][name] = desc

    def postOptions(self):
        config, doors = self.configuration()
        self["tls"] = tlsstack.choose(config, doors)
        for name, desc in config.listen.items():
            if desc is not None:
                probe_endpoint(name, desc)
        check_directory(os.path.abspath(config["store.path"]))
        self["settings"] = config
        self["doors"] = doors

    def configuration(self):
        """Return C{(config, doors)}: the L{mqserver.config.Config} these options give
        (the defaults, then the C{--config} file, then the other options) and the front
        doors. Raises L{usage.UsageError} naming what is wrong; nothing of this host
        (ports, directories) is looked at."""
        doors = front_doors()
        overrides = {}
        if self["data"]:
            overrides["store.path"] = self["data"]
        for key in ("role", "master"):
            if self[key] is not None:
                overrides[key] = self[key]
        if self["master-tls"]:
            overrides["masterTls"] = True
        if self["event"] is not None:
            try:
                overrides["event"] = int(self["event"])
            except ValueError:
                raise usage.UsageError("--event wants an integer eventId") from None
        try:
            config = load_config(self["config"], overrides, doors)
        except ConfigError as e:
            raise usage.UsageError(str(e))
        for name, desc in self["listen"].items():
            if name not in doors:
                raise usage.UsageError(f"unknown front door {name!r} in --listen")
            config.listen[name] = None if desc == "off" else desc
        for name, desc in config.listen.items():
            if desc is not None:
                check_endpoint(name, desc)
        return config, doors


class ConfigOptions(Options):
    """The same options, read for the configuration they give alone (C{mqserver
    config}): nothing is probed or created, and an error is raised (L{usage.UsageError})
    rather than ending the process."""

    def parseOptions(self, options=None):
        usage.Options.parseOptions(self, options)

    def postOptions(self):
        self["settings"], self["doors"] = self.configuration()


def check_endpoint(door, description):
    """Raise L{usage.UsageError} naming C{door} when C{description} is not an endpoint
    string Twisted can parse."""
    try:
        # Parsing only stores the reactor; none is chosen yet while options are read.
        check_description(description)
    except Exception as e:  # each endpoint parser raises its own kind of error
        raise usage.UsageError(
            f"front door {door} cannot listen on {description!r}: not a valid endpoint "
            f"string ({type(e).__name__}: {e})") from None


def probe_endpoint(door, description):
    """Raise L{ListenError} when the TCP address of C{description} cannot be bound (a
    door that cannot listen must stop start-up, and this is known before anything
    starts)."""
    from mqserver.service import ListenError

    try:
        probe_bind(description)
    except OSError as e:
        raise ListenError(door, description, e) from None


def makeService(options, reactor=None):
    """Build the service tree (no I/O happens until it starts)."""
    from mqserver.replication.roles import Roles
    from mqserver.runtime.fastpath import service_reactor
    from mqserver.service import BrokerService

    config = options["settings"]
    if options.get("tls") is not None:
        log.info("{why}", why=options["tls"].why)
    if reactor is None:
        reactor = service_reactor(spin=config["server.spinMicros"] / 1e6,
                                  standard=config["server.reactor"] == "standard",
                                  probe=config["server.spinProbe"])
    root = BrokerService(config, reactor, ready_file=options.get("ready-file"))
    broker = root.storage.broker
    # a member of a replica group starts with no role: etcd decides whether it leads
    in_group = bool(etcd_endpoints(config["cluster.etcd"]))
    if in_group:
        broker.is_master = False
    elif config["role"] == "master" and config["replication.syncReplicas"] > 0:
        broker.require_replicas(config["replication.syncReplicas"],
                                config["replication.syncTimeoutMs"])
    followers = [d for d in options["doors"].values() if d.follower]
    roles = Roles(broker, lambda master: followers[0].make_follower(broker, config, reactor, master),
                  config["replication.syncReplicas"], config["replication.syncTimeoutMs"])
    roles.setServiceParent(root)
    broker.roles = roles
    if config["role"] == "slave":
        broker.is_master = False
        roles.follow(config["master"])  # set up now, connects when the tree starts
    for name, door in options["doors"].items():
        if config.listen.get(name):
            try:
                factory = door.make_factory(broker, config, reactor)
            except StartupError as e:  # before twistd logs anything: one line
                refuse_start(e)
            root.add_door_services(factory)
            root.add_listener(name, factory)
    if in_group:
        from mqserver.cluster.member import GroupService

        # after the doors: it publishes their addresses once they listen
        broker.group = GroupService(broker, root.listeners, config, reactor)
        broker.group.setServiceParent(root)
    return root
