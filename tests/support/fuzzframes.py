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

DOORS = ("smss", "namesrv", "broker", "nsqd_tcp", "nsqd_http", "lookupd_tcp", "lookupd_http")
#: The ServerProcess port name of each door.
PORT_NAMES = {
    "smss": "SmssFactory", "namesrv": "NamesrvFactory", "broker": "BrokerDoor",
    "nsqd_tcp": "NsqdFactory", "nsqd_http": "NsqdHttpSite",
    "lookupd_tcp": "LookupdFactory", "lookupd_http": "LookupdHttpSite",
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
    except Exception:
        return False
    raise ValueError(door)


