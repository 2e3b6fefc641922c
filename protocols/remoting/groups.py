"""The broker door's consumer groups: their configs, their clients, their offsets."""

import json

from twisted.internet import defer

from mqserver.errors import StoreError

from protocols.remoting import codes
from protocols.remoting.admin_stats import mq_map
from protocols.remoting.consumers import ConsumerManager
from protocols.remoting.stats import group_consumer
from protocols.remoting.topicview import RETRY_PREFIX, valid_group

GROUP_FILE = "subscriptionGroup.json"


class Groups:
    """Owns the subscription groups as the broker door sees them: their configs (auto
    created, set and deleted by admins, saved to ``subscriptionGroup.json``), the
    clients' heartbeats and the notifications they get (consumer ids changed, offsets
    reset), and the retry topics groups need.

    @ivar consumers: the L{ConsumerManager} of the connected clients and group configs.
    """

    def __init__(self, broker, files, topics, *, broker_name, auto_create, max_reconsume):
        """
        @param files: the L{protocols.remoting.topic_table.ConfigFiles} the group file
            is written with.
        @param topics: the L{protocols.remoting.topic_table.TopicTable} (retry topics).
        @param auto_create: C{rocketmq.autoCreateSubscriptionGroup}.
        @param max_reconsume: C{rocketmq.maxReconsumeTimes}, a new group's retry limit.
        """
        self.broker = broker
        self._files = files
        self._topics = topics
        self.broker_name = broker_name
        self.auto_create_group = auto_create
        self.max_reconsume = max_reconsume
        self.consumers = ConsumerManager(broker.now_ms)

    def load(self):
        """Load the saved group configs (the store is open)."""
        data = self.broker.files.read_json(GROUP_FILE) or {}
        for name, cfg in (data.get("subscriptionGroupTable") or {}).items():
            self.consumers.group_configs[name] = cfg

    def save(self, data_version, sync=False):
        """Rewrite the group file if a config changed since the last save."""
        if not self.consumers.changed_configs:
            return
        self.consumers.changed_configs = False
        written = self._files.write(GROUP_FILE, self.wrapper(data_version), sync)
        if written is not None:
            written.addErrback(self._unsaved)

    def _unsaved(self, failure):
        failure.trap(StoreError)  # counted and logged as a disk error
        self.consumers.changed_configs = True  # the next save (the tick) tries again

    # -- configs -------------------------------------------------------------------

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
            return self._topics.ensure_topic(RETRY_PREFIX + cfg["groupName"], 1)
        return defer.succeed(None)

    def delete_group_config(self, name):
        self.consumers.delete_group_config(name)

    def wrapper(self, data_version):
        """The SubscriptionGroupWrapper: every group's config and C{data_version}."""
        return {"subscriptionGroupTable": dict(sorted(self.consumers.group_configs.items())),
                "dataVersion": dict(data_version)}

    # -- clients -------------------------------------------------------------------

    def heartbeat(self, protocol, data):
        """Apply a heartbeat; create retry topics; tell groups whose members changed."""
        ds = []
        for cd in data.get("consumerDataSet") or []:
            group = cd.get("groupName")
            if group and self.group_config(group) is not None and self.broker.is_master:
                ds.append(self._topics.ensure_topic(RETRY_PREFIX + group, 1))
        self._notify(self.consumers.heartbeat(protocol, data))
        return defer.gatherResults(ds, consumeErrors=True) if ds else defer.succeed(None)

    def unregister_client(self, client_id, producer_group, consumer_group):
        self._notify(self.consumers.unregister(client_id, producer_group, consumer_group))

    def connection_lost(self, protocol):
        self._notify(self.consumers.connection_lost(protocol))

    def expire_clients(self):
        """Forget clients whose heartbeats stopped, and tell their groups."""
        self._notify(self.consumers.expire())

    def _notify(self, groups):
        for group in groups:
            cfg = self.consumers.group_configs.get(group) or {}
            if not cfg.get("notifyConsumerIdsChangedEnable", True):
                continue
            for conn in self.consumers.connections(group):
                conn.send_oneway(codes.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group})

    # -- offsets -------------------------------------------------------------------

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


def reset_offset_body(broker_name, topic, positions, for_c):
    """The body of RESET_CONSUMER_CLIENT_OFFSET: ResetOffsetBodyForC (a list) for C++
    clients, ResetOffsetBody (a map keyed by MessageQueue, as fastjson writes it) for the others."""
    mqs = [({"brokerName": broker_name, "queueId": q, "topic": topic}, o)
           for q, o in sorted(positions.items())]
    if for_c:
        return json.dumps({"offsetTable": [dict(mq, offset=o) for mq, o in mqs]},
                          separators=(",", ":")).encode()
    pairs = [((topic, broker_name, q), o) for q, o in sorted(positions.items())]
    return ('{"offsetTable":' + mq_map(pairs) + "}").encode()
