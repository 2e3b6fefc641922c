"""A twisted.web request every HTTP door of the broker can use (its site's
C{requestFactory})."""

from twisted.web import server


class Request(server.Request):
    """A request whose C{repr} never fails.

    twisted.web puts the request's C{repr} into log events (e.g. its warning about the
    body of a HEAD answer it drops), and C{Request.__repr__} decodes the method and URI as
    ASCII: a request line with other bytes made that log event fail to format, which is
    logged as a traceback. Here those bytes are shown escaped instead.
    """

    def __repr__(self):
        def text(b):
            return b.decode("ascii", "backslashreplace") if isinstance(b, bytes) else str(b)

        return "<{} at 0x{:x} method={} uri={} clientproto={}>".format(
            type(self).__name__, id(self), text(self.method), text(self.uri), text(self.clientproto))
