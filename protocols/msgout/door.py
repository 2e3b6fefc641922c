"""The msgout front door as twistd starts it: the push subscriptions run from start-up,
and the HTTP site (L{protocols.msgout.http}: twisted.web, several MB resident) is
imported and built at the door's first connection (L{mqserver.frontdoor.FirstUseFactory})."""

from mqserver.faults import check_http
from mqserver.frontdoor import FirstUseFactory
from mqserver.service import HookService
from protocols.msgout.config import DOOR
from protocols.msgout.push import push_manager


def make_factory(broker, config, reactor):
    """The msgout door's factory: its site is built at its first connection."""
    pushes = push_manager(broker, config, reactor)
    broker.wiretap.faults.door(DOOR, check_http)

    def build():
        from protocols.msgout import http

        return http.make_factory(broker, config, reactor, pushes)

    return FirstUseFactory(build, "MsgoutSite",
                           [HookService(pushes.start, pushes.stop, "msgout-pushes")])
