"""zope.interface contracts between the protocols and the broker core."""

from zope.interface import Attribute, Interface


class IBroker(Interface):
    """What every protocol may ask of the broker core."""

    store = Attribute("The MessageStore holding every record.")
    is_master = Attribute("False on a replication slave, which refuses writes.")

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

    def delay(topic, delay_ms, messages):
        """Store messages to publish later; Deferred firing with the delay's eventId."""

    def open_cursor(topic, after_event_id):
        """Return a TopicCursor after an eventId."""

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
