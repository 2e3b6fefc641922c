"""Core pieces behind the RocketMQ doors: the nameserver route table, consumer offsets,
the key index files, delay levels, tag subscriptions."""

import json
import os

import pytest
from twisted.internet.task import Clock

from mqserver.broker.offsets import ConsumerOffsets
from mqserver.cluster.namesrv import RouteTable
from mqserver.config import ConfigError, build_config
from protocols.remoting.config import parse_delay_levels
from mqserver.store import format as fmt
from mqserver.store.index import IndexService
from protocols.remoting.consumers import parse_subscription
from protocols.remoting.tolerant_json import loads_tolerant

TOPICS = {"T": {"readQueueNums": 4, "writeQueueNums": 4, "perm": 6}}


def test_route_table_register_route_and_expiry():
    clock = Clock()
    t = RouteTable(clock, expire_ms=120_000, scan_interval_ms=10_000)
    t.start()
    t.register_broker("C", "b1", "10.0.0.1:10911", 0, TOPICS, {"counter": 1})
    t.register_broker("C", "b2", "10.0.0.2:10911", 0, TOPICS, {"counter": 1})
    route = t.route("T")
    assert [b["brokerName"] for b in route["brokerDatas"]] == ["b1", "b2"]
    assert route["queueDatas"][0] == {"brokerName": "b1", "perm": 6, "readQueueNums": 4,
                                      "topicSysFlag": 0, "writeQueueNums": 4}
    assert t.route("nope") is None
    clock.advance(100)
    t.register_broker("C", "b1", "10.0.0.1:10911", 0, None)  # heartbeat keeps b1 alive
    clock.advance(30)  # b2 silent for 130 s: the 10 s scan drops it
    assert [b["brokerName"] for b in t.route("T")["brokerDatas"]] == ["b1"]
    assert t.cluster_info()["clusterAddrTable"] == {"C": ["b1"]}
    clock.advance(200)
    assert t.route("T") is None and t.topic_list() == []
    t.stop()


def test_route_table_topic_changes_replace_queue_data():
    t = RouteTable(Clock())
    t.register_broker("C", "b1", "a:1", 0, TOPICS, {"counter": 1})
    t.register_broker("C", "b1", "a:1", 0, {"U": {"readQueueNums": 1, "writeQueueNums": 1}}, {"counter": 2})
    assert t.route("T") is None and t.route("U") is not None
    t.put_kv("ORDER_TOPIC_CONFIG", "U", "b1:1")
    assert t.route("U")["orderTopicConf"] == "b1:1"
    assert t.wipe_write_perm("b1") == 1 and t.route("U")["queueDatas"][0]["perm"] == 4
    t.unregister_broker("C", "b1", "a:1", 0)
    assert t.route("U") is None and t.cluster_info() == {"brokerAddrTable": {}, "clusterAddrTable": {}}


def test_consumer_offsets_round_trip(tmp_path):
    o = ConsumerOffsets(str(tmp_path))
    o.load()
    assert o.query("T", "G", 0) is None
    o.commit("T", "G", 0, 12)
    o.commit("%RETRY%G", "G", 0, 3)
    o.save()
    data = json.load(open(tmp_path / "consumerOffset.json"))
    assert data == {"offsetTable": {"%RETRY%G@G": {"0": 3}, "T@G": {"0": 12}}}
    o2 = ConsumerOffsets(str(tmp_path))
    o2.load()
    assert o2.query("T", "G", 0) == 12 and o2.query("%RETRY%G", "G", 0) == 3
    assert o2.save() is None  # nothing changed, nothing written


def test_index_service_finds_keys_and_survives_reopen(tmp_path):
    d = str(tmp_path / "index")
    idx = IndexService(d, slots=16, max_entries=5)  # tiny: forces collisions and rolling
    props = lambda keys, uniq: fmt.encode_properties([(b"KEYS", keys), (b"UNIQ_KEY", uniq)])
    for i in range(6):
        idx.dispatch(1000 + i * 100, "T", props(f"k{i} all".encode(), f"U{i}".encode()), 1_700_000_000_000 + i)
    idx.dispatch(1000, "T", props(b"dup", b"dup"), 0)  # replayed: below the last offset, skipped
    idx.dispatch(1600, "T", fmt.encode_properties([(b"TAGS", b"A"), (b"UNIQ_KEY", b"U6")]), 1_700_000_000_006)
    idx.dispatch(1700, "T", fmt.encode_properties([(b"XUNIQ_KEY", b"U7")]), 1_700_000_000_007)
    assert len(idx.files) >= 2
    assert idx.lookup("T", "k3", 32, 0, 2**62) == [1300]
    assert sorted(idx.lookup("T", "all", 32, 0, 2**62)) == [1000 + i * 100 for i in range(6)]
    assert idx.lookup("T", "U5", 32, 0, 2**62) == [1500]
    assert idx.lookup("T", "U6", 32, 0, 2**62) == [1600]  # UNIQ_KEY only: the fast path
    assert idx.lookup("T", "U7", 32, 0, 2**62) == []
    assert idx.lookup("Other", "k3", 32, 0, 2**62) == []
    assert idx.lookup("T", "dup", 32, 0, 2**62) == []
    idx.close()
    again = IndexService(d, slots=16, max_entries=5)
    assert again.lookup("T", "k1", 32, 0, 2**62) == [1100]
    assert again.last_offset() == 1600
    header = fmt.INDEX_HEADER.unpack_from(open(os.path.join(d, sorted(os.listdir(d))[0]), "rb").read(40))
    assert header[2] == 1000 and header[4] == 16  # BeginPhyOffset, HashSlotCount
    again.close()


