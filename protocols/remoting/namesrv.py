"""The nameserver wire protocol: remoting requests onto a L{RouteTable}.

As RocketMQ 4.9.4's DefaultRequestProcessor (codes 100-106, 206, 216, 219, 224, 205/327, 322).
"""

import struct
import zlib

from twisted.internet.protocol import Factory

from mqserver.cluster.namesrv import RouteTable
from mqserver.wiretap import OFF

from protocols.remoting import codes
from protocols.remoting.server import (
    BadRequest, RemotingProtocol, bool_field, error, field, int_field, json_body, ok,
)
from protocols.remoting.inflate import inflate
from protocols.remoting.tolerant_json import loads_object, loads_tolerant
from protocols.remoting.wire import DEFAULT_MAX_FRAME

#: A compressed RegisterBrokerBody inflates to at most what an uncompressed one can hold.
MAX_REGISTER_BODY = DEFAULT_MAX_FRAME


def decode_register_body(body, compressed):
    """Return C{(topic configs, data version)} from a RegisterBrokerBody."""
    if not body:
        return {}, {}
    if not compressed:
        obj = loads_object(body)
        wrapper = obj.get("topicConfigSerializeWrapper") or {}
        if not isinstance(wrapper, dict):
            raise ValueError("topicConfigSerializeWrapper is not an object")
        topics = wrapper.get("topicConfigTable") or {}
        if not isinstance(topics, dict) or not all(isinstance(t, dict) for t in topics.values()):
            raise ValueError("topicConfigTable is not an object of objects")
        return topics, wrapper.get("dataVersion") or {}
    raw = inflate(body, MAX_REGISTER_BODY)
    pos = 0

    def chunk():
        nonlocal pos
        (n,) = struct.unpack_from(">i", raw, pos)
        pos += 4
        if n < 0 or pos + n > len(raw):
            raise ValueError(f"bad length {n} at {pos - 4}")
        data = raw[pos:pos + n]
        pos += n
        return data

    version = loads_tolerant(chunk())
    (count,) = struct.unpack_from(">i", raw, pos)
    pos += 4
    topics = {}
    for _ in range(count):
        parts = chunk().decode("utf-8").split(" ")
        if len(parts) < 4:
            raise ValueError(f"bad topic config {' '.join(parts)!r}")
        name, read, write, perm = parts[0], int(parts[1]), int(parts[2]), int(parts[3])
        topics[name] = {"topicName": name, "readQueueNums": read, "writeQueueNums": write, "perm": perm}
    return topics, version


