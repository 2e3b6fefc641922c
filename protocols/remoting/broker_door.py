"""Front door ``broker``: the RocketMQ broker (default 127.0.0.1:10911).

L{BrokerDoor} is the factory and holds what all connections share. Its parts, one
module each: L{TopicTable} (topic_table.py: the RocketMQ views of the core's topics,
``topic.json`` and its data version), L{Groups} (groups.py: consumer groups, their
clients and ``subscriptionGroup.json``), L{StoredRecords} (stored_records.py: records
by offset and by key), the L{Registrar} (nameserver registration), parked pulls
(L{LongPolls}, longpolls.py) and L{Transactions}. The files are in the store directory, rewritten
atomically with a data version when they change.
"""

import os
import socket

from twisted.internet import defer
from twisted.internet.protocol import Factory
from twisted.logger import Logger

from mqserver.service import HookService, local_ipv4, timer

from protocols.remoting import broker_settings
from protocols.remoting.acl import make_acl
from protocols.remoting.broker_protocol import BrokerProtocol
from protocols.remoting.config import parse_delay_levels
from protocols.remoting.context import context_for
from protocols.remoting.groups import GROUP_FILE, Groups, reset_offset_body
from protocols.remoting.longpolls import LongPolls
from protocols.remoting.registrar import Registrar, parse_addrs
from protocols.remoting.server import check_fault
from protocols.remoting.stored_records import StoredRecords, key_matches
from protocols.remoting.topic_table import TOPIC_FILE, ConfigFiles, TopicTable
from protocols.remoting.transactions import Transactions

__all__ = ["BrokerDoor", "GROUP_FILE", "TOPIC_FILE", "TICK_S", "key_matches", "make_factory",
           "reset_offset_body"]

TICK_S = 5.0