def test_index_key_hash_is_java_abs_hashcode():
    assert fmt.index_key_hash("T", "k") == abs(fmt.java_string_hash("T#k"))
    assert fmt.java_string_hash("TagA") == 2598919


def test_delay_levels():
    assert parse_delay_levels("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h")[:6] == [
        1000, 5000, 10000, 30000, 60000, 120000]
    assert parse_delay_levels("500ms 2h 1d") == [500, 7_200_000, 86_400_000]
    with pytest.raises(ValueError):
        parse_delay_levels("1x")
    with pytest.raises(ConfigError):
        build_config({"rocketmq": {"messageDelayLevel": "soon"}})
    assert build_config({})["rocketmq.defaultTopicQueueNums"] == 4


def test_subscriptions_and_fastjson_keys():
    assert parse_subscription("*") == (None, None)
    assert parse_subscription(" TagA || TagB ") == ({"TagA", "TagB"}, {2598919, 2598920})
    assert loads_tolerant(b'{"brokerAddrs":{0:"127.0.0.1:10911"}}') == {"brokerAddrs": {"0": "127.0.0.1:10911"}}


def test_send_header_forms_and_cpp_compressed_batch():
    """Short V2 names map to the long ones; a deflated C++ batch is inflated and split,
    and the compressed bit is not copied onto its messages."""
    import zlib

    from protocols.remoting.messages import RemotingCommand
    from protocols.remoting.props import encode_batch_body
    from protocols.remoting.sending import build_messages, send_header

    ext = send_header(RemotingCommand(code=310, ext_fields={"b": "T", "e": "2", "m": "false"}))
    assert ext["topic"] == "T" and ext["queueId"] == "2" and ext["batch"] == "false"
    body = encode_batch_body([(0, b"a" * 3000, {"UNIQ_KEY": "U1", "TAGS": "TagA"}), (5, b"b", {"UNIQ_KEY": "U2"})],
                             trailing_separator=True)
    msgs = build_messages({"topic": "T", "batch": "1", "sysFlag": "1", "bornTimestamp": "7"},
                          zlib.compress(body), b"\x7f\x00\x00\x01\x00\x00\x00\x01", 1 << 20)
    assert [(m.body[:1], m.flag, m.sys_flag, m.born_ts) for m in msgs] == [(b"a", 0, 0, 7), (b"b", 5, 0, 7)]
    assert fmt.tag_hash_of(msgs[0].properties) == 2598919
    single = build_messages({"topic": "T", "sysFlag": "1", "properties": "WAIT\x01true"}, b"zz", b"\0" * 8,
                            1 << 20)
    assert single[0].sys_flag == 1 and single[0].properties == b"WAIT\x01true\x02"


def test_retry_copy_keeps_the_message_and_counts():
    from protocols.remoting.sending import retry_copy

    rec = fmt.pack_record(magic=fmt.MESSAGE_MAGIC, queue_id=0, flag=3, queue_offset=0, physical_offset=0,
                          sys_flag=1, born_ts=5, born_host=bytes([1, 2, 3, 4, 0, 0, 0, 9]), store_ts=6, store_host=fmt.NO_HOST,
                          reconsume_times=2, event_id=1, body=b"zipped", topic=b"T",
                          properties=fmt.encode_properties([(b"UNIQ_KEY", b"U"), (b"MQ_DELAY_ID", b"4")]))
    m = retry_copy(fmt.RecordView(rec), "OFFSETID")
    assert (m.body, m.flag, m.sys_flag, m.reconsume_times, m.born_ts) == (b"zipped", 3, 1, 3, 5)
    assert fmt.decode_properties(m.properties) == [(b"UNIQ_KEY", b"U"), (b"RETRY_TOPIC", b"T"),
                                                   (b"ORIGIN_MESSAGE_ID", b"U")]


def test_register_body_plain_and_compressed():
    """RegisterBrokerBody in JSON (fastjson bare keys tolerated) and in the compressed
    layout of RegisterBrokerBody."""
    import struct
    import zlib

    from protocols.remoting.namesrv import decode_register_body

    plain = b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"topicName":"T","readQueueNums":4,' \
            b'"writeQueueNums":4,"perm":6}},"dataVersion":{"counter":3,"timestamp":9}},"filterServerList":[]}'
    topics, version = decode_register_body(plain, False)
    assert topics["T"]["readQueueNums"] == 4 and version == {"counter": 3, "timestamp": 9}

    def chunk(b):
        return struct.pack(">i", len(b)) + b

    raw = chunk(b'{"counter":5,"timestamp":1}') + struct.pack(">i", 2) + chunk(b"T 4 4 6 SINGLE_TAG") \
        + chunk(b"U 1 2 7 MULTI_TAG") + chunk(b"[]")
    topics, version = decode_register_body(zlib.compress(raw), True)
    assert version == {"counter": 5, "timestamp": 1}
    assert topics["U"] == {"topicName": "U", "readQueueNums": 1, "writeQueueNums": 2, "perm": 7}
    assert decode_register_body(b"", False) == ({}, {})
