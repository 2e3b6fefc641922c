"""ALIVE on an smss stream that has been quiet: subscriptions and the
master's REPLICA feed."""


class IdleAlive:
    """Calls C{send_alive} once the stream has written nothing for C{interval} seconds,
    and again every C{interval} while it stays quiet.

    One timer serves the whole stream: a write only records its time (L{wrote}), and the
    timer, when it fires early, re-arms itself for what is left. A busy stream so pays a
    clock read per write instead of a callLater and a cancel.

    C{send_alive()} returns False when ALIVE must not go now (a subscription waiting for
    an ack); the timer then tries again an interval later.
    """

    def __init__(self, reactor, interval, send_alive):
        self._reactor = reactor
        self._interval = interval
        self._send_alive = send_alive
        self._last = 0.0
        self._call = None

    def start(self):
        """Start counting from now."""
        self._last = self._reactor.seconds()
        if self._call is None:
            self._call = self._reactor.callLater(self._interval, self._check)

    def wrote(self):
        """The stream just wrote something: the quiet time starts again."""
        self._last = self._reactor.seconds()

    def stop(self):
        """Send no more ALIVE."""
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None

    def _check(self):
        self._call = None
        left = self._last + self._interval - self._reactor.seconds()
        if left <= 0:
            if self._send_alive():
                self._last = self._reactor.seconds()
            left = self._interval
        self._call = self._reactor.callLater(left, self._check)
