"""A TCP forwarder on loopback that can cut the line silently, in-process on the reactor:
while cut, bytes in both directions are dropped and new connections are accepted but go
nowhere, as across a network partition (requests time out; nothing is refused)."""

from twisted.internet import reactor
from twisted.protocols import portforward


class _Client(portforward.ProxyClient):
    def dataReceived(self, data):
        if not self.peer.factory.cut:
            super().dataReceived(data)


class _ClientFactory(portforward.ProxyClientFactory):
    protocol = _Client


class _Server(portforward.ProxyServer):
    clientProtocolFactory = _ClientFactory

    def connectionMade(self):
        self.factory.connections.append(self)
        super().connectionMade()

    def dataReceived(self, data):
        if not self.factory.cut and self.peer is not None:
            super().dataReceived(data)


class CuttableForwarder(portforward.ProxyFactory):
    """Forward 127.0.0.1:C{port} (see L{listen}) to C{host}:C{target_port}.

    @ivar cut: True while the line is cut.
    """

    protocol = _Server
    noisy = False

    def __init__(self, host, target_port):
        super().__init__(host, target_port)
        self.cut = False
        self.connections = []
        self.listening = None

    def listen(self):
        """Listen on an ephemeral loopback port; returns the port number."""
        self.listening = reactor.listenTCP(0, self, interface="127.0.0.1")
        return self.listening.getHost().port

    def close(self):
        """Stop listening and drop every connection; returns a Deferred."""
        for c in self.connections:
            c.transport.abortConnection()
        return self.listening.stopListening()
