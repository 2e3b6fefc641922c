"""Every door that speaks over a TCP stream turns Nagle's algorithm off on its
connections, as the servers it stands in for do (Go's net package sets TCP_NODELAY on
every connection: smss, nsqd, nsqlookupd; the 4.9.4 RocketMQ broker and name server set
it on their Netty channels). With Nagle on, an answer written while the one before is
unacknowledged waits for the client's delayed ACK: two pipelined sends at flush level 2
took about 44 ms a pair on the RocketMQ and console doors (bench/pipelined.py)."""

import pytest
from twisted.internet.testing import StringTransportWithDisconnection

from protocols.console.factory import make_factory as console_factory
from protocols.nsq.factory import make_factory as nsqd_factory
from protocols.nsq.lookupd import make_factory as lookupd_factory
from protocols.remoting.broker_door import make_factory as broker_factory
from protocols.remoting.namesrv_door import make_factory as namesrv_factory
from protocols.smss.factory import make_factory as smss_factory
from tests.support.inprocess import running

DOORS = {"smss": smss_factory, "nsqd_tcp": nsqd_factory, "lookupd_tcp": lookupd_factory,
         "broker": broker_factory, "namesrv": namesrv_factory, "console": console_factory}


class TcpTransport(StringTransportWithDisconnection):
    """A transport with a TCP socket's Nagle switch (L{ITCPTransport}'s), on at first as
    on a new socket."""

    nodelay = False

    def setTcpNoDelay(self, enabled):
        self.nodelay = bool(enabled)

    def getTcpNoDelay(self):
        return self.nodelay


@pytest.mark.parametrize("door", sorted(DOORS))
def test_a_tcp_connection_answers_without_nagle(door, tmp_path):
    with running(tmp_path / "data", DOORS[door]) as node:
        c = node.connect(node.factory, transport=TcpTransport)
        assert c.transport.getTcpNoDelay() is True
        c.lose()
        # a transport without the switch (a UNIX socket's) is served as before
        c = node.connect(node.factory)
        assert c.connected
        c.lose()
