"""nsqlookupd's registration database, as pure state (no wire, no reactor).

Producers (nsqd nodes) register topics and channels; readers ask which producers hold a
topic. Keys follow nsqlookupd: a topic registration, a channel registration per
(topic, channel), and a "client" registration per connected producer. A producer is
identified by its peer id (its connection). An optional C{local_source} callable adds a
producer computed on every query (the embedded lookupd describing its own broker).
"""

import time

INACTIVE_TIMEOUT = 300.0
TOMBSTONE_LIFETIME = 45.0


class LookupRegistry:
    """Registrations: (category, topic, channel) -> {peer id: peer info dict}.

    @ivar local_source: None, or a callable returning None or
        C{(peer_info, {topic: [channel, ...]})} for a producer that is always live.
    @ivar dropped_local: C{(topic, channel)} pairs of the local producer whose
        registration was deleted through /channel/delete: hidden until that channel is
        added or removed again (when an nsqd would register it anew).
    """

    def __init__(self, clock=time.time):
        self.clock = clock
        self.regs = {}  # ("topic"|"channel", topic, channel) -> {peer_id: info}
        self.last_seen = {}  # peer_id -> time
        self.peers = {}  # peer_id -> info
        self.tombstones = {}  # (topic, peer_id) -> until
        self.local_source = None
        self.dropped_local = set()

    # -- producers ------------------------------------------------------------------------

    def identify(self, peer_id, info):
        """Record a producer connection's IDENTIFY info."""
        self.peers[peer_id] = dict(info)
        self.last_seen[peer_id] = self.clock()

    def ping(self, peer_id):
        """A producer said it is alive."""
        self.last_seen[peer_id] = self.clock()

    def register(self, peer_id, topic, channel=None):
        """Register C{topic} (and C{channel}) for the producer."""
        info = self.peers[peer_id]
        self.regs.setdefault(("topic", topic, ""), {})[peer_id] = info
        if channel:
            self.regs.setdefault(("channel", topic, channel), {})[peer_id] = info

    def unregister(self, peer_id, topic, channel=None):
        """Remove the producer from a channel (an ephemeral channel's key goes with its
        last producer), or from a topic and all its channels."""
        if channel:
            key = ("channel", topic, channel)
            producers = self.regs.get(key)
            if producers is not None:
                producers.pop(peer_id, None)
                if not producers and channel.endswith("#ephemeral"):
                    del self.regs[key]
            return
        for key, producers in list(self.regs.items()):
            if key[1] == topic:
                producers.pop(peer_id, None)
        key = ("topic", topic, "")
        if topic.endswith("#ephemeral") and not self.regs.get(key):
            self.regs.pop(key, None)

    def drop_peer(self, peer_id):
        """The producer's connection closed: remove all its registrations (keys stay)."""
        for producers in self.regs.values():
            producers.pop(peer_id, None)
        self.peers.pop(peer_id, None)
        self.last_seen.pop(peer_id, None)

    # -- admin (HTTP) ----------------------------------------------------------------------

    def create_topic(self, topic):
        self.regs.setdefault(("topic", topic, ""), {})

    def delete_topic(self, topic):
        for key in [k for k in self.regs if k[1] == topic]:
            del self.regs[key]

    def create_channel(self, topic, channel):
        self.create_topic(topic)
        self.regs.setdefault(("channel", topic, channel), {})

    def delete_channel(self, topic, channel):
        """Drop the channel's registration, every producer's (the local producer's
        too), as nsqlookupd's /channel/delete does. Returns False when it had none."""
        found = self.regs.pop(("channel", topic, channel), None) is not None
        if channel in self._local_channels(topic):
            self.dropped_local.add((topic, channel))
            found = True
        return found

    # the broker's channel registry tells (the local producer registering anew, as an
    # nsqd registers a channel it creates and unregisters one it deletes)

    def channel_added(self, topic, channel):
        self.dropped_local.discard((topic, channel))

    channel_removed = channel_added

    def tombstone(self, topic, node):
        """Hide the producer whose C{broadcast_address:http_port} is C{node} from
        lookups of C{topic} for a while. Returns False when no such producer."""
        for peer_id, info in self._producers_of(topic):
            if f"{info['broadcast_address']}:{info['http_port']}" == node:
                self.tombstones[(topic, peer_id)] = self.clock() + TOMBSTONE_LIFETIME
                return True
        return False

    # -- queries -----------------------------------------------------------------------------

    def _local(self):
        if self.local_source is None:
            return None
        return self.local_source()

    def _producers_of(self, topic):
        out = list(self.regs.get(("topic", topic, ""), {}).items())
        local = self._local()
        if local is not None and topic in local[1]:
            out = [(pid, info) for pid, info in out if not _same_node(info, local[0])]
            out.append(("local", local[0]))
        return out

    def topics(self):
        """Every registered topic name, sorted."""
        names = {k[1] for k in self.regs if k[0] == "topic"}
        local = self._local()
        if local is not None:
            names.update(local[1])
        return sorted(names)

    def _local_channels(self, topic):
        """The local producer's registered channels of C{topic}."""
        local = self._local()
        if local is None:
            return set()
        return {c for c in local[1].get(topic, ()) if (topic, c) not in self.dropped_local}

    def channels(self, topic):
        """The registered channels of C{topic}, sorted."""
        names = {k[2] for k in self.regs if k[0] == "channel" and k[1] == topic}
        return sorted(names | self._local_channels(topic))

    def has_topic(self, topic):
        return topic in self.topics()

    def _live(self, topic, peer_id):
        now = self.clock()
        if peer_id != "local" and now - self.last_seen.get(peer_id, 0) > INACTIVE_TIMEOUT:
            return False
        until = self.tombstones.get((topic, peer_id))
        return until is None or until < now

    def lookup(self, topic):
        """Return (channels, live producer infos) of C{topic}, or None if unregistered."""
        if not self.has_topic(topic):
            return None
        producers = [info for pid, info in self._producers_of(topic) if self._live(topic, pid)]
        return self.channels(topic), producers

    def nodes(self):
        """Every live producer with the topics it holds and their tombstone flags."""
        out = []
        items = [(pid, info) for pid, info in self.peers.items() if self._live("", pid)]
        local = self._local()
        if local is not None:
            # a broker registering with its own embedded lookupd is one node, not two
            items = [(pid, info) for pid, info in items if not _same_node(info, local[0])]
            items.append(("local", local[0]))
        now = self.clock()
        for pid, info in items:
            if pid == "local":
                topics = sorted(local[1])
            else:
                topics = sorted({k[1] for k, ps in self.regs.items()
                                 if k[0] == "topic" and pid in ps})
            tomb = [self.tombstones.get((t, pid), 0) > now for t in topics]
            out.append(dict(info, tombstones=tomb, topics=topics))
        return out


def _same_node(a, b):
    """True when two producer infos describe the same nsqd (address and ports)."""
    return all(a.get(k) == b.get(k) for k in ("broadcast_address", "tcp_port", "http_port"))
