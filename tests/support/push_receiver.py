"""A real twisted.web endpoint for msgout push tests: it answers every Nth POST with
500 (the rest with 204) and appends each accepted batch as a JSON line to a file.

Usage: python push_receiver.py OUT_FILE FAIL_EVERY; prints "PORT <n>" once listening.
"""

import json
import sys

from twisted.internet import reactor
from twisted.web import resource, server


class Receiver(resource.Resource):
    isLeaf = True

    def __init__(self, out, fail_every):
        super().__init__()
        self.out = out
        self.fail_every = fail_every
        self.count = 0

    def render_POST(self, request):
        self.count += 1
        body = request.content.read()
        if self.fail_every and self.count % self.fail_every == 0:
            request.setResponseCode(500)
            return b"fail on purpose"
        batch = json.loads(body)
        self.out.write(json.dumps({"n": self.count, "batch": batch}) + "\n")
        self.out.flush()
        request.setResponseCode(204)
        return b""


def main():
    out = open(sys.argv[1], "a")
    port = reactor.listenTCP(0, server.Site(Receiver(out, int(sys.argv[2]))),
                             interface="127.0.0.1")
    print("PORT", port.getHost().port, flush=True)
    reactor.run()


if __name__ == "__main__":
    main()
