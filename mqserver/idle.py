"""Closing connections that send nothing for a configured time (each front door's idle
timeout), the way smss's and nsqd's read deadlines and RocketMQ's idle handler do.

A read only sets a flag (one attribute store on the request path); a timer armed with
Twisted's L{TimeoutMixin} looks at the flag every quarter of the timeout, so a
connection is closed after between 1 and 1.25 timeouts without input, as smss counts
360 consecutive 5-second header timeouts.
"""

from twisted.protocols.policies import TimeoutMixin

__all__ = ["IdleWatch"]

#: Checks per timeout.
CHECKS = 4


class IdleWatch(TimeoutMixin):
    """Mixin for a L{twisted.internet.protocol.Protocol}.

    The protocol sets C{self.active = True} whenever it receives bytes, calls
    L{watch_idle} when the connection is made and L{stop_idle_watch} when it is lost.
    It may override L{idle_exempt} (a connection that is busy in another way, such as
    a subscription stream with its own keep-alives) and L{idle_expired}.
    """

    active = False
    _idle_quiet = 0
    _idle_period = None

    def watch_idle(self, timeout, clock):
        """Start watching: close after C{timeout} seconds with no input (None or 0:
        never). C{clock} provides C{callLater} (the reactor, or a test's Clock)."""
        if not timeout:
            return
        self.callLater = clock.callLater
        self._idle_period = timeout / CHECKS
        self._idle_quiet = 0
        self.active = False
        self.setTimeout(self._idle_period)

    def stop_idle_watch(self):
        """Cancel the timer (connection lost)."""
        if self._idle_period is not None:
            self._idle_period = None
            self.setTimeout(None)

    def idle_exempt(self):
        """True while the connection must not be closed for silence."""
        return False

    def idle_expired(self):
        """Close the connection (the protocol may log or answer first)."""
        self.transport.loseConnection()

    def timeoutConnection(self):
        # TimeoutMixin's timer fired: one quarter of the timeout has passed.
        if self._idle_period is None:
            return
        if self.active or self.idle_exempt():
            self.active = False
            self._idle_quiet = 0
        else:
            self._idle_quiet += 1
            if self._idle_quiet >= CHECKS:
                self._idle_period = None
                self.idle_expired()
                return
        self.setTimeout(self._idle_period)
