"""How a benchmark client waits for a reply: block in recv(), or poll briefly first.

A client that sleeps in recv() after each request pays for a wake-up on every reply. On
the project VM (2 vCPUs) that wake-up, an inter-processor interrupt and a VM exit, costs
about 50-65 µs, more than the broker's own work per request, so one-request-at-a-time
figures measure the client's sleep as much as the broker. The reference figures (the Go
smss server, nsqd) come from Go clients, whose runtime polls the network before it parks
a thread and so rarely pays that cost.

L{Waiter} wraps a connected socket and offers both:

- C{poll_us=0} (the benchmarks' default): the socket's own blocking C{recv},
  C{recv_into}, C{sendall} and C{settimeout}, unchanged and without extra overhead;
- C{poll_us>0}: the socket is kept non-blocking; a receive retries for up to C{poll_us}
  microseconds from the start of the wait, yielding the CPU between tries, then sleeps in
  poll() until data comes. The socket's timeout still bounds the whole wait and raises
  C{socket.timeout} (C{TimeoutError}) as a blocking socket's would.
"""

import os
import select
import socket
import time

_clock = time.perf_counter


def describe(poll_us):
    """One line saying how the clients wait for replies, for a benchmark's header."""
    if poll_us:
        return f"clients: poll {poll_us} µs before blocking (--client-poll {poll_us})"
    return "clients: blocking recv (--client-poll 0)"


def add_argument(parser):
    """Add the benchmarks' common C{--client-poll US} option to an argparse parser."""

    def microseconds(text):
        value = int(text)
        if value < 0:
            raise ValueError(text)
        return value

    parser.add_argument(
        "--client-poll", type=microseconds, default=0, metavar="US",
        help="clients poll a non-blocking socket for up to US microseconds before they "
             "sleep waiting for a reply, like Go clients (default 0: block in recv)")


class Waiter:
    """A connected socket's send and receive calls, optionally polling before sleeping.

    Use the Waiter instead of the socket once it is made (C{settimeout} included: in
    poll mode the socket itself must stay non-blocking).
    """

    def __init__(self, sock, poll_us=0):
        self.sock = sock
        self.poll_s = poll_us / 1e6
        if not poll_us:
            # The socket's own bound methods: the default mode is exactly a blocking
            # client, with no extra Python call per request.
            self.recv = sock.recv
            self.recv_into = sock.recv_into
            self.sendall = sock.sendall
            self.settimeout = sock.settimeout
            return
        self.timeout = sock.gettimeout()
        sock.setblocking(False)
        self._poller = select.poll()

    def settimeout(self, timeout):
        """Bound each later receive or send (None: wait for ever), as socket.settimeout."""
        self.timeout = timeout

    def recv(self, bufsize):
        """Like C{socket.recv}."""
        return self._receive(self.sock.recv, bufsize)

    def recv_into(self, buffer):
        """Like C{socket.recv_into}: the count of bytes received, 0 when the peer closed."""
        return self._receive(self.sock.recv_into, buffer)

    def _receive(self, op, arg):
        try:
            return op(arg)
        except BlockingIOError:
            pass
        start = _clock()
        deadline = None if self.timeout is None else start + self.timeout
        spin_until = start + self.poll_s
        if deadline is not None and deadline < spin_until:
            spin_until = deadline
        while _clock() < spin_until:
            # Let a runnable process (the server, on a busy machine) have this CPU.
            os.sched_yield()
            try:
                return op(arg)
            except BlockingIOError:
                pass
        while True:
            self._wait(select.POLLIN, deadline)
            try:
                return op(arg)
            except BlockingIOError:  # a spurious wake-up: wait again
                pass

    def sendall(self, data):
        """Like C{socket.sendall}: send all of C{data}, waiting while the send buffer is
        full; the timeout bounds the whole call, as it does for a blocking socket."""
        view = memoryview(data).cast("B")
        deadline = None
        sent = 0
        while sent < len(view):
            try:
                sent += self.sock.send(view[sent:])
            except BlockingIOError:
                if deadline is None and self.timeout is not None:
                    deadline = _clock() + self.timeout
                self._wait(select.POLLOUT, deadline)

    def close(self):
        """Close the socket."""
        self.sock.close()

    def _wait(self, events, deadline):
        """Sleep until the socket is ready for C{events} or the deadline has passed."""
        self._poller.register(self.sock, events)
        if deadline is None:
            ready = self._poller.poll()
        else:
            left = deadline - _clock()
            ready = self._poller.poll(left * 1000) if left > 0 else []
        if not ready:
            raise socket.timeout("timed out")
