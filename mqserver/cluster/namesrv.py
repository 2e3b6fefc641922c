"""The nameserver's route table (RocketMQ's RouteInfoManager), as pure state.

Brokers register their topics here; clients ask which brokers serve a topic. No wire
knowledge: ``protocols/remoting/namesrv.py`` turns requests into calls on L{RouteTable}.
A broker re-registers every 30 s; L{RouteTable.start} scans every 10 s and drops brokers
silent for longer than the expiry (120 s), as RocketMQ's nameserver does.
"""

from dataclasses import dataclass, field

from twisted.logger import Logger

PERM_WRITE = 2
PERM_READ = 4


@dataclass(slots=True)
class QueueData:
    """One broker's share of a topic."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int = 6
    topic_sys_flag: int = 0

    def to_json(self):
        return {
            "brokerName": self.broker_name,
            "perm": self.perm,
            "readQueueNums": self.read_queue_nums,
            "topicSysFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queue_nums,
        }


@dataclass(slots=True)
class BrokerData:
    """A broker name: its cluster and its addresses by broker id (0 = master)."""

    cluster: str
    broker_name: str
    addrs: dict = field(default_factory=dict)

    def to_json(self):
        return {
            "brokerAddrs": {str(k): v for k, v in sorted(self.addrs.items())},
            "brokerName": self.broker_name,
            "cluster": self.cluster,
        }


@dataclass(slots=True)
class LiveBroker:
    """Liveness of one broker address."""

    last_update_ms: int
    data_version: dict
    ha_server_addr: str = ""
    connection: object = None


class RouteTable:
    """Topics, brokers, clusters, broker liveness and the KV config of a nameserver.

    @ivar topics: topic -> {broker name: L{QueueData}}.
    @ivar brokers: broker name -> L{BrokerData}.
    @ivar clusters: cluster name -> set of broker names.
    @ivar live: broker address -> L{LiveBroker}.
    @ivar kv: namespace -> {key: value}.
    """

    log = Logger()

    def __init__(self, reactor, expire_ms=120_000, scan_interval_ms=10_000):
        self._reactor = reactor
        self.expire_ms = expire_ms
        self.scan_interval_ms = scan_interval_ms
        self.topics = {}
        self.brokers = {}
        self.clusters = {}
        self.live = {}
        self.kv = {}
        self._scan_call = None

    def now_ms(self):
        return int(self._reactor.seconds() * 1000)

    # -- life cycle ------------------------------------------------------------------

    def start(self):
        """Start the periodic scan for silent brokers."""
        self._schedule()

    def stop(self):
        """Stop the scan."""
        if self._scan_call is not None and self._scan_call.active():
            self._scan_call.cancel()
        self._scan_call = None

    def _schedule(self):
        self._scan_call = self._reactor.callLater(self.scan_interval_ms / 1000.0, self._scan)

    def _scan(self):
        self.scan()
        self._schedule()

    def scan(self):
        """Drop every broker whose last registration is older than the expiry."""
        now = self.now_ms()
        for addr, live in list(self.live.items()):
            if now - live.last_update_ms > self.expire_ms:
                self.remove_address(addr, f"expired, silent for {now - live.last_update_ms} ms", warn=True)

    # -- brokers ---------------------------------------------------------------------

    def register_broker(self, cluster, broker_name, broker_addr, broker_id, topics,
                        data_version=None, ha_server_addr="", connection=None):
        """Register (or refresh) a broker and, for a master, its topic table.

        @param topics: topic -> dict with readQueueNums, writeQueueNums, perm,
            topicSysFlag (RocketMQ TopicConfig fields), or None to keep the known ones.
        @return: C{(master_addr, master_ha_addr)} for a slave, C{("", "")} for a master.
        """
        self.clusters.setdefault(cluster, set()).add(broker_name)
        bd = self.brokers.get(broker_name)
        if bd is None:
            bd = self.brokers[broker_name] = BrokerData(cluster, broker_name)
        bd.cluster = cluster
        # One address holds one id: a restarted broker may come back with another role.
        for bid, addr in list(bd.addrs.items()):
            if addr == broker_addr and bid != broker_id:
                del bd.addrs[bid]
        first = broker_addr not in self.live
        old_addr = bd.addrs.get(broker_id)
        if old_addr is not None and old_addr != broker_addr:
            self.log.info("cluster {cluster} broker {name} id {id} address changed from {old} to {addr}",
                          cluster=cluster, name=broker_name, id=broker_id, old=old_addr, addr=broker_addr)
        bd.addrs[broker_id] = broker_addr
        old = self.live.get(broker_addr)
        changed = first or old is None or old.data_version != (data_version or {})
        self.live[broker_addr] = LiveBroker(self.now_ms(), dict(data_version or {}), ha_server_addr, connection)
        if broker_id == 0 and topics is not None and changed:
            for queues in self.topics.values():
                queues.pop(broker_name, None)
            for name, tc in topics.items():
                self.topics.setdefault(name, {})[broker_name] = QueueData(
                    broker_name,
                    int(tc.get("readQueueNums", 0)),
                    int(tc.get("writeQueueNums", 0)),
                    int(tc.get("perm", 6)),
                    int(tc.get("topicSysFlag", 0)),
                )
            self._drop_empty_topics()
        if first:
            self.log.info("broker {name} ({addr}, id {id}) registered in cluster {cluster}",
                          name=broker_name, addr=broker_addr, id=broker_id, cluster=cluster)
        if broker_id != 0:
            master = bd.addrs.get(0, "")
            master_live = self.live.get(master)
            return master, master_live.ha_server_addr if master_live else ""
        return "", ""

    def touch(self, broker_addr, data_version=None):
        """Refresh a broker's liveness; return True when its data version changed."""
        live = self.live.get(broker_addr)
        if live is None:
            return True
        live.last_update_ms = self.now_ms()
        return data_version is not None and data_version != live.data_version

    def data_version(self, broker_addr):
        """Return the data version last registered by C{broker_addr}, or None."""
        live = self.live.get(broker_addr)
        return live.data_version if live else None

    def unregister_broker(self, cluster, broker_name, broker_addr, broker_id):
        """Remove one broker address; the broker name goes when it has none left."""
        known = self.live.pop(broker_addr, None) is not None
        bd = self.brokers.get(broker_name)
        if bd is not None:
            if bd.addrs.get(broker_id) == broker_addr:
                del bd.addrs[broker_id]
                known = True
            if not bd.addrs:
                self._remove_name(broker_name)
        if known:
            self.log.info("broker {name} ({addr}, id {id}) of cluster {cluster} unregistered",
                          name=broker_name, addr=broker_addr, id=broker_id, cluster=cluster)
        else:
            self.log.info("unregistering broker {name} ({addr}) of cluster {cluster}: not registered",
                          name=broker_name, addr=broker_addr, cluster=cluster)

    def remove_address(self, broker_addr, why="removed", warn=False):
        """Forget an address (expired, or its registering connection closed), saying
        C{why} in the log."""
        self.live.pop(broker_addr, None)
        for name, bd in list(self.brokers.items()):
            for bid, addr in list(bd.addrs.items()):
                if addr == broker_addr:
                    del bd.addrs[bid]
                    emit = self.log.warn if warn else self.log.info
                    emit("broker {name} ({addr}, id {id}) of cluster {cluster} dropped: {why}",
                         name=name, addr=addr, id=bid, cluster=bd.cluster, why=why)
            if not bd.addrs:
                self._remove_name(name)

    def connection_lost(self, connection):
        """Drop the brokers that registered over C{connection}."""
        for addr, live in list(self.live.items()):
            if live.connection is connection:
                self.remove_address(addr, "its connection closed")

    def _remove_name(self, name):
        bd = self.brokers.pop(name, None)
        if bd is not None:
            names = self.clusters.get(bd.cluster)
            if names is not None:
                names.discard(name)
                if not names:
                    del self.clusters[bd.cluster]
        for queues in self.topics.values():
            queues.pop(name, None)
        self._drop_empty_topics()

    def _drop_empty_topics(self):
        for t in [t for t, q in self.topics.items() if not q]:
            del self.topics[t]

    # -- queries ---------------------------------------------------------------------

    def route(self, topic):
        """Return the TopicRouteData dict of C{topic}, or None when no known broker has it."""
        queues = self.topics.get(topic)
        if not queues:
            return None
        brokers = [self.brokers[n] for n in sorted(queues) if n in self.brokers]
        if not brokers:
            return None
        route = {
            "brokerDatas": [b.to_json() for b in brokers],
            "filterServerTable": {},
            "queueDatas": [queues[b.broker_name].to_json() for b in brokers],
        }
        order = self.kv.get("ORDER_TOPIC_CONFIG", {}).get(topic)
        if order:
            route["orderTopicConf"] = order
        return route

    def cluster_info(self):
        """Return the ClusterInfo dict (brokerAddrTable, clusterAddrTable)."""
        return {
            "brokerAddrTable": {n: b.to_json() for n, b in sorted(self.brokers.items())},
            "clusterAddrTable": {c: sorted(ns) for c, ns in sorted(self.clusters.items())},
        }

    def topic_list(self, cluster=None):
        """Return the known topic names (of one cluster when C{cluster} is given)."""
        if cluster is None:
            return sorted(self.topics)
        names = self.clusters.get(cluster, set())
        return sorted(t for t, q in self.topics.items() if names & set(q))

    def delete_topic(self, topic, cluster=None):
        """Forget C{topic} (only its queues on C{cluster}'s brokers when given)."""
        if cluster is None:
            self.topics.pop(topic, None)
            return
        for name in self.clusters.get(cluster, ()):
            self.topics.get(topic, {}).pop(name, None)
        self._drop_empty_topics()

    def wipe_write_perm(self, broker_name, add=False):
        """Clear (or with C{add} set) the write bit of every queue of C{broker_name};
        return how many topics changed."""
        n = 0
        for queues in self.topics.values():
            qd = queues.get(broker_name)
            if qd is not None:
                qd.perm = (qd.perm | PERM_WRITE) if add else (qd.perm & ~PERM_WRITE)
                n += 1
        return n

    # -- KV config -------------------------------------------------------------------

    def put_kv(self, namespace, key, value):
        self.kv.setdefault(namespace, {})[key] = value

    def get_kv(self, namespace, key):
        return self.kv.get(namespace, {}).get(key)

    def delete_kv(self, namespace, key):
        ns = self.kv.get(namespace)
        if ns is not None:
            ns.pop(key, None)
            if not ns:
                del self.kv[namespace]

    def kv_list(self, namespace):
        return dict(self.kv.get(namespace, {}))
