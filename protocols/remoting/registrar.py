"""The broker's registration with its nameservers (REGISTER_BROKER every 30 s and when
topics change, UNREGISTER_BROKER at stop; as RocketMQ 4.9.4's BrokerOuterAPI).

With no C{rocketmq.namesrvAddr} configured, the broker registers in-process with the
nameserver embedded in the same process (if its door is on); otherwise it connects to
each listed nameserver (``host:port;host:port``) over TCP.
"""

import json

from twisted.internet import defer
from twisted.internet.protocol import Factory
from twisted.logger import Logger

from protocols.remoting import codes
from protocols.remoting.server import RemotingProtocol


class _Client(RemotingProtocol):
    """A connection to one nameserver (it never sends us requests)."""


def parse_addrs(text):
    """Return [(host, port)] from ``host:port;host:port``."""
    out = []
    for item in (text or "").replace(",", ";").split(";"):
        item = item.strip()
        if item:
            host, _, port = item.rpartition(":")
            out.append((host, int(port)))
    return out


class Registrar:
    """Keeps one broker registered with the nameservers."""

    log = Logger()

    def __init__(self, door, reactor, addrs, embedded_table):
        self.door = door
        self.reactor = reactor
        self.addrs = addrs
        self.embedded = embedded_table if not addrs else None
        self.clients = {}  # (host, port) -> _Client
        self._connecting = {}  # (host, port) -> Deferreds waiting for its first registration
        self._kick_call = None
        self._kicked = []  # Deferreds waiting for the kicked registration

    def register_body(self):
        wrapper = self.door.topic_config_wrapper()
        return wrapper, json.dumps(
            {"topicConfigSerializeWrapper": wrapper, "filterServerList": []}, separators=(",", ":")
        ).encode()

    def kick(self):
        """Register soon (topics changed); several kicks in one turn make one registration.

        @return: a Deferred firing (with None, never failing) once every nameserver
            answered that registration or failed to: a topic created through the admin
            is answered after the nameservers know it, as 4.9's broker does
            (C{registerIncrementBrokerData} waits for them), so a client that looks its
            route up next finds it.
        """
        d = defer.Deferred()
        self._kicked.append(d)
        if self._kick_call is None or not self._kick_call.active():
            self._kick_call = self.reactor.callLater(0, self._register_kicked)
        return d

    def _register_kicked(self):
        waiting, self._kicked = self._kicked, []
        self.register().addCallback(lambda _: _fire(waiting))

    def register(self):
        """Register with every nameserver now.

        @return: a Deferred firing (with None, never failing) once every nameserver
            answered or failed to (each failure is logged).
        """
        d = self.door
        if d.broker_addr is None:
            return defer.succeed(None)
        if self.embedded is not None:
            wrapper, _ = self.register_body()
            self.embedded.register_broker(
                d.cluster_name, d.broker_name, d.broker_addr, d.broker_id,
                wrapper["topicConfigTable"], wrapper["dataVersion"], d.broker_addr,
            )
            return defer.succeed(None)
        done = []
        for addr in self.addrs:
            client = self.clients.get(addr)
            if client is not None and not client.closed:
                done.append(self._send(client, addr))
            else:
                # a connection under way registers when it is up, with the table as
                # it is then (so including what changed meanwhile)
                waiter = defer.Deferred()
                if addr not in self._connecting:
                    self._connect(addr)
                self._connecting[addr].append(waiter)
                done.append(waiter)
        return defer.gatherResults(done).addCallback(lambda _: None)

    def _ext(self):
        d = self.door
        return {"brokerName": d.broker_name, "brokerAddr": d.broker_addr, "clusterName": d.cluster_name,
                "haServerAddr": d.broker_addr, "brokerId": d.broker_id, "compressed": "false", "bodyCrc32": 0}

    def _send(self, client, addr):
        """Send REGISTER_BROKER to C{client}; return a Deferred firing with None once it
        is answered or failed."""
        _, body = self.register_body()
        dd = client.request(codes.REGISTER_BROKER, self._ext(), body, timeout=10, reactor=self.reactor)

        def done(resp):
            if resp.code != codes.SUCCESS:
                self.log.warn("nameserver {addr} refused registration: {r}", addr=addr, r=resp.remark)

        def failed(f):
            self.log.warn("registering with nameserver {addr} failed: {e}", addr=addr, e=f.getErrorMessage())
            client.transport.loseConnection()

        return dd.addCallbacks(done, failed)

    def _connect(self, addr):
        # imported here: a broker whose nameserver runs in its own process never needs
        # twisted.internet.endpoints
        from twisted.internet import endpoints

        self._connecting[addr] = []
        ep = endpoints.TCP4ClientEndpoint(self.reactor, addr[0], addr[1], timeout=5)
        d = ep.connect(Factory.forProtocol(_Client))

        def connected(client):
            self.clients[addr] = client
            return self._send(client, addr)

        def failed(f):
            self.log.warn("cannot reach nameserver {addr}: {e}", addr=addr, e=f.getErrorMessage())

        d.addCallbacks(connected, failed)
        d.addCallback(lambda _: _fire(self._connecting.pop(addr, [])))

    def unregister(self):
        """Tell the nameservers this broker is going (best effort)."""
        d = self.door
        if self._kick_call is not None and self._kick_call.active():
            self._kick_call.cancel()
            _fire(self._kicked)  # no registration comes now: answer who waited for one
            self._kicked = []
        if d.broker_addr is None:
            return
        if self.embedded is not None:
            self.embedded.unregister_broker(d.cluster_name, d.broker_name, d.broker_addr, d.broker_id)
            return
        ext = {"brokerName": d.broker_name, "brokerAddr": d.broker_addr, "clusterName": d.cluster_name,
               "brokerId": d.broker_id}
        for client in self.clients.values():
            if not client.closed:
                client.send_oneway(codes.UNREGISTER_BROKER, ext)
                client.transport.loseConnection()
        self.clients = {}


def _fire(waiting):
    for w in waiting:
        w.callback(None)
