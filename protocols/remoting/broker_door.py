"""Front door ``broker``: the RocketMQ broker (default 127.0.0.1:10911).

L{BrokerDoor} is the factory and holds what all connections share: consumer groups,
parked pulls, statistics, the nameserver registration, and the RocketMQ views of the
core's topics (``topic.json``, ``subscriptionGroup.json`` in the store directory,
rewritten atomically with a data version when they change).
"""

import json
import os
import socket

from twisted.internet import defer
from twisted.internet.protocol import Factory
from twisted.logger import Logger

from mqserver.service import HookService, local_ipv4, timer
from mqserver.store import format as fmt
from mqserver.store.flush import read_json, write_json_atomic
from mqserver.store.index import IndexService

from protocols.remoting import codes
from protocols.remoting.admin_stats import mq_map
from protocols.remoting.config import parse_delay_levels
from protocols.remoting.broker_protocol import BrokerProtocol
from protocols.remoting.consumers import ConsumerManager
from protocols.remoting.context import context_for
from protocols.remoting.pulling import LongPolls
from protocols.remoting.registrar import Registrar, parse_addrs
from protocols.remoting.stats import group_consumer
from protocols.remoting.acl import make_acl
from protocols.remoting.transactions import Transactions
from protocols.remoting.topicview import (
    DLQ_PREFIX, PERM_INHERIT, PERM_READ, PERM_WRITE, RETRY_PREFIX, TBW102, make_attrs, topic_config,
    valid_group, write_queues,
)

TOPIC_FILE = "topic.json"
GROUP_FILE = "subscriptionGroup.json"
TICK_S = 5.0


