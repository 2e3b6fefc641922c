"""Random and mutated frames for every front door, for ``bench/fuzz.py`` and the short
hypothesis run in ``tests/integration/test_fuzz.py``.

``conversation(door, rng)`` returns the byte strings one connection sends: mostly valid
requests of that door's protocol (from the codecs' own client-side encoders) of which
some are mutated: bytes flipped, length and header-length fields set to extremes, JSON
garbled or nested deeply, compressed flags set on garbage, truncated or duplicated.
Everything is derived from ``rng`` (a ``random.Random``), so a seed replays a run.
"""

import json
import socket
import struct
import time
import urllib.request
import zlib

from protocols.nsq.compress import DeflateCompressor, SnappyCompressor
from protocols.nsq.frames import encode_command, encode_mpub
from protocols.remoting import codes
from protocols.remoting.codec import encode as encode_remoting
from protocols.remoting.messages import RemotingCommand
from protocols.remoting.props import encode_batch_body
from protocols.smss import client_codec as cc
from protocols.smss.client import SmssClient
from protocols.smss.payload import encode_payload
from tests.support.remoting_client import RemotingClient

DOORS = ("smss", "namesrv", "broker", "nsqd_tcp", "nsqd_http", "lookupd_tcp", "lookupd_http",
         "msgout", "console", "admin", "metrics")
#: The ServerProcess port name of each door.
PORT_NAMES = {
    "smss": "SmssFactory", "namesrv": "NamesrvFactory", "broker": "BrokerDoor",
    "nsqd_tcp": "NsqdFactory", "nsqd_http": "NsqdHttpSite",
    "lookupd_tcp": "LookupdFactory", "lookupd_http": "LookupdHttpSite",
    "msgout": "MsgoutSite", "console": "ConsoleFactory", "admin": "AdminSite", "metrics": "MetricsSite",
}
# A small pool keeps the fuzzer from creating a topic per frame.
TOPICS = ["fz", "fz2", "fz.3", "fz_4", "%RETRY%fzg", "TBW102"]
EXTREME_U32 = [0, 1, 3, 4, 5, 8, 9, 20, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFF, 0x1000000]
EXTREME_INTS = [0, -1, 1, 2**31 - 1, -2**31, 2**63 - 1, -2**63, 2**64, 10**30]


def _topic(rng):
    return rng.choice(TOPICS)


def _make_bodies():
    import random

    rng = random.Random(0)
    out = [b"", b"x", bytes(100), bytes(2048), b"[" * 5000, b"{" * 1200,
           json.dumps({"k": 1, "v": "x" * 40}).encode(), b"\xff" * 300]
    out += [rng.randbytes(rng.randrange(1, 64)) for _ in range(16)]
    # compressed: a few hundred bytes inflating to up to 1 MiB, and garbage
    out += [zlib.compress(bytes(n)) for n in (10, 4096, 1 << 18, 1 << 20)]
    out += [zlib.compress(b"ab" * 1000)[:-5], b"x\x9c" + rng.randbytes(40)]
    return out


# Expensive bodies are made once: the fuzzer's own speed limits how much it sends.
_BODIES = _make_bodies()
_DEEP = [b"[" * 1000, b"[" * 100_000, b'{"a":' * 20_000]


def _body(rng):
    return rng.choice(_BODIES)


