"""A twisted.web request every HTTP door of the broker can use (its site's
C{requestFactory})."""

from twisted.web import server


class Request(server.Request):
    """A request whose C{repr} never fails and whose bad Content-Type gets a 400.

    twisted.web puts the request's C{repr} into log events (e.g. its warning about the
    body of a HEAD answer it drops), and C{Request.__repr__} decodes the method and URI as
    ASCII: a request line with other bytes made that log event fail to format, which is
    logged as a traceback. Here those bytes are shown escaped instead.

    On a POST with a body, twisted.web parses the Content-Type (looking for a form) with
    the e-mail package, which raises ValueError on some values (a CR inside); raised
    from the channel's C{dataReceived}, that was an unhandled error.
    """

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
