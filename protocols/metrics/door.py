"""The ``metrics`` front door: an HTTP server (twisted.web) answering ``GET /metrics`` in
Prometheus's text format, from a collector that reads the core statistics at scrape
time (L{protocols.metrics.collector})."""

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from twisted.web import resource, server

from mqserver import webrequest
from protocols.metrics.collector import BrokerCollector


class MetricsResource(resource.Resource):
    """``/metrics``: every metric of the broker's registry."""

    isLeaf = True

    def __init__(self, registry):
        super().__init__()
        self.registry = registry

    def render_GET(self, request):
        # the format the scraper asks for (Prometheus text 0.0.4/1.0.0, OpenMetrics)
        accept = (request.getHeader(b"accept") or b"").decode("latin-1")
        encoder, content_type = choose_encoder(accept)
        request.setHeader(b"Content-Type", content_type.encode())
        return encoder(self.registry)


class MetricsSite(server.Site):
    """The metrics door's factory (a Site with quiet access logs)."""

    noisy = False
    requestFactory = webrequest.Request

    def log(self, request):
        pass


def make_factory(broker, config, reactor):
    """Return the metrics site of C{broker}."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(broker, config["metrics.perConsumer"]))
    root = resource.Resource()
    root.putChild(b"metrics", MetricsResource(registry))
    site = MetricsSite(root)
    site.displayTracebacks = False
    return site