def _json_value(rng, depth=0):
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 0:
        return rng.choice(EXTREME_INTS)
    if kind == 1:
        return rng.random() * 10 ** rng.randrange(-5, 30)
    if kind == 2:
        return "".join(chr(rng.randrange(0, 0x3000)) for _ in range(rng.randrange(10)))
    if kind == 3:
        return rng.choice([None, True, False])
    if kind == 4:
        return _topic(rng)
    if kind == 5:
        return [_json_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {str(_json_value(rng, depth + 1))[:20]: _json_value(rng, depth + 1) for _ in range(rng.randrange(4))}


# -- mutations ------------------------------------------------------------------------------


def flip(rng, data):
    if not data:
        return rng.randbytes(rng.randrange(1, 16))
    b = bytearray(data)
    for _ in range(rng.randrange(1, 8)):
        i = rng.randrange(len(b))
        b[i] = rng.randrange(256) if rng.random() < 0.5 else b[i] ^ (1 << rng.randrange(8))
    return bytes(b)


def set_u32(rng, data, offset, byteorder="big"):
    """Overwrite the 4 bytes at C{offset} with an extreme or off-by-one value."""
    if len(data) < offset + 4:
        return flip(rng, data)
    current = int.from_bytes(data[offset:offset + 4], byteorder)
    value = rng.choice(EXTREME_U32 + [current - 1, current + 1, current * 2]) & 0xFFFFFFFF
    return data[:offset] + value.to_bytes(4, byteorder) + data[offset + 4:]


def truncate(rng, data):
    return data[:rng.randrange(len(data) + 1)]


def garble_text(rng, data):
    """Insert, delete or replace a few characters (for JSON and text lines)."""
    b = bytearray(data)
    for _ in range(rng.randrange(1, 5)):
        op = rng.randrange(3)
        i = rng.randrange(len(b) + 1)
        if op == 0:
            b[i:i] = rng.choice([b"{", b"}", b"[", b"]", b'"', b":", b",", b"\\", b"\x00", b"\xff", b"1e999"])
        elif op == 1 and b:
            del b[i:i + rng.randrange(1, 5)]
        elif b:
            b[min(i, len(b) - 1)] = rng.randrange(256)
    return bytes(b)


def mutate(rng, data, length_offsets=(), text=False):
    """Return C{data} as sent (most of the time) or mutated one way."""
    roll = rng.random()
    if roll < 0.45:
        return data
    if roll < 0.65:
        return flip(rng, data)
    if roll < 0.8 and length_offsets:
        offset, order = rng.choice(length_offsets)
        return set_u32(rng, data, offset, order)
    if roll < 0.88 and text:
        return garble_text(rng, data)
    if roll < 0.94:
        return truncate(rng, data)
    if roll < 0.97:
        return data + data
    return rng.randbytes(rng.randrange(1, 256))


# -- smss -----------------------------------------------------------------------------------


def smss_frame(rng):
    t = _topic(rng)
    kind = rng.randrange(12)
    if kind <= 3:
        msgs = [_body(rng) or b"x" for _ in range(rng.randrange(1, 4))]
        if rng.random() < 0.3:
            msgs = [({"k": "v", "n": str(rng.randrange(9))}, m) for m in msgs]
        frame = cc.encode_pub(t, encode_payload(msgs))
    elif kind == 4:
        frame = cc.encode_create(t, rng.choice([0, 0, -1, 1, 2**62]))
    elif kind == 5:
        frame = cc.encode_delay(t, rng.choice([0, 1, 1000, 2**31, -5]) & 0xFFFFFFFFFFFF,
                                encode_payload([b"d"]))
    elif kind == 6:
        frame = cc.encode_topic_info(t)
    elif kind == 7:
        frame = cc.encode_list()
    elif kind == 8:
        frame = cc.encode_valid_list(rng.choice(EXTREME_INTS[:7]) & 0x7FFFFFFFFFFFFFFF)
    elif kind == 9:
        frame = cc.encode_sub(t, rng.randrange(0, 100), rng.randrange(0, 256),
                              rng.choice([None, 1, 10**9]), b"w%d" % rng.randrange(3))
    elif kind == 10:
        frame = cc.encode_alive() if rng.random() < 0.8 else cc.encode_replica(rng.randrange(0, 50))
    else:
        frame = cc.encode_ack(rng.randrange(0, 3)) if rng.random() < 0.5 else cc.encode_delete("fz-del")
    # the 20-byte header holds the command, lengths (little-endian) and the payload size
    return mutate(rng, frame, length_offsets=[(0, "little"), (4, "little"), (8, "little"), (12, "little")])


# -- RocketMQ remoting ------------------------------------------------------------------


_BROKER_CODES = [
    codes.SEND_MESSAGE, codes.SEND_MESSAGE_V2, codes.SEND_BATCH_MESSAGE, codes.PULL_MESSAGE,
    codes.HEART_BEAT, codes.QUERY_CONSUMER_OFFSET, codes.UPDATE_CONSUMER_OFFSET, codes.GET_MAX_OFFSET,
    codes.GET_MIN_OFFSET, codes.SEARCH_OFFSET_BY_TIMESTAMP, codes.GET_EARLIEST_MSG_STORETIME,
    codes.VIEW_MESSAGE_BY_ID, codes.QUERY_MESSAGE, codes.CONSUMER_SEND_MSG_BACK, codes.END_TRANSACTION,
    codes.GET_CONSUMER_LIST_BY_GROUP, codes.LOCK_BATCH_MQ, codes.UNLOCK_BATCH_MQ, codes.UNREGISTER_CLIENT,
    codes.UPDATE_AND_CREATE_TOPIC, codes.GET_ALL_TOPIC_CONFIG, codes.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
    codes.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, codes.GET_BROKER_RUNTIME_INFO, codes.QUERY_BROKER_OFFSET,
    codes.GET_TOPIC_STATS_INFO, codes.GET_CONSUME_STATS, codes.VIEW_BROKER_STATS_DATA
    if hasattr(codes, "VIEW_BROKER_STATS_DATA") else codes.GET_BROKER_CONFIG, 99999,
]
_NAMESRV_CODES = [
    codes.GET_ROUTEINFO_BY_TOPIC, codes.REGISTER_BROKER, codes.UNREGISTER_BROKER, codes.GET_BROKER_CLUSTER_INFO,
    codes.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, codes.PUT_KV_CONFIG, codes.GET_KV_CONFIG, codes.DELETE_KV_CONFIG,
    codes.GET_KVLIST_BY_NAMESPACE, codes.GET_TOPICS_BY_CLUSTER, codes.WIPE_WRITE_PERM_OF_BROKER,
    codes.DELETE_TOPIC_IN_NAMESRV, getattr(codes, "QUERY_DATA_VERSION", 322), 12345,
]
_EXT_NAMES = [
    "topic", "b", "producerGroup", "a", "consumerGroup", "queueId", "e", "sysFlag", "f", "bornTimestamp",
    "flag", "properties", "i", "batch", "m", "queueOffset", "maxMsgNums", "commitOffset",
    "suspendTimeoutMillis", "subscription", "subVersion", "offset", "timestamp", "key", "maxNum",
    "beginTimestamp", "endTimestamp", "delayLevel", "group", "originTopic", "originMsgId",
    "maxReconsumeTimes", "reconsumeTimes", "brokerName", "brokerAddr", "clusterName", "brokerId",
    "haServerAddr", "compressed", "bodyCrc32", "namespace", "value", "readQueueNums", "writeQueueNums",
    "perm", "topicFilterType", "commitLogOffset", "tranStateTableOffset", "commitOrRollback",
    "transactionId", "msgId", "defaultTopic", "defaultTopicQueueNums", "unitMode", "cluster",
]


def _ext_value(rng):
    kind = rng.randrange(7)
    if kind == 0:
        return str(rng.choice(EXTREME_INTS))
    if kind == 1:
        return str(rng.randrange(0, 8))
    if kind == 2:
        return rng.choice(["true", "false", "1", "0", ""])
    if kind == 3:
        return _topic(rng)
    if kind == 4:
        return "TAGS\x01a\x02KEYS\x01k\x02DELAY\x01%d\x02" % rng.randrange(-1, 30)
    if kind == 5:
        return "".join(chr(rng.randrange(1, 0x3000)) for _ in range(rng.randrange(20)))
    return "127.0.0.1:%d" % rng.randrange(70000)


def remoting_frame(rng, broker):
    code = rng.choice(_BROKER_CODES if broker else _NAMESRV_CODES)
    ext = {rng.choice(_EXT_NAMES): _ext_value(rng) for _ in range(rng.randrange(12))}
    if code in (codes.SEND_MESSAGE, codes.SEND_MESSAGE_V2, codes.SEND_BATCH_MESSAGE) and rng.random() < 0.6:
        ext.update(topic=_topic(rng), producerGroup="PG", queueId=str(rng.randrange(-1, 6)),
                   sysFlag=str(rng.choice([0, 0, 1, 4, 8, 0x30, -1])), bornTimestamp="0", flag="0",
                   properties="", reconsumeTimes="0", batch=rng.choice(["true", "false"]))
    body = _body(rng)
    if code == codes.SEND_BATCH_MESSAGE and rng.random() < 0.5:
        body = encode_batch_body([(0, _body(rng) or b"m", {"UNIQ_KEY": "u"}) for _ in range(rng.randrange(1, 4))])
        if rng.random() < 0.5:
            body = zlib.compress(body)
    if code in (codes.HEART_BEAT, codes.LOCK_BATCH_MQ, codes.REGISTER_BROKER,
                codes.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP) and rng.random() < 0.6:
        body = json.dumps(_json_value(rng) if rng.random() < 0.5 else {
            "clientID": "c", "consumerDataSet": [{"groupName": "fzg", "subscriptionDataSet": [
                {"topic": _topic(rng), "subString": "*"}]}], "producerDataSet": _json_value(rng),
            "groupName": _json_value(rng), "mqSet": _json_value(rng),
            "topicConfigSerializeWrapper": {"topicConfigTable": {_topic(rng): _json_value(rng)}}}).encode()
    cmd = RemotingCommand(code=code, language=rng.choice(["JAVA", "CPP", "GO", "OTHER"]),
                          version=rng.choice([0, 63, 401, -1]), opaque=rng.randrange(2**31),
                          flag=rng.choice([0, 0, 1, 2, 3]), ext_fields=ext, body=body,
                          serialize_type=rng.choice([0, 0, 0, 1]))
    try:
        frame = encode_remoting(cmd)
    except ValueError:
        frame = rng.randbytes(32)
    if rng.random() < 0.1 and len(frame) > 8:
        # garble or nest the JSON header, keeping the lengths consistent
        header_len = int.from_bytes(frame[5:8], "big")
        header = frame[8:8 + header_len]
        header = garble_text(rng, header) if rng.random() < 0.9 else rng.choice(_DEEP)
        rest = frame[8 + header_len:]
        frame = struct.pack(">II", 4 + len(header) + len(rest), len(header)) + header + rest
    return mutate(rng, frame, length_offsets=[(0, "big"), (4, "big")], text=True)


# -- NSQ -------------------------------------------------------------------------------------


def nsqd_frame(rng):
    t = _topic(rng) if rng.random() < 0.9 else "fz#ephemeral"
    kind = rng.randrange(14)
    if kind <= 3:
        frame = encode_command("PUB", t, body=_body(rng) or b"x")
    elif kind == 4:
        frame = encode_mpub(t, [_body(rng) or b"x" for _ in range(rng.randrange(1, 5))])
    elif kind == 5:
        frame = encode_command("DPUB", t, rng.choice([0, 100, 3600000, 3600001, -1]), body=b"d")
    elif kind == 6:
        frame = encode_command("SUB", t, rng.choice(["c", "c2", "c#ephemeral", "bad name"]))
    elif kind == 7:
        frame = encode_command("RDY", rng.choice([0, 1, 100, 2500, 2501, -1, 2**64]))
    elif kind == 8:
        msg_id = rng.choice(["%016x" % rng.randrange(50), "zz", "0" * 16, "%016X" % 3])
        verb = rng.choice(["FIN", "REQ", "TOUCH"])
        frame = encode_command(verb, msg_id, *([rng.choice([0, 10, -1, 2**40])] if verb == "REQ" else []))
    elif kind == 9:
        frame = encode_command(rng.choice(["NOP", "CLS"]))
    elif kind == 10:
        frame = encode_command("AUTH", body=b"secret")
    elif kind == 11:
        frame = encode_command("IDENTIFY", body=json.dumps(
            {"feature_negotiation": rng.random() < 0.8, "heartbeat_interval": rng.choice([-1, 0, 1000, 999, 60001]),
             "output_buffer_size": rng.choice([-1, 0, 64, 1 << 20]), "msg_timeout": rng.choice([0, 999, 1000]),
             "sample_rate": rng.choice([0, 50, 100, 101]), "user_agent": _json_value(rng)}).encode())
    else:
        frame = rng.choice([b"", b"\n", b"\r\n", b"PUB\n", b"MPUB " + t.encode() + b"\n"]) + rng.randbytes(rng.randrange(8))
    return mutate(rng, frame, length_offsets=[(frame.find(b"\n") + 1, "big")] if b"\n" in frame else (), text=True)


def nsqd_conversation(rng, n):
    """V2 magic, then frames; some connections upgrade to deflate or snappy after
    IDENTIFY and send the rest compressed (validly or not)."""
    out = [b"  V2" if rng.random() < 0.95 else rng.randbytes(4)]
    compressor = None
    if rng.random() < 0.25:
        feature = rng.choice(["deflate", "snappy"])
        body = json.dumps({"feature_negotiation": True, feature: True, "deflate_level": rng.randrange(1, 10)}).encode()
        out.append(encode_command("IDENTIFY", body=body))
        if rng.random() < 0.8:
            compressor = DeflateCompressor() if feature == "deflate" else SnappyCompressor()
    for _ in range(n):
        frame = nsqd_frame(rng)
        if compressor is not None:
            frame = compressor.compress(frame) if rng.random() < 0.9 else flip(rng, compressor.compress(frame))
        out.append(frame)
    return out


def lookupd_frame(rng):
    t = _topic(rng)
    kind = rng.randrange(6)
    if kind == 0:
        body = json.dumps(_json_value(rng) if rng.random() < 0.3 else {
            "broadcast_address": "127.0.0.1", "tcp_port": rng.choice([4150, 0, -1, "x"]), "http_port": 4151,
            "version": "1.3.0", "hostname": _json_value(rng)}).encode()
        frame = b"IDENTIFY\n" + struct.pack(">I", len(body)) + body
    elif kind <= 2:
        frame = b"REGISTER %s %s\n" % (t.encode(), rng.choice([b"", b"c", b"c#ephemeral", b"bad name"]))
    elif kind == 3:
        frame = b"UNREGISTER %s %s\n" % (t.encode(), rng.choice([b"", b"c"]))
    elif kind == 4:
        frame = b"PING\n"
    else:
        frame = rng.randbytes(rng.randrange(1, 40))
    return mutate(rng, frame, length_offsets=[(9, "big")] if frame.startswith(b"IDENTIFY") else (), text=True)


def lookupd_conversation(rng, n):
    return [b"  V1" if rng.random() < 0.95 else rng.randbytes(4)] + [lookupd_frame(rng) for _ in range(n)]


# -- HTTP ------------------------------------------------------------------------------------


_NSQD_PATHS = ["/pub?topic={t}", "/mpub?topic={t}", "/mpub?topic={t}&binary=true", "/pub?topic={t}&defer=100",
               "/topic/create?topic={t}", "/topic/empty?topic={t}", "/topic/pause?topic={t}",
               "/topic/unpause?topic={t}", "/channel/create?topic={t}&channel=c", "/channel/empty?topic={t}&channel=c",
               "/channel/pause?topic={t}&channel=c", "/stats", "/stats?format=json&topic={t}", "/info", "/ping",
               "/config/nsqlookupd_tcp_addresses", "/debug/pprof", "/pub", "/channel/delete?topic={t}&channel=c2"]
_LOOKUPD_PATHS = ["/lookup?topic={t}", "/topics", "/channels?topic={t}", "/nodes", "/topic/create?topic={t}",
                  "/channel/create?topic={t}&channel=c", "/channel/delete?topic={t}&channel=c",
                  "/topic/tombstone?topic={t}&node=127.0.0.1:4151", "/ping", "/info", "/debug", "/lookup"]


_LONG = [b"a" * 100, b"a" * 20000, b"a" * 70000]


def http_frame(rng, lookupd):
    path = rng.choice(_LOOKUPD_PATHS if lookupd else _NSQD_PATHS).format(t=_topic(rng))
    method = rng.choice([b"GET", b"POST", b"POST", b"PUT", b"DELETE", b"HEAD"])
    body = _body(rng)
    if b"mpub" in path.encode() and b"binary" in path.encode() and rng.random() < 0.6:
        body = struct.pack(">I", 2) + b"".join(struct.pack(">I", len(m)) + m for m in (b"a", b"bb"))
    headers = [b"Host: fuzz", b"Content-Length: %d" % len(body)]
    if rng.random() < 0.1:
        headers.append(b"Transfer-Encoding: chunked")
    if rng.random() < 0.03:
        headers.append(b"X-Long: " + rng.choice(_LONG))
    request = method + b" " + path.encode() + b" HTTP/1.1\r\n" + b"\r\n".join(headers) + b"\r\n\r\n" + body
    return mutate(rng, request, text=True)


# -- msgout, admin and metrics (HTTP/JSON) ----------------------------------------------------


_QUEUES = ["fzq", "fzq2", "fz.q3", "fzt"]
_BAD_SEGMENTS = ["", "%00", "%ff%fe", "..", "a" * 300, "\u00e9", "x y", "%2F", "q?x=1"]


def _queue(rng):
    return rng.choice(_QUEUES) if rng.random() < 0.9 else rng.choice(_BAD_SEGMENTS)


def _maybe(rng, good, p=0.7):
    """C{good} most of the time, else a JSON value of any type."""
    return good if rng.random() < p else _json_value(rng)


def _msgout_request(rng):
    q = _queue(rng)
    kind = rng.randrange(14)
    if kind == 0:
        return "GET", "/v1/queues", None
    if kind == 1:
        attrs = {k: _maybe(rng, v) for k, v in (("mode", rng.choice(["queue", "topic", "x"])),
                                                 ("ack", rng.random() < 0.8),
                                                 ("ordered", rng.random() < 0.2),
                                                 ("persistent", rng.random() < 0.1),
                                                 ("ack_timeout_ms", rng.choice([99, 100, 30000, 3600001])))
                 if rng.random() < 0.5}
        return "PUT", f"/v1/queues/{q}", attrs
    if kind == 2:
        return "GET", f"/v1/queues/{q}", None
    if kind == 3:
        return "DELETE", f"/v1/queues/{rng.choice(['fz-del', q])}", None
    if kind <= 6:
        msgs = [{"body": _maybe(rng, "m%d" % rng.randrange(9)), "headers": _maybe(rng, {"k": "v"})}
                for _ in range(rng.randrange(0, 4))]
        return "POST", f"/v1/queues/{q}/messages", {"messages": _maybe(rng, msgs, 0.85)}
    if kind <= 8:
        body = {"max": _maybe(rng, rng.choice([1, 10, 1000, 1001, 0, -1])),
                "wait_ms": _maybe(rng, rng.choice([0, 0, 0, 50, -1]), 0.9)}
        for key, value in (("sub_id", "s%d" % rng.randrange(3)), ("from", rng.choice(["earliest", "latest", 0, 5])),
                           ("from_id", rng.choice([0, 1, 2**63, -1]))):
            if rng.random() < 0.25:
                body[key] = _maybe(rng, value)
        return "POST", f"/v1/queues/{q}/fetch", body
    if kind == 9:
        receipts = _maybe(rng, ["%d.%d.%d" % (rng.randrange(3), rng.randrange(50), rng.randrange(3))
                                for _ in range(rng.randrange(4))] + [rng.choice(["", "x", "1.2", "9.9.9.9"])])
        return "POST", rng.choice(["/v1/ack", "/v1/nack"]), {"receipts": receipts}
    if kind == 10:
        body = {"url": _maybe(rng, rng.choice(["http://127.0.0.1:9/p", "ftp://x", "http://", ""])),
                "sub_id": _maybe(rng, "push%d" % rng.randrange(2)), "batch": _maybe(rng, rng.choice([1, 100, 0]))}
        return "POST", f"/v1/queues/{q}/subscriptions", body
    if kind == 11:
        return rng.choice(["GET", "DELETE"]), f"/v1/queues/{q}/subscriptions/push{rng.randrange(2)}", None
    if kind == 12:
        return "GET", f"/v1/queues/{q}/subscriptions", None
    return rng.choice(["GET", "POST", "PATCH", "OPTIONS"]), rng.choice(
        ["/", "/v1", "/v2/queues", "/v1/queues/%s/nope" % q, "/v1/queues/" + "/".join(["a"] * 40)]), None


def _admin_request(rng):
    t = _topic(rng) if rng.random() < 0.9 else rng.choice(_BAD_SEGMENTS)
    kind = rng.randrange(9)
    if kind == 0:
        return "GET", rng.choice(["/stats", "/topics", "/consumers", f"/consumers?topic={t}"]), None
    if kind == 1:
        name = _maybe(rng, rng.choice([t, "fz-del"]))
        return "POST", "/topics", {"name": name, "queues": _maybe(rng, rng.choice([1, 4, 0, -1, 10**6]))}
    if kind == 2:
        return "GET", f"/topics/{t}", None
    if kind == 3:
        # never the shared topics (TBW102 is RocketMQ's auto-create template)
        return "DELETE", f"/topics/{rng.choice(['fz-del', 'fz-del', rng.choice(_BAD_SEGMENTS)])}", None
    if kind == 4:
        query = "&".join(f"{k}={v}" for k, v in (("n", rng.choice([1, 10, 0, 1001, "x", -1, 10**30])),
                                                  ("after", rng.choice([0, 5, -1, "x", 2**64])))
                         if rng.random() < 0.6)
        return "GET", f"/topics/{t}/messages" + ("?" + query if query else ""), None
    if kind == 5:
        body = {"topic": _maybe(rng, t), "name": _maybe(rng, rng.choice(["c", "fzg", "PG"])),
                "kind": _maybe(rng, rng.choice([None, "nsq", "rocketmq", "smss", "msgout", "x"]))}
        body[rng.choice(["time_ms", "event_id"])] = _maybe(rng, rng.choice([0, 1, -1, 2**63, 10**30]))
        if rng.random() < 0.2:
            body["event_id"] = 1
        return "POST", "/consumers/rewind", body
    return rng.choice(["GET", "POST", "PUT", "DELETE", "HEAD"]), rng.choice(
        ["/", "/stats/x", "/topics/a/b/c", "/consumers/rewind", "/nope", "/topics//messages"]), None


def _metrics_request(rng):
    path = rng.choice(["/metrics", "/metrics", "/metrics?name[]=mqserver_up", "/metrics?name[]=%ff",
                       "/", "/metrics/x", "/favicon.ico"])
    headers = []
    if rng.random() < 0.3:
        headers.append(b"Accept: " + rng.choice([b"application/openmetrics-text; version=1.0.0", b"text/plain",
                                                 b"*/*;q=x", b"\xff\xfe"]))
    if rng.random() < 0.2:
        headers.append(b"Accept-Encoding: " + rng.choice([b"gzip", b"gzip;q=0", b"br, x", b"\x00"]))
    return rng.choice(["GET", "GET", "GET", "HEAD", "POST"]), path, None, headers


def _http_bytes(rng, method, path, body, extra=()):
    """One HTTP/1.1 request, JSON body sometimes garbled, nested deep, chunked wrongly or
    announced with a wrong Content-Length."""
    data = b"" if body is None else json.dumps(body).encode()
    roll = rng.random()
    if roll < 0.05:
        data = rng.choice(_DEEP)
    elif roll < 0.15 and data:
        data = garble_text(rng, data)
    elif roll < 0.18:
        data = rng.choice([b"\xff\xfe{}", b'{"messages": [{"body": "\xc3\x28"}]}', b"null", b"[]", b'"x"', b"1e999"])
    headers = [b"Host: fuzz", b"Content-Type: " + rng.choice([b"application/json", b"text/plain", b"\xff"])]
    headers += extra
    roll = rng.random()
    if roll < 0.08:
        headers.append(b"Transfer-Encoding: chunked")
        if rng.random() < 0.5:
            data = b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data)
        else:
            data = rng.choice([b"zz\r\n", b"ffffffffffffffff\r\nx", b"5\r\nab\r\n0\r\n\r\n", b"-1\r\n"]) + data
    elif roll < 0.14:
        headers.append(b"Content-Length: %s" % rng.choice(
            [b"-1", b"x", b"99999999999999999999", b"%d" % (len(data) + 10), b"%d" % max(0, len(data) - 3),
             b"1, 2", b"%d" % (1 << 40)]))
    else:
        headers.append(b"Content-Length: %d" % len(data))
    if rng.random() < 0.03:
        headers.append(b"X-Long: " + rng.choice(_LONG))
    if rng.random() < 0.02:
        headers += [b"X-H%d: v" % i for i in range(rng.choice([100, 600]))]
    if rng.random() < 0.03:
        headers.append(b"Authorization: " + rng.choice([b"Bearer x", b"Bearer \xff", b"Basic", b""]))
    request = method.encode() + b" " + path.encode("utf-8", "surrogatepass") + b" HTTP/1.1\r\n"
    request += b"\r\n".join(headers) + b"\r\n\r\n" + data
    return mutate(rng, request, text=True)


