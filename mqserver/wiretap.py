"""The switch front doors read on their usual path: L{WireTap.active} is True while a
fault rule is set (L{mqserver.faults}) or someone traces (L{mqserver.trace}), and a door
then takes its slower, looking path for each request: it reports the frames it reads
and writes, and applies fault rules. While it is False a door pays one attribute read
per read, request or write.

The tap also numbers connections (the ids fault rules match and the trace shows); a
connection gets its number the first time the tap sees it.
"""

import itertools
import weakref

from mqserver.faults import FaultRules
from mqserver.trace import TraceHub


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

    @ivar active: True while any rule is set or anyone traces.
    @ivar faults: the L{FaultRules}.
    @ivar trace: the L{TraceHub}.
    @ivar clock: the reactor (C{seconds}, C{callLater}) doors time faults with.
    """

    def __init__(self, clock):
        self.clock = clock
        self.faults = FaultRules(clock.seconds, on_change=self._update,
                                 call_later=clock.callLater)
        self.trace = TraceHub(clock.seconds, on_change=self._update)
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
        rule = self.faults.match(door, self.conn_id(protocol), host, port, names)
        if rule is not None and self.trace.active:
            self.trace.frame(door, self.conn_id(protocol), f"{host}:{port}", "fault", names,
                             {"rule": rule.id, "action": rule.action, "value": rule.value})
        return rule

    def frame(self, door, protocol, direction, names, fields, size=None, raw=None):
        """Report a frame front door C{door} read (C{direction} "in") or wrote ("out")
        on C{protocol}'s connection to the trace (L{TraceHub.frame})."""
        if not self.trace.active:
            return
        host, port = peer_of(protocol.transport)
        self.trace.frame(door, self.conn_id(protocol), f"{host}:{port}", direction, names,
                         fields, size, raw)

    def _update(self):
        self.active = self.faults.active or self.trace.active


#: Seconds between two pieces of an answer a C{split} rule writes.
SPLIT_GAP = 0.05


def invert_byte(data, offset):
    """Return C{data} (not empty) with the byte at C{offset} inverted: from its end when
    negative, the last (or first) byte when past its end."""
    data = bytearray(data)
    data[max(-len(data), min(offset, len(data) - 1))] ^= 0xFF
    return bytes(data)


def tamper_output(protocol, rule, clock):
    """Make C{protocol}'s connection write its next output as fault rule C{rule} says:
    C{split}, C{rule.value} bytes at a time, L{SPLIT_GAP} seconds apart (anything written
    meanwhile queues behind, in order); C{corrupt}, with the byte at offset C{rule.value}
    of its next write inverted (negative: from its end). The connection's transport is
    itself again once that is done.

    The door calls it before it handles the request, with nothing gathered for a later
    send (its writes go to C{protocol.transport} as they are made)."""
    protocol.transport = _Tampered(protocol, protocol.transport, rule, clock)


class _Tampered:
    """Stands for a connection's transport while a split or corrupt rule changes what it
    writes; everything else passes through to the real transport."""

    def __init__(self, protocol, real, rule, clock):
        self._protocol = protocol
        self._real = real
        self._rule = rule
        self._clock = clock
        self._queue = bytearray()
        self._pumping = False
        self._closing = False

    def __getattr__(self, name):
        return getattr(self._real, name)

    def write(self, data):
        if not data:
            return
        if self._rule.action == "corrupt":
            self._done()
            self._real.write(invert_byte(data, self._rule.value))
            return
        self._queue += data
        if not self._pumping:
            self._pumping = True
            self._pump()

    def writeSequence(self, seq):
        self.write(b"".join(seq))

    def loseConnection(self):
        if self._queue:
            self._closing = True  # once the rest is written, as a transport does
        else:
            self._real.loseConnection()

    def _pump(self):
        size = self._rule.value
        piece = bytes(self._queue[:size])
        del self._queue[:size]
        self._real.write(piece)
        if self._queue:
            self._clock.callLater(SPLIT_GAP, self._pump)
            return
        self._done()
        if self._closing:
            self._real.loseConnection()

    def _done(self):
        if self._protocol.transport is self:
            self._protocol.transport = self._real
