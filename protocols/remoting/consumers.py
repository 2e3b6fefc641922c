"""Consumer groups as the broker sees them: clients from heartbeats, their
subscriptions, queue locks for orderly consumers, and subscription-group configs.

Connection-bound state only (nothing here is durable except the subscription-group
configs, which L{protocols.remoting.configfiles} writes to subscriptionGroup.json).
"""

from dataclasses import dataclass, field

from mqserver.message import java_string_hash

LOCK_MAX_LIVE_MS = 60_000
CLIENT_EXPIRE_MS = 120_000


def parse_subscription(expression):
    """Return C{(tags, codes)} of a tag expression; C{(None, None)} for ``*``/empty.

    Hash codes are recomputed here: the C++ client's codeSet is garbage.
    """
    expression = (expression or "").strip()
    if not expression or expression == "*":
        return None, None
    tags = [t.strip() for t in expression.split("||") if t.strip()]
    if not tags:
        return None, None
    return set(tags), {java_string_hash(t) for t in tags}


@dataclass
class ConsumerClient:
    """One client of a group, as its last heartbeat described it."""

    client_id: str
    connection: object
    consume_type: object = None
    message_model: object = None
    consume_from_where: object = None
    last_heartbeat_ms: int = 0
    # topic -> (subString, subVersion)
    subscriptions: dict = field(default_factory=dict)


def default_group_config(name, retry_max_times=16):
    """Return RocketMQ's default SubscriptionGroupConfig for C{name}."""
    return {
        "groupName": name, "consumeEnable": True, "consumeFromMinEnable": True,
        "consumeBroadcastEnable": True, "retryQueueNums": 1, "retryMaxTimes": retry_max_times,
        "brokerId": 0, "whichBrokerWhenConsumeSlowly": 1, "notifyConsumerIdsChangedEnable": True,
    }


class ConsumerManager:
    """Groups, their clients, subscriptions and queue locks.

    @ivar groups: group -> {client id: L{ConsumerClient}}.
    @ivar producers: group -> {client id: connection}.
    @ivar locks: (group, topic, queue id) -> (client id, last lock ms).
    @ivar group_configs: group -> SubscriptionGroupConfig dict.
    """

    def __init__(self, now_ms):
        self.now_ms = now_ms
        self.groups = {}
        self.producers = {}
        self.locks = {}
        self.group_configs = {}
        self.changed_configs = False

    # -- subscription groups -----------------------------------------------------------

    def ensure_group(self, name, retry_max_times):
        """Return the config of C{name}, creating the default one when missing."""
        cfg = self.group_configs.get(name)
        if cfg is None:
            cfg = self.group_configs[name] = default_group_config(name, retry_max_times)
            self.changed_configs = True
        return cfg

    def set_group_config(self, cfg):
        self.group_configs[cfg["groupName"]] = cfg
        self.changed_configs = True

    def delete_group_config(self, name):
        if self.group_configs.pop(name, None) is not None:
            self.changed_configs = True

    # -- heartbeats ----------------------------------------------------------------------

    def heartbeat(self, connection, data):
        """Apply a HeartbeatData dict; return the groups whose client set changed."""
        client_id = data.get("clientID") or ""
        now = self.now_ms()
        changed = []
        for cd in data.get("consumerDataSet") or []:
            group = cd.get("groupName")
            if not group:
                continue
            clients = self.groups.setdefault(group, {})
            old = clients.get(client_id)
            subs = {}
            for sd in cd.get("subscriptionDataSet") or []:
                topic = sd.get("topic")
                if topic:
                    subs[topic] = (sd.get("subString") or "*", int(sd.get("subVersion") or 0))
            clients[client_id] = ConsumerClient(
                client_id, connection, cd.get("consumeType"), cd.get("messageModel"),
                cd.get("consumeFromWhere"), now, subs,
            )
            if old is None or old.connection is not connection:
                changed.append(group)
        for pd in data.get("producerDataSet") or []:
            group = pd.get("groupName")
            if group:
                self.producers.setdefault(group, {})[client_id] = connection
        return changed

    def unregister(self, client_id, producer_group, consumer_group):
        """Remove a client; return the consumer groups that changed."""
        changed = []
        if producer_group:
            self.producers.get(producer_group, {}).pop(client_id, None)
        if consumer_group and self.groups.get(consumer_group, {}).pop(client_id, None) is not None:
            changed.append(consumer_group)
            if not self.groups[consumer_group]:
                del self.groups[consumer_group]
        return changed

    def connection_lost(self, connection):
        """Remove every client of C{connection}; return the consumer groups that changed."""
        changed = []
        for group, clients in list(self.groups.items()):
            for cid, c in list(clients.items()):
                if c.connection is connection:
                    del clients[cid]
                    changed.append(group)
            if not clients:
                del self.groups[group]
        for clients in self.producers.values():
            for cid, conn in list(clients.items()):
                if conn is connection:
                    del clients[cid]
        return sorted(set(changed))

    def expire(self):
        """Drop clients silent for 120 s; return the consumer groups that changed."""
        now = self.now_ms()
        changed = []
        for group, clients in list(self.groups.items()):
            for cid, c in list(clients.items()):
                if now - c.last_heartbeat_ms > CLIENT_EXPIRE_MS:
                    del clients[cid]
                    changed.append(group)
            if not clients:
                del self.groups[group]
        return sorted(set(changed))

    def client_ids(self, group):
        return sorted(self.groups.get(group, {}))

    def connections(self, group):
        return [c.connection for c in self.groups.get(group, {}).values()]

    def subscription(self, group, topic):
        """Return the (subString, subVersion) a heartbeat gave for (group, topic), or None."""
        best = None
        for c in self.groups.get(group, {}).values():
            sub = c.subscriptions.get(topic)
            if sub is not None and (best is None or sub[1] > best[1]):
                best = sub
        return best

    # -- locks ---------------------------------------------------------------------------

    def lock(self, group, client_id, queues):
        """Lock C{queues} ((topic, queue id) pairs) for C{client_id}; return those granted."""
        now = self.now_ms()
        granted = []
        for topic, qid in queues:
            key = (group, topic, qid)
            holder = self.locks.get(key)
            if holder is None or holder[0] == client_id or now - holder[1] > LOCK_MAX_LIVE_MS:
                self.locks[key] = (client_id, now)
                granted.append((topic, qid))
        return granted

    def unlock(self, group, client_id, queues):
        for topic, qid in queues:
            key = (group, topic, qid)
            holder = self.locks.get(key)
            if holder is not None and holder[0] == client_id:
                del self.locks[key]
