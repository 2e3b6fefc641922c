"""zope.interface contracts between the protocols and the broker core.

L{IBroker} is what the front doors under C{protocols/} call on the broker (and nothing
more); L{IWatcher} is what the broker calls on whoever waits for a topic's messages;
L{IChannelConsumer} is what a channel (C{mqserver/broker/channels.py}) reads and calls
on a connection it delivers to. C{tests/unit/test_interfaces.py} checks every
implementation with C{zope.interface.verify.verifyObject}.
"""

from zope.interface import Attribute, Interface


class IBroker(Interface):
    """What every protocol may ask of the broker core."""

    store = Attribute("The MessageStore holding every record.")
    is_master = Attribute("False on a replication slave, which refuses writes.")
    registry = Attribute("The TopicRegistry: every topic by name, deleted ones included "
                         "(smss reads it for its VALID and follower checks).")
    channels = Attribute("The ChannelRegistry: NSQ-style channels over the topics.")
    offsets = Attribute("The ConsumerOffsets: committed (group, topic, queue) offsets.")
    stats = Attribute("The BrokerStats: per-queue, consumer and connection counters.")
    queues = Attribute("The QueueService: msgout's queues, receipts and subscriptions.")
    wiretap = Attribute("The WireTap: fault rules, and whether a front door looks at each "
                        "request (its one switch, 'active').")
    extensions = Attribute("A dict a front door keeps per-broker state in, by its own "
                           "key; the core never reads it.")

    def now_ms():
        """Return the current time in ms."""

    def topic(name):
        """Return the valid Topic called name, or None."""

    def topics():
        """Return every topic, sorted by name bytes."""

    def create_topic(name, expire_at=0, queues=1, perm=6, attrs=None):
        """Create a topic; Deferred firing with the Topic."""

    def update_topic(name, queues=None, perm=None, attrs=None):
        """Create or change a topic; Deferred firing with the Topic."""

    def delete_topic(name):
        """Delete a topic; Deferred."""

    def publish(topic, messages, queue_id=None):
        """Store messages in one write; Deferred firing with a PutResult."""

    def publish_now(topic, messages, queue_id=None, answer=None):
        """As publish, but the PutResult itself when the write is already as durable as
        asked (else a Deferred of it); raises BrokerError when refused or failed. With
        answer, a write that completes at once calls answer(PutResult) as soon as it is
        written, before the broker's bookkeeping of it, and returns None."""

    def delay(topic, delay_ms, messages):
        """Store messages to publish later; Deferred firing with the delay's eventId."""

    def open_cursor(topic, after_event_id):
        """Return a TopicCursor after an eventId."""

    def track_cursor(cursor):
        """Count a cursor made elsewhere in the retention floor until closed."""

    def register_state(name, obj):
        """Keep obj's snapshot_state()/restore_state(data) in the checkpoint under name."""

    def close_cursor(cursor):
        """Forget a cursor."""

    def claim(topic, who, subscriber):
        """Claim the one live subscription of (topic, who); False when taken."""

    def release(topic, who, subscriber):
        """Give up a claim."""

    def watch(topic, watcher):
        """Tell watcher (an IWatcher) about arrivals in and deletion of topic."""

    def unwatch(topic, watcher):
        """Stop telling watcher."""


class IWatcher(Interface):
    """Something waiting for messages of a topic (a subscription, a long poll)."""

    def data_available(topic, queue_id):
        """New messages are readable in (topic, queue_id)."""

    def topic_deleted(topic):
        """The topic was deleted or expired."""


class IChannelConsumer(Interface):
    """A connection a channel delivers to (an NSQ consumer). The channel reads the
    attributes below on every pump and keeps C{in_flight} up to date itself."""

    rdy = Attribute("How many messages the consumer is ready to have in flight.")
    in_flight = Attribute("How many it has in flight; the channel adds and subtracts.")
    msg_timeout = Attribute("Seconds a delivered message may stay unfinished.")
    sample_rate = Attribute("0, or the percentage (1..99) of messages to deliver.")
    can_receive = Attribute("False while the consumer must get nothing (closing, "
                            "output buffer full).")
    defer_room = Attribute("While the consumer holds what it is handed for a flush it has "
                           "scheduled: how many more messages it could take before they "
                           "would leave at once; else 0. The channel may leave that many "
                           "arrivals in the store, and the consumer calls its "
                           "pump_deferred() before it flushes.")

    def deliver(items):
        """Send messages: a list of (timestamp ns, attempts, eventId, buffer, body start,
        body end) tuples."""

    def channel_closed():
        """The channel was deleted: stop consuming from it."""