def json_http_frame(rng, door):
    if door == "metrics":
        method, path, body, extra = _metrics_request(rng)
    else:
        method, path, body = (_msgout_request if door == "msgout" else _admin_request)(rng)
        extra = ()
    return _http_bytes(rng, method, path, body, extra)


# -- console (lines) ---------------------------------------------------------------------


_CONSOLE_WORDS = [b"HELP", b"STATS", b"TOPICS", b"INFO", b"PUB", b"PEEK", b"TAIL", b"FETCH", b"SUB", b"ACK",
                  b"NACK", b"AUTH", b"help", b"NOPE", b""]


def _console_arg(rng):
    return rng.choice([_queue(rng).encode("utf-8", "surrogatepass"), b"FROM", b"ID", b"earliest", b"latest",
                       b"%d" % rng.choice(EXTREME_INTS), b"1.2.3", b"0.0.0", b"-", b'"quoted words"', b'"open',
                       b"'", b"\\", b"\xff\xfe", b"\x00", b"s%d" % rng.randrange(3)])


def console_line(rng):
    kind = rng.randrange(40)
    if kind == 0:
        return rng.randbytes(rng.randrange(1, 200)) + b"\n"
    if kind == 1:
        return b"PUB fzq " + rng.choice(_LONG) + rng.choice([b"\n", b"\r\n"])
    if kind == 2:
        # over console.maxLineLength (rarely: a megabyte each), or under
        return b"X" * ((1 << 20) + 10 if rng.random() < 0.05 else 1 << 16) + b"\n"
    if kind == 3:
        return b"".join(b"PUB fzq m%d\n" % i for i in range(rng.choice([10, 600])))  # a pipelined burst
    if kind == 4:
        return b"PUB %s %s\n" % (_queue(rng).encode("utf-8", "surrogatepass"), _body(rng)[:60].replace(b"\n", b" "))
    if kind == 5:
        return b"FETCH fzq %d\nACK %d.%d.1\n" % (rng.choice([1, 10, 0, 1001]), rng.randrange(3), rng.randrange(50))
    if kind == 6:
        return b"SUB fzq FROM earliest\n" + b"ACK 1.1.1\n" * rng.randrange(3) + b"done\n"
    if kind == 7:
        return b"TAIL fzq\n" + b"PUB fzq during-tail\n" + b"x\n"
    line = b" ".join([rng.choice(_CONSOLE_WORDS)] + [_console_arg(rng) for _ in range(rng.randrange(5))])
    return mutate(rng, line, text=True) + rng.choice([b"\n", b"\r\n", b"\r", b""])


