"""mqserver.runtime.output: the one object a connection's protocol writes through
(corking, direct sends, TLS), over StringTransport and a real TCP connection that
started TLS (tests/integration/test_output_tls.py runs TLS end to end through the
broker)."""

import socket

import pytest
from twisted.internet import protocol, ssl, tcp
from twisted.internet.testing import MemoryReactor, StringTransport

from mqserver.runtime import output
from mqserver.runtime.output import Output, send_now
from tests.support.tls import Certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return Certs(tmp_path_factory.mktemp("certs"))


def _server_options(certs):
    def pem(path):
        with open(path, "rb") as f:
            return f.read()

    return ssl.PrivateCertificate.loadPEM(pem(certs.cert) + pem(certs.key)).options()


class _Conn(protocol.Protocol):
    def __init__(self):
        self.output = Output(self)


def _string_conn():
    conn = _Conn()
    conn.makeConnection(StringTransport())
    return conn


def test_writes_during_a_read_leave_in_one_write_after_it():
    """What a read's handling writes is gathered and written once, in order, when the
    read is handled; outside a read each write goes out at once."""
    conn = _string_conn()
    writes = []
    conn.transport.write = lambda data: writes.append(data)

    def handle(data):
        conn.output.write(b"a")
        conn.output.write_sequence((b"b", data, b"c"))
        assert writes == []

    conn.output.received(handle, b"-")
    assert writes == [b"ab-c"]
    conn.output.write(b"d")
    conn.output.write_sequence((b"e", b"f"))
    assert writes == [b"ab-c", b"d", b"ef"]


def test_send_and_flush_keep_the_order_of_the_writes():
    """send() writes what was gathered first, then its bytes, at once; after detach()
    writes go out as they are made until the read ends."""
    conn = _string_conn()

    def handle(data):
        conn.output.write(b"1")
        conn.output.send(b"2")
        assert conn.transport.value() == b"12"
        conn.output.write(b"3")
        conn.output.detach()
        assert conn.transport.value() == b"123"
        conn.output.write(b"4")
        assert conn.transport.value() == b"1234"

    conn.output.received(handle, b"")
    assert conn.transport.value() == b"1234"


def test_nothing_is_written_without_a_transport():
    """A protocol that lost its transport (None) writes nothing, and does not fail."""
    conn = _Conn()
    conn.output.write(b"x")
    conn.output.received(lambda data: conn.output.write(data), b"y")


def _tls_server_connection(certs):
    """A real TCP server connection (over a socket pair, never started on a running
    reactor) that has started TLS, and the peer's end of the socket pair."""
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    peer.setblocking(False)
    proto = _Conn()

    class Port:
        _realPortNumber = 1

    conn = tcp.Server(ours, proto, ("127.0.0.1", 2), Port(), 1, MemoryReactor())
    proto.makeConnection(conn)
    conn.startTLS(_server_options(certs))
    return proto, peer


@pytest.mark.parametrize("write", [
    lambda proto, data: send_now(proto.transport, data),
    lambda proto, data: proto.output.write(data),
    lambda proto, data: proto.output.send(data),
    lambda proto, data: proto.output.received(proto.output.write, data),
], ids=["send_now", "write", "send", "received"])
def test_no_direct_send_on_a_connection_running_tls(certs, write):
    """On a TCP connection that started TLS (its type is still tcp.Server) no way of
    writing sends to the socket: the bytes go to the TLS layer, and the peer, which has
    not even begun the handshake, gets nothing (a direct send put them on the socket in
    the clear)."""
    output.enable(True)  # the direct path is on, as on the spinning reactor
    proto, peer = _tls_server_connection(certs)
    try:
        assert type(proto.transport) is tcp.Server and proto.transport.TLS
        write(proto, b"secret in the clear")
        with pytest.raises(BlockingIOError):
            got = peer.recv(100)
            pytest.fail(f"the socket carried {got!r}")
    finally:
        proto.transport.socket.close()
        peer.close()


@pytest.fixture(autouse=True)
def restore_direct_sends():
    before = output._SUPPORTED
    yield
    output.enable(before)


def _counting_conn():
    conn = _string_conn()
    conn.writes = []
    conn.transport.write = conn.writes.append
    return conn


def test_together_gathers_each_connections_writes_into_one_write():
    """What connections write outside their reads while together() runs a function
    leaves when it returns, one write per connection with its bytes in order; the
    function's result comes back, and nested calls gather into the outermost."""
    a, b = _counting_conn(), _counting_conn()

    def answer():
        a.output.write(b"1")
        b.output.write(b"x")
        output.together(lambda: (a.output.write_sequence((b"2", b"3")), b.output.write(b"y")))
        a.output.write(b"4")
        assert a.writes == [] and b.writes == []
        return "done"

    assert output.together(answer) == "done"
    assert a.writes == [b"1234"] and b.writes == [b"xy"]
    a.output.write(b"5")
    assert a.writes == [b"1234", b"5"], "after together() each write goes out at once"


def test_together_sends_what_it_gathered_when_the_function_raises():
    a = _counting_conn()

    def fail():
        a.output.write(b"answer")
        raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        output.together(fail)
    assert a.writes == [b"answer"]
    a.output.write(b"next")
    assert a.writes == [b"answer", b"next"]


def test_a_read_inside_together_keeps_the_order_of_the_writes():
    """A connection that held writes for together() and then handles a read sends the
    held bytes before the read's; detach() sends at once what was held."""
    a, b = _counting_conn(), _counting_conn()

    def run():
        a.output.write(b"held")
        a.output.received(lambda data: a.output.write(data), b"read")
        a.output.write(b"after")
        b.output.write(b"b1")
        b.output.detach()
        assert b.writes == [b"b1"]
        b.output.write(b"b2")

    output.together(run)
    assert a.writes == [b"held", b"read", b"after"]
    assert b.writes == [b"b1", b"b2"]
