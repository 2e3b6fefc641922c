"""nsqd's authorization (as nsqd 1.3.0's internal/auth): the auth server's reply, its
checks, and the query.

With ``nsq.authHttpAddresses`` set, a client sends ``AUTH <secret>``; nsqd asks one of
the auth servers ``GET /auth?remote_ip=&tls=&secret=&common_name=`` and keeps the reply:
an identity, a TTL in seconds and authorizations (a topic regex, channel regexes and
the permissions ``publish`` / ``subscribe``). PUB/MPUB/DPUB need ``publish`` and SUB
``subscribe``; the reply is fetched again once its TTL has run out.
"""

import json
import random
import re
from dataclasses import dataclass
from urllib.parse import urlencode

from twisted.internet import defer
from twisted.logger import Logger

log = Logger()

#: Seconds an auth server has to answer (nsqd's http-client request timeout is 5 s).
QUERY_TIMEOUT = 5.0
#: The largest auth server reply read; a longer one is an invalid answer.
MAX_REPLY = 1 << 20
_PERMISSIONS = ("subscribe", "publish")


class AuthReplyError(ValueError):
    """The auth server's reply is unusable (nsqd then answers E_AUTH_FAILED)."""


@dataclass(frozen=True)
class Authorization:
    """One grant: topics matching C{topic}, channels matching any of C{channels}."""

    topic: re.Pattern
    channels: tuple
    permissions: frozenset

    def allows(self, topic, channel):
        # As nsqd: a publish (no channel) also needs a channel regex matching "", and
        # Go's MatchString finds a match anywhere (re.search, not re.match).
        if ("subscribe" if channel else "publish") not in self.permissions:
            return False
        if not self.topic.search(topic):
            return False
        return any(c.search(channel) for c in self.channels)


@dataclass(frozen=True)
class AuthState:
    """An auth server's answer for one connection's secret."""

    identity: str
    identity_url: str
    authorizations: tuple
    expires: float

    def allows(self, topic, channel=""):
        return any(a.allows(topic, channel) for a in self.authorizations)

    def expired(self, now):
        return self.expires < now

    def reply(self):
        """The AUTH response frame's JSON."""
        return json.dumps({"identity": self.identity, "identity_url": self.identity_url,
                           "permission_count": len(self.authorizations)},
                          separators=(",", ":")).encode()


def _regex(text):
    if not isinstance(text, str):
        raise AuthReplyError(f"regex {text!r} is not a string")
    try:
        return re.compile(text)
    except re.error as e:
        raise AuthReplyError(f"unable to compile {text!r} {e}") from None


def parse_reply(body, now):
    """Return the L{AuthState} of an auth server's JSON reply received at C{now}.

    @raise AuthReplyError: not JSON, an unknown permission, a regex that does not
        compile, or a TTL that is not positive (nsqd's checks).
    """
    try:
        doc = json.loads(body)
    except ValueError:
        raise AuthReplyError("reply is not JSON") from None
    if not isinstance(doc, dict):
        raise AuthReplyError("reply is not a JSON object")
    grants = []
    for a in doc.get("authorizations") or []:
        if not isinstance(a, dict):
            raise AuthReplyError("authorization is not an object")
        perms = a.get("permissions") or []
        for p in perms:
            if p not in _PERMISSIONS:
                raise AuthReplyError(f"unknown permission {p}")
        grants.append(Authorization(_regex(a.get("topic", "")),
                                    tuple(_regex(c) for c in a.get("channels") or []),
                                    frozenset(perms)))
    ttl = doc.get("ttl", 0)
    if type(ttl) is not int or ttl <= 0:
        raise AuthReplyError(f"invalid TTL {ttl} (must be >0)")
    return AuthState(str(doc.get("identity", "")), str(doc.get("identity_url", "")),
                     tuple(grants), now + ttl)


def auth_url(address, remote_ip, tls, secret, common_name=""):
    """The auth query of nsqd: C{address} is host:port (then /auth) or a whole URL."""
    base = address if "://" in address else f"http://{address}/auth"
    query = urlencode({"remote_ip": remote_ip, "tls": "true" if tls else "false",
                       "secret": secret, "common_name": common_name})
    return f"{base}?{query}"


def _read_bounded(resp, limit):
    """Return a Deferred with the body of C{resp}, failing (and dropping the connection)
    as soon as more than C{limit} bytes arrive."""
    import treq

    chunks, size = [], [0]

    def collect(data):
        size[0] += len(data)
        if size[0] > limit:
            raise AuthReplyError(f"reply longer than {limit} bytes")
        chunks.append(data)

    return treq.collect(resp, collect).addCallback(lambda _: b"".join(chunks))


class AuthClient:
    """Asks the configured auth servers, starting at a random one, each in turn."""

    def __init__(self, addresses, reactor):
        self.addresses = list(addresses)
        self.reactor = reactor
        self._http = None

    def _client(self):
        if self._http is None:
            import treq.client
            from twisted.web.client import Agent, HTTPConnectionPool

            pool = HTTPConnectionPool(self.reactor, persistent=False)
            self._http = treq.client.HTTPClient(Agent(self.reactor, pool=pool))
        return self._http

    @defer.inlineCallbacks
    def query(self, remote_ip, tls, secret):
        """Return a Deferred firing with the L{AuthState} of the first auth server that
        answers well; it fails with L{AuthReplyError} naming every failure otherwise."""
        n = len(self.addresses)
        start = random.randrange(n)
        errors = []
        for i in range(n):
            address = self.addresses[(start + i) % n]
            try:
                state = yield self._ask(auth_url(address, remote_ip, tls, secret))
                return state
            except Exception as e:  # reported together below, never to the client
                errors.append(f"failed to auth against {address} - {e}")
        raise AuthReplyError("; ".join(errors))

    @defer.inlineCallbacks
    def _ask(self, url):
        resp = yield self._client().get(url, headers={"Accept": "application/vnd.nsq; version=1.0"},
                                        timeout=QUERY_TIMEOUT)
        body = yield _read_bounded(resp, MAX_REPLY)
        if resp.code != 200:
            raise AuthReplyError(f"got response {resp.code} {body[:200]!r}")
        return parse_reply(body, self.reactor.seconds())
