"""Errors the broker core raises; each protocol maps them to its own error frames."""


class BrokerError(Exception):
    """A request the broker refuses. The text is meant for the client."""


class StoreError(BrokerError):
    """A write that failed: it was not stored, or not made durable, and is not acknowledged."""


class DiskFullError(StoreError):
    """A write refused because the disk is full or over C{store.diskMaxUsedRatio}."""


class ReplicationError(StoreError):
    """A write stored on the master but not confirmed by enough followers: it is not
    acknowledged, stays in the log, and becomes readable once followers confirm it.

    @ivar put_result: the write's L{mqserver.store.message.PutResult} (a RocketMQ send
        answers with its msgId and queue offset beside the status)."""

    def __init__(self, text, result=None):
        super().__init__(text)
        self.put_result = result


class ReplicasUnavailable(ReplicationError):
    """Fewer followers that confirm writes are connected and caught up than
    C{replication.syncReplicas} asks for."""


class ReplicationTimeout(ReplicationError):
    """The followers did not confirm the write within C{replication.syncTimeoutMs}."""


class TopicNotFound(BrokerError):
    """The topic does not exist, or is deleted or expired."""


class TopicExists(BrokerError):
    """A topic of that name exists already."""


class InvalidTopicName(BrokerError):
    """The topic name breaks the naming rules."""


class InvalidRequest(BrokerError):
    """A request whose parameters are out of range."""


class NotMaster(BrokerError):
    """A write sent to a slave (a follower, or a member of a replica group that does not
    lead). The text names what was refused and, when known, where the master is.

    @ivar master: the master's address (HOST:PORT) while following one, else None."""

    def __init__(self, what, master=None):
        super().__init__(what if master is None else f"{what} (master: {master})")
        self.master = master


class StartupError(Exception):
    """The broker cannot start; the text is one line for the operator (what failed,
    where, and why)."""
