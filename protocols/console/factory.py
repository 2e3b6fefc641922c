"""The console front door (``listen.console``)."""

from twisted.internet.protocol import Factory

from protocols.console.protocol import ConsoleProtocol


class ConsoleFactory(Factory):
    """Builds L{ConsoleProtocol}s.

    @ivar max_line: the longest line accepted, in bytes.
    @ivar window: un-acked messages one SUB may hold per queue.
    @ivar peek_max: the most messages PEEK returns (FETCH: ten times as many).
    @ivar token: the C{AUTH <token>} a connection must send first, or "" (none).
    """

    noisy = False

    def __init__(self, broker, reactor, max_line=1 << 20, window=100, peek_max=100, token=""):
        self.broker = broker
        self.token = token
        self.reactor = reactor
        self.max_line = max_line
        self.window = window
        self.peek_max = peek_max
        self.connections = set()

    def buildProtocol(self, addr):
        return ConsoleProtocol(self)


def make_factory(broker, config, reactor):
    """Return the console factory over C{broker}."""
    return ConsoleFactory(broker, reactor, max_line=config["console.maxLineLength"],
                          window=config["console.window"], peek_max=config["console.peekMax"],
                          token=config["console.token"])
