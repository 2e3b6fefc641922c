"""The broker's registration with its nameservers (REGISTER_BROKER every 30 s and when
topics change, UNREGISTER_BROKER at stop; spec 3.2, 3.3).

With no C{rocketmq.namesrvAddr} configured, the broker registers in-process with the
nameserver embedded in the same process (if its door is on); otherwise it connects to
each listed nameserver (``host:port;host:port``) over TCP.
"""

import json

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
        self._connecting = set()
        self._kick_call = None

    def register_body(self):
        wrapper = self.door.topic_config_wrapper()
        return wrapper, json.dumps(
            {"topicConfigSerializeWrapper": wrapper, "filterServerList": []}, separators=(",", ":")
        ).encode()

    def kick(self):
        """Register soon (topics changed); several kicks in one turn make one registration."""
        if self._kick_call is None or not self._kick_call.active():
            self._kick_call = self.reactor.callLater(0, self.register)

    def register(self):
        """Register with every nameserver now."""
        d = self.door
        if d.broker_addr is None:
            return
        wrapper, body = self.register_body()
        if self.embedded is not None:
            self.embedded.register_broker(
                d.cluster_name, d.broker_name, d.broker_addr, d.broker_id,
                wrapper["topicConfigTable"], wrapper["dataVersion"], d.broker_addr,
            )
            return
        ext = {"brokerName": d.broker_name, "brokerAddr": d.broker_addr, "clusterName": d.cluster_name,
               "haServerAddr": d.broker_addr, "brokerId": d.broker_id, "compressed": "false", "bodyCrc32": 0}
        for addr in self.addrs:
            client = self.clients.get(addr)
            if client is not None and not client.closed:
                self._send(client, addr, ext, body)
            elif addr not in self._connecting:
                self._connect(addr, ext, body)

    def _send(self, client, addr, ext, body):
        dd = client.request(codes.REGISTER_BROKER, ext, body, timeout=10, reactor=self.reactor)

        def done(resp):
            if resp.code != codes.SUCCESS:
                self.log.warn("nameserver {addr} refused registration: {r}", addr=addr, r=resp.remark)

        def failed(f):
            self.log.warn("registering with nameserver {addr} failed: {e}", addr=addr, e=f.getErrorMessage())
            client.transport.loseConnection()

        dd.addCallbacks(done, failed)

    def _connect(self, addr, ext, body):
        # imported here: twisted.internet.endpoints loads the TLS stack (about 12 MB),
        # which a broker whose nameserver runs in its own process never needs
        from twisted.internet import endpoints

        self._connecting.add(addr)
        ep = endpoints.TCP4ClientEndpoint(self.reactor, addr[0], addr[1], timeout=5)
        d = ep.connect(Factory.forProtocol(_Client))

        def connected(client):
            self._connecting.discard(addr)
            self.clients[addr] = client
            self._send(client, addr, ext, body)

        def failed(f):
            self._connecting.discard(addr)
            self.log.warn("cannot reach nameserver {addr}: {e}", addr=addr, e=f.getErrorMessage())

        d.addCallbacks(connected, failed)

    def unregister(self):
        """Tell the nameservers this broker is going (best effort)."""
        d = self.door
        if self._kick_call is not None and self._kick_call.active():
            self._kick_call.cancel()
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
