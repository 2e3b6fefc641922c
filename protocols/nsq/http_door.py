"""The nsqd HTTP front door as twistd starts it: the shared NSQ node learns at start
that it has an HTTP door (whether TLS, and once bound its port, for /info, IDENTIFY and
lookupd), and the site (L{protocols.nsq.http}: twisted.web, several MB resident) is
imported and built at the door's first connection
(L{mqserver.frontdoor.FirstUseFactory})."""

from mqserver.faults import check_http
from mqserver.frontdoor import FirstUseFactory
from protocols.nsq.faults import HTTP_DOOR
from protocols.nsq.node import get_node


def http_node(broker, config, reactor):
    """C{broker}'s shared NSQ node, told whether its HTTP door speaks TLS."""
    node = get_node(broker, config, reactor)
    node.http_tls = (getattr(config, "listen", {}).get("nsqd_http") or "").startswith("ssl:")
    return node


def make_factory(broker, config, reactor):
    """The nsqd HTTP door's factory: its site is built at its first connection."""
    node = http_node(broker, config, reactor)
    broker.wiretap.faults.door(HTTP_DOOR, check_http)

    def build():
        from protocols.nsq.http import NsqdHttpSite

        return NsqdHttpSite(node, config["nsq.httpIdleTimeout"] / 1000.0)

    def listening(port):  # as NsqdHttpSite.listening
        node.http_port = port.getHost().port

    return FirstUseFactory(build, "NsqdHttpSite", listening=listening)
