"""The NSQ node: what nsqd's TCP, HTTP and lookupd doors of one broker share.

One L{NsqNode} per broker, kept in C{broker.extensions["nsq"]} and made by the first
door that asks (L{get_node}). It holds the negotiated server settings, the connected
clients (for /stats), the ports the doors ended up on, topic auto-creation, and the
embedded lookupd registry that describes this node.
"""

import socket

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqserver.cluster.lookupd import LookupRegistry
from mqserver.errors import StartupError, TopicExists

from protocols.nsq.auth import AuthClient
from protocols.nsq.codec import is_valid_name
from protocols.nsq.identify import ServerSettings
from protocols.nsq.lookupd_client import LookupdClients
from protocols.nsq.version import VERSION


def tls_options(cert, key):
    """Return the server TLS options of PEM files C{cert} (with its chain) and C{key},
    or None when they are not set."""
    if not cert:
        return None
    from twisted.internet import ssl

    try:
        with open(key, "rb") as k, open(cert, "rb") as c:
            return ssl.PrivateCertificate.loadPEM(k.read() + b"\n" + c.read()).options()
    except Exception as e:  # the file system's, pyOpenSSL's or Twisted's own error
        raise StartupError(f"config keys 'nsq.tlsCert' ({cert}) and 'nsq.tlsKey' ({key}):"
                           f" cannot load the certificate and key ({type(e).__name__}: {e})") from None


class NsqNode:
    """Shared NSQ state of one broker.

    @ivar server: the L{ServerSettings} IDENTIFY negotiates against.
    @ivar clients: connected V2 protocol instances.
    @ivar tcp_port: the nsqd TCP port once known (-1 before).
    @ivar http_port: the nsqd HTTP port once known (-1 before).
    @ivar lookupd: the embedded L{LookupRegistry} (this node is always its producer).
    """

    log = Logger()

    def __init__(self, broker, config, reactor):
        self.broker = broker
        self.reactor = reactor
        self.config = config
        self.tls_options = tls_options(config["nsq.tlsCert"], config["nsq.tlsKey"])
        self.tls_required = config["nsq.tlsRequired"]
        self.http_tls = False  # the nsqd HTTP door listens on ssl: (set by its factory)
        addresses = config["nsq.authHttpAddresses"]
        self.auth = AuthClient(addresses, reactor) if addresses else None
        self.server = ServerSettings(
            version=VERSION,
            max_rdy_count=config["nsq.maxRdyCount"],
            msg_timeout_ms=config["nsq.msgTimeout"],
            max_msg_timeout_ms=config["nsq.maxMsgTimeout"],
            max_heartbeat_interval_ms=config["nsq.maxHeartbeatInterval"],
            max_output_buffer_size=config["nsq.maxOutputBufferSize"],
            output_buffer_timeout_ms=config["nsq.outputBufferTimeout"],
            min_output_buffer_timeout_ms=config["nsq.minOutputBufferTimeout"],
            max_output_buffer_timeout_ms=config["nsq.maxOutputBufferTimeout"],
            deflate_enabled=config["nsq.deflate"],
            max_deflate_level=config["nsq.maxDeflateLevel"],
            snappy_enabled=config["nsq.snappy"],
            tls_available=self.tls_options is not None,
            auth_required=self.auth is not None,
        )
        self.max_msg_size = config["nsq.maxMsgSize"]
        self.max_body_size = config["nsq.maxBodySize"]
        self.max_req_timeout_ms = config["nsq.maxReqTimeout"]
        self.max_channel_consumers = config["nsq.maxChannelConsumers"]
        self.broadcast_address = config["nsq.broadcastAddress"]
        self.hostname = socket.gethostname()
        self.start_time = int(reactor.seconds())
        self.clients = set()
        self.tcp_port = -1
        self.http_port = -1
        self._creating = {}
        self.lookupd = LookupRegistry(clock=reactor.seconds)
        self.lookupd.local_source = self._local_registrations
        broker.channels.observers.append(self.lookupd)
        self.lookupd_clients = []
        broker.add_role_listener(self._role_changed)

    # -- topics --------------------------------------------------------------------------

    def ensure_topic(self, name):
        """Return a Deferred firing once topic C{name} exists (created with 1 queue)."""
        if self.broker.topic(name) is not None:
            return defer.succeed(None)
        d = defer.Deferred()
        waiters = self._creating.get(name)
        if waiters is not None:
            waiters.append(d)
            return d
        self._creating[name] = [d]

        def done(result):
            ok = not isinstance(result, Failure) or result.check(TopicExists)
            if not isinstance(result, Failure):
                self.broker.channels.note_ephemeral_topic(name)
            for w in self._creating.pop(name, []):
                if ok:
                    w.callback(None)
                else:
                    w.errback(result)

        self.broker.create_topic(name).addBoth(done)
        return d

    def topic_names(self):
        """Every valid topic of the broker, sorted by name."""
        now = self.broker.now_ms()
        return [t.name for t in self.broker.topics() if t.valid(now)]

    # -- lookupd -------------------------------------------------------------------------

    def peer_info(self):
        """This node as lookupd describes a producer."""
        return {
            "remote_address": f"{self.broadcast_address}:{self.tcp_port}",
            "hostname": self.hostname,
            "broadcast_address": self.broadcast_address,
            "tcp_port": self.tcp_port,
            "http_port": self.http_port,
            "version": VERSION,
        }

    def registrations(self):
        """topic -> sorted channel names, as this node registers them with lookupds:
        only names NSQ can carry (a RocketMQ C{%RETRY%group} topic is a broker topic
        that lookupd would refuse with E_BAD_TOPIC). A follower registers nothing: it
        refuses publishes, and consumers that look topics up must reach the master."""
        if not self.broker.is_master:
            return {}
        chans = self.broker.channels
        return {t: sorted(c for c in chans.of(t) if is_valid_name(c))
                for t in self.topic_names() if is_valid_name(t)}

    def tcp_started(self):
        """The TCP door is listening: register with the configured lookupds."""
        addresses = self.config["nsq.lookupdTcpAddresses"]
        if addresses and not self.lookupd_clients:
            clients = LookupdClients(self, addresses)
            self.lookupd_clients.append(clients)
            self.broker.channels.observers.append(clients)
            clients.start()

    def _role_changed(self, is_master):
        # tell the lookupds at once, not at their next resync: producers and consumers
        # move to (or off) this node as soon as they look the topic up again
        for clients in self.lookupd_clients:
            clients.resync()

    def _local_registrations(self):
        if self.tcp_port < 0:
            return None
        return self.peer_info(), self.registrations()


def get_node(broker, config, reactor):
    """Return the broker's L{NsqNode}, creating it on first use."""
    node = broker.extensions.get("nsq")
    if node is None:
        node = broker.extensions["nsq"] = NsqNode(broker, config, reactor)
    return node

