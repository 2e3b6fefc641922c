"""The RocketMQ view of the broker's topics: their configs, the data version nameservers
compare, and ``topic.json``."""

import os

from twisted.internet import defer
from twisted.logger import Logger

from mqserver.store.flush import write_json_atomic

from protocols.remoting.topicview import (
    DLQ_PREFIX, PERM_INHERIT, PERM_READ, PERM_WRITE, RETRY_PREFIX, TBW102, make_attrs, topic_config,
    write_queues,
)

TOPIC_FILE = "topic.json"


class ConfigFiles:
    """Writes the door's JSON files (``topic.json``, ``subscriptionGroup.json``) into the
    store directory, atomically, on the store's disk thread or at once."""

    log = Logger()

    def __init__(self, store):
        self._store = store

    def write(self, name, data, sync):
        """Write C{data} as the file C{name}: now when C{sync}, else on the disk thread."""
        if sync:
            write_json_atomic(os.path.join(self._store.path, name), data)
        else:
            self.save(name, data).addErrback(
                lambda f: self.log.failure("writing {name} failed", f, name=name))

    def save(self, name, data):
        """Write C{data} as the file C{name} on the disk thread; return a Deferred that
        fires once it is written, or fails with the error."""
        return self._store.runner.run(write_json_atomic, os.path.join(self._store.path, name), data)


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
        table = {t.name: topic_config(t) for t in self.broker.topics() if t.valid(self.broker.now_ms())}
        fp = sorted((n, tuple(sorted(c.items()))) for n, c in table.items())
        if fp == self._topic_fingerprint:
            return defer.succeed(None)
        first = self._topic_fingerprint is None
        self._topic_fingerprint = fp
        self.data_version = {"counter": self.data_version["counter"] + 1, "timestamp": self.broker.now_ms()}
        self._files.write(TOPIC_FILE, {"topicConfigTable": table, "dataVersion": self.data_version}, sync)
        if first:
            return defer.succeed(None)
        return self._registrar.kick()

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
        self.check()
        return t

    def auto_create(self, name, default_topic, queue_nums):
        """Create an unknown topic a producer sends to, or return None when not allowed
        (spec 4.1 step 2)."""
        if name.startswith(RETRY_PREFIX) or name.startswith(DLQ_PREFIX):
            return self.ensure_topic(name, 1)
        if not self.auto_create_enabled:
            return None
        template = self.broker.topic(default_topic or TBW102)
        if template is None or not template.perm & PERM_INHERIT:
            return None
        return self.ensure_topic(name, max(1, min(queue_nums, write_queues(template))))
