"""Write to a TCP transport without waiting for the next reactor turn.

Twisted's L{FileDescriptor.write} only buffers: the bytes go out when the reactor next
finds the socket writable, which costs two C{epoll_ctl} calls, one more C{epoll_wait} and
a whole reactor iteration per reply.  For request/reply protocols answering one small
request at a time that is most of the server's CPU.  L{send_now} sends at once when
nothing is queued ahead, and falls back to C{transport.write} otherwise, so the byte
order on the connection is the one the caller wrote in. Where Twisted's internals do not
fit (L{mqserver.runtime.fastpath}) or the operator chose the standard path, it is always
C{transport.write}.
"""

import socket

from twisted.internet import tcp

__all__ = ["send_now", "Cork", "WriteCork"]


def enable(on):
    """Let L{send_now} write to sockets directly (C{on}), or make it plain
    C{transport.write} (Twisted's standard path; L{mqserver.runtime.fastpath.choose} decides)."""
    global _SUPPORTED
    _SUPPORTED = bool(on)


#: Attributes send_now reads on a TCP connection (tcp.Connection / FileDescriptor).
TRANSPORT_ATTRIBUTES = (
    "socket", "dataBuffer", "_tempDataBuffer", "connected", "disconnecting",
    "_writeDisconnected",
)


class _NoReactor:
    """Stands in for a reactor while a probe connection is built (it never runs)."""


def missing_transport_internals():
    """Return the names of L{TRANSPORT_ATTRIBUTES} missing on a real (never started)
    C{tcp.Server}-like connection, or on the module (C{tcp.Server} itself)."""
    if not isinstance(getattr(tcp, "Server", None), type):
        return ["twisted.internet.tcp.Server"]
    a, b = socket.socketpair()
    try:
        conn = tcp.Connection(a, None, _NoReactor())
        return [f"tcp.Connection.{n}" for n in TRANSPORT_ATTRIBUTES if not hasattr(conn, n)]
    finally:
        a.close()
        b.close()


def _fast_path_supported():
    # send_now reads a TCP connection's socket and buffer attributes; when a Twisted
    # release renames them it must degrade to plain transport.write, never to reordered
    # bytes or an AttributeError. mqserver.runtime.fastpath runs the same check when it chooses
    # the paths (and may turn send_now off); here it sets the default at import.
    return not missing_transport_internals()


_SUPPORTED = _fast_path_supported()


def send_now(transport, data):
    """Write C{data} to C{transport}, sending it in this call when the transport has
    nothing queued; whatever the socket does not take is queued with C{write}.

    Errors from the socket are left to Twisted: the unsent bytes are queued and the
    reactor sees the failure when it next writes, exactly as with C{write}.
    """
    if (
        _SUPPORTED
        and type(transport) is tcp.Server
        and not getattr(transport, "_tempDataBuffer", True)
        and not transport.dataBuffer
        and transport.connected
        and not transport.disconnecting
        and not transport._writeDisconnected
        and data
    ):
        try:
            sent = transport.socket.send(data)
        except OSError:
            sent = 0
        if sent == len(data):
            return
        data = data[sent:]
    transport.write(data)


class Cork:
    """Gathers what a protocol writes while it handles one read and sends it in one call
    (pipelined requests get one send for all their replies); outside a read, writes go
    out at once through L{send_now}.

    A protocol routes C{dataReceived} through L{received} and its writes through
    L{write}.
    """

    __slots__ = ("_parts",)

    def __init__(self):
        self._parts = None

    def received(self, transport, handle, data):
        """Call C{handle(data)}, then send everything it wrote."""
        self._parts = parts = []
        try:
            handle(data)
        finally:
            self._parts = None
            if parts and transport is not None:
                send_now(transport, parts[0] if len(parts) == 1 else b"".join(parts))

    def write(self, transport, data):
        """Write C{data}: gathered during L{received}, else sent at once."""
        if self._parts is not None:
            self._parts.append(data)
        elif transport is not None:
            send_now(transport, data)

    def detach(self, transport):
        """Send what was gathered so far, and return a cork of the same kind that
        gathers nothing until its next L{received}: for a connection whose writes from
        now on must reach C{protocol.transport} as they are made (a fault rule changes
        them, L{mqserver.wiretap.tamper_output})."""
        self.flush(transport)
        return type(self)()

    def flush(self, transport):
        """Send what was gathered so far at once (e.g. the last clear-text reply
        before the connection starts TLS); gathering goes on."""
        parts = self._parts
        if parts:
            data = b"".join(parts)
            parts.clear()
            send_now(transport, data)


class WriteCork(Cork):
    """A L{Cork} that writes through C{transport.write} only, for a connection that
    started TLS in the middle (C{startTLS} keeps the transport's type, and
    L{send_now} would write clear text straight to its socket)."""

    __slots__ = ()

    def received(self, transport, handle, data):
        self._parts = parts = []
        try:
            handle(data)
        finally:
            self._parts = None
            if parts and transport is not None:
                transport.write(b"".join(parts))

    def write(self, transport, data):
        if self._parts is not None:
            self._parts.append(data)
        elif transport is not None:
            transport.write(data)
