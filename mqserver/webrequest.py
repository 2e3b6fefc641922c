"""The twisted.web site and request every HTTP door of the broker uses: request bodies
bounded from the request head and kept in memory, never spooled to disk.

A door's site is a L{Site}: it names the largest body a request may carry
(L{Site.body_limit}, by method and path) and how its errors look (L{Site.refusal}). A
request whose Content-Length is over the limit is answered 413 from its head, before
any of the body is read; a chunked body is counted as it comes and answered 413 as
soon as it passes the limit; either way the connection is then closed.
"""

import json
from io import BytesIO

from twisted.web import http, server

from mqserver.wiretap import invert_byte

#: the body limit of a door that takes no request bodies of its own
SMALL_BODY = 64 << 10


class Refusal(Exception):
    """An answer given from the request head (or from a body past its limit), before
    the request is processed.

    @ivar status: the HTTP status.
    @ivar body: the answer's body (bytes).
    @ivar headers: C{(name, value)} byte pairs besides Content-Type and Content-Length.
    """

    def __init__(self, status, body, content_type=b"application/json", headers=()):
        super().__init__(status)
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = tuple(headers)


def request_target(request):
    """The method and path (query string included) of a request whose head is in but
    whose body is not yet read, or (None, None) when this Twisted does not expose them.

    twisted.web sets C{method}/C{path} on the request only once the body is read; the
    channel keeps the request line meanwhile. This is the one place that reads it."""
    channel = request.channel
    command = getattr(channel, "_command", None)
    path = getattr(channel, "_path", None)
    if isinstance(command, bytes) and isinstance(path, bytes):
        return command, path
    return None, None


class _Discard:
    """A content file that keeps nothing (for a refused body)."""

    def write(self, data):
        pass

    def seek(self, *a):
        pass

    def tell(self):
        return 0

    def read(self, *a):
        return b""

    def close(self):
        pass


class Request(server.Request):
    """A request whose body is bounded by its site (L{Site.body_limit}) and kept in
    memory, whose C{repr} never fails and whose bad Content-Type gets a 400.

    twisted.web's own request writes a body of unknown length (chunked) or of 100 kB
    and more to a temporary file: a client announcing gigabytes had them written to
    disk before any limit was looked at.

    twisted.web puts the request's C{repr} into log events (e.g. its warning about the
    body of a HEAD answer it drops), and C{Request.__repr__} decodes the method and URI as
    ASCII: a request line with other bytes made that log event fail to format, which is
    logged as a traceback. Here those bytes are shown escaped instead.

    On a POST with a body, twisted.web parses the Content-Type (looking for a form) with
    the e-mail package, which raises ValueError on some values (a CR inside); raised
    from the channel's C{dataReceived}, that was an unhandled error.
    """

    _refused = False
    _received = 0
    _limit = None
    _too_large = None
    #: C{(tap, door, names)} while the wire trace watches this request's answer: the
    #: L{mqserver.wiretap.WireTap}, the front door and the route's names (set by
    #: L{mqserver.webfaults.serve}; reported by L{Site.log} when the answer is finished)
    watched = None
    #: the offset of the byte a fault rule inverts in the first piece of this request's
    #: answer body (L{mqserver.wiretap.invert_byte}), or None
    corrupt_at = None

    def write(self, data):
        if self.corrupt_at is not None and data:
            data, self.corrupt_at = invert_byte(data, self.corrupt_at), None
        super().write(data)

    def gotLength(self, length):
        site = getattr(self.channel, "site", None)
        if not isinstance(site, Site):
            super().gotLength(length)
            return
        method, target = request_target(self)
        path = target.split(b"?", 1)[0] if target is not None else None
        try:
            self._limit, self._too_large = site.body_limit(self, method, path)
            if length is not None and length > self._limit:
                raise site.refusal(413, self._too_large)
        except Refusal as refusal:
            self._refuse(refusal)
            return
        # in memory whatever the length: the limit above bounds it, and twisted.web's own
        # choice is a temporary file for a chunked body or one of 100 kB and more
        self.content = BytesIO()

    def handleContentChunk(self, data):
        if self._refused:
            return
        self._received += len(data)
        if self._limit is not None and self._received > self._limit:
            self._refuse(self.channel.site.refusal(413, self._too_large))
            return
        self.content.write(data)

    def _refuse(self, refusal):
        """Answer C{refusal} now and close: the rest of the body is never read."""
        self._refused = True
        # no "100 Continue" after the refusal: the client must not send the body
        self.requestHeaders.removeHeader(b"expect")
        if self.content is not None and not isinstance(self.content, _Discard):
            self.content.close()
        self.content = _Discard()
        phrase = http.RESPONSES.get(refusal.status, b"Error")
        head = [b"HTTP/1.1 %d %s" % (refusal.status, phrase),
                b"Content-Type: " + refusal.content_type,
                b"Content-Length: %d" % len(refusal.body), b"Connection: close"]
        head += [name + b": " + value for name, value in refusal.headers]
        transport = self.channel.transport
        transport.write(b"\r\n".join(head) + b"\r\n\r\n" + refusal.body)
        transport.loseConnection()

    def process(self):
        if self._refused:
            return
        super().process()

    def requestReceived(self, command, path, version):
        try:
            super().requestReceived(command, path, version)
        except ValueError:
            # raised while parsing the head, before the request was processed
            if self.startedWriting or self.finished:
                raise
            self.setResponseCode(400)
            self.setHeader(b"Content-Type", b"text/plain; charset=utf-8")
            self.setHeader(b"Connection", b"close")
            self.write(b"bad request head\n")
            self.finish()

    def __repr__(self):
        def text(b):
            return b.decode("ascii", "backslashreplace") if isinstance(b, bytes) else str(b)

        return "<{} at 0x{:x} method={} uri={} clientproto={}>".format(
            type(self).__name__, id(self), text(self.method), text(self.uri), text(self.clientproto))


