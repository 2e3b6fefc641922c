"""The msgout HTTP front door (``listen.msgout``): a twisted.web site with one root
resource (so one wrapper can guard every route) over L{MsgoutApi}.

Oversize bodies, unknown routes and unknown queues are refused from the request head,
before any of the body is buffered (L{MsgoutSite.body_limit}, L{mqserver.webrequest}).
"""

from twisted.internet import defer
from twisted.web import resource, server

from mqserver import webfaults, webrequest
from mqserver.security import BearerTokenResource, bearer_authorized
from mqserver.service import HookService

from protocols.msgout.api import ApiError, Messages, MsgoutApi, dumps, split_path, status_of
from protocols.msgout.config import DOOR
from protocols.msgout.push import push_manager

_JSON_TYPE = b"application/json; charset=utf-8"


class MsgoutResource(resource.Resource):
    """The root of every route: runs L{MsgoutApi.call} and writes its JSON."""

    isLeaf = True

    def __init__(self, api):
        super().__init__()
        self.api = api
        self.tap = api.broker.wiretap

    def render(self, request):
        if self.tap.active:
            return webfaults.serve(self.tap, DOOR, request, self._render, self._fault_error)
        return self._render(request)

    def _fault_error(self, request, status, text):
        return self._body(request, (status, {"error": text}))

    def _render(self, request):
        parts = split_path(request.path)
        if parts is None:
            d = defer.succeed((400, {"error": "bad path"}))
        else:
            raw = request.content.read() if request.content is not None else b""
            d = self.api.call(request.method, parts, raw)
        # answered now when the result is there; a fired Deferred can still be waiting
        # on another (a publish to a persistent queue waits for the fsync)
        now = []
        d.addCallback(lambda r: now.append(r) or r)
        if now:
            return self._body(request, now[0])
        gone = webrequest.departure(request)
        request.notifyFinish().addErrback(lambda _: self._gone(d))
        d.addCallback(self._finish, request, gone)
        return server.NOT_DONE_YET

    @staticmethod
    def _gone(d):
        # the client left: stop a long poll (what it took goes back)
        if not d.called:
            d.cancel()

    def _finish(self, result, request, gone):
        if gone:
            status, data = result
            receipts = data.receipts() if isinstance(data, Messages) else []
            if receipts:
                self.api.queues.nack(receipts)  # never seen: fail them back now
            return
        request.write(self._body(request, result))
        request.finish()

    @staticmethod
    def _body(request, result):
        status, data = result
        request.setResponseCode(status)
        request.setHeader(b"Content-Type", _JSON_TYPE)
        body = dumps(data)
        request.setHeader(b"Content-Length", b"%d" % len(body))
        return body


class MsgoutSite(webrequest.Site):
    """The msgout HTTP site; its push subscriptions run as a service of the broker's
    tree (L{services})."""

    def __init__(self, api, pushes=None, root=None, token=""):
        root = root if root is not None else MsgoutResource(api)
        super().__init__(BearerTokenResource(root, token) if token else root)
        self.token = token
        self.api = api
        self.pushes = pushes
        self.max_body = api.max_body

    def body_limit(self, request, method, path):
        """msgout.maxBodySize; a request without its token, or to an unknown route or
        queue, is refused from its head (its body is never read)."""
        if not bearer_authorized(request, self.token):
            raise self.refusal(*status_of(ApiError(401, "unauthorized")))
        if method is not None:
            parts = split_path(path)
            try:
                if parts is None:
                    raise ApiError(400, "bad path")
                self.api.precheck(method, parts)
            except Exception as e:
                raise self.refusal(*status_of(e)) from None
        return super().body_limit(request, method, path)

    def refusal(self, status, text):
        return webrequest.Refusal(status, dumps({"error": text}), _JSON_TYPE)

    def services(self):
        """The service pushing the subscriptions (none without pushes), added to the
        broker's service tree beside the listener: it starts after the broker (whose
        channels the pushes read) and stops after the listener closes, waiting for the
        push connections to close (L{mqserver.service.BrokerService.add_door_services})."""
        if self.pushes is None:
            return []
        return [HookService(self.pushes.start, self.pushes.stop, "msgout-pushes")]


def make_factory(broker, config, reactor, pushes=None):
    """Return the msgout HTTP site over C{broker} (with C{pushes}, or a new push
    manager)."""
    api = MsgoutApi(broker, reactor, max_body=config["msgout.maxBodySize"],
                    max_fetch=config["msgout.maxFetch"],
                    max_wait_ms=config["msgout.maxWaitMs"])
    if pushes is None:
        pushes = push_manager(broker, config, reactor)
    return MsgoutSite(api, pushes, token=config["msgout.token"])
