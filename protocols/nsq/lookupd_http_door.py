"""The embedded lookupd's HTTP front door as twistd starts it: the shared NSQ node is
made at start, and the site (L{protocols.nsq.lookupd_http}: twisted.web, several MB
resident) is imported and built at the door's first connection
(L{mqserver.frontdoor.FirstUseFactory})."""

from mqserver.faults import check_http
from mqserver.frontdoor import FirstUseFactory
from protocols.nsq.faults import LOOKUPD_HTTP_DOOR
from protocols.nsq.node import get_node


def make_factory(broker, config, reactor):
    """The lookupd HTTP door's factory: its site is built at its first connection."""
    get_node(broker, config, reactor)
    broker.wiretap.faults.door(LOOKUPD_HTTP_DOOR, check_http)

    def build():
        from protocols.nsq import lookupd_http

        return lookupd_http.make_factory(broker, config, reactor)

    return FirstUseFactory(build, "LookupdHttpSite")