class NamesrvProtocol(RemotingProtocol):
    """One connection to the nameserver (client, admin tool or broker)."""

    door_name = "namesrv"

    handlers = {
        codes.PUT_KV_CONFIG: "put_kv",
        codes.GET_KV_CONFIG: "get_kv",
        codes.DELETE_KV_CONFIG: "delete_kv",
        codes.GET_KVLIST_BY_NAMESPACE: "kv_list",
        codes.REGISTER_BROKER: "register_broker",
        codes.UNREGISTER_BROKER: "unregister_broker",
        codes.QUERY_DATA_VERSION: "query_data_version",
        codes.GET_ROUTEINFO_BY_TOPIC: "route",
        codes.GET_BROKER_CLUSTER_INFO: "cluster_info",
        codes.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: "topic_list",
        codes.GET_TOPICS_BY_CLUSTER: "topics_by_cluster",
        codes.DELETE_TOPIC_IN_NAMESRV: "delete_topic",
        codes.WIPE_WRITE_PERM_OF_BROKER: "wipe_write_perm",
        codes.ADD_WRITE_PERM_OF_BROKER: "add_write_perm",
        codes.GET_NAMESRV_CONFIG: "get_config",
    }

    def __init__(self, table):
        super().__init__()
        self.table = table

    def connectionLost(self, reason):
        super().connectionLost(reason)
        self.table.connection_lost(self)

    # -- KV ------------------------------------------------------------------------

    def put_kv(self, cmd):
        ns, key, value = field(cmd, "namespace"), field(cmd, "key"), field(cmd, "value")
        if not ns or not key:
            return error(cmd, codes.SYSTEM_ERROR, "namespace or key is null")
        self.table.put_kv(ns, key, value or "")
        return ok(cmd)

    def get_kv(self, cmd):
        ns, key = field(cmd, "namespace", ""), field(cmd, "key", "")
        value = self.table.get_kv(ns, key)
        if value is None:
            return error(cmd, codes.QUERY_NOT_FOUND, f"No config item, Namespace: {ns} Key: {key}")
        return ok(cmd, {"value": value})

    def delete_kv(self, cmd):
        self.table.delete_kv(field(cmd, "namespace", ""), field(cmd, "key", ""))
        return ok(cmd)

    def kv_list(self, cmd):
        ns = field(cmd, "namespace", "")
        table = self.table.kv_list(ns)
        if not table:
            return error(cmd, codes.QUERY_NOT_FOUND, f"No config item, Namespace: {ns}")
        return ok(cmd, body=json_body({"table": table}))

    # -- brokers -------------------------------------------------------------------

    def register_broker(self, cmd):
        crc = int_field(cmd, "bodyCrc32", 0)
        if crc and (zlib.crc32(cmd.body) & 0x7FFFFFFF) != crc:
            return error(cmd, codes.SYSTEM_ERROR, "crc32 not match")
        try:
            topics, version = decode_register_body(cmd.body, bool_field(cmd, "compressed"))
        except (ValueError, struct.error, zlib.error) as e:
            raise BadRequest(codes.SYSTEM_ERROR, f"bad register body: {e}") from None
        master, master_ha = self.table.register_broker(
            field(cmd, "clusterName", ""), field(cmd, "brokerName", ""), field(cmd, "brokerAddr", ""),
            int_field(cmd, "brokerId", 0), topics, version, field(cmd, "haServerAddr", ""), self,
        )
        order = self.table.kv_list("ORDER_TOPIC_CONFIG")
        return ok(cmd, {"masterAddr": master, "haServerAddr": master_ha},
                  body=json_body({"table": order}) if order else b"")

    def unregister_broker(self, cmd):
        self.table.unregister_broker(
            field(cmd, "clusterName", ""), field(cmd, "brokerName", ""),
            field(cmd, "brokerAddr", ""), int_field(cmd, "brokerId", 0),
        )
        return ok(cmd)

    def query_data_version(self, cmd):
        addr = field(cmd, "brokerAddr", "")
        try:
            version = loads_tolerant(cmd.body) if cmd.body else None
        except ValueError:
            version = None
        changed = self.table.touch(addr, version)
        stored = self.table.data_version(addr)
        return ok(cmd, {"changed": "true" if changed else "false"},
                  body=json_body(stored) if stored is not None else b"")

    # -- queries -------------------------------------------------------------------

    def route(self, cmd):
        topic = field(cmd, "topic", "")
        route = self.table.route(topic)
        if route is None:
            return error(cmd, codes.TOPIC_NOT_EXIST, f"No topic route info in name server for the topic: {topic}")
        return ok(cmd, body=json_body(route))

    def cluster_info(self, cmd):
        return ok(cmd, body=json_body(self.table.cluster_info()))

    def topic_list(self, cmd):
        return ok(cmd, body=json_body({"topicList": self.table.topic_list()}))

    def topics_by_cluster(self, cmd):
        return ok(cmd, body=json_body({"topicList": self.table.topic_list(field(cmd, "cluster", ""))}))

    def delete_topic(self, cmd):
        self.table.delete_topic(field(cmd, "topic", ""), field(cmd, "clusterName") or None)
        return ok(cmd)

    def wipe_write_perm(self, cmd):
        return ok(cmd, {"wipeTopicCount": self.table.wipe_write_perm(field(cmd, "brokerName", ""))})

    def add_write_perm(self, cmd):
        return ok(cmd, {"addTopicCount": self.table.wipe_write_perm(field(cmd, "brokerName", ""), add=True)})

    def get_config(self, cmd):
        # Java Properties text (key=value lines), as NamesrvController's configuration
        port = self.transport.getHost().port
        values = {"rocketmqHome": "", "productEnvName": "center", "clusterTest": "false",
                  "orderMessageEnable": "false", "listenPort": port,
                  "serverChannelMaxIdleTimeSeconds": 120,
                  "brokerExpireMs": self.table.expire_ms}
        return ok(cmd, body="".join(f"{k}={v}\n" for k, v in values.items()).encode())


class NamesrvFactory(Factory):
    """Builds L{NamesrvProtocol}s over one L{RouteTable}; starts and stops its scan.

    @ivar idle_timeout: seconds without input before a connection is closed (0: never).
    @ivar tap: the L{mqserver.wiretap.WireTap} of the broker embedding the nameserver
        (its connections look at fault rules), or one never active.
    """

    noisy = False
    tap = OFF

    def __init__(self, table, idle_timeout=0, clock=None):
        self.table = table
        self.idle_timeout = idle_timeout
        self.clock = clock

    def startFactory(self):
        self.table.start()

    def stopFactory(self):
        self.table.stop()

    def buildProtocol(self, addr):
        p = NamesrvProtocol(self.table)
        p.factory = self
        p.tap = self.tap
        return p


def make_table(config, reactor):
    """Return a L{RouteTable} with the expiry and scan interval of C{config}."""
    return RouteTable(reactor, config["rocketmq.brokerExpireMs"], config["rocketmq.scanIntervalMs"])