class Site(server.Site):
    """The site of an HTTP door: bounded bodies (L{Request}), no access log, HTTP/1.1.

    @ivar max_body: the body limit of every route (L{body_limit} may say otherwise).
    """

    noisy = False
    requestFactory = Request
    max_body = SMALL_BODY

    def body_limit(self, request, method, path):
        """Return C{(limit, text)}: the largest body (bytes) a request to C{path}
        (bytes, without the query; None with C{method} when unknown) may carry, and the
        text of the 413 answering a larger one. Raise L{Refusal} to refuse the request
        from its head for another reason."""
        return self.max_body, f"request body larger than {self.max_body} bytes"

    def refusal(self, status, text):
        """The L{Refusal} answering C{status} with C{text}, in this door's error form
        (here C{{"error": text}})."""
        return Refusal(status, json.dumps({"error": text}).encode() + b"\n")

    def acceptableProtocols(self):
        """HTTP/1.1 only, also when the h2 package is installed: the body limits are
        those of HTTP/1.1 requests."""
        return [b"http/1.1"]

    def log(self, request):
        # Called by twisted.web when the answer is finished. No access log: a line per
        # request would cost more than the request; the wire trace's line, while it watches.
        if request.watched is not None:
            tap, door, names = request.watched
            request.watched = None
            tap.frame(door, request.channel, "out", (str(request.code),) + names,
                      {"status": request.code, "route": names[0], "body": request.sentLength})


def departure(request):
    """Return a list that stays empty while the client of C{request} can still get the
    answer, and holds the reason once the connection was lost before the answer was
    finished.

    Call it when a resource returns C{NOT_DONE_YET} (the connection cannot be lost while
    C{render} runs), and check the list before writing the late answer. It listens on
    C{request.notifyFinish()}, the public API for this, and so works with any
    C{IRequest}, not only with the request class that has the private flag it sets.
    """
    gone = []
    request.notifyFinish().addErrback(gone.append)
    return gone
