"""Front doors: how the core finds the wire protocols without importing them.

Each protocol is announced by a L{FrontDoor} plugin object in
C{twisted/plugins/mqserver_plugin.py}. It names the protocol's factory module as a string,
loaded only when the front door is enabled, so imports still point one way
(protocols -> mqserver) and twistd's plugin scan stays cheap.
"""

from twisted.plugin import IPlugin, getPlugins
from twisted.python.reflect import namedAny
from zope.interface import Attribute, Interface, implementer


class IFrontDoor(Interface):
    """A wire protocol the broker can listen for."""

    name = Attribute("The key under listen: in config.yaml, e.g. 'smss'.")
    default_endpoint = Attribute("The endpoint string used when the config names none.")

    def make_factory(broker, config, reactor):
        """Return the protocol factory serving broker."""

    follower = Attribute("Module with make_follower(broker, config, reactor), or None.")

    config = Attribute(
        "Dotted name of the module declaring the door's config keys (KEYS, optional "
        "ALIASES and validate(values); see mqserver.config.KeySet), or None. Doors that "
        "share keys (NSQ's four, RocketMQ's two) name the same module."
    )


@implementer(IPlugin, IFrontDoor)
class FrontDoor:
    """A front door whose factory is C{make_factory} in the module C{module}."""

    def __init__(self, name, module, default_endpoint, order=100, follower=None, config=None):
        self.name = name
        self.config = config
        self.module = module
        self.default_endpoint = default_endpoint
        self.order = order
        self.follower = follower

    def make_factory(self, broker, config, reactor):
        return namedAny(self.module + ".make_factory")(broker, config, reactor)

    def make_follower(self, broker, config, reactor):
        """Return the service following a master (this door speaks the replication
        stream)."""
        return namedAny(self.follower + ".make_follower")(broker, config, reactor)


def front_doors():
    """Return every installed front door, by name."""
    import twisted.plugins

    doors = sorted(getPlugins(IFrontDoor, twisted.plugins), key=lambda d: (d.order, d.name))
    return {d.name: d for d in doors}
