"""Front doors: how the core finds the wire protocols without importing them.

Each protocol is announced by a L{FrontDoor} plugin object in
C{twisted/plugins/mqserver_plugin.py}. It names the protocol's factory module as a string,
loaded only when the front door is enabled, so imports still point one way
(protocols -> mqserver) and twistd's plugin scan stays cheap.
"""

import importlib.util

from twisted.internet.interfaces import ILoggingContext, IProtocolFactory, IProtocolNegotiationFactory
from twisted.logger import Logger
from twisted.plugin import IPlugin, getPlugins
from twisted.python.reflect import namedAny
from zope.interface import Attribute, Interface, implementer

log = Logger()


class IFrontDoor(Interface):
    """A wire protocol the broker can listen for."""

    name = Attribute("The key under listen: in config.yaml, e.g. 'smss'.")
    default_endpoint = Attribute("The endpoint string used when the config names none.")

    def make_factory(broker, config, reactor):
        """Return the protocol factory serving broker."""

    follower = Attribute(
        "Module with make_follower(broker, config, reactor, master=None), or None.")

    config = Attribute(
        "Dotted name of the module declaring the door's config keys (KEYS, optional "
        "ALIASES and validate(values); see mqserver.config.KeySet), or None. Doors that "
        "share keys (NSQ's four, RocketMQ's two) name the same module."
    )


@implementer(IPlugin, IFrontDoor)
class FrontDoor:
    """A front door whose factory is C{make_factory} in the module C{module}.

    @ivar first_use: C{None}, or the name the door's factory logs under (its class name)
        when its module is to be imported and its factory built at the door's first
        connection (L{FirstUseFactory}): for doors whose C{make_factory} only builds the
        factory (no services, nothing else done at start) and whose imports are heavy
        (twisted.web, prometheus_client).
    """

    def __init__(self, name, module, default_endpoint, order=100, follower=None, config=None,
                 first_use=None):
        self.name = name
        self.config = config
        self.module = module
        self.default_endpoint = default_endpoint
        self.order = order
        self.follower = follower
        self.first_use = first_use

    def make_factory(self, broker, config, reactor):
        make = self.module + ".make_factory"
        if self.first_use is None:
            return namedAny(make)(broker, config, reactor)
        if importlib.util.find_spec(self.module) is None:  # a broken install fails at start
            raise ImportError(f"front door {self.name}: no module {self.module}")
        return FirstUseFactory(lambda: namedAny(make)(broker, config, reactor), self.first_use)

    def make_follower(self, broker, config, reactor, master=None):
        """Return the service following a master (this door speaks the replication
        stream)."""
        return namedAny(self.follower + ".make_follower")(broker, config, reactor, master)


@implementer(IProtocolFactory, ILoggingContext, IProtocolNegotiationFactory)
class FirstUseFactory:
    """Stands for a front door's factory until its first connection, which builds it
    (C{build()}: importing the door's module) and from then on builds every protocol.

    Listening ports log it as C{log_prefix} (the real factory's class name, as they log
    a factory without one), and it passes C{doStart}/C{doStop} on once the factory exists,
    so the factory sees as many starts as the ports listening for it. C{services} are
    the door's services to run from start-up (L{mqserver.service.BrokerService.
    add_door_services}), which its factory would otherwise give, and C{listening} what
    learns the port once bound (L{mqserver.service.ListenerService}).

    Behind an C{ssl:} endpoint it offers the real factory's application protocols
    (ALPN, L{acceptableProtocols}): a twisted.web site speaks C{http/1.1}, and a TLS
    server whose factory names no protocol answers a client that offers some with a
    fatal alert, as Twisted's ALPN selection finds no overlap.
    """

    def __init__(self, build, log_prefix, services=(), listening=None):
        self._build = build
        self._log_prefix = log_prefix
        self._services = list(services)
        self._listening = listening
        self._ports = 0
        self.factory = None

    def logPrefix(self):
        return self._log_prefix

    def services(self):
        return self._services

    def listening(self, port):
        """The listener is bound: C{listening(port)} given at creation learns it (what
        the door's factory would have)."""
        if self._listening is not None:
            self._listening(port)

    def acceptableProtocols(self):
        """The real factory's ALPN protocols (none when it has no such list). TLS asks
        during the handshake, after C{buildProtocol} built the factory."""
        negotiation = IProtocolNegotiationFactory(self.factory, None)
        return list(negotiation.acceptableProtocols()) if negotiation is not None else []

    def doStart(self):
        self._ports += 1
        if self.factory is not None:
            self.factory.doStart()

    def doStop(self):
        self._ports -= 1
        if self.factory is not None:
            self.factory.doStop()

    def buildProtocol(self, addr):
        if self.factory is None:
            try:
                factory = self._build()
            except Exception:
                # refuse this connection, keep listening, try again at the next one (an
                # error out of buildProtocol would close the listening port)
                log.failure("front door {door}: its factory could not be built",
                            door=self._log_prefix)
                return None
            for _ in range(self._ports):
                factory.doStart()
            self.factory = factory
        return self.factory.buildProtocol(addr)


def front_doors():
    """Return every installed front door, by name."""
    import twisted.plugins

    doors = sorted(getPlugins(IFrontDoor, twisted.plugins), key=lambda d: (d.order, d.name))
    return {d.name: d for d in doors}
