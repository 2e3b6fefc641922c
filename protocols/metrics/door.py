"""The ``metrics`` front door: an HTTP server (twisted.web) answering ``GET /metrics`` in
Prometheus's text format, from a collector that reads the core statistics at scrape
time (L{protocols.metrics.collector})."""

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from twisted.web import resource

from mqserver import webrequest
from protocols.metrics.collector import BrokerCollector


class MetricsResource(resource.Resource):
    """``/metrics``: every metric of the broker's registry."""

    isLeaf = True

    def __init__(self, registry):
        super().__init__()
        self.registry = registry

    def render(self, request):
        # every method answered here: twisted.web's own 405 page formats the URI as
        # ASCII and fails (a logged traceback) on other bytes
        if request.method not in (b"GET", b"HEAD"):
            request.setResponseCode(405)
            request.setHeader(b"Allow", b"GET, HEAD")
            request.setHeader(b"Content-Type", b"text/plain; charset=utf-8")
            return b"method not allowed\n"
        body = self.render_GET(request)
        if request.method == b"HEAD":  # no body: twisted.web would log that it drops it
            request.setHeader(b"Content-Length", b"%d" % len(body))
            return b""
        return body

    def render_GET(self, request):
        # the format the scraper asks for (Prometheus text 0.0.4/1.0.0, OpenMetrics)
        accept = (request.getHeader(b"accept") or b"").decode("latin-1")
        try:
            encoder, content_type = choose_encoder(accept)
        except (TypeError, ValueError):  # a version prometheus_client cannot compare
            encoder, content_type = choose_encoder("")
        request.setHeader(b"Content-Type", content_type.encode())
        return encoder(self.registry)


class MetricsSite(webrequest.Site):
    """The metrics door's factory (quiet access log; no route takes a body: at most
    64 KiB is read)."""

    def refusal(self, status, text):
        return webrequest.Refusal(status, text.encode() + b"\n", b"text/plain; charset=utf-8")


def make_factory(broker, config, reactor):
    """Return the metrics site of C{broker}."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(broker, config["metrics.perConsumer"]))
    root = resource.Resource()
    root.putChild(b"metrics", MetricsResource(registry))
    site = MetricsSite(root)
    site.displayTracebacks = False
    return site
