"""Every channel of every topic, paused topics, and where a topic's next first channel starts.

Durable state (in the broker checkpoint under "channels"): non-ephemeral channels with
their positions and paused flags, paused topics, and "holds" (the queue offsets a topic's
backlog starts at once its last channel went away). Ephemeral channels live in memory only.
"""

from twisted.logger import Logger
from zope.interface import implementer

from mqserver.broker.channels import SCAN_INTERVAL, Channel
from mqserver.errors import TopicNotFound
from mqserver.interfaces import IWatcher

EPHEMERAL = "#ephemeral"


def is_ephemeral(name):
    """True for NSQ-style ephemeral topic/channel names."""
    return name.endswith(EPHEMERAL)


@implementer(IWatcher)
class ChannelRegistry:
    """The channels over one broker.

    @ivar channels: topic -> {channel name: L{Channel}}.
    @ivar paused_topics: topics whose channels deliver nothing.
    @ivar observers: objects told C{channel_added(topic, name)} and
        C{channel_removed(topic, name)} (e.g. lookupd registration).
    """

    log = Logger()

    def __init__(self, broker, reactor):
        self.broker = broker
        self.store = broker.store
        self.reactor = reactor
        self.channels = {}
        self.paused_topics = set()
        self.holds = {}
        #: ephemeral topics a channel user created (only these are deleted with their
        #: last channel / at start: another protocol's topic may carry the same suffix)
        self.ephemeral_topics = set()
        self.observers = []
        self._active = set()
        self._scan_call = None
        self._restored = []
        self._started = False
        #: set by L{stop}: no channel arms a timer after it (connections close after the
        #: services stop, and their fail-backs must not run against a stopped broker)
        self.stopped = False

    # -- checkpoint ----------------------------------------------------------------------

    def snapshot(self):
        """Return the durable state."""
        chans = [ch.snapshot() for by_name in self.channels.values()
                 for ch in by_name.values() if not ch.ephemeral]
        if not self._started:
            chans = self._restored
        return {
            "channels": chans,
            "pausedTopics": sorted(t for t in self.paused_topics if not is_ephemeral(t)),
            "holds": {t: {str(q): o for q, o in h.items()} for t, h in self.holds.items()},
            "ephemeralTopics": sorted(self.ephemeral_topics),
        }

    def restore(self, state):
        """Load what L{snapshot} returned (channels are built at L{start})."""
        self._restored = list(state.get("channels", []))
        self.paused_topics = set(state.get("pausedTopics", []))
        self.holds = {t: {int(q): o for q, o in h.items()}
                      for t, h in state.get("holds", {}).items()}
        self.ephemeral_topics = set(state.get("ephemeralTopics", []))

    def start(self):
        """Build the restored channels of topics that still exist."""
        self._started = True
        for c in self._restored:
            topic = c["topic"]
            if self.broker.topic(topic) is None:
                continue
            # never past a queue's end (a crash may have taken back unsynced messages)
            floor = {int(q): min(o, self.store.queue(topic, int(q)).max_offset)
                     for q, o in c["floor"].items()}
            done = {}
            for q, ranges in c.get("done", {}).items():
                done[int(q)] = {o for a, b in ranges for o in range(a, b)}
            # messages already stored entered the channel before this start (nsqd
            # counts only what its topic hands over while it runs)
            ends = {q: self.store.queue(topic, q).max_offset for q in floor}
            self._add(topic, c["name"], floor, done, c.get("paused", False), False, ends)
        self._restored = []
        self.paused_topics = {t for t in self.paused_topics if self.broker.topic(t) is not None}
        if self.broker.is_master:
            # ephemeral topics do not outlive the process that had their channels
            for t in sorted(self.ephemeral_topics):
                if self.broker.topic(t) is not None:
                    self.broker.delete_topic(t).addErrback(
                        lambda f: self.log.failure("dropping an ephemeral topic failed", f))
            self.ephemeral_topics.clear()
            self.store.mark_dirty()

    def stop(self):
        """Cancel the scan timer and every channel's pending pump; arm nothing after."""
        self.stopped = True
        if self._scan_call is not None and self._scan_call.active():
            self._scan_call.cancel()
        self._scan_call = None
        for by_name in self.channels.values():
            for ch in by_name.values():
                ch.cancel_pump()

    # -- lookup --------------------------------------------------------------------------

    def get(self, topic, name):
        """Return the L{Channel} or None."""
        return self.channels.get(topic, {}).get(name)

    def of(self, topic):
        """Return {name: Channel} of C{topic} (empty when none)."""
        return self.channels.get(topic, {})

    # -- changes -------------------------------------------------------------------------

    def _start_positions(self, topic):
        t = self.broker.topic(topic)
        qids = range(t.queues)
        if self.channels.get(topic):
            # a later channel gets messages from now on
            return {q: self.store.queue(topic, q).max_offset for q in qids}
        # the first channel gets the topic's backlog
        hold = self.holds.pop(topic, {})
        return {q: max(hold.get(q, 0), self.store.queue(topic, q).min_offset) for q in qids}

    def create_channel(self, topic, name, positions=None):
        """Return the channel C{name} of C{topic}, creating it (the topic must exist;
        raises L{TopicNotFound}) at C{positions} (queue id -> queue offset) or, without
        them, where NSQ starts a channel (the backlog for the first, new messages after)."""
        ch = self.get(topic, name)
        if ch is not None:
            return ch
        if self.broker.topic(topic) is None:
            raise TopicNotFound(topic)
        if positions is None:
            positions = self._start_positions(topic)
        return self._add(topic, name, positions, None, False, is_ephemeral(name))

    def _add(self, topic, name, positions, done, paused, ephemeral, entered_from=None):
        ch = Channel(self, topic, name, positions, done, paused, ephemeral, entered_from)
        by_name = self.channels.setdefault(topic, {})
        if not by_name:
            self.broker.watch(topic, self)
        by_name[name] = ch
        self.broker.track_cursor(ch.cursor)
        if not ephemeral:
            self.store.mark_dirty()
        for o in list(self.observers):
            o.channel_added(topic, name)
        ch.schedule_pump()
        return ch

    def delete_channel(self, topic, name):
        """Delete a channel: its consumers are told, its state goes. Returns False when
        there was no such channel."""
        by_name = self.channels.get(topic)
        ch = by_name.pop(name, None) if by_name else None
        if ch is None:
            return False
        ch.close()
        self._active.discard(ch)
        for c in list(ch.consumers):
            c.channel_closed()
        if not by_name:
            del self.channels[topic]
            self.broker.unwatch(topic, self)
            self.holds[topic] = {q: self.store.queue(topic, q).max_offset
                                 for q in ch.cursor.positions}
            if topic in self.ephemeral_topics and self.broker.topic(topic) is not None:
                self.broker.delete_topic(topic).addErrback(
                    lambda f: self.log.failure("deleting ephemeral topic failed", f))
        self.store.mark_dirty()
        for o in list(self.observers):
            o.channel_removed(topic, name)
        return True

    def empty_topic(self, topic):
        """Drop the topic's own backlog (messages not yet handed to any channel)."""
        if not self.channels.get(topic) and self.broker.topic(topic) is not None:
            t = self.broker.topic(topic)
            self.holds[topic] = {q: self.store.queue(topic, q).max_offset for q in range(t.queues)}
            self.store.mark_dirty()

    def note_ephemeral_topic(self, topic):
        """C{topic} was created as an ephemeral topic (it goes with its last channel)."""
        if is_ephemeral(topic):
            self.ephemeral_topics.add(topic)
            self.store.mark_dirty()

    def set_topic_paused(self, topic, paused):
        """Pause or unpause a topic's delivery."""
        if paused:
            self.paused_topics.add(topic)
        else:
            self.paused_topics.discard(topic)
            for ch in self.of(topic).values():
                ch.schedule_pump()
        self.store.mark_dirty()

    def set_channel_paused(self, ch, paused):
        """Pause or unpause one channel."""
        ch.paused = paused
        if not paused:
            ch.schedule_pump()
        self.store.mark_dirty()

    # -- IWatcher ------------------------------------------------------------------------

    def data_available(self, topic, queue_id):
        for ch in self.channels.get(topic, {}).values():
            if ch._pump_call is None:
                ch.arrived(queue_id)

    def topic_deleted(self, topic):
        for name in list(self.channels.get(topic, {})):
            self.delete_channel(topic, name)
        self.ephemeral_topics.discard(topic)
        self.holds.pop(topic, None)
        self.paused_topics.discard(topic)
        self.store.mark_dirty()

    # -- timeouts ------------------------------------------------------------------------

    def arm(self, ch):
        """Watch C{ch}'s in-flight and deferred messages until it has none."""
        self._active.add(ch)
        if self._scan_call is None and not self.stopped:
            self._scan_call = self.reactor.callLater(SCAN_INTERVAL, self._scan)

    def _scan(self):
        self._scan_call = None
        now = self.reactor.seconds()
        for ch in list(self._active):
            if ch.deleted or not ch.scan(now):
                self._active.discard(ch)
        if self._active:
            self._scan_call = self.reactor.callLater(SCAN_INTERVAL, self._scan)
