"""nsqlookupd's HTTP API (``listen.lookupd_http``): /ping, /info, /lookup, /topics,
/channels, /nodes, topic/channel create/delete, /topic/tombstone, /debug."""

from twisted.web import resource

from mqserver import webfaults
from mqserver.wiretap import OFF

from protocols.nsq.faults import LOOKUPD_HTTP_DOOR
from protocols.nsq.httputil import (
    HttpError, NsqSite, arg as _arg, error_body, fault_error, handler_for, name_arg,
    result_body,
)
from protocols.nsq.version import VERSION


def _topic(request):
    return name_arg(request, "topic")


def _channel(request):
    return name_arg(request, "channel")


class LookupdHttpResource(resource.Resource):
    """Every nsqlookupd HTTP endpoint over a L{LookupRegistry}.

    @ivar tap: the broker's L{mqserver.wiretap.WireTap} (wire trace and fault rules of
        the embedded lookupd), else one that is never active (a standalone lookupd).
    """

    isLeaf = True

    def __init__(self, registry, tap=OFF):
        super().__init__()
        self.registry = registry
        self.tap = tap
        self.routes = {
            b"/ping": (b"GET", lambda r: b"OK"),
            b"/info": (b"GET", lambda r: {"version": VERSION}),
            b"/lookup": (b"GET", self.lookup), b"/topics": (b"GET", self.topics),
            b"/channels": (b"GET", self.channels), b"/nodes": (b"GET", self.nodes),
            b"/debug": (b"GET", self.debug),
            b"/topic/create": (b"POST", self.topic_create),
            b"/topic/delete": (b"POST", self.topic_delete),
            b"/topic/tombstone": (b"POST", self.topic_tombstone),
            b"/channel/create": (b"POST", self.channel_create),
            b"/channel/delete": (b"POST", self.channel_delete),
        }

    def render(self, request):
        if self.tap.active:
            return webfaults.serve(self.tap, LOOKUPD_HTTP_DOOR, request, self._render,
                                   fault_error)
        return self._render(request)

    def _render(self, request):
        path = request.path.rstrip(b"/") or b"/"
        try:
            result = handler_for(self.routes.get(path), request)(request)
        except HttpError as e:
            return error_body(request, e)
        return result_body(request, result, path == b"/ping")

    def lookup(self, request):
        t = _arg(request, "topic")
        if not t:
            raise HttpError(400, "MISSING_ARG_TOPIC")
        found = self.registry.lookup(t)
        if found is None:
            raise HttpError(404, "TOPIC_NOT_FOUND")
        channels, producers = found
        return {"channels": channels, "producers": producers}

    def topics(self, request):
        return {"topics": self.registry.topics()}

    def channels(self, request):
        t = _arg(request, "topic")
        if not t:
            raise HttpError(400, "MISSING_ARG_TOPIC")
        return {"channels": self.registry.channels(t)}

    def nodes(self, request):
        return {"producers": self.registry.nodes()}

    def debug(self, request):
        return {f"{k[0]}:{k[1]}:{k[2]}": list(v.values()) for k, v in self.registry.regs.items()}

    def topic_create(self, request):
        self.registry.create_topic(_topic(request))

    def topic_delete(self, request):
        self.registry.delete_topic(_topic(request))

    def topic_tombstone(self, request):
        t = _topic(request)
        node = _arg(request, "node")
        if not node:
            raise HttpError(400, "MISSING_ARG_NODE")
        if not self.registry.tombstone(t, node):
            raise HttpError(404, "PRODUCER_NOT_FOUND")

    def channel_create(self, request):
        self.registry.create_channel(_topic(request), _channel(request))

    def channel_delete(self, request):
        t, c = _topic(request), _channel(request)
        if not self.registry.delete_channel(t, c):
            raise HttpError(404, "CHANNEL_NOT_FOUND")


class LookupdHttpSite(NsqSite):
    """The nsqlookupd HTTP site (no route reads a body: at most 64 KiB is taken)."""

    def __init__(self, registry, idle_timeout=60.0, reactor=None, tap=OFF):
        super().__init__(LookupdHttpResource(registry, tap), timeout=idle_timeout or None,
                         reactor=reactor)


def make_factory(broker, config, reactor):
    """The embedded lookupd's HTTP door over the broker's NSQ node registry."""
    from protocols.nsq.node import get_node

    return LookupdHttpSite(get_node(broker, config, reactor).lookupd, config["nsq.httpIdleTimeout"] / 1000.0,
                           reactor, broker.wiretap)
