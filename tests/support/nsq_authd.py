"""A real nsqd auth server for tests (twisted.web), run in its own process:

    python -m tests.support.nsq_authd

prints its port on the first line, then serves ``GET /auth?secret=..`` from the GRANTS
table below, and ``GET /log`` (every query's arguments so far, as JSON).
"""

import json
import sys

from twisted.internet import reactor
from twisted.web import resource, server

ANY = [".*"]
GRANTS = {
    "both": {"ttl": 3600, "identity": "both-user", "identity_url": "http://id/both",
             "authorizations": [{"topic": "^auth_", "channels": ANY,
                                 "permissions": ["publish", "subscribe"]}]},
    "pub-only": {"ttl": 3600, "identity": "pub-user",
                 "authorizations": [{"topic": "^auth_t$", "channels": ANY, "permissions": ["publish"]}]},
    "sub-ch": {"ttl": 3600, "identity": "sub-user",
               "authorizations": [{"topic": "^auth_t$", "channels": ["^ch$"],
                                   "permissions": ["subscribe"]}]},
    "none": {"ttl": 3600, "identity": "nobody", "authorizations": []},
    "bad-ttl": {"ttl": 0, "authorizations": [{"topic": ".*", "channels": ANY,
                                              "permissions": ["publish"]}]},
}
# "short": a 1-second grant to publish on auth_t, taken back at the second query.
SHORT = [
    {"ttl": 1, "identity": "short", "authorizations": [
        {"topic": "^auth_t$", "channels": ANY, "permissions": ["publish"]}]},
    {"ttl": 3600, "identity": "short", "authorizations": [
        {"topic": "^elsewhere$", "channels": ANY, "permissions": ["publish"]}]},
]


class Auth(resource.Resource):
    isLeaf = True

    def __init__(self):
        super().__init__()
        self.queries = []

    def render_GET(self, request):
        if request.path == b"/log":
            return json.dumps(self.queries).encode()
        args = {k.decode(): v[0].decode() for k, v in request.args.items()}
        self.queries.append(args)
        secret = args.get("secret", "")
        if secret == "huge":  # more than the broker reads of a reply
            return b'{"ttl": 60, "identity": "' + b"x" * (2 << 20) + b'"}'
        if secret == "short":
            n = sum(1 for q in self.queries if q.get("secret") == "short")
            reply = SHORT[min(n, len(SHORT)) - 1]
        elif secret in GRANTS:
            reply = GRANTS[secret]
        else:
            request.setResponseCode(403)
            return b'{"message":"NOT_AUTHORIZED"}'
        request.setHeader(b"Content-Type", b"application/json")
        return json.dumps(reply).encode()


def main():
    port = reactor.listenTCP(0, server.Site(Auth()), interface="127.0.0.1")
    print(port.getHost().port, flush=True)
    # Stop with the test even if it forgets to: the parent closes our stdin.
    reactor.callInThread(lambda: (sys.stdin.read(), reactor.callFromThread(reactor.stop)))
    reactor.run()


if __name__ == "__main__":
    main()