# -- per door ----------------------------------------------------------------------------


def conversation(door, rng, n):
    """The byte strings one connection to C{door} sends: C{n} frames (plus a preamble)."""
    if door == "smss":
        return [smss_frame(rng) for _ in range(n)]
    if door in ("namesrv", "broker"):
        return [remoting_frame(rng, door == "broker") for _ in range(n)]
    if door == "nsqd_tcp":
        return nsqd_conversation(rng, n)
    if door == "lookupd_tcp":
        return lookupd_conversation(rng, n)
    if door in ("nsqd_http", "lookupd_http"):
        return [http_frame(rng, door == "lookupd_http") for _ in range(n)]
    if door in ("msgout", "admin", "metrics"):
        return [json_http_frame(rng, door) for _ in range(n)]
    if door == "console":
        return [console_line(rng) for _ in range(n)]
    raise ValueError(f"unknown door {door!r}")


# -- sending and checking (blocking, for tests) -------------------------------------------


def send_conversation(port, frames, timeout=10.0):
    """Send C{frames} on one connection, half-close, read until the broker closes it.
    Return True if it closed within C{timeout} (False: the connection hangs)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(b"".join(frames))
            s.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if not s.recv(1 << 16):
                    return True
        except (ConnectionResetError, BrokenPipeError, ConnectionAbortedError):
            return True  # closed on bad input before reading everything
        except OSError as e:
            if e.errno == 107:  # ENOTCONN: already closed by the broker
                return True
            raise
        except TimeoutError:
            return False
    return False


# -- a normal client of each door ------------------------------------------------------


def healthy(door, port):
    """True if an ordinary request to C{door} gets its ordinary answer."""
    try:
        if door == "smss":
            c = SmssClient("127.0.0.1", port, timeout=10)
            try:
                c.publish("fz-health", [b"ok"])
            except Exception as e:  # the topic may not exist yet
                if "not exist" not in str(e):
                    raise
                c.create("fz-health")
                c.publish("fz-health", [b"ok"])
            c.close()
            return True
        if door in ("namesrv", "broker"):
            c = RemotingClient("127.0.0.1", port, timeout=10)
            try:
                code = codes.GET_BROKER_RUNTIME_INFO if door == "broker" else codes.GET_BROKER_CLUSTER_INFO
                return c.call(code, {}).code == codes.SUCCESS
            finally:
                c.close()
        if door in ("nsqd_tcp", "lookupd_tcp"):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                if door == "nsqd_tcp":
                    s.sendall(b"  V2" + encode_command("PUB", "fz-health", body=b"ok"))
                    want = struct.pack(">II", 6, 0) + b"OK"
                else:
                    s.sendall(b"  V1PING\n")
                    want = struct.pack(">I", 2) + b"OK"
                got = b""
                while len(got) < len(want):
                    chunk = s.recv(64)
                    if not chunk:
                        return False
                    got += chunk
                return got[:len(want)] == want
        if door in ("nsqd_http", "lookupd_http"):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=10) as r:
                return r.status == 200
        if door in ("msgout", "admin", "metrics"):
            return _http_healthy(door, port)
        if door == "console":
            return _console_healthy(port)
    except Exception:
        return False
    raise ValueError(door)




def _http_healthy(door, port):
    """msgout: a message published is fetched back; admin: /stats answers JSON;
    metrics: /metrics holds the broker's metrics."""
    def call(method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()

    if door == "msgout":
        queue = "fz-health-%d" % time.monotonic_ns()
        call("PUT", f"/v1/queues/{queue}", {})
        call("POST", f"/v1/queues/{queue}/messages", {"messages": [{"body": "ok"}]})
        status, body = call("POST", f"/v1/queues/{queue}/fetch", {"max": 1})
        ok = status == 200 and [m["body"] for m in json.loads(body)["messages"]] == ["ok"]
        call("DELETE", f"/v1/queues/{queue}")
        return ok
    if door == "admin":
        status, body = call("GET", "/stats")
        return status == 200 and isinstance(json.loads(body), dict)
    status, body = call("GET", "/metrics")
    return status == 200 and b"mqserver_" in body


def _console_healthy(port):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"STATS\nTOPICS\nQUIT\n")
        got = b""
        while b"OK bye" not in got:
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            got += chunk
        lines = got.split(b"\r\n") if b"\r\n" in got else got.split(b"\n")
        return lines[0].startswith(b"OK topics=") and b"OK bye" in got


def prepare(ports):
    """Make the queues the msgout and console frames use (through msgout's API), so
    that the fuzzers reach past "unknown queue"; C{ports}: door -> port."""
    if "msgout" not in ports:
        return
    for i, q in enumerate(_QUEUES):
        body = json.dumps({"mode": "topic"} if q == "fzt" else {"ack_timeout_ms": 1000}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{ports['msgout']}/v1/queues/{q}", data=body, method="PUT",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10):
            pass
