"""Helpers shared by the nsqd and nsqlookupd HTTP APIs."""


class HttpError(Exception):
    """An HTTP error of nsqd/nsqlookupd: the status and the message code of the JSON body."""

    def __init__(self, status, code):
        super().__init__(code)
        self.status = status
        self.code = code


def arg(request, name):
    """Return query argument C{name} of a twisted.web request as str, or None."""
    v = request.args.get(name.encode())
    return v[0].decode("utf-8", "surrogateescape") if v else None
