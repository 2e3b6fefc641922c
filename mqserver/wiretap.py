"""The switch front doors read on their usual path: L{WireTap.active} is True while a
fault rule is set (L{mqserver.faults}), and a door then takes its slower, looking path
for each request. While it is False a door pays one attribute read per read or request.

The tap also numbers connections (the ids fault rules match and the trace shows); a
connection gets its number the first time the tap sees it.
"""

import itertools
import weakref

from mqserver.faults import FaultRules


class _Off:
    """The tap of a connection no broker watches (e.g. a client-side remoting
    connection): never active."""

    active = False


#: Stands for a tap where there is none.
OFF = _Off()


def peer_of(transport):
    """Return (host, port) of C{transport}'s peer; ("", 0) when it has none (a UNIX
    socket)."""
    peer = transport.getPeer()
    return getattr(peer, "host", ""), getattr(peer, "port", 0)


class WireTap:
    """The broker's fault rules and connection numbers, and whether doors must look.

    @ivar active: True while any rule is set.
    @ivar faults: the L{FaultRules}.
    @ivar clock: the reactor (C{seconds}, C{callLater}) doors time faults with.
    """

    def __init__(self, clock):
        self.clock = clock
        self.faults = FaultRules(clock.seconds, on_change=self._update)
        self.active = False
        self._ids = weakref.WeakKeyDictionary()
        self._next_id = itertools.count(1)

    def conn_id(self, protocol):
        """Return the number of the connection C{protocol} serves."""
        n = self._ids.get(protocol)
        if n is None:
            n = self._ids[protocol] = next(self._next_id)
        return n

    def fault(self, door, protocol, names):
        """Return the fault rule to apply to the request C{protocol} of front door
        C{door} received, whose command goes by any of C{names}; or None."""
        if not self.faults.active:
            return None
        host, port = peer_of(protocol.transport)
        return self.faults.match(door, self.conn_id(protocol), host, port, names)

    def _update(self):
        self.active = self.faults.active
