"""The smss server factory: the broker reference and per-protocol settings."""

from twisted.internet.protocol import Factory

from protocols.smss.faults import DOOR, check_fault
from protocols.smss.protocol import SmssServerProtocol
from protocols.smss.replica import SharedFrames


class SmssFactory(Factory):
    """Builds L{SmssServerProtocol}s.

    @ivar alive_interval: seconds of idleness before a subscription gets ALIVE.
    @ivar max_payload: the largest PUB/DELAY payload accepted, in bytes.
    @ivar folder_count: smss's store.folderCount, for the topicRoot field of topic JSON.
    @ivar idle_timeout: seconds without a request before a connection is closed (0: never).
    """

    noisy = False

    def __init__(self, broker, reactor, alive_interval=30.0, max_payload=64 << 20, folder_count=10,
                 idle_timeout=0):
        self.broker = broker
        self.reactor = reactor
        self.alive_interval = alive_interval
        self.max_payload = max_payload
        self.folder_count = folder_count
        self.idle_timeout = idle_timeout
        self.replica_feeds = 0
        self.shared_frames = SharedFrames(reactor)  # the replica feeds' (protocols.smss.replica)
        self.names = {}  # raw topic bytes -> validated name (see protocol._topic_name)
        broker.wiretap.faults.door(DOOR, check_fault)

    def buildProtocol(self, addr):
        return SmssServerProtocol(self)


def make_factory(broker, config, reactor):
    """Return the smss factory for C{broker} configured from C{config} (a Config)."""
    return SmssFactory(
        broker,
        reactor,
        alive_interval=config["timeout.server.alive"] / 1000.0,
        max_payload=config["store.maxPubPayload"],
        folder_count=config["store.folderCount"],
        idle_timeout=config["timeout.net.idle"] / 1000.0,
    )
