"""State shared by the two RocketMQ front doors of one broker process.

The nameserver door and the broker door are separate listeners built by separate
C{make_factory} calls. When the nameserver is embedded (the default), the broker
registers with it in-process instead of over TCP, so the broker door needs the
nameserver's L{RouteTable}: both doors find it here, keyed by the core broker object.
"""

import weakref

_contexts = weakref.WeakKeyDictionary()


class RocketContext:
    """Per-broker shared state.

    @ivar route_table: the embedded nameserver's L{RouteTable}, or None when the
        nameserver door is off.
    @ivar broker_door: the broker door's factory, or None.
    """

    def __init__(self):
        self.route_table = None
        self.broker_door = None


def context_for(broker):
    """Return the L{RocketContext} of C{broker}, creating it on first use."""
    ctx = _contexts.get(broker)
    if ctx is None:
        ctx = _contexts[broker] = RocketContext()
    return ctx
