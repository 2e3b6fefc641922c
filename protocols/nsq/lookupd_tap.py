"""``twistd -n mqlookupd``: a standalone nsqlookupd (TCP V1 + HTTP) with no broker."""

import socket

from twisted.internet import endpoints
from twisted.python import usage

from mqserver.cluster.lookupd import LookupRegistry
from mqserver.service import ListenerService, StandaloneService

from protocols.nsq.lookupd import LookupdFactory
from protocols.nsq.lookupd_http import LookupdHttpSite


class Options(usage.Options):
    """Command line of C{twistd mqlookupd}."""

    optParameters = [
        ["tcp", "t", "tcp:4160:interface=127.0.0.1", "Endpoint of the TCP (V1) listener."],
        ["http", "h", "tcp:4161:interface=127.0.0.1", "Endpoint of the HTTP listener."],
        ["broadcast-address", "b", "127.0.0.1", "Address this lookupd reports in IDENTIFY."],
        ["idle-timeout", None, 60.0, "Close connections silent for this many seconds (0: never).", float],
        ["ready-file", None, None,
         "Once listening, write this JSON file: version, pid, and where each door is bound."],
    ]


def makeService(options, reactor=None):
    """Both lookupd listeners over one in-memory registry."""
    if reactor is None:
        from twisted.internet import reactor
    registry = LookupRegistry(clock=reactor.seconds)
    root = StandaloneService(options["ready-file"])
    idle = options["idle-timeout"]
    tcp = LookupdFactory(registry, reactor, options["broadcast-address"], socket.gethostname(), idle)
    # ListenerService tells the factory its port (reported in IDENTIFY answers).
    ListenerService("lookupd_tcp", options["tcp"], endpoints.serverFromString(reactor, options["tcp"]),
                    tcp).setServiceParent(root)
    ListenerService("lookupd_http", options["http"], endpoints.serverFromString(reactor, options["http"]),
                    LookupdHttpSite(registry, idle, reactor)).setServiceParent(root)
    return root
