"""FirstUseFactory: a front door's factory built at the door's first connection."""

from twisted.internet import protocol
from twisted.internet.address import IPv4Address
from twisted.internet.interfaces import ILoggingContext, IProtocolFactory
from twisted.protocols.tls import TLSMemoryBIOFactory

from mqserver.frontdoor import FirstUseFactory, FrontDoor

ADDR = IPv4Address("TCP", "127.0.0.1", 40000)


class Counting(protocol.Factory):
    protocol = protocol.Protocol
    noisy = False

    def __init__(self):
        self.starts = self.stops = 0

    def startFactory(self):
        self.starts += 1

    def stopFactory(self):
        self.stops += 1


def test_factory_is_built_once_at_the_first_connection_and_started_as_listened():
    """Nothing is built while ports start; the first buildProtocol builds the factory,
    starts it once per listening port, and every protocol comes from it; doStop reaches
    it."""
    built = []

    def build():
        built.append(Counting())
        return built[-1]

    f = FirstUseFactory(build, "CountingSite")
    assert IProtocolFactory.providedBy(f) and ILoggingContext.providedBy(f)
    f.doStart()
    assert built == [] and f.factory is None
    p1, p2 = f.buildProtocol(ADDR), f.buildProtocol(ADDR)
    assert len(built) == 1 and f.factory is built[0]
    assert p1.factory is built[0] and p2.factory is built[0]
    assert (built[0].numPorts, built[0].starts) == (1, 1)
    f.doStop()
    assert (built[0].numPorts, built[0].stops) == (0, 1)


def test_ports_log_the_real_factory_name_also_through_tls(tmp_path):
    """Ports log a factory by its logPrefix (what tests and operators read as
    "MetricsSite starting on N"); TLS endpoints wrap it and append " (TLS)"."""
    from twisted.internet import ssl

    from tests.support.tls import Certs

    certs = Certs(str(tmp_path))
    with open(certs.cert, "rb") as c, open(certs.key, "rb") as k:
        options = ssl.PrivateCertificate.loadPEM(c.read() + k.read()).options()
    f = FirstUseFactory(Counting, "MetricsSite")
    assert f.logPrefix() == "MetricsSite"
    assert TLSMemoryBIOFactory(options, False, f).logPrefix() == "MetricsSite (TLS)"


def test_front_door_defers_only_when_asked_and_checks_its_module_at_start():
    """A door with first_use returns a FirstUseFactory without importing its module; a
    door whose module does not exist fails at start as before."""
    door = FrontDoor("x", "tests.unit.test_first_use", "tcp:0", first_use="XSite")
    assert isinstance(door.make_factory(None, {}, None), FirstUseFactory)
    missing = FrontDoor("y", "tests.unit.no_such_door_module", "tcp:0", first_use="YSite")
    try:
        missing.make_factory(None, {}, None)
    except ImportError as e:
        assert "no_such_door_module" in str(e)
    else:
        raise AssertionError("a missing door module did not fail at start")


def make_factory(broker, config, reactor):  # the door module of the test above
    return Counting()


def test_services_and_listening_are_there_from_the_start():
    """A door's services run from start-up and its port is learnt when bound, before
    any connection builds the factory."""
    ports = []
    f = FirstUseFactory(Counting, "XSite", services=["svc"], listening=ports.append)
    assert f.services() == ["svc"]
    f.listening("port")
    assert ports == ["port"] and f.factory is None
    FirstUseFactory(Counting, "YSite").listening("port")  # nothing to tell: no error


def test_a_factory_that_cannot_be_built_refuses_the_connection_and_is_retried():
    """When building fails, the connection is refused (None: the port closes that socket
    and keeps listening) and the error logged; the next connection tries again."""
    from twisted.logger import globalLogPublisher

    attempts = []

    def build():
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("not this time")
        return Counting()

    events = []
    globalLogPublisher.addObserver(events.append)
    try:
        f = FirstUseFactory(build, "FlakySite")
        f.doStart()
        assert f.buildProtocol(ADDR) is None and f.factory is None
        p = f.buildProtocol(ADDR)
    finally:
        globalLogPublisher.removeObserver(events.append)
    assert p is not None and len(attempts) == 2 and f.factory.numPorts == 1
    failures = [e for e in events if e.get("log_failure") is not None]
    assert len(failures) == 1 and failures[0]["door"] == "FlakySite"
    assert failures[0]["log_failure"].check(RuntimeError)


def test_offers_the_built_sites_alpn_protocols():
    """Behind TLS, ALPN asks the factory for its protocols during the handshake: the
    site built at the first connection answers (a twisted.web site: http/1.1), so a
    client offering h2 and http/1.1 is not refused for want of a common protocol."""
    from twisted.internet.interfaces import IProtocolNegotiationFactory
    from twisted.web import resource, server

    site = server.Site(resource.Resource())
    f = FirstUseFactory(lambda: site, "Site")
    assert IProtocolNegotiationFactory.providedBy(f)
    assert f.acceptableProtocols() == []  # nothing built, nothing to offer
    f.doStart()
    f.buildProtocol(ADDR)
    assert f.acceptableProtocols() == site.acceptableProtocols()
    assert b"http/1.1" in f.acceptableProtocols()
    plain = FirstUseFactory(Counting, "Plain")  # a factory without a protocol list
    plain.buildProtocol(ADDR)
    assert plain.acceptableProtocols() == []
