"""mqserver's side of nsqlookupd: register this node's topics and channels with every
lookupd in ``nsq.lookupdTcpAddresses`` (as nsqd does): magic + IDENTIFY, REGISTER for
each topic and channel, REGISTER/UNREGISTER on changes, PING every 15 s, reconnect.
"""

import json
from collections import deque

from twisted.internet import protocol
from twisted.logger import Logger

from protocols.nsq.version import VERSION
from protocols.nsq.wire import U32

PING_INTERVAL = 15.0
#: Topics are not announced by the broker, so the registration list is refreshed this often.
RESYNC_INTERVAL = 1.0


class _LookupdPeer(protocol.Protocol):
    """One connection to one lookupd; replies are read and ignored (except to log errors)."""

    log = Logger()

    def __init__(self, owner):
        self.owner = owner
        self.sent = set()
        self._buf = b""
        self._asked = deque()  # what each reply to come answers: a (topic, channel) or None

    def connectionMade(self):
        node = self.owner.node
        body = json.dumps({"broadcast_address": node.broadcast_address,
                           "hostname": node.hostname, "tcp_port": node.tcp_port,
                           "http_port": node.http_port, "version": VERSION}).encode()
        self.transport.write(b"  V1IDENTIFY\n" + U32.pack(len(body)) + body)
        self._asked.append(None)
        self.owner.connected(self)
        self.sync()

    def dataReceived(self, data):
        self._buf += data
        while len(self._buf) >= 4:
            (n,) = U32.unpack_from(self._buf, 0)
            if len(self._buf) < 4 + n:
                return
            reply, self._buf = self._buf[4:4 + n], self._buf[4 + n:]
            asked = self._asked.popleft() if self._asked else None
            if reply.startswith(b"E_"):
                if asked is not None:
                    # never ask again: one refused name must not stop the others
                    self.owner.refuse(asked, reply)
                else:
                    self.log.warn("lookupd error: {reply}", reply=reply.decode("latin-1"))

    def sync(self):
        """Send REGISTER/UNREGISTER so the lookupd holds exactly our registrations."""
        want = set()
        for topic, channels in self.owner.node.registrations().items():
            want.add((topic, ""))
            want.update((topic, c) for c in channels)
        want -= self.owner.refused
        lines = []
        for topic, channel in sorted(want - self.sent):
            lines.append(f"REGISTER {topic} {channel}".rstrip() + "\n")
            self._asked.append((topic, channel))
        for topic, channel in sorted(self.sent - want, key=lambda k: (k[0], k[1] == "")):
            lines.append(f"UNREGISTER {topic} {channel}".rstrip() + "\n")
            self._asked.append(None)
        self.sent = want
        if lines:
            self.transport.write("".join(lines).encode())

    def ping(self):
        self.transport.write(b"PING\n")
        self._asked.append(None)

    def connectionLost(self, reason):
        self.owner.disconnected(self)


class _PeerFactory(protocol.ReconnectingClientFactory):
    noisy = False
    maxDelay = 5.0

    def __init__(self, owner):
        self.owner = owner

    def buildProtocol(self, addr):
        self.resetDelay()
        return _LookupdPeer(self.owner)


class LookupdClients:
    """Keeps every configured lookupd told about this node (a channel-registry observer)."""

    log = Logger()

    def __init__(self, node, addresses):
        self.node = node
        self.addresses = list(addresses)
        self.peers = set()
        self.refused = set()  # (topic, channel) a lookupd refused: not registered again
        self.factories = []
        self._call = None
        self._last_ping = 0.0

    def start(self):
        reactor = self.node.reactor
        for addr in self.addresses:
            host, _, port = addr.rpartition(":")
            f = _PeerFactory(self)
            self.factories.append(f)
            reactor.connectTCP(host or "127.0.0.1", int(port), f)
        self._call = reactor.callLater(RESYNC_INTERVAL, self._tick)

    def _tick(self):
        now = self.node.reactor.seconds()
        for p in list(self.peers):
            p.sync()
            if now - self._last_ping >= PING_INTERVAL:
                p.ping()
        if now - self._last_ping >= PING_INTERVAL:
            self._last_ping = now
        self._call = self.node.reactor.callLater(RESYNC_INTERVAL, self._tick)

    def resync(self):
        """Bring every connected lookupd up to this node's registrations now."""
        for p in list(self.peers):
            p.sync()

    def connected(self, peer):
        self.peers.add(peer)

    def refuse(self, registration, reply):
        """A lookupd refused C{registration} (topic, channel): log it once, skip it from
        now on (the lookupd closes the connection; the next one registers the rest)."""
        if registration not in self.refused:
            self.refused.add(registration)
            topic, channel = registration
            self.log.warn("lookupd refused {what}: {reply}; not registering it again",
                          what=f"{topic} {channel}".strip(), reply=reply.decode("latin-1"))

    def disconnected(self, peer):
        self.peers.discard(peer)

    # channel-registry observer: tell the lookupds right away

    def channel_added(self, topic, name):
        self.resync()

    channel_removed = channel_added
