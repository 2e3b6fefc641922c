"""nsqlookupd's TCP protocol (V1, ``listen.lookupd_tcp``): nsqd nodes IDENTIFY, REGISTER,
UNREGISTER and PING. Replies are ``<u32 size><data>`` with no frame type; errors are
replies starting with ``E_`` and fatal ones close the socket.
"""

import itertools
import json

from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger

from mqserver.idle import IdleWatch
from mqserver.runtime.output import Output, no_delay

from protocols.nsq.codec import DEFAULT_MAX_LINE, is_valid_name
from protocols.nsq.version import VERSION
from protocols.nsq.wire import U32

_ids = itertools.count(1)
#: Largest IDENTIFY body: an nsqd's JSON is a few hundred bytes.
MAX_IDENTIFY_BODY = 1 << 20


def v1_reply(data):
    """A lookupd V1 reply frame."""
    return U32.pack(len(data)) + data


class LookupdProtocol(IdleWatch, Protocol):
    """One nsqd (producer) connected to the lookupd.

    Closed after the factory's C{idle_timeout} seconds with nothing received (nsqd PINGs
    every 15 s). A line longer than nsqd's 16 KiB or an IDENTIFY body over 1 MiB is fatal,
    so nothing a peer sends is buffered without bound.
    """

    log = Logger()

    def __init__(self, factory):
        self.factory = factory
        self.registry = factory.registry
        self.peer_id = f"peer{next(_ids)}"
        self.identified = False
        self._buf = b""
        self._magic = False
        self._dead = False
        self.output = Output(self)

    def connectionMade(self):
        no_delay(self.transport)  # as nsqlookupd's (Go's net sets TCP_NODELAY)
        self.watch_idle(self.factory.idle_timeout, self.factory.reactor)

    def idle_expired(self):
        self.log.info("closing idle lookupd connection {peer}: nothing received for {timeout} s",
                      peer=self.peer_id, timeout=self.factory.idle_timeout)
        self.transport.loseConnection()

    def dataReceived(self, data):
        if self._dead:
            return
        self.active = True
        self._buf += data
        if not self._magic:
            if len(self._buf) < 4:
                return
            if self._buf[:4] != b"  V1":
                return self._fatal(b"E_BAD_PROTOCOL")
            self._magic = True
            self._buf = self._buf[4:]
        buf, pos = self._buf, 0
        try:
            while not self._dead:
                nl = buf.find(b"\n", pos, pos + DEFAULT_MAX_LINE)
                if nl < 0:
                    if len(buf) - pos >= DEFAULT_MAX_LINE:
                        self._fatal(b"E_INVALID line too long")
                    return
                params = buf[pos:nl].strip().split(b" ")
                if params[0] == b"IDENTIFY":
                    if len(buf) < nl + 5:
                        return
                    (n,) = U32.unpack_from(buf, nl + 1)
                    if n > MAX_IDENTIFY_BODY:
                        self._fatal(b"E_BAD_BODY IDENTIFY body too big")
                        return
                    if len(buf) < nl + 5 + n:
                        return
                    pos = nl + 5 + n
                    self._identify(buf[nl + 5:pos])
                    continue
                pos = nl + 1
                self._command(params)
        finally:
            # one slice per read, not one per command
            self._buf = b"" if self._dead else buf[pos:]

    def _fatal(self, data):
        self._dead = True
        self.output.write(v1_reply(data))
        self.transport.loseConnection()

    def _identify(self, body):
        if self.identified:
            return self._fatal(b"E_INVALID cannot IDENTIFY again")
        try:
            info = json.loads(body)
        except (ValueError, RecursionError):
            return self._fatal(b"E_BAD_BODY IDENTIFY failed to decode JSON body")
        need = ("broadcast_address", "tcp_port", "http_port", "version")
        if not isinstance(info, dict) or not all(info.get(k) for k in need):
            return self._fatal(b"E_BAD_BODY IDENTIFY missing fields")
        peer = self.transport.getPeer()
        self.registry.identify(self.peer_id, {
            "remote_address": f"{peer.host}:{peer.port}",
            "hostname": info.get("hostname", ""),
            "broadcast_address": info["broadcast_address"],
            "tcp_port": info["tcp_port"], "http_port": info["http_port"],
            "version": info["version"],
        })
        self.identified = True
        f = self.factory
        self.output.write(v1_reply(json.dumps({
            "broadcast_address": f.broadcast_address, "hostname": f.hostname,
            "http_port": f.http_port, "tcp_port": f.tcp_port, "version": VERSION,
        }, separators=(",", ":")).encode()))

    def _command(self, params):
        verb = params[0]
        if verb == b"PING":
            if self.identified:
                self.registry.ping(self.peer_id)
            self.output.write(v1_reply(b"OK"))
            return
        if verb not in (b"REGISTER", b"UNREGISTER"):
            return self._fatal(b"E_INVALID invalid command " + verb)
        if not self.identified:
            return self._fatal(b"E_INVALID client must IDENTIFY")
        if len(params) < 2:
            return self._fatal(b"E_INVALID " + verb + b" insufficient number of params")
        topic = params[1]
        channel = params[2] if len(params) > 2 else b""
        if not is_valid_name(topic):
            return self._fatal(b"E_BAD_TOPIC " + verb + b" topic name '" + topic + b"' is not valid")
        if channel and not is_valid_name(channel):
            return self._fatal(b"E_BAD_CHANNEL " + verb + b" channel name '" + channel
                               + b"' is not valid")
        t, c = topic.decode(), channel.decode() or None
        if verb == b"REGISTER":
            self.registry.register(self.peer_id, t, c)
        else:
            self.registry.unregister(self.peer_id, t, c)
        self.output.write(v1_reply(b"OK"))

    def connectionLost(self, reason):
        self.stop_idle_watch()
        self._buf = b""
        self.registry.drop_peer(self.peer_id)


class LookupdFactory(Factory):
    """The lookupd TCP factory over a registry (the embedded node's or a standalone one)."""

    noisy = False

    def __init__(self, registry, reactor, broadcast_address="127.0.0.1", hostname="", idle_timeout=60.0):
        self.registry = registry
        self.reactor = reactor
        self.idle_timeout = idle_timeout
        self.broadcast_address = broadcast_address
        self.hostname = hostname
        self.tcp_port = -1
        self.http_port = -1
        self.ports = None  # shared object also told the HTTP port

    def buildProtocol(self, addr):
        return LookupdProtocol(self)

    def listening(self, port):
        """The listener is bound (called by the broker's service tree)."""
        self.tcp_port = port.getHost().port


def make_factory(broker, config, reactor):
    """The embedded lookupd's TCP door: its registry is the broker's NSQ node's."""
    from protocols.nsq.node import get_node

    node = get_node(broker, config, reactor)
    f = LookupdFactory(node.lookupd, reactor, node.broadcast_address, node.hostname,
                       config["nsq.lookupdIdleTimeout"] / 1000.0)
    node.lookupd_tcp = f
    return f
