"""The RocketMQ view of the broker's topics: their configs, the data version nameservers
compare, and ``topic.json``."""

from twisted.internet import defer
from twisted.logger import Logger

from mqserver.errors import StoreError

from protocols.remoting.topicview import (
    DLQ_PREFIX, PERM_INHERIT, PERM_READ, PERM_WRITE, RETRY_PREFIX, TBW102, make_attrs, topic_config,
    write_queues,
)

TOPIC_FILE = "topic.json"


class ConfigFiles:
    """Writes the door's JSON files (``topic.json``, ``subscriptionGroup.json``) into the
    data directory, atomically, on the store's disk thread or at once, through the
    broker's L{mqserver.interfaces.IDataFiles}.

    A write that fails (a full disk) is a disk error of the store: counted and logged
    as the store's own (one line per disk trouble),
    and the file as it was stays (the write goes to a temporary file first).
    """

    log = Logger()

    def __init__(self, files):
        self._files = files

    def write(self, name, data, sync):
        """Write C{data} as the file C{name}: now when C{sync} (raising OSError), else on
        the disk thread.

        @return: (not C{sync}) a Deferred firing once written, or failing with the
            L{StoreError} to answer a request with (L{DiskFullError} for a full disk),
            the failure already counted and logged.
        """
        if sync:
            self._files.write_json(name, data)
            return None
        return self.save(name, data).addErrback(self._failed, name)

    def save(self, name, data):
        """Write C{data} as the file C{name} on the disk thread; return a Deferred that
        fires once it is written, or fails with the error."""
        return self._files.save_json(name, data)

    def _failed(self, f, name):
        if f.check(OSError):
            raise self._files.disk_failed(f"writing {name}", f.value)
        self.log.failure("writing {name} failed", f, name=name)
        raise StoreError(f"writing {name} failed")


def _written(failure):
    """Errback of a write nothing waits for: its failure was counted and logged."""
    failure.trap(StoreError)


class TopicTable:
    """Owns the RocketMQ view of the core's topics: their configs (as the route and
    ``topic.json`` show them), the data version, the creation of the topics RocketMQ
    clients expect (TBW102, retry and dead-letter topics, auto-created ones), and telling
    the registrar when the table changed.

    @ivar data_version: C{{"counter", "timestamp"}}, bumped whenever the table changes.
    """

    log = Logger()

    def __init__(self, broker, files, registrar, *, auto_create, default_queue_nums):
        """
        @param files: the L{ConfigFiles} C{topic.json} is written with.
        @param registrar: the L{protocols.remoting.registrar.Registrar} kicked on changes.
        @param auto_create: C{rocketmq.autoCreateTopicEnable}.
        """
        self.broker = broker
        self._files = files
        self._registrar = registrar
        self.auto_create_enabled = auto_create
        self.default_queue_nums = default_queue_nums
        self.data_version = {"counter": 0, "timestamp": broker.now_ms()}
        self._topic_fingerprint = None

    def start(self):
        """Create TBW102 when auto-creation is on (a master), and write the table."""
        if self.auto_create_enabled and self.broker.is_master and self.broker.topic(TBW102) is None:
            self.broker.create_topic(TBW102, queues=8, perm=PERM_READ | PERM_WRITE | PERM_INHERIT,
                                     attrs=make_attrs(None, 8, 8)).addErrback(
                lambda f: self.log.failure("creating TBW102 failed", f))
        self.check()

    def check(self, sync=False):
        """Bump the data version, rewrite topic.json and re-register when topics changed.

        @return: a Deferred firing (never failing) once the nameservers answered the
            re-registration, or at once when there was none to make.
        """
        written, registered = self._update(sync)
        written.addErrback(_written)
        return registered

    def _update(self, sync):
        """L{check}'s work: return the Deferreds of the topic.json write (failing with
        a L{StoreError} when it failed) and of the re-registration."""
        table = {t.name: topic_config(t) for t in self.broker.topics() if t.valid(self.broker.now_ms())}
        fp = sorted((n, tuple(sorted(c.items()))) for n, c in table.items())
        if fp == self._topic_fingerprint:
            return defer.succeed(None), defer.succeed(None)
        first = self._topic_fingerprint is None
        self._topic_fingerprint = fp
        self.data_version = {"counter": self.data_version["counter"] + 1, "timestamp": self.broker.now_ms()}
        written = self._files.write(TOPIC_FILE, {"topicConfigTable": table, "dataVersion": self.data_version},
                                    sync)
        if written is None:
            written = defer.succeed(None)
        written.addErrback(self._unwritten, fp)
        return written, defer.succeed(None) if first else self._registrar.kick()

    def _unwritten(self, failure, fp):
        # the file on disk is the old table: the next check (the tick) writes it again
        if self._topic_fingerprint == fp:
            self._topic_fingerprint = [("unwritten",)]
        return failure

    def wrapper(self):
        """The TopicConfigSerializeWrapper: every valid topic's config and the data version."""
        table = {t.name: topic_config(t) for t in self.broker.topics() if t.valid(self.broker.now_ms())}
        return {"topicConfigTable": table, "dataVersion": dict(self.data_version)}

    def ensure_topic(self, name, queues):
        """Return a Deferred firing with topic C{name}, created with C{queues} queues if missing."""
        t = self.broker.topic(name)
        if t is not None:
            return defer.succeed(t)
        d = self.broker.create_topic(name, queues=queues, perm=PERM_READ | PERM_WRITE,
                                     attrs=make_attrs(None, queues, queues))
        d.addCallback(self._created)
        return d

    def _created(self, t):
        # the request that created the topic is answered once topic.json holds it, or
        # fails with the store's error (a full disk) when it could not be written
        written, _ = self._update(False)
        return written.addCallback(lambda _: t)

    def auto_create(self, name, default_topic, queue_nums):
        """Create an unknown topic a producer sends to, or return None when not allowed
        (as SendMessageProcessor checks it)."""
        if name.startswith(RETRY_PREFIX) or name.startswith(DLQ_PREFIX):
            return self.ensure_topic(name, 1)
        if not self.auto_create_enabled:
            return None
        template = self.broker.topic(default_topic or TBW102)
        if template is None or not template.perm & PERM_INHERIT:
            return None
        return self.ensure_topic(name, max(1, min(queue_nums, write_queues(template))))
