"""Server endpoints from endpoint strings, without importing Twisted's endpoints for plain TCP.

C{twisted.internet.endpoints} is a large module (about 0.4 MB resident once the reactor
is imported) that an idle broker with plain TCP doors never uses. So a plain
C{tcp:PORT[:interface=ADDR][:backlog=N]} description, what every default front door
uses, is parsed here into a L{PlainTCPServerEndpoint} over the reactor's public
C{listenTCP}, which is what Twisted's C{tcp:} endpoint does too; every other description
(C{ssl:}, C{unix:}, C{systemd:}, escaped characters, anything this parser does not take)
goes to Twisted's C{serverFromString}, imported only then.
"""

import re
import socket

from twisted.internet import defer, interfaces
from zope.interface import implementer

__all__ = ["server_endpoint", "check_description", "probe_bind", "PlainTCPServerEndpoint"]

_KEYS = ("port", "interface", "backlog")


@implementer(interfaces.IStreamServerEndpoint)
class PlainTCPServerEndpoint:
    """Listen with C{reactor.listenTCP}, as Twisted's C{TCP4ServerEndpoint} does."""

    def __init__(self, reactor, port, backlog=50, interface=""):
        self._reactor = reactor
        self._port = port
        self._backlog = backlog
        self._interface = interface

    def listen(self, protocolFactory):
        return defer.execute(self._reactor.listenTCP, self._port, protocolFactory,
                             backlog=self._backlog, interface=self._interface)


def parse_plain_tcp(description):
    """The C{(port, interface, backlog)} of a plain C{tcp:} description, as Twisted's
    parser reads it, or C{None} when the description is anything else (Twisted's parser
    then decides)."""
    if not description.startswith("tcp:") or "\\" in description:
        return None
    values = {}
    for i, part in enumerate(description.split(":")[1:]):
        key, sep, value = part.partition("=")
        if not sep:
            if i:  # only the port may come without its name, and only first
                return None
            key, value = "port", part
        if key not in _KEYS or key in values:
            return None
        values[key] = value
    port, backlog = values.get("port", ""), values.get("backlog", "50")
    if not (port.isdigit() and port.isascii() and backlog.isdigit() and backlog.isascii()):
        return None
    return int(port), values.get("interface", ""), int(backlog)


def server_endpoint(reactor, description):
    """An C{IStreamServerEndpoint} for C{description}, like Twisted's
    C{serverFromString}."""
    plain = parse_plain_tcp(description)
    if plain is not None:
        port, interface, backlog = plain
        return PlainTCPServerEndpoint(reactor, port, backlog, interface)
    from twisted.internet import endpoints  # loads the TLS stack when it is installed

    return endpoints.serverFromString(reactor, description)


def check_description(description):
    """Raise what Twisted's parser raises when C{description} is not a valid server
    endpoint string (parsing stores the reactor only, so none is needed)."""
    server_endpoint(None, description)


def _tcp_address(description):
    """The C{(interface, port)} a C{tcp:} or C{ssl:} description listens on, or None
    for any other kind of endpoint."""
    kind, _, rest = description.partition(":")
    if kind not in ("tcp", "ssl"):
        return None
    port, interface = None, ""
    for i, part in enumerate(re.split(r"(?<!\\):", rest)):
        key, sep, value = part.partition("=")
        if not sep and i == 0:
            port = key
        elif key == "port":
            port = value
        elif key == "interface":
            interface = value.replace("\\:", ":")
    if port is None or not port.isdigit():
        return None
    return interface, int(port)


def probe_bind(description):
    """Bind the TCP address of a C{tcp:} or C{ssl:} description and let it go at once
    (as the reactor's C{listenTCP} binds: with SO_REUSEADDR); nothing for other kinds.

    A check before start-up: a port in use, a privileged port, or an address this host
    does not have is found before anything runs; the door's own bind at start stays
    the authority.

    @raise OSError: the address cannot be bound.
    """
    address = _tcp_address(description)
    if address is None:
        return
    interface, port = address
    family = socket.AF_INET6 if ":" in interface else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((interface, port))
