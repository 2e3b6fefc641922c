"""How a connection's protocol writes: one L{Output} per connection.

Twisted's L{FileDescriptor.write} only buffers: the bytes go out when the reactor next
finds the socket writable, which costs two C{epoll_ctl} calls, one more C{epoll_wait} and
a whole reactor iteration per reply.  For request/reply protocols answering one small
request at a time that is most of the server's CPU.  L{Output} decides, for every write
of its connection, among three ways out:

  - corking: while the protocol handles one read (L{Output.received}) what it writes is
    gathered and leaves in one send when the read is handled (pipelined requests get one
    send for all their replies); so is what any connection writes while L{together}
    runs a function (a group commit answering every write its fsync covered);
  - a direct send (L{send_now}): a plain TCP connection with nothing queued ahead gets
    the bytes in this call, from the socket's C{send};
  - C{transport.write}: everything else, that is a connection with bytes queued, a
    transport that is not a plain TCP connection (C{ssl:} listeners, UNIX sockets, test
    transports, a fault rule's stand-in), and every connection running TLS: on one that
    started TLS in the middle (C{startTLS} keeps the transport's type) the socket carries
    TLS records, and only the transport may write to it.

Byte order on the connection is always the order the protocol wrote in. Where
Twisted's internals do not fit (L{mqserver.runtime.fastpath}) or the operator chose the
standard path (C{server.reactor: standard}), there is no direct send.
"""

import socket

from twisted.internet import tcp

__all__ = ["Output", "send_now", "no_delay", "together"]


def no_delay(transport):
    """Turn Nagle's algorithm off on a door's connection: TCP, and TLS over TCP (a UNIX
    socket has no such switch). Every door does, as the servers it stands in for do
    (Go's C{net} sets TCP_NODELAY on every connection, RocketMQ's Netty server on its
    channels): with Nagle an answer written while the one before is unacknowledged
    waits for the peer's delayed ACK, about 40 ms, which is what a pipelining client
    meets whenever two of its answers leave in different group commits."""
    if hasattr(transport, "setTcpNoDelay"):
        transport.setTcpNoDelay(True)


def enable(on):
    """Let L{send_now} write to sockets directly (C{on}), or make it plain
    C{transport.write} (Twisted's standard path; L{mqserver.runtime.fastpath.choose} decides)."""
    global _SUPPORTED
    _SUPPORTED = bool(on)


#: Attributes send_now reads on a TCP connection (tcp.Connection / FileDescriptor);
#: C{TLS} is what C{startTLS} sets on it (and its C{write} checks).
TRANSPORT_ATTRIBUTES = (
    "socket", "dataBuffer", "_tempDataBuffer", "connected", "disconnecting",
    "_writeDisconnected", "TLS",
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

#: The transports send_now writes to directly: an accepted TCP connection, and one the
#: broker made (a follower's connection to its master).
_TCP_TYPES = (getattr(tcp, "Server", None), getattr(tcp, "Client", None))


def send_now(transport, data):
    """Write C{data} to C{transport}, sending it in this call when the transport is a
    plain TCP connection (not running TLS) with nothing queued; whatever the socket does
    not take is queued with C{write}. On every other transport it is C{write}.

    Errors from the socket are left to Twisted: the unsent bytes are queued and the
    reactor sees the failure when it next writes, exactly as with C{write}.
    """
    if (
        _SUPPORTED
        and type(transport) in _TCP_TYPES
        and not transport.TLS
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


#: The Outputs holding writes while L{together} runs a function, else None.
_held = None


def together(f, *args):
    """Call C{f(*args)} and return its result; what it makes connections write outside
    their own reads is gathered per connection and leaves in one send each when it
    returns (or raises). A group commit answers every write its fsync covered this way:
    the Java client sends all its threads' requests on one connection, and their
    answers then leave in one send instead of one each. Nested calls gather into the
    outermost."""
    global _held
    if _held is not None:
        return f(*args)
    _held = held = []
    try:
        return f(*args)
    finally:
        _held = None
        for out in held:
            out.flush()
            out._parts = None


class Output:
    """Everything a connection's protocol writes goes through its L{Output} (see the
    module docstring): gathered while a read is handled, else sent at once.

    The protocol routes C{dataReceived} through L{received}, its writes through
    L{write} (or L{send}, for a stream that must see the transport's buffer fill), and
    starts TLS with L{start_tls}. It writes to C{protocol.transport} as it is at the
    time of the write (a fault rule may stand in for it, L{mqserver.wiretap}); nothing
    is written while that is None.
    """

    __slots__ = ("_protocol", "_parts")

    def __init__(self, protocol):
        """@param protocol: the connection's protocol, whose C{transport} it writes to."""
        self._protocol = protocol
        self._parts = None  # what this read wrote so far, while a read is handled

    def received(self, handle, data):
        """Call C{handle(data)}, then send everything it wrote, in one send."""
        if self._parts is not None:  # held by together (a read inside its function)
            self.flush()
        self._parts = parts = []
        try:
            handle(data)
        finally:
            self._parts = None
            if parts:
                transport = self._protocol.transport
                if transport is not None:
                    send_now(transport, parts[0] if len(parts) == 1 else b"".join(parts))

    def write(self, data):
        """Write C{data}: gathered during L{received}, else sent at once."""
        if self._parts is not None:
            self._parts.append(data)
        elif _held is not None:
            self._parts = [data]
            _held.append(self)
        else:
            # _send, inlined: this is every reply's path outside a read
            transport = self._protocol.transport
            if transport is not None:
                send_now(transport, data)

    def write_sequence(self, parts):
        """Write the bytes of C{parts} one after the other, as one L{write}."""
        if self._parts is not None:
            self._parts.extend(parts)
        elif _held is not None:
            self._parts = list(parts)
            _held.append(self)
        else:
            self._send(b"".join(parts))

    def send(self, data):
        """Send what was gathered so far, then C{data}, at once: for a stream whose
        next write depends on the transport's buffer (its producer pauses when the
        buffer fills)."""
        self.flush()
        self._send(data)

    def flush(self):
        """Send what was gathered so far at once; gathering goes on."""
        parts = self._parts
        if parts:
            data = b"".join(parts)
            parts.clear()
            self._send(data)

    def detach(self):
        """Send what was gathered so far, and gather nothing more until the next
        L{received}: for a connection whose writes from now on must reach
        C{protocol.transport} as they are made (a fault rule changes them,
        L{mqserver.wiretap.tamper_output})."""
        self.flush()
        self._parts = None

    def start_tls(self, options):
        """Start TLS with C{options} (an L{IOpenSSLServerConnectionCreator} or context
        factory): what was written so far goes out in the clear first, everything
        after through the TLS layer (L{send_now} never writes to the socket of a
        connection running TLS)."""
        self.flush()
        self._protocol.transport.startTLS(options)

    def _send(self, data):
        transport = self._protocol.transport
        if transport is not None:
            send_now(transport, data)
