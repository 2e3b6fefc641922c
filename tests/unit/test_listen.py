"""mqserver.listen: plain tcp: descriptions parsed without twisted.internet.endpoints, the
same way Twisted's serverFromString reads them; everything else goes to Twisted."""

import socket

import pytest
import pytest_twisted
from twisted.internet import endpoints, protocol, reactor

from mqserver.listen import PlainTCPServerEndpoint, check_description, server_endpoint

PLAIN = [
    "tcp:0", "tcp:4150", "tcp:port=4150", "tcp:12301:interface=127.0.0.1",
    "tcp:12301:backlog=7", "tcp:12301:backlog=7:interface=0.0.0.0",
    "tcp:80:interface=",
]
TWISTED = [  # left to Twisted's parser: escapes, other kinds, odd spellings
    "tcp:80:interface=\\:\\:1", "unix:/tmp/x.sock", "TCP:80", "tcp: 80",
    "tcp:80:interface=a:interface=b", "tcp:interface=127.0.0.1:80", "tcp:port=9:interface=::1",
]
INVALID = ["tcp:x", "tcp:80:colour=red", "tcp:80:backlog=many", "tcp:port=1:2", "nosuchkind:80"]


@pytest.mark.parametrize("description", PLAIN)
def test_plain_tcp_read_as_twisted_reads_it(description):
    ours = server_endpoint(reactor, description)
    theirs = endpoints.serverFromString(reactor, description)
    assert isinstance(ours, PlainTCPServerEndpoint)
    assert (ours._port, ours._interface, ours._backlog) == (
        theirs._port, theirs._interface, theirs._backlog)


@pytest.mark.parametrize("description", TWISTED)
def test_anything_else_goes_to_twisted(description):
    try:
        ep = server_endpoint(reactor, description)
    except Exception as e:
        with pytest.raises(type(e)):
            endpoints.serverFromString(reactor, description)
    else:
        assert not isinstance(ep, PlainTCPServerEndpoint)
        assert type(ep) is type(endpoints.serverFromString(reactor, description))


@pytest.mark.parametrize("description", INVALID)
def test_invalid_descriptions_refused_like_twisted(description):
    with pytest.raises(Exception) as ours:
        check_description(description)
    with pytest.raises(Exception) as theirs:
        endpoints.serverFromString(None, description)
    assert type(ours.value) is type(theirs.value)


@pytest_twisted.inlineCallbacks
def test_plain_endpoint_listens_on_a_real_socket():
    port = yield server_endpoint(reactor, "tcp:0:interface=127.0.0.1:backlog=5").listen(
        protocol.Factory.forProtocol(protocol.Protocol))
    try:
        host = port.getHost()
        assert host.host == "127.0.0.1" and host.port > 0
        with socket.create_connection(("127.0.0.1", host.port), timeout=5):
            pass
    finally:
        yield port.stopListening()


def test_probe_bind_finds_what_the_listener_would_hit():
    """tcp: and ssl: descriptions are probed (port in use, address this host lacks);
    other kinds are left to their listener."""
    import errno
    import socket

    import pytest

    from mqserver.listen import probe_bind

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        for desc in (f"tcp:{port}:interface=127.0.0.1",
                     f"ssl:port={port}:privateKey=a\\:b.pem:interface=127.0.0.1"):
            with pytest.raises(OSError) as e:
                probe_bind(desc)
            assert e.value.errno == errno.EADDRINUSE
    with pytest.raises(OSError):
        probe_bind("tcp:0:interface=192.0.2.1")
    probe_bind("tcp:0:interface=127.0.0.1")
    probe_bind("unix:/nonexistent/dir/sock")  # not probed
