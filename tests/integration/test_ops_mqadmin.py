"""mqadmin's everyday requests with frames shaped as the Java 4.9.4 admin client sends
them (language JAVA, version 401, its request-header field names), against the real
broker: topicStatus (202), consumerProgress (208), consumerConnection (203),
producerConnection (204), getBrokerConfig (26), getNamesrvConfig (319), queryMsgById's
track (300), resetOffsetByTime (222), statsAll (315), clusterList (28), deleteSubGroup,
updateBrokerConfig (25) and brokerConsumeStats (317)."""

import json
import time

import pytest

from protocols.remoting import codes
from tests.support.remoting_client import RemotingClient, heartbeat_body, mq_json
from tests.support.rmq import broker_port, rocket_server

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = rocket_server(tmp_path_factory.mktemp("mqadmin") / "broker").start()
    try:
        yield s
    finally:
        s.stop()
        s.close()


@pytest.fixture
def admin(srv):
    c = RemotingClient("127.0.0.1", broker_port(srv))
    yield c
    c.close()


def send(c, topic, body, queue):
    r = c.call(codes.SEND_MESSAGE_V2, {
        "a": "PG_ADM", "b": topic, "c": "TBW102", "d": 2, "e": queue, "f": 0,
        "g": int(time.time() * 1000), "h": 0, "i": "TAGS\x01A\x02", "j": 0, "k": "false",
        "m": "false"}, body)
    assert r.code == codes.SUCCESS, r.remark
    return r


def create_topic(c, topic, queues=2):
    r = c.call(codes.UPDATE_AND_CREATE_TOPIC, {
        "topic": topic, "defaultTopic": "TBW102", "readQueueNums": queues,
        "writeQueueNums": queues, "perm": 6, "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": 0, "order": "false"})
    assert r.code == codes.SUCCESS


def pull(c, group, topic, queue, offset):
    return c.call(codes.PULL_MESSAGE, {
        "consumerGroup": group, "topic": topic, "queueId": queue, "queueOffset": offset,
        "maxMsgNums": 32, "sysFlag": 2, "commitOffset": 0, "suspendTimeoutMillis": 0,
        "subscription": "*", "subVersion": 0, "expressionType": "TAG"})


def test_topic_status_202(admin):
    """GET_TOPIC_STATS_INFO: TopicStatsTable keyed by MessageQueue."""
    create_topic(admin, "StatT")
    send(admin, "StatT", b"a", 0)
    send(admin, "StatT", b"b", 0)
    send(admin, "StatT", b"c", 1)
    r = admin.call(codes.GET_TOPIC_STATS_INFO, {"topic": "StatT"})
    assert r.code == codes.SUCCESS, r.remark
    table = mq_json(r.body)["offsetTable"]
    assert table["StatT/0"]["maxOffset"] == 2 and table["StatT/0"]["minOffset"] == 0
    assert table["StatT/1"]["maxOffset"] == 1
    assert table["StatT/0"]["lastUpdateTimestamp"] > 0
    r = admin.call(codes.GET_TOPIC_STATS_INFO, {"topic": "NoSuchT"})
    assert (r.code, r.remark) == (codes.TOPIC_NOT_EXIST, "topic[NoSuchT] not exist")


