"""The broker's answers to mqadmin's everyday requests (AdminBrokerProcessor), with the bodies the
4.9.4 broker sends: topic and consume stats, connections, broker config, who consumes a
topic, resetting a group's offsets by time, BrokerStatsData and the runtime info.

Maps keyed by a MessageQueue are written as fastjson writes them (an object as the key,
as fastjson writes them), so the Java admin tools read them back."""

import json


from protocols.remoting import codes
from protocols.remoting import stats as rstats
from protocols.remoting.consumers import parse_subscription
from protocols.remoting.server import bool_field, error, field, int_field, json_body, ok
from protocols.remoting.topicview import read_queues, rocket_attrs, write_queues

#: Request code -> handler name (merged into the broker protocol's dispatch table).
HANDLERS = {
    codes.GET_TOPIC_STATS_INFO: "topic_stats",
    codes.GET_CONSUME_STATS: "consume_stats",
    codes.GET_BROKER_CONSUME_STATS: "broker_consume_stats",
    codes.GET_CONSUMER_CONNECTION_LIST: "consumer_connections",
    codes.GET_PRODUCER_CONNECTION_LIST: "producer_connections",
    codes.GET_BROKER_CONFIG: "broker_config",
    codes.QUERY_TOPIC_CONSUME_BY_WHO: "consumed_by",
    codes.INVOKE_BROKER_TO_RESET_OFFSET: "reset_offset",
    codes.VIEW_BROKER_STATS_DATA: "stats",
    codes.GET_BROKER_RUNTIME_INFO: "runtime_info",
}
CONSUMER_NOT_ONLINE = 206


def _dumps(obj):
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def mq_map(pairs):
    """Return fastjson's text of a map keyed by MessageQueue: C{pairs} is a list of
    C{((topic, broker name, queue id), value)}."""
    items = []
    for (topic, broker_name, qid), value in pairs:
        key = _dumps({"brokerName": broker_name, "queueId": qid, "topic": topic})
        items.append(key + ":" + _dumps(value))
    return "{" + ",".join(items) + "}"


def subscription_data(topic, sub):
    """Return a SubscriptionData dict of (subString, subVersion) C{sub}."""
    expr, version = sub
    tags, hashes = parse_subscription(expr)
    return {"classFilterMode": False, "codeSet": sorted(hashes or ()),
            "expressionType": "TAG", "subString": expr or "*", "subVersion": version,
            "tagsSet": sorted(tags or ()), "topic": topic}


def _connection(conn, client_id):
    peer = conn.transport.getPeer() if conn.transport is not None else None
    addr = f"{getattr(peer, 'host', '')}:{getattr(peer, 'port', 0)}"
    return {"clientAddr": addr, "clientId": client_id,
            "language": getattr(conn, "client_language", "JAVA"),
            "version": getattr(conn, "client_version", codes.SERVER_VERSION)}


def consume_stats_text(pairs, tps):
    """fastjson's text of a ConsumeStats: C{pairs} as L{mq_map} takes them (OffsetWrapper
    dicts as values) and the consume TPS."""
    return '{"consumeTps":' + _dumps(tps) + ',"offsetTable":' + mq_map(pairs) + "}"


def properties_text(values):
    """Java's Properties text as MixAll.properties2String writes it: C{key=value} lines."""
    return "".join(f"{k}={v}\n" for k, v in values.items()).encode("utf-8")


