"""Core pieces of network safety every front door can use.

- L{AllowList} / L{AllowListEndpoint}: the C{security.allow} CIDR list, checked when a
  connection is accepted (before any protocol object exists, on every door and through
  TLS); refused addresses are logged at most once a minute each.
- L{BearerTokenResource}: an optional C{Authorization: Bearer <token>} check in front of a
  twisted.web resource tree (the HTTP doors).
- L{LineTokenGate}: an optional C{AUTH <token>} first line for line protocols (the
  console).
"""

import hmac
import ipaddress

from twisted.internet.interfaces import IStreamServerEndpoint
from twisted.logger import Logger
from twisted.web import resource
from zope.interface import implementer

#: Seconds between two log lines about the same refused address.
LOG_EVERY = 60.0
_MAX_REMEMBERED = 10_000


def parse_networks(items):
    """Return the networks of a C{security.allow} list (CIDRs or single addresses).

    @raise ValueError: an item is not an IPv4/IPv6 network.
    """
    return [ipaddress.ip_network(str(i).strip(), strict=False) for i in items]


def valid_networks(items):
    """True when every item of C{items} is a network (for the config check)."""
    try:
        parse_networks(items)
    except (ValueError, TypeError):
        return False
    return True


class AllowList:
    """Which peer addresses may connect; an empty list allows everyone.

    @ivar refused: number of connections refused so far.
    """

    log = Logger()

    def __init__(self, networks, clock):
        self.networks = parse_networks(networks)
        self._clock = clock
        self._logged = {}  # address -> when it was last logged
        self.refused = 0

    def allows(self, addr):
        """True when C{addr} (an L{IAddress}) may connect. Addresses without a host
        (UNIX sockets) are local and always allowed."""
        host = getattr(addr, "host", None)
        if not self.networks or host is None:
            return True
        try:
            ip = ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            return False
        if ip.version == 6 and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip in n for n in self.networks)

    def note_refused(self, addr, door):
        """Count a refusal and log it, once a minute at most per address."""
        self.refused += 1
        host = getattr(addr, "host", "?")
        now = self._clock()
        last = self._logged.get(host)
        if last is not None and now - last < LOG_EVERY:
            return
        if len(self._logged) >= _MAX_REMEMBERED:
            self._logged.clear()
        self._logged[host] = now
        self.log.warn("refused a connection to {door} from {host} (not in security.allow)",
                      door=door, host=host)

    def guard(self, port, door):
        """Make C{port} (a listening port) refuse connections from other addresses:
        its outermost factory (a TLS wrapper, or the door's own) builds no protocol for
        them, so Twisted closes the socket at once."""
        outer = port.factory
        build = outer.buildProtocol

        def buildProtocol(addr):
            if self.allows(addr):
                return build(addr)
            self.note_refused(addr, door)
            return None

        outer.buildProtocol = buildProtocol
        return port


@implementer(IStreamServerEndpoint)
class AllowListEndpoint:
    """A server endpoint whose ports refuse peers that L{AllowList} does not allow."""

    def __init__(self, endpoint, allow, door):
        self.endpoint = endpoint
        self.allow = allow
        self.door = door

    def listen(self, factory):
        d = self.endpoint.listen(factory)
        return d.addCallback(self.allow.guard, self.door)


# -- tokens --------------------------------------------------------------------------

def token_matches(expected, offered):
    """Compare a secret token in constant time (both str or bytes)."""
    if isinstance(expected, str):
        expected = expected.encode("utf-8")
    if isinstance(offered, str):
        offered = offered.encode("utf-8")
    return hmac.compare_digest(expected, offered or b"")


def bearer_authorized(request, token):
    """True when C{request} (a twisted.web request, from its headers alone) carries
    C{Authorization: Bearer <token>}, or when no token is set."""
    if not token:
        return True
    header = request.getHeader(b"authorization") or b""
    scheme, _, offered = header.partition(b" ")
    return scheme.lower() == b"bearer" and token_matches(token, offered.strip())


class _Unauthorized(resource.Resource):
    isLeaf = True

    def render(self, request):
        request.setResponseCode(401)
        request.setHeader(b"WWW-Authenticate", b'Bearer realm="mqserver"')
        request.setHeader(b"Content-Type", b"application/json")
        return b'{"message":"UNAUTHORIZED"}'


class BearerTokenResource(resource.Resource):
    """Serve C{wrapped} (a twisted.web resource, a leaf or a tree) only to requests that
    carry C{Authorization: Bearer <token>}; others get 401. Without a token (None or
    empty) everything passes, so a door can always wrap its root."""

    def __init__(self, wrapped, token):
        super().__init__()
        self.wrapped = wrapped
        self.token = token

    def authorized(self, request):
        return bearer_authorized(request, self.token)

    def getChildWithDefault(self, path, request):
        if not self.authorized(request):
            return _Unauthorized()
        # Hand the segment back: the wrapped root sees the request as if it were the root.
        request.postpath.insert(0, request.prepath.pop())
        return self.wrapped

    def render(self, request):
        if not self.authorized(request):
            return _Unauthorized().render(request)
        return self.wrapped.render(request)


class LineTokenGate:
    """The C{AUTH <token>} line a line protocol (the console) asks for first when a
    token is set.

    The protocol passes each line to L{check} until L{passed}; C{check} returns the
    reply to send, and whether the connection may go on (a wrong or missing token
    closes it, so guessing costs a connection per try).
    """

    OK = b"OK"
    REQUIRED = b"ERR AUTH <token> required"
    WRONG = b"ERR wrong token"

    def __init__(self, token):
        self.token = token
        self.passed = not token

    def check(self, line):
        """Return (reply, keep_open) for C{line} (bytes, without the line end)."""
        verb, _, rest = line.strip().partition(b" ")
        if verb.upper() != b"AUTH":
            return self.REQUIRED, False
        if not token_matches(self.token, rest.strip()):
            return self.WRONG, False
        self.passed = True
        return self.OK, True
