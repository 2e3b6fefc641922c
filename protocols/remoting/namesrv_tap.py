"""``twistd -n mqnamesrv``: a standalone RocketMQ nameserver (no store, no broker).

Brokers of a cluster register with it (``rocketmq.namesrvAddr`` in their config);
clients point ``namesrv_addr`` at it.
"""

from twisted.internet import endpoints
from twisted.python import usage

from mqserver.cluster.namesrv import RouteTable
from mqserver.service import ListenerService, StandaloneService

from protocols.remoting.namesrv import NamesrvFactory


class Options(usage.Options):
    optParameters = [
        ["listen", "l", "tcp:9876:interface=127.0.0.1", "Endpoint to listen on."],
        ["broker-expire-ms", None, 120000, "Drop brokers silent for this long.", int],
        ["scan-interval-ms", None, 10000, "How often to look for silent brokers.", int],
        ["idle-timeout", None, 120, "Close connections silent for this many seconds (0: never).", int],
        ["ready-file", None, None,
         "Once listening, write this JSON file: version, pid, and where the door is bound."],
    ]


def makeService(options, reactor=None):
    if reactor is None:
        from twisted.internet import reactor
    table = RouteTable(reactor, options["broker-expire-ms"], options["scan-interval-ms"])
    root = StandaloneService(options["ready-file"])
    factory = NamesrvFactory(table, options["idle-timeout"], reactor)
    svc = ListenerService("namesrv", options["listen"],
                          endpoints.serverFromString(reactor, options["listen"]), factory)
    svc.setName("namesrv")
    svc.setServiceParent(root)
    return root
