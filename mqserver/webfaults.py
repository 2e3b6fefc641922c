"""Fault rules (L{mqserver.faults}) and the wire trace (L{mqserver.trace}: the requests,
with their method, path, arguments and body size, and their answers, with their status
and body size) on the broker's HTTP doors (twisted.web). For fault rules a request's
command is its route, named C{"POST /pub"} or C{"/pub"}; C{respond} answers the rule's
HTTP status with the door's own error body; C{delay} serves the request and writes its
answer the rule's seconds later; C{drop} never answers; C{close} closes the connection;
C{split} serves it and writes its answer, head and body, the rule's bytes at a time
(L{mqserver.wiretap.tamper_output}); C{corrupt} serves it and inverts one byte of its
answer's body (of the first piece written; the head is left alone, so the client reads
a whole answer with a wrong body).

A door's resource calls L{serve} from C{render} only while the tap is active; the door's
rules are checked by L{mqserver.faults.check_http}.
"""

from twisted.internet import task
from twisted.web import server

from mqserver import webrequest
from mqserver.wiretap import tamper_output


def route_names(request):
    """Return the names a fault rule's command may give C{request}'s route."""
    path = request.path.split(b"?", 1)[0].decode("utf-8", "replace")
    return f"{request.method.decode('ascii', 'replace')} {path}", path


def serve(tap, door, request, render, error):
    """Return what C{render(request)} should, as a fault rule of C{tap} for front door
    C{door} says: C{render} is the door's usual rendering, C{error(request, status,
    text)} renders the door's error body."""
    names = route_names(request)
    if tap.trace.active:
        tap.frame(door, request.channel, "in", names, {
            "method": request.method.decode("ascii", "replace"), "path": names[1],
            "args": {k.decode("utf-8", "replace"): [v.decode("utf-8", "replace") for v in vs]
                     for k, vs in request.args.items()},
            "body": int(request.getHeader(b"content-length") or 0)})
        request.watched = (tap, door, names)  # its answer, when finished (webrequest.Site)
    rule = tap.fault(door, request.channel, names)
    if rule is None:
        return render(request)
    action = rule.action
    if action == "split":
        tamper_output(request.channel, rule, tap.clock)
        return render(request)
    if action == "corrupt":
        request.corrupt_at = rule.value
        return render(request)
    if action == "respond":
        text = rule.remark or f"injected by mqserver fault rule {rule.id}"
        return error(request, int(rule.value), text)
    if action == "close":
        request.channel.transport.loseConnection()
    elif action == "delay":
        gone = webrequest.departure(request)
        task.deferLater(tap.clock, rule.value, _late, request, render, gone)
    # drop (and close): no answer
    return server.NOT_DONE_YET


def _late(request, render, gone):
    if gone:
        return  # the client left before the answer was ready
    body = render(request)
    if body is not server.NOT_DONE_YET:  # else the resource finishes it
        # as twisted.web sets it for a body render returns (no chunked encoding)
        request.setHeader(b"Content-Length", b"%d" % len(body))
        request.write(body)
        request.finish()