class BrokerDoor(Factory):
    """The RocketMQ broker factory.

    @ivar broker_addr: the ``ip:port`` advertised to nameservers and written as STOREHOST,
        known once the listener is bound (L{listening}).
    """

    log = Logger()
    noisy = False

    def __init__(self, broker, config, reactor):
        self.broker = broker
        self.store = broker.store
        self.reactor = reactor
        self.config = config
        self.broker_name = config["rocketmq.brokerName"]
        self.cluster_name = config["rocketmq.brokerClusterName"]
        # A replication slave registers under its master's broker name as brokerId 1
        # unless the config names another id, so consumers read from it when the master
        # is down.
        self.broker_id = config["rocketmq.brokerId"]
        if config["role"] == "slave" and self.broker_id == 0:
            self.broker_id = 1
        self.broker_ip = config["rocketmq.brokerIP"]
        self.auto_create_enabled = config["rocketmq.autoCreateTopicEnable"]
        self.auto_create_group = config["rocketmq.autoCreateSubscriptionGroup"]
        self.default_queue_nums = config["rocketmq.defaultTopicQueueNums"]
        self.delay_levels = parse_delay_levels(config["rocketmq.messageDelayLevel"])
        self.max_reconsume = config["rocketmq.maxReconsumeTimes"]
        self.long_poll_max_ms = config["rocketmq.longPollMaxMs"]
        self.register_interval = config["rocketmq.registerIntervalMs"] / 1000.0
        self.broker_addr = None
        self.consumers = ConsumerManager(broker.now_ms)
        self.polls = LongPolls(broker, reactor)
        ctx = context_for(broker)
        ctx.broker_door = self
        self.registrar = Registrar(self, reactor, parse_addrs(config["rocketmq.namesrvAddr"]), ctx.route_table)
        self.data_version = {"counter": 0, "timestamp": broker.now_ms()}
        self._topic_fingerprint = None
        self.index = IndexService(os.path.join(self.store.path, "index"))
        self.acl = make_acl(config, reactor)
        self.store.add_dispatch_listener(self.index.dispatch)
        self.transactions = Transactions(self, config)

    # -- life cycle ----------------------------------------------------------------

    def listening(self, port):
        """The listener is bound: advertise its real address and register."""
        host = port.getHost()
        ip = self.broker_ip or (host.host if host.host not in ("0.0.0.0", "", "::") else local_ipv4())
        self.broker_addr = f"{ip}:{host.port}"
        self.store.store_host = socket.inet_aton(ip) + host.port.to_bytes(4, "big")
        self.log.info("RocketMQ broker {name} at {addr} (cluster {cluster})",
                      name=self.broker_name, addr=self.broker_addr, cluster=self.cluster_name)
        self.registrar.register()

    def services(self):
        """The services running this door's background work, added to the broker's
        service tree beside its listener: they start after the store opens and stop
        after the listener closes (L{mqserver.service.BrokerService.add_door_services})."""
        loops = [timer(interval, f, self.reactor, f"rocketmq-{name}", now=False)
                 for name, interval, f in (
                     ("tick", TICK_S, self._tick),
                     ("register", self.register_interval, self.registrar.register),
                     ("expire-clients", 30.0, self._expire_clients),
                     ("check-transactions", self.transactions.check_interval,
                      self.transactions.check))]
        return [HookService(self.start, self.stop, "rocketmq-broker"), *loops]

    def start(self):
        """Load the group configs and the topics (the store is open)."""
        data = read_json(os.path.join(self.store.path, GROUP_FILE)) or {}
        for name, cfg in (data.get("subscriptionGroupTable") or {}).items():
            self.consumers.group_configs[name] = cfg
        if self.auto_create_enabled and self.broker.is_master and self.broker.topic(TBW102) is None:
            self.broker.create_topic(TBW102, queues=8, perm=PERM_READ | PERM_WRITE | PERM_INHERIT,
                                     attrs=make_attrs(None, 8, 8)).addErrback(
                lambda f: self.log.failure("creating TBW102 failed", f))
        self._check_topics()

    def stop(self):
        """Unregister and save (the listener is closed; the store is still open)."""
        self.polls.stop()
        self.registrar.unregister()
        self.index.close()
        try:
            self._check_topics(sync=True)
            self._save_groups(sync=True)
        except OSError as e:
            self.log.error("saving RocketMQ config files failed: {e}", e=e)

    def buildProtocol(self, addr):
        p = BrokerProtocol(self)
        p.factory = self
        return p

    # -- periodic ------------------------------------------------------------------

    def _tick(self):
        self._check_topics()
        self._save_groups()

    def _expire_clients(self):
        self._notify(self.consumers.expire())

    def _check_topics(self, sync=False):
        """Bump the data version, rewrite topic.json and re-register when topics changed."""
        table = {t.name: topic_config(t) for t in self.broker.topics() if t.valid(self.broker.now_ms())}
        fp = sorted((n, tuple(sorted(c.items()))) for n, c in table.items())
        if fp == self._topic_fingerprint:
            return
        first = self._topic_fingerprint is None
        self._topic_fingerprint = fp
        self.data_version = {"counter": self.data_version["counter"] + 1, "timestamp": self.broker.now_ms()}
        self._write(TOPIC_FILE, {"topicConfigTable": table, "dataVersion": self.data_version}, sync)
        if not first:
            self.registrar.kick()

    def topics_changed(self):
        """A topic was created, changed or deleted through this door."""
        self._check_topics()

    def _save_groups(self, sync=False):
        if not self.consumers.changed_configs:
            return
        self.consumers.changed_configs = False
        self._write(GROUP_FILE, self.group_config_wrapper(), sync)

    def _write(self, name, data, sync):
        path = os.path.join(self.store.path, name)
        if sync:
            write_json_atomic(path, data)
        else:
            self.store.runner.run(write_json_atomic, path, data).addErrback(
                lambda f: self.log.failure("writing {name} failed", f, name=name))

    # -- topics --------------------------------------------------------------------

    def topic_config_wrapper(self):
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
        self._check_topics()
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

    # -- groups --------------------------------------------------------------------

    def group_config(self, group):
        cfg = self.consumers.group_configs.get(group)
        if cfg is None and self.auto_create_group and valid_group(group):
            cfg = self.consumers.ensure_group(group, self.max_reconsume)
        return cfg

    def retry_max_times(self, group):
        cfg = self.group_config(group)
        return cfg.get("retryMaxTimes", self.max_reconsume) if cfg else self.max_reconsume

    def set_group_config(self, cfg):
        """Create or update a subscription group (admin); its retry topic is created at
        once, so consumers started afterwards find its route on their first lookup."""
        base = self.consumers.ensure_group(cfg["groupName"], self.max_reconsume)
        self.consumers.set_group_config(dict(base, **cfg))
        if self.broker.is_master:
            return self.ensure_topic(RETRY_PREFIX + cfg["groupName"], 1)
        return defer.succeed(None)

    def delete_group_config(self, name):
        self.consumers.delete_group_config(name)

    def group_config_wrapper(self):
        return {"subscriptionGroupTable": dict(sorted(self.consumers.group_configs.items())),
                "dataVersion": dict(self.data_version)}

    def delay_ms(self, level):
        level = max(1, min(level, len(self.delay_levels)))
        return self.delay_levels[level - 1]

    # -- clients -------------------------------------------------------------------

    def heartbeat(self, protocol, data):
        """Apply a heartbeat; create retry topics; tell groups whose members changed."""
        ds = []
        for cd in data.get("consumerDataSet") or []:
            group = cd.get("groupName")
            if group and self.group_config(group) is not None and self.broker.is_master:
                ds.append(self.ensure_topic(RETRY_PREFIX + group, 1))
        self._notify(self.consumers.heartbeat(protocol, data))
        return defer.gatherResults(ds, consumeErrors=True) if ds else defer.succeed(None)

    def unregister_client(self, client_id, producer_group, consumer_group):
        self._notify(self.consumers.unregister(client_id, producer_group, consumer_group))

    def connection_lost(self, protocol):
        self._notify(self.consumers.connection_lost(protocol))

    def _notify(self, groups):
        for group in groups:
            cfg = self.consumers.group_configs.get(group) or {}
            if not cfg.get("notifyConsumerIdsChangedEnable", True):
                continue
            for conn in self.consumers.connections(group):
                conn.send_oneway(codes.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group})

    # -- records -------------------------------------------------------------------

    def raw_record_at(self, offset):
        """Return the stored message record at commit-log C{offset} (STOREHOST patched),
        or None when there is none."""
        log = self.store.commitlog
        if offset < log.min_offset or offset + fmt.HEADER_SIZE > self.store.visible_end:
            return None
        try:
            head = log.read(offset, 8)
            size, magic = fmt.BLANK.unpack_from(head, 0)
            if magic != fmt.MESSAGE_MAGIC or size < fmt.HEADER_SIZE or offset + size > self.store.visible_end:
                return None
            data = log.read(offset, size)
        except (OSError, ValueError):
            return None
        if self.store.damaged(data, offset):  # never served (reported by the store)
            return None
        data = bytearray(data)
        data[64:72] = self.store.store_host
        return bytes(data)

    def record_at(self, offset):
        data = self.raw_record_at(offset)
        return fmt.RecordView(data) if data is not None else None

    def query_by_key(self, topic, key, max_num, begin, end):
        """Return (body, last index ts, last index offset) of messages of C{topic} with
        key C{key} stored in [begin, end]."""
        offsets = self.index.lookup(topic, key, max_num, begin, end)
        parts = []
        for off in offsets:
            data = self.raw_record_at(off)
            if data is None:
                continue
            view = fmt.RecordView(data)
            if view.topic == topic and key_matches(view.properties, key):
                parts.append(data)
        return b"".join(parts), self.index.last_ts(), self.index.last_offset()

    # -- statistics and offsets -----------------------------------------------------

    def group_consumer(self, group, topic):
        """Return the core consumer of (group, topic) that pulls are counted on."""
        return group_consumer(self.broker, group, topic,
                              lambda positions: self._reset_clients(group, topic, positions))

    def rewind_group(self, group, topic, positions):
        """Set the group's offsets on C{topic} to C{positions} (queue id -> offset) and
        tell its online clients (RESET_CONSUMER_CLIENT_OFFSET, 220), which drop what they
        pulled from the old position and go on from the new one."""
        self.group_consumer(group, topic).rewind(positions)

    def _reset_clients(self, group, topic, positions):
        # the timestamp is only logged by clients; the offsets are what they apply
        ext = {"topic": topic, "group": group, "timestamp": -1, "isForce": "true"}
        for conn in self.consumers.connections(group):
            conn.send_oneway(codes.RESET_CONSUMER_CLIENT_OFFSET, ext,
                             reset_offset_body(self.broker_name, topic, positions,
                                               getattr(conn, "client_language", "") == "CPP"))

    def broker_config(self):
        """The broker's configuration as GET_BROKER_CONFIG shows it (RocketMQ names)."""
        c = self.config
        return {
            "brokerClusterName": self.cluster_name, "brokerName": self.broker_name,
            "brokerId": self.broker_id, "brokerIP1": (self.broker_addr or ":").rsplit(":", 1)[0],
            "listenPort": (self.broker_addr or ":0").rsplit(":", 1)[1],
            "namesrvAddr": c["rocketmq.namesrvAddr"] or "",
            "brokerRole": "SLAVE" if c["role"] == "slave" else "ASYNC_MASTER",
            "flushDiskType": "SYNC_FLUSH" if c["store.flushLevel"] >= 2 else "ASYNC_FLUSH",
            "storePathRootDir": self.store.path,
            "storePathCommitLog": os.path.join(self.store.path, "commitlog"),
            "mappedFileSizeCommitLog": c["store.maxLogSize"],
            "maxMessageSize": c["store.maxMessageSize"],
            "fileReservedTime": c["store.maxDays"] * 24,
            "autoCreateTopicEnable": str(self.auto_create_enabled).lower(),
            "autoCreateSubscriptionGroup": str(self.auto_create_group).lower(),
            "defaultTopicQueueNums": self.default_queue_nums,
            "messageDelayLevel": c["rocketmq.messageDelayLevel"],
            "longPollingEnable": "true",
        }


def key_matches(properties, key):
    for k, v in fmt.decode_properties(properties):
        if k == b"KEYS" and key.encode() in v.split(b" "):
            return True
        if k == b"UNIQ_KEY" and v == key.encode():
            return True
    return False


def reset_offset_body(broker_name, topic, positions, for_c):
    """The body of RESET_CONSUMER_CLIENT_OFFSET: ResetOffsetBodyForC (a list) for C++
    clients, ResetOffsetBody (a map keyed by MessageQueue, spec 5.8) for the others."""
    mqs = [({"brokerName": broker_name, "queueId": q, "topic": topic}, o)
           for q, o in sorted(positions.items())]
    if for_c:
        return json.dumps({"offsetTable": [dict(mq, offset=o) for mq, o in mqs]},
                          separators=(",", ":")).encode()
    pairs = [((topic, broker_name, q), o) for q, o in sorted(positions.items())]
    return ('{"offsetTable":' + mq_map(pairs) + "}").encode()


def make_factory(broker, config, reactor):
    """Return the RocketMQ broker factory for C{broker}."""
    door = BrokerDoor(broker, config, reactor)
    door.idle_timeout, door.clock = config["rocketmq.serverChannelMaxIdleTimeSeconds"], reactor
    return door
