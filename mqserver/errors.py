"""Errors the broker core raises; each protocol maps them to its own error frames."""


class BrokerError(Exception):
    """A request the broker refuses. The text is meant for the client."""


class StoreError(BrokerError):
    """A write that failed: it was not stored, or not made durable, and is not acknowledged."""


class DiskFullError(StoreError):
    """A write refused because the disk is full or over C{store.diskMaxUsedRatio}."""


class TopicNotFound(BrokerError):
    """The topic does not exist, or is deleted or expired."""


class TopicExists(BrokerError):
    """A topic of that name exists already."""


class InvalidTopicName(BrokerError):
    """The topic name breaks the naming rules."""


class InvalidRequest(BrokerError):
    """A request whose parameters are out of range."""


class NotMaster(BrokerError):
    """A write sent to a slave."""


class StartupError(Exception):
    """The broker cannot start; the text is one line for the operator (what failed,
    where, and why)."""