class StatsHandlers:
    """Handlers mixed into L{protocols.remoting.broker_protocol.BrokerProtocol}."""

    def _mq(self, topic, qid):
        return (topic, self.door.broker_name, qid)

    def _store_ts_at(self, topic, qid, qoff):
        q = self.messages.find_queue(topic, qid)
        if q is None or not q.min_offset <= qoff < q.max_offset:
            return 0
        return self.messages.store_ts_at(q.entry(qoff)[0])

    def topic_stats(self, cmd):
        topic = field(cmd, "topic", "")
        t = self.broker.topic(topic)
        if t is None:
            return error(cmd, codes.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        pairs = []
        for qid in range(write_queues(t)):
            q = self.messages.find_queue(topic, qid)
            lo, hi = (q.min_offset, q.max_offset) if q is not None else (0, 0)
            ts = self._store_ts_at(topic, qid, hi - 1) if hi > 0 else 0
            pairs.append((self._mq(topic, qid),
                          {"lastUpdateTimestamp": ts, "maxOffset": hi, "minOffset": lo}))
        return ok(cmd, body=('{"offsetTable":' + mq_map(pairs) + "}").encode("utf-8"))

    def consume_stats(self, cmd):
        group = field(cmd, "consumerGroup", "")
        topic = field(cmd, "topic", "")
        if topic:
            topics = [topic]
        else:
            topics = sorted(t for t, g in self.broker.offsets.table if g == group)
        counts = self.broker.stats.counts()
        pairs, tps = [], 0.0
        for name in topics:
            progress = self._progress(group, name, read_queues, counts)
            if progress is not None:
                pairs += progress[0]
                tps += progress[1]
        return ok(cmd, body=consume_stats_text(pairs, tps).encode("utf-8"))

    def broker_consume_stats(self, cmd):
        """GET_BROKER_CONSUME_STATS (mqadmin brokerConsumeStats): ConsumeStatsList, one
        ConsumeStats per topic each subscription group has offsets on (only ordered
        topics when C{isOrder}), over the write queues, as 4.9.4's
        fetchAllConsumeStatsInBroker answers; C{totalDiff} sums their backlogs."""
        only_ordered = bool_field(cmd, "isOrder")
        counts = self.broker.stats.counts()
        by_group = {}
        for topic, group in self.broker.offsets.table:
            by_group.setdefault(group, []).append(topic)
        entries, total_diff = [], 0
        for group in sorted(self.door.consumers.group_configs):
            stats = []
            for name in sorted(by_group.get(group, ())):
                t = self.broker.topic(name)
                if t is None or only_ordered and not rocket_attrs(t).get("order", False):
                    continue
                progress = self._progress(group, name, write_queues, counts)
                if progress is None:
                    continue
                pairs, tps = progress
                total_diff += sum(w["brokerOffset"] - w["consumerOffset"] for _, w in pairs)
                stats.append(consume_stats_text(pairs, tps))
            entries.append("{" + _dumps(group) + ":[" + ",".join(stats) + "]}")
        body = ('{"brokerAddr":' + _dumps(self.door.broker_addr) + ',"consumeStatsList":['
                + ",".join(entries) + '],"totalDiff":' + _dumps(total_diff) + "}")
        return ok(cmd, body=body.encode("utf-8"))

    def _progress(self, group, name, queues, counts):
        """Return C{(pairs, tps)} of C{group} on topic C{name}: C{(message queue,
        OffsetWrapper)} for each queue id below C{queues(topic)} and the group's pull TPS
        there; or None when the topic is gone, or the group is online without
        subscribing to it (4.9.4 leaves those out)."""
        t = self.broker.topic(name)
        if t is None:
            return None
        consumers = self.door.consumers
        if consumers.groups.get(group) and consumers.subscription(group, name) is None:
            return None
        committed = self.broker.offsets.table.get((name, group), {})
        pairs = []
        for qid in range(queues(t)):
            q = self.messages.find_queue(name, qid)
            broker_off = q.max_offset if q is not None else 0
            consumer_off = max(0, committed.get(qid, 0))
            last = self._store_ts_at(name, qid, consumer_off - 1) if consumer_off > 0 else 0
            pairs.append((self._mq(name, qid), {"brokerOffset": broker_off,
                                                "consumerOffset": consumer_off,
                                                "lastTimestamp": last}))
        return pairs, self.broker.stats.window(("get", f"{name}@{group}"), 0, 60, counts)[1]

    def consumer_connections(self, cmd):
        group = field(cmd, "consumerGroup", "")
        clients = self.door.consumers.groups.get(group)
        if not clients:
            return error(cmd, CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online")
        first = next(iter(clients.values()))
        subs = {}
        for c in clients.values():
            for topic, sub in c.subscriptions.items():
                subs[topic] = subscription_data(topic, sub)
        conns = [_connection(c.connection, cid) for cid, c in sorted(clients.items())]
        body = {"connectionSet": conns,
                "consumeFromWhere": first.consume_from_where or "CONSUME_FROM_LAST_OFFSET",
                "consumeType": first.consume_type or "CONSUME_PASSIVELY",
                "messageModel": first.message_model or "CLUSTERING",
                "subscriptionTable": subs}
        return ok(cmd, body=json_body(body))

    def producer_connections(self, cmd):
        group = field(cmd, "producerGroup", "")
        clients = self.door.consumers.producers.get(group)
        if clients is None:
            return error(cmd, codes.SYSTEM_ERROR, f"the producer group[{group}] not exist")
        conns = [_connection(conn, cid) for cid, conn in sorted(clients.items())]
        return ok(cmd, body=json_body({"connectionSet": conns}))

    def broker_config(self, cmd):
        return ok(cmd, {"version": _dumps(self.door.data_version)},
                  body=properties_text(self.door.broker_config()))

    def consumed_by(self, cmd):
        topic = field(cmd, "topic", "")
        groups = {g for g, clients in self.door.consumers.groups.items()
                  if any(topic in c.subscriptions for c in clients.values())}
        groups |= {g for t, g in self.broker.offsets.table if t == topic}
        return ok(cmd, body=json_body({"groupList": sorted(groups)}))

    def reset_offset(self, cmd):
        topic = field(cmd, "topic", "")
        group = field(cmd, "group", "")
        ts = int_field(cmd, "timestamp", -1)
        force = bool_field(cmd, "isForce")
        t = self.broker.topic(topic)
        if t is None:
            return error(cmd, codes.SYSTEM_ERROR, "[reset-offset] reset offset failed, "
                                                  f"no topic in this broker. topic={topic}")
        committed = self.broker.offsets.table.get((topic, group))
        if committed is None:
            return error(cmd, codes.SYSTEM_ERROR, f"THe consumer group <{group}> not exist")
        stats = self.broker.stats
        table = {}
        for qid in range(write_queues(t)):
            if ts == -1:
                q = self.messages.find_queue(topic, qid)
                target = q.max_offset if q is not None else 0
            else:
                target = stats.offset_at_time(topic, qid, ts)
            current = committed.get(qid, 0)
            table[qid] = target if force or target < current else current
        if not self.door.consumers.groups.get(group):
            return error(cmd, CONSUMER_NOT_ONLINE,
                         f"Consumer not online, so can not reset offset, Group: {group} "
                         f"Topic: {topic} Timestamp: {ts}")
        self.door.rewind_group(group, topic, table)
        pairs = [(self._mq(topic, q), o) for q, o in sorted(table.items())]
        return ok(cmd, body=('{"offsetTable":' + mq_map(pairs) + "}").encode("utf-8"))

    def stats(self, cmd):
        name, key = field(cmd, "statsName", ""), field(cmd, "statsKey", "")
        data = rstats.stats_data(self.broker.stats, name, key)
        if data is None:
            return error(cmd, codes.SYSTEM_ERROR, f"The stats <{name}> <{key}> not exist")
        return ok(cmd, body=json_body(data))

    def runtime_info(self, cmd):
        table = rstats.runtime_info(self.broker.stats, self.broker.store_stats, codes.SERVER_VERSION, "V4_9_4")
        return ok(cmd, body=json_body({"table": table}))
