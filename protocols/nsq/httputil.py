"""Helpers shared by the nsqd and nsqlookupd HTTP APIs: routing, error and result
bodies, arguments."""

import json

from mqserver import webrequest

from protocols.nsq.codec import is_valid_name

_JSON_TYPE = b"application/json; charset=utf-8"
_NSQ_TYPE = (b"X-NSQ-Content-Type", b"nsq; version=1.0")


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


def handler_for(route, request):
    """Return the function of C{route} (a C{(method, fn)} pair, or None when the path is
    unknown) for C{request}; raise HttpError 404 or 405 as nsqd does. GET routes answer
    HEAD too."""
    if route is None:
        raise HttpError(404, "NOT_FOUND")
    method, fn = route
    if request.method != method and not (method == b"GET" and request.method == b"HEAD"):
        request.setHeader(b"Allow", b"OPTIONS, " + method)
        raise HttpError(405, "METHOD_NOT_ALLOWED")
    return fn


def _error_json(code):
    return json.dumps({"message": code}).encode()


def error_body(request, e):
    """Set the status and headers of HttpError C{e}; return its JSON body."""
    request.setResponseCode(e.status)
    request.setHeader(*_NSQ_TYPE)
    request.setHeader(b"Content-Type", _JSON_TYPE)
    return head_aware(request, _error_json(e.code))


def fault_error(request, status, text):
    """Return the body of a fault rule's error (L{mqserver.webfaults}), as nsqd and
    nsqlookupd write their errors."""
    return error_body(request, HttpError(status, text))


class NsqSite(webrequest.Site):
    """The site of an nsqd or nsqlookupd HTTP API: its refusals are nsqd's errors
    (C{{"message": CODE}}), and a body past the limit is C{BODY_TOO_BIG}."""

    def body_limit(self, request, method, path):
        return self.max_body, "BODY_TOO_BIG"

    def refusal(self, status, code):
        return webrequest.Refusal(status, _error_json(code), _JSON_TYPE, [_NSQ_TYPE])


def result_body(request, result, plain):
    """Return the body of a handler's C{result}: nothing, text (bytes or str) or JSON.
    C{plain} (/ping) leaves out the X-NSQ-Content-Type header, as nsqd does."""
    if not plain:
        request.setHeader(b"X-NSQ-Content-Type", b"nsq; version=1.0")
    if result is None:
        return b""
    if isinstance(result, (bytes, str)):
        request.setHeader(b"Content-Type", b"text/plain; charset=utf-8")
        return head_aware(request, result.encode() if isinstance(result, str) else result)
    request.setHeader(b"Content-Type", b"application/json; charset=utf-8")
    return head_aware(request, json.dumps(result, separators=(",", ":")).encode())


def head_aware(request, body):
    """Return C{body}, or for a HEAD request nothing but its Content-Length: twisted.web
    would otherwise log a warning about the dropped body, and formatting that warning
    fails (a logged traceback) when the request line is not ASCII."""
    if request.method == b"HEAD":
        request.setHeader(b"Content-Length", b"%d" % len(body))
        return b""
    return body


def name_arg(request, kind):
    """Return the required topic or channel name argument C{kind} ("topic" or "channel");
    raise HttpError MISSING_ARG_/INVALID_ARG_ as nsqlookupd does."""
    value = arg(request, kind)
    if value is None:
        # an empty value is there, and invalid (nsqlookupd's ReqParams.Get)
        raise HttpError(400, f"MISSING_ARG_{kind.upper()}")
    if not is_valid_name(value):
        raise HttpError(400, f"INVALID_ARG_{kind.upper()}")
    return value
