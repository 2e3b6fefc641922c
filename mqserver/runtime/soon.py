"""Calls in the reactor's next turn, cheaper than C{callLater(0, ...)}.

A broker coalesces the arrivals of one reactor turn into one delivery pass: the channel's
pump, an smss subscription's send. Through C{callLater(0)} each pass costs a
L{DelayedCall}, a heap insertion and its comparisons and Twisted's full
C{runUntilCurrent}, some 250 bytecodes, as much as a third of what delivering the message
costs. L{mqserver.runtime.reactor.SpinningEPollReactor} keeps a plain list of such calls
instead and runs it at the start of its next turn, before timers; on any other reactor
(Twisted's own, a test's L{Clock} or C{MemoryReactor}) L{call_soon} is C{callLater(0)}.
"""

__all__ = ["call_soon", "SoonCall"]


class SoonCall:
    """A call L{call_soon} queued: C{active()} until it ran or was cancelled, like a
    L{DelayedCall}."""

    __slots__ = ("f", "args", "done")

    def __init__(self, f, args):
        self.f = f
        self.args = args
        self.done = False

    def active(self):
        return not self.done

    def cancel(self):
        """Do not run it (nothing happens when it already ran)."""
        self.done = True


def call_soon(reactor, f, *args):
    """Call C{f(*args)} in C{reactor}'s next turn; return a handle with C{active()} and
    C{cancel()}."""
    soon = getattr(reactor, "call_soon", None)
    if soon is None:
        return reactor.callLater(0, f, *args)
    return soon(f, args)