def test_consumer_progress_connections_and_who(admin, srv):
    """208 ConsumeStats, 203 ConsumerConnection, 204 ProducerConnection, 300 GroupList."""
    create_topic(admin, "ProgT")
    for i in range(3):
        send(admin, "ProgT", b"m%d" % i, 0)
    hb = json.loads(heartbeat_body("cli-1", "GP", ["ProgT"]))
    hb["producerDataSet"] = [{"groupName": "PG_ADM"}]
    assert admin.call(codes.HEART_BEAT, {}, json.dumps(hb).encode()).code == codes.SUCCESS
    assert admin.call(codes.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": "GP", "topic": "ProgT", "queueId": 0, "commitOffset": 2}).code == 0
    r = admin.call(codes.GET_CONSUME_STATS, {"consumerGroup": "GP", "topic": "ProgT"})
    assert r.code == codes.SUCCESS, r.remark
    stats = mq_json(r.body)
    q0 = stats["offsetTable"]["ProgT/0"]
    assert (q0["brokerOffset"], q0["consumerOffset"]) == (3, 2)
    assert q0["lastTimestamp"] > 0 and "consumeTps" in stats
    assert stats["offsetTable"]["ProgT/1"]["brokerOffset"] == 0
    r = admin.call(codes.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "GP"})
    assert r.code == codes.SUCCESS
    conn = json.loads(r.body)
    (c,) = conn["connectionSet"]
    assert c["clientId"] == "cli-1" and c["language"] == "JAVA" and c["version"] == 401
    assert c["clientAddr"] == f"127.0.0.1:{admin.sock.getsockname()[1]}"
    assert conn["subscriptionTable"]["ProgT"]["subString"] == "*"
    r = admin.call(codes.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "Nobody"})
    assert (r.code, r.remark) == (206, "the consumer group[Nobody] not online")
    r = admin.call(codes.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "PG_ADM"})
    assert r.code == codes.SUCCESS
    assert json.loads(r.body)["connectionSet"][0]["clientId"] == "cli-1"
    r = admin.call(codes.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "NoPG"})
    assert (r.code, r.remark) == (codes.SYSTEM_ERROR, "the producer group[NoPG] not exist")
    r = admin.call(codes.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": "ProgT"})
    assert r.code == codes.SUCCESS and json.loads(r.body) == {"groupList": ["GP"]}


def test_view_message_then_track_does_not_end_in_300(admin):
    """queryMsgById prints the message (33) and then asks who consumes its topic (300):
    both succeed."""
    create_topic(admin, "ViewT", 1)
    r = send(admin, "ViewT", b"look", 0)
    offset = int(r.ext_fields["msgId"][16:], 16)
    assert admin.call(codes.VIEW_MESSAGE_BY_ID, {"offset": offset}).code == codes.SUCCESS
    r = admin.call(codes.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": "ViewT"})
    assert r.code == codes.SUCCESS and json.loads(r.body) == {"groupList": []}


def test_broker_and_namesrv_config(admin, srv):
    """26 answers Java properties text and the data version; 319 the nameserver's."""
    r = admin.call(codes.GET_BROKER_CONFIG)
    assert r.code == codes.SUCCESS
    props = dict(line.split("=", 1) for line in r.body.decode().splitlines())
    assert props["brokerName"] == "broker-a" and props["brokerClusterName"] == "DefaultCluster"
    assert props["listenPort"] == str(broker_port(srv))
    assert json.loads(r.ext_fields["version"])["counter"] >= 1
    ns = RemotingClient("127.0.0.1", srv.ports["NamesrvFactory"])
    r = ns.call(codes.GET_NAMESRV_CONFIG)
    ns.close()
    assert r.code == codes.SUCCESS
    props = dict(line.split("=", 1) for line in r.body.decode().splitlines())
    assert props["listenPort"] == str(srv.ports["NamesrvFactory"])


def test_reset_offset_by_time_222(admin, srv):
    """resetOffsetByTime: the group's offsets move to the first message stored at or
    after the time, its online clients get RESET_CONSUMER_CLIENT_OFFSET, and a pull from
    there gets the messages after the point again, none before it."""
    create_topic(admin, "RstT", 1)
    send(admin, "RstT", b"old", 0)
    # the next message is stored in a later millisecond than "old"
    first = int(time.time() * 1000)
    while int(time.time() * 1000) <= first + 1:
        time.sleep(0.001)
    mark = int(time.time() * 1000)
    send(admin, "RstT", b"new1", 0)
    send(admin, "RstT", b"new2", 0)
    consumer = RemotingClient("127.0.0.1", broker_port(srv))
    assert consumer.call(codes.HEART_BEAT, {}, heartbeat_body("cli-r", "GR", ["RstT"])).code == 0
    assert consumer.call(codes.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": "GR", "topic": "RstT", "queueId": 0, "commitOffset": 3}).code == 0
    r = admin.call(codes.INVOKE_BROKER_TO_RESET_OFFSET, {
        "topic": "RstT", "group": "GR", "timestamp": mark, "isForce": "true"})
    assert r.code == codes.SUCCESS, r.remark
    assert mq_json(r.body)["offsetTable"] == {"RstT/0": 1}
    consumer.sock.settimeout(10)
    while not any(c.code == codes.RESET_CONSUMER_CLIENT_OFFSET and not c.is_response()
                  for c in consumer.inbox):
        consumer.inbox.extend(consumer.decoder.feed(consumer.sock.recv(1 << 16)))
    (req,) = [c for c in consumer.requests() if c.code == codes.RESET_CONSUMER_CLIENT_OFFSET]
    assert req.ext_fields["group"] == "GR" and req.ext_fields["topic"] == "RstT"
    assert mq_json(req.body)["offsetTable"] == {"RstT/0": 1}
    off = consumer.call(codes.QUERY_CONSUMER_OFFSET, {
        "consumerGroup": "GR", "topic": "RstT", "queueId": 0}).ext_fields["offset"]
    assert off == "1"
    r = pull(consumer, "GR", "RstT", 0, int(off))
    assert r.code == codes.SUCCESS and b"new1" in r.body and b"old" not in r.body
    consumer.close()
    r = admin.call(codes.INVOKE_BROKER_TO_RESET_OFFSET, {
        "topic": "RstT", "group": "GR", "timestamp": mark, "isForce": "true"})
    assert r.code == 206  # no consumer online: mqadmin falls back to its old command


def test_delete_group_whose_dlq_topic_does_not_exist(admin):
    """deleteSubGroup deletes the group, then its %RETRY% and %DLQ% topics whether or not
    they exist: every step answers success, as 4.9.4 does."""
    assert admin.call(codes.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                      body=b'{"groupName":"DelG"}').code == codes.SUCCESS
    assert admin.call(codes.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": "DelG", "topic": "TBW102", "queueId": 0, "commitOffset": 0}).code == 0
    assert admin.call(codes.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": "TBW102"}).body.count(b"DelG")
    assert admin.call(codes.DELETE_SUBSCRIPTIONGROUP,
                      {"groupName": "DelG", "removeOffset": "true"}).code == codes.SUCCESS
    assert not admin.call(codes.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": "TBW102"}).body.count(b"DelG")
    for topic in ("%RETRY%DelG", "%DLQ%DelG"):
        r = admin.call(codes.DELETE_TOPIC_IN_BROKER, {"topic": topic})
        assert r.code == codes.SUCCESS, (topic, r.remark)


def test_stats_all_315(admin):
    """statsAll: TOPIC_PUT_NUMS and GROUP_GET_NUMS with minute, hour and day items; an
    unknown key answers RocketMQ's error."""
    create_topic(admin, "AllT", 1)
    send(admin, "AllT", b"x", 0)
    send(admin, "AllT", b"y", 0)
    assert admin.call(codes.HEART_BEAT, {}, heartbeat_body("cli-a", "GA", ["AllT"])).code == 0
    assert pull(admin, "GA", "AllT", 0, 0).code == codes.SUCCESS
    put = json.loads(admin.call(codes.VIEW_BROKER_STATS_DATA,
                                {"statsName": "TOPIC_PUT_NUMS", "statsKey": "AllT"}).body)
    assert [put[k]["sum"] for k in ("statsMinute", "statsHour", "statsDay")] == [2, 2, 2]
    get = json.loads(admin.call(codes.VIEW_BROKER_STATS_DATA,
                                {"statsName": "GROUP_GET_NUMS", "statsKey": "AllT@GA"}).body)
    assert get["statsDay"]["sum"] == 2
    r = admin.call(codes.VIEW_BROKER_STATS_DATA, {"statsName": "TOPIC_PUT_NUMS", "statsKey": "NoT"})
    assert (r.code, r.remark) == (codes.SYSTEM_ERROR, "The stats <TOPIC_PUT_NUMS> <NoT> not exist")


@pytest.fixture
def fresh(tmp_path):
    """A broker of its own (its consume stats and settings are the test's alone)."""
    s = rocket_server(tmp_path / "broker").start()
    try:
        yield s
    finally:
        s.stop()
        s.close()


def broker_config(port):
    c = RemotingClient("127.0.0.1", port)
    try:
        r = c.call(codes.GET_BROKER_CONFIG)
    finally:
        c.close()
    assert r.code == codes.SUCCESS
    return dict(line.split("=", 1) for line in r.body.decode().splitlines())


def test_update_broker_config_25_changes_settings_that_survive_a_restart(fresh):
    """updateBrokerConfig's Properties body (MixAll.properties2String: key=value lines)
    changes the runtime settings at once, 4.9.4 names unknown here are ignored, and the
    change is in force again after a restart; a value a setting cannot take is refused
    with nothing changed."""
    c = RemotingClient("127.0.0.1", broker_port(fresh))
    try:
        r = c.call(codes.UPDATE_BROKER_CONFIG, {}, b"autoCreateTopicEnable=false\nmessageDelayLevel=2s 4s\n"
                                                   b"brokerPermission=4\nflushDiskType=SYNC_FLUSH\n")
        assert (r.code, r.remark) == (codes.SUCCESS, None)
        r = send_new_topic(c, "NoAutoT")
        assert (r.code, r.remark) == (codes.TOPIC_NOT_EXIST, "topic[NoAutoT] not exist, apply first please!")
        r = c.call(codes.UPDATE_BROKER_CONFIG, {}, b"transactionCheckMax=many\nautoCreateTopicEnable=true\n")
        assert r.code == codes.SYSTEM_ERROR and "transactionCheckMax" in r.remark
    finally:
        c.close()
    props = broker_config(broker_port(fresh))
    assert (props["autoCreateTopicEnable"], props["messageDelayLevel"]) == ("false", "2s 4s")
    assert props["flushDiskType"] == "ASYNC_FLUSH"

    fresh.stop()
    fresh.start()
    assert "settings changed by updateBrokerConfig" in fresh.current_log()
    props = broker_config(broker_port(fresh))
    assert (props["autoCreateTopicEnable"], props["messageDelayLevel"]) == ("false", "2s 4s")
    c = RemotingClient("127.0.0.1", broker_port(fresh))
    try:
        assert send_new_topic(c, "NoAutoT").code == codes.TOPIC_NOT_EXIST
        assert c.call(codes.UPDATE_BROKER_CONFIG, {}, b"autoCreateTopicEnable=true\n").code == codes.SUCCESS
        assert send_new_topic(c, "NoAutoT").code == codes.SUCCESS
    finally:
        c.close()


def send_new_topic(c, topic):
    return c.call(codes.SEND_MESSAGE_V2, {
        "a": "PG_ADM", "b": topic, "c": "TBW102", "d": 4, "e": 0, "f": 0,
        "g": int(time.time() * 1000), "h": 0, "i": "", "j": 0, "k": "false", "m": "false"}, b"m")


def test_broker_consume_stats_317(fresh):
    """brokerConsumeStats: ConsumeStatsList with the broker's address, per subscription
    group the ConsumeStats of each topic it has offsets on, and the total backlog;
    isOrder keeps the ordered topics alone."""
    c = RemotingClient("127.0.0.1", broker_port(fresh))
    try:
        create_topic(c, "BcsT", 2)
        r = c.call(codes.UPDATE_AND_CREATE_TOPIC, {
            "topic": "BcsOrd", "defaultTopic": "TBW102", "readQueueNums": 1, "writeQueueNums": 1,
            "perm": 6, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": "true"})
        assert r.code == codes.SUCCESS
        for body, queue in ((b"a", 0), (b"b", 0), (b"c", 1)):
            send(c, "BcsT", body, queue)
        send(c, "BcsOrd", b"o", 0)
        for group in ("GB1", "GB2"):
            assert c.call(codes.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {},
                          json.dumps({"groupName": group}).encode()).code == codes.SUCCESS
        for topic in ("BcsT", "BcsOrd"):
            assert c.call(codes.UPDATE_CONSUMER_OFFSET, {
                "consumerGroup": "GB1", "topic": topic, "queueId": 0, "commitOffset": 1}).code == 0
        r = c.call(codes.GET_BROKER_CONSUME_STATS, {"isOrder": "false"})
        assert (r.code, r.remark) == (codes.SUCCESS, None)
        body = mq_json(r.body)
        assert body["brokerAddr"] == f"127.0.0.1:{broker_port(fresh)}"
        assert body["totalDiff"] == 2  # BcsT: (2 - 1) + (1 - 0); BcsOrd: 1 - 1
        groups = {g: stats for entry in body["consumeStatsList"] for g, stats in entry.items()}
        assert groups["GB2"] == []
        assert [sorted(s["offsetTable"]) for s in groups["GB1"]] == [["BcsOrd/0"], ["BcsT/0", "BcsT/1"]]
        q0 = groups["GB1"][1]["offsetTable"]["BcsT/0"]
        assert (q0["brokerOffset"], q0["consumerOffset"]) == (2, 1) and q0["lastTimestamp"] > 0
        body = mq_json(c.call(codes.GET_BROKER_CONSUME_STATS, {"isOrder": "true"}).body)
        groups = {g: stats for entry in body["consumeStatsList"] for g, stats in entry.items()}
        assert [sorted(s["offsetTable"]) for s in groups["GB1"]] == [["BcsOrd/0"]]
        assert body["totalDiff"] == 0
    finally:
        c.close()