class BrokerDoor(Factory):
    """The RocketMQ broker factory: the door's configuration, its life cycle and
    background loops (L{services}), and the connections it builds; the work is its
    parts'.

    @ivar broker_addr: the ``ip:port`` advertised to nameservers and written as STOREHOST,
        known once the listener is bound (L{listening}).
    @ivar topic_table: the L{TopicTable}.
    @ivar groups: the L{Groups}; C{consumers} is its L{ConsumerManager}.
    @ivar records: the L{StoredRecords}.
    @ivar settings: the runtime settings (L{broker_settings.RUNTIME}) in force, by config
        key; C{updated_settings} those of them updateBrokerConfig changed (kept in
        L{broker_settings.SETTINGS_FILE}).
    @ivar idle_timeout: seconds without input before a new connection is closed (0:
        never), timed on C{clock}.
    """

    log = Logger()
    noisy = False

    def __init__(self, broker, config, reactor):
        self.broker = broker
        self.messages = broker.messages
        self.reactor = reactor
        self.config = config
        self.broker_name = config["rocketmq.brokerName"]
        self.cluster_name = config["rocketmq.brokerClusterName"]
        # A replication slave registers under its master's broker name as brokerId 1
        # unless the config names another id, so consumers read from it when the master
        # is down.
        self.broker_id = self._id_for(broker.is_master)
        self.broker_ip = config["rocketmq.brokerIP"]
        if broker.is_master:
            self._sync_master()
        broker.add_role_listener(self._role_changed)
        self.delay_levels = parse_delay_levels(config["rocketmq.messageDelayLevel"])
        self.long_poll_max_ms = config["rocketmq.longPollMaxMs"]
        self.register_interval = config["rocketmq.registerIntervalMs"] / 1000.0
        self.broker_addr = None
        self.settings = {key: config[key] for key in broker_settings.RUNTIME.values()}
        self.updated_settings = {}
        # one update at a time, each file write holding every earlier change (4.9.4's
        # updateBrokerConfig is synchronized)
        self._settings_lock = defer.DeferredLock()
        self.idle_timeout = self.settings["rocketmq.serverChannelMaxIdleTimeSeconds"]
        self.clock = reactor
        self.files = files = ConfigFiles(broker.files)
        self.polls = LongPolls(broker, reactor, config["rocketmq.longPollBatchMs"] / 1000.0)
        ctx = context_for(broker)
        ctx.broker_door = self
        self.registrar = Registrar(self, reactor, parse_addrs(config["rocketmq.namesrvAddr"]), ctx.route_table)
        self.topic_table = TopicTable(
            broker, files, self.registrar, auto_create=config["rocketmq.autoCreateTopicEnable"],
            default_queue_nums=config["rocketmq.defaultTopicQueueNums"])
        self.groups = Groups(
            broker, files, self.topic_table, broker_name=self.broker_name,
            auto_create=config["rocketmq.autoCreateSubscriptionGroup"],
            max_reconsume=config["rocketmq.maxReconsumeTimes"])
        self.consumers = self.groups.consumers
        self.records = StoredRecords(broker.messages)
        self.acl = make_acl(config, reactor)
        self.transactions = Transactions(self, config)
        # Called on every pull: straight to the part (one call, not two).
        self.group_consumer = self.groups.group_consumer
        broker.wiretap.faults.door(BrokerProtocol.door_name, check_fault)

    # -- life cycle ----------------------------------------------------------------

    def listening(self, port):
        """The listener is bound: advertise its real address and register."""
        host = port.getHost()
        ip = self.broker_ip or (host.host if host.host not in ("0.0.0.0", "", "::") else local_ipv4())
        self.broker_addr = f"{ip}:{host.port}"
        self.messages.store_host = socket.inet_aton(ip) + host.port.to_bytes(4, "big")
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
                     ("register", self.register_interval, self._reregister),
                     ("expire-clients", 30.0, self.groups.expire_clients),
                     ("check-transactions", self.transactions.check_interval,
                      self.transactions.check))]
        return [HookService(self.start, self.stop, "rocketmq-broker"), *loops]

    def _reregister(self):
        # not waited for: a slow nameserver must hold neither the loop nor the stop
        self.registrar.register()

    def start(self):
        """Apply the settings updateBrokerConfig changed, load the group configs and the
        topics (the store is open)."""
        self._load_settings()
        self.groups.load()
        self.topic_table.start()

    def _load_settings(self):
        name = broker_settings.SETTINGS_FILE
        data = self.broker.files.read_json(name)
        if data is None:
            return
        try:
            values = broker_settings.from_file(data)
        except broker_settings.SettingsError as e:
            self.log.error("ignoring {name}, config.yaml's settings apply: {e}", name=name, e=e)
            return
        self.updated_settings = values
        self._apply_settings(values)
        self.log.info("settings changed by updateBrokerConfig ({name}): {values}",
                      name=name, values=broker_settings.to_file(values))

    def stop(self):
        """Unregister and save (the listener is closed; the store is still open)."""
        self.polls.stop()
        self.registrar.unregister()
        self.records.close()
        try:
            self.topic_table.check(sync=True)
            self.groups.save(self.topic_table.data_version, sync=True)
        except OSError as e:
            self.log.error("saving RocketMQ config files failed: {e}", e=e)

    def buildProtocol(self, addr):
        p = BrokerProtocol(self)
        p.factory = self
        return p

    def _tick(self):
        self.topic_table.check()
        self.groups.save(self.topic_table.data_version)

    # -- role ----------------------------------------------------------------------

    def _id_for(self, is_master):
        # A slave registers under its master's broker name as brokerId 1 unless the
        # config names another id, so consumers read from it when the master is down;
        # a master (a slave promoted too) as 0, where producers send.
        configured = self.config["rocketmq.brokerId"]
        if is_master:
            return 0 if self.config["role"] == "slave" else configured
        return configured or 1

    def _sync_master(self):
        # 4.9's SYNC_MASTER: a send is SEND_OK once a slave holds it too (the core's
        # synchronous replication with one follower at least, 4.9's timeout and lag)
        if self.config["rocketmq.brokerRole"] == "SYNC_MASTER":
            self.broker.require_replicas(1, self.config["rocketmq.syncFlushTimeout"],
                                         self.config["rocketmq.haSlaveFallbehindMax"])

    def _role_changed(self, is_master):
        # a slave promoted registers as the master (brokerId 0): producers move their
        # sends to it at their next route refresh
        if is_master:
            self._sync_master()
        broker_id = self._id_for(is_master)
        if broker_id != self.broker_id:
            self.registrar.unregister()
            self.broker_id = broker_id
            self.registrar.register()

    # -- configuration -------------------------------------------------------------

    def update_settings(self, values):
        """Change the runtime settings C{values} (config key -> checked value, see
        L{broker_settings.convert}): they are written to the settings file first, then
        applied. Returns a Deferred firing once both are done (failing, with nothing
        changed, when the file could not be written)."""
        return self._settings_lock.run(self._update_settings, values)

    def _update_settings(self, values):
        updated = dict(self.updated_settings, **values)
        d = self.files.save(broker_settings.SETTINGS_FILE, broker_settings.to_file(updated))

        def written(_):
            self.updated_settings = updated
            self._apply_settings(values)

        return d.addCallback(written)

    def _apply_settings(self, values):
        self.settings.update(values)
        s = self.settings
        self.topic_table.auto_create_enabled = s["rocketmq.autoCreateTopicEnable"]
        self.groups.auto_create_group = s["rocketmq.autoCreateSubscriptionGroup"]
        self.delay_levels = parse_delay_levels(s["rocketmq.messageDelayLevel"])
        self.transactions.timeout_ms = s["rocketmq.transactionTimeoutMs"]
        self.transactions.check_max = s["rocketmq.transactionCheckMax"]
        self.idle_timeout = s["rocketmq.serverChannelMaxIdleTimeSeconds"]

    def delay_ms(self, level):
        level = max(1, min(level, len(self.delay_levels)))
        return self.delay_levels[level - 1]

    def broker_config(self):
        """The broker's configuration as GET_BROKER_CONFIG shows it (RocketMQ names)."""
        c = self.config
        return {
            "brokerClusterName": self.cluster_name, "brokerName": self.broker_name,
            "brokerId": self.broker_id, "brokerIP1": (self.broker_addr or ":").rsplit(":", 1)[0],
            "listenPort": (self.broker_addr or ":0").rsplit(":", 1)[1],
            "namesrvAddr": c["rocketmq.namesrvAddr"] or "",
            "brokerRole": (c["rocketmq.brokerRole"].replace("SLAVE", "ASYNC_MASTER")
                           if self.broker.is_master else "SLAVE"),
            "flushDiskType": "SYNC_FLUSH" if c["store.flushLevel"] >= 2 else "ASYNC_FLUSH",
            "storePathRootDir": self.broker.files.path,
            "storePathCommitLog": os.path.join(self.broker.files.path, "commitlog"),
            "mappedFileSizeCommitLog": c["store.maxLogSize"],
            "maxMessageSize": c["store.maxMessageSize"],
            "fileReservedTime": c["store.maxDays"] * 24,
            "autoCreateTopicEnable": str(self.topic_table.auto_create_enabled).lower(),
            "autoCreateSubscriptionGroup": str(self.groups.auto_create_group).lower(),
            "defaultTopicQueueNums": self.topic_table.default_queue_nums,
            "messageDelayLevel": self.settings["rocketmq.messageDelayLevel"],
            "longPollingEnable": "true",
            "transactionTimeOut": self.transactions.timeout_ms,
            "transactionCheckMax": self.transactions.check_max,
            "serverChannelMaxIdleTimeSeconds": self.idle_timeout,
        }

    # -- what the protocol and the admin commands ask (the parts answer) -----------

    @property
    def data_version(self):
        """The topic table's data version (see L{TopicTable})."""
        return self.topic_table.data_version

    def topics_changed(self):
        """A topic was created, changed or deleted through this door; return a Deferred
        firing once the nameservers know (L{TopicTable.check})."""
        return self.topic_table.check()

    def topic_config_wrapper(self):
        return self.topic_table.wrapper()

    def ensure_topic(self, name, queues):
        """Return a Deferred firing with topic C{name}, created with C{queues} queues if missing."""
        return self.topic_table.ensure_topic(name, queues)

    def auto_create(self, name, default_topic, queue_nums):
        """Create an unknown topic a producer sends to, or return None when not allowed."""
        return self.topic_table.auto_create(name, default_topic, queue_nums)

    def group_config(self, group):
        return self.groups.group_config(group)

    def retry_max_times(self, group):
        return self.groups.retry_max_times(group)

    def set_group_config(self, cfg):
        """Create or update a subscription group (admin); Deferred."""
        return self.groups.set_group_config(cfg)

    def delete_group_config(self, name):
        self.groups.delete_group_config(name)

    def group_config_wrapper(self):
        return self.groups.wrapper(self.topic_table.data_version)

    def rewind_group(self, group, topic, positions):
        """Set the group's offsets on C{topic} and tell its online clients."""
        self.groups.rewind_group(group, topic, positions)

    def heartbeat(self, protocol, data):
        """Apply a heartbeat (see L{Groups.heartbeat}); Deferred."""
        return self.groups.heartbeat(protocol, data)

    def unregister_client(self, client_id, producer_group, consumer_group):
        self.groups.unregister_client(client_id, producer_group, consumer_group)

    def connection_lost(self, protocol):
        self.groups.connection_lost(protocol)

    def raw_record_at(self, offset):
        """Return the stored message record at C{offset} (STOREHOST patched), or None."""
        return self.records.raw_record_at(offset)

    def record_at(self, offset):
        return self.records.record_at(offset)

    def query_by_key(self, topic, key, max_num, begin, end):
        """Return (body, last index ts, last index offset) of messages with key C{key}."""
        return self.records.query_by_key(topic, key, max_num, begin, end)


def make_factory(broker, config, reactor):
    """Return the RocketMQ broker factory for C{broker}."""
    return BrokerDoor(broker, config, reactor)
