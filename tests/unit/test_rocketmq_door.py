"""The RocketMQ broker door in process: BrokerProtocol over StringTransport, the store and
broker on a Clock (long polling times, the transaction check timer)."""

import json
import os

import pytest
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from mqserver.broker.broker import Broker
from mqserver.config import build_config
from mqserver.store.format import RecordView, decode_properties
from mqserver.store.store import MessageStore
from protocols.remoting import codes
from protocols.remoting.broker_door import BrokerDoor, make_factory
from protocols.remoting.codec import decode_frame, encode
from protocols.remoting.framing import FrameDecoder
from protocols.remoting.messages import RemotingCommand
from protocols.remoting.topicview import make_attrs
from tests.support.inprocess import door_fixtures
from tests.support.remoting_client import mq_json


class Door:
    """A broker door on a Clock with one client connection."""

    def __init__(self, path, io=None, **rocketmq):
        self.clock = Clock()
        self.clock.advance(1_700_000_000)
        self.store = MessageStore(str(path), self.clock, clock=self.clock.seconds, segment_size=1 << 20,
                                  flush_level=0, io=io)
        self.broker = Broker(self.store, self.clock)
        config = build_config({"rocketmq": rocketmq})
        self.door = BrokerDoor(self.broker, config, self.clock)
        self.store.open()
        self.broker.start()
        # the door's life cycle and loops are services of the broker's tree
        self.services = self.door.services()
        for svc in self.services:
            svc.startService()
        self.conn = self.connect()
        self.opaque = 0

    def connect(self):
        p = self.door.buildProtocol(None)
        t = StringTransport()
        p.makeConnection(t)
        p.decoder_out = FrameDecoder()
        return p

    def send(self, code, ext, body=b"", conn=None, flag=0):
        self.opaque += 1
        cmd = RemotingCommand(code=code, language="JAVA", version=401, opaque=self.opaque, flag=flag,
                              ext_fields={k: str(v) for k, v in ext.items()}, body=body)
        (conn or self.conn).dataReceived(encode(cmd))
        return self.opaque

    def received(self, conn=None):
        conn = conn or self.conn
        data = conn.transport.value()
        conn.transport.clear()
        return conn.decoder_out.feed(data)

    def call(self, code, ext, body=b"", conn=None):
        op = self.send(code, ext, body, conn)
        out = [c for c in self.received(conn) if c.is_response() and c.opaque == op]
        assert len(out) == 1
        return out[0]

    def create_topic(self, name, queues, perm, expire_at, read, write):
        """Create a topic at once (the Clock's store answers before this returns)."""
        done = []
        attrs = make_attrs(None, read, write)
        self.broker.create_topic(name, expire_at, queues, perm, attrs).addBoth(done.append)
        assert done and not hasattr(done[0], "check"), done

    def close(self):
        for svc in reversed(self.services):
            svc.stopService()
        self.broker.stop()
        self.store.close()


@pytest.fixture
def door(tmp_path):
    d = Door(tmp_path / "s")
    yield d
    d.close()


def send(d, topic, body=b"m", props="TAGS\x01A\x02", queue=0, conn=None):
    return d.call(codes.SEND_MESSAGE, {"producerGroup": "PG", "topic": topic, "defaultTopic": "TBW102",
                                       "defaultTopicQueueNums": 4, "queueId": queue, "sysFlag": 0,
                                       "bornTimestamp": 1, "flag": 0, "properties": props,
                                       "reconsumeTimes": 0}, body, conn)


def pull_fields(topic, offset, suspend_ms):
    return {"consumerGroup": "G", "topic": topic, "queueId": 0, "queueOffset": offset, "maxMsgNums": 32,
            "sysFlag": 6, "commitOffset": 0, "suspendTimeoutMillis": suspend_ms, "subscription": "*",
            "subVersion": 0}


# -- sending ------------------------------------------------------------------------------


def _send_command(topic, opaque):
    return RemotingCommand(code=codes.SEND_MESSAGE, opaque=opaque, body=b"now", ext_fields={
        "producerGroup": "PG", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
        "queueId": "0", "sysFlag": "0", "bornTimestamp": "1", "flag": "0", "reconsumeTimes": "0"})


def test_durable_send_is_answered_without_a_deferred(door):
    """At flush level 0 the write is done when it returns: the handler answers at once
    (Broker.publish_now), with the same answer the Deferred path gave."""
    first = send(door, "Now")  # creates the topic
    frame = door.conn.send(_send_command("Now", 7))
    assert isinstance(frame, bytes)  # the answer's frame, encoded at once
    answer = decode_frame(frame)
    assert (answer.code, answer.opaque, answer.flag) == (codes.SUCCESS, 7, codes.FLAG_RESPONSE)
    assert list(answer.ext_fields) == ["MSG_REGION", "TRACE_ON", "msgId", "queueId", "queueOffset"]
    assert answer.ext_fields["queueId"] == "0" and answer.ext_fields["queueOffset"] == "1"
    assert answer.ext_fields["msgId"] != first.ext_fields["msgId"]


@pytest.mark.parametrize("name, value, remark", [
    ("sysFlag", "x", "the custom field <sysFlag> is not a number: 'x'"),
    ("flag", str(2**31), f"the custom field <flag> is out of range: {2**31}"),
    ("bornTimestamp", str(-2**63 - 1), f"the custom field <bornTimestamp> is out of range: {-2**63 - 1}"),
    ("reconsumeTimes", "1.5", "the custom field <reconsumeTimes> is not a number: '1.5'"),
])
def test_send_header_numbers_are_checked(door, name, value, remark):
    send(door, "Num")
    ext = dict(_send_command("Num", 0).ext_fields, **{name: value})
    r = door.call(codes.SEND_MESSAGE, ext, b"bad")
    assert (r.code, r.remark) == (codes.SYSTEM_ERROR, remark)
    assert send(door, "Num").ext_fields["queueOffset"] == "1"  # nothing was stored


# -- long polling (19.3) ---------------------------------------------------------------


def test_long_poll_holds_for_the_clients_suspend_time(door):
    assert send(door, "LP").code == codes.SUCCESS
    door.send(codes.PULL_MESSAGE, pull_fields("LP", 1, 20000))  # Java's 20 s
    door.clock.advance(19.9)
    assert door.received() == []  # still held after the old fixed 15 s
    door.clock.advance(0.2)
    (r,) = door.received()
    assert r.code == codes.PULL_NOT_FOUND


def test_long_poll_is_bounded_by_long_poll_max(tmp_path):
    d = Door(tmp_path / "s", longPollMaxMs=30000)
    try:
        send(d, "LP")
        d.send(codes.PULL_MESSAGE, pull_fields("LP", 1, 90000))
        d.clock.advance(29.9)
        assert d.received() == []
        d.clock.advance(0.2)
        assert [c.code for c in d.received()] == [codes.PULL_NOT_FOUND]
    finally:
        d.close()


def test_long_poll_answers_at_arrival(door):
    send(door, "LP")
    door.send(codes.PULL_MESSAGE, pull_fields("LP", 1, 20000))
    door.clock.advance(5)
    other = door.connect()
    assert send(door, "LP", b"second", conn=other).code == codes.SUCCESS
    (r,) = door.received()
    assert r.code == codes.SUCCESS and bytes(RecordView(r.body).body) == b"second"


# -- transactions (19.1): the check timer on a Clock --------------------------------------


def test_check_timer_checks_after_timeout_then_discards(tmp_path):
    d = Door(tmp_path / "s", transactionTimeoutMs=6000, transactionCheckIntervalMs=60000, transactionCheckMax=2)
    try:
        hb = {"clientID": "c1", "producerDataSet": [{"groupName": "PG"}], "consumerDataSet": []}
        assert d.call(codes.HEART_BEAT, {}, json.dumps(hb).encode()).code == codes.SUCCESS
        props = "TRAN_MSG\x01true\x02PGROUP\x01PG\x02UNIQ_KEY\x01U1\x02"
        r = send(d, "TxT", b"half", props, queue=1)
        assert r.code == codes.SUCCESS
        assert d.store.find_queue("TxT", 1) is None or d.store.find_queue("TxT", 1).max_offset == 0
        d.clock.advance(59.9)
        assert d.received() == []
        checks = []
        for _ in range(3):
            d.clock.advance(60)
            checks += [c for c in d.received() if c.code == codes.CHECK_TRANSACTION_STATE]
        assert [dict(decode_properties(RecordView(c.body).properties))[b"TRANSACTION_CHECK_TIMES"]
                for c in checks] == [b"1", b"2"]
        assert all(c.flag & codes.FLAG_ONEWAY for c in checks)
        assert d.door.transactions.pending == {}
        assert d.store.find_queue("TRANS_CHECK_MAX_TIME_TOPIC", 0).max_offset == 1
        d.clock.advance(600)
        assert d.received() == []
    finally:
        d.close()


def test_pending_halves_are_rebuilt_by_replay_without_a_checkpoint(tmp_path):
    """No checkpoint (a crash before the first one): the dispatch listener rebuilds the pending
    halves from the half, copy and op records as the log is replayed."""
    d = Door(tmp_path / "s", transactionTimeoutMs=1000, transactionCheckIntervalMs=1000)
    props = "TRAN_MSG\x01true\x02PGROUP\x01PG\x02UNIQ_KEY\x01{}\x02"
    sent = [send(d, "TxR", u.encode(), props.format(u)) for u in ("A", "B", "C")]
    d.clock.advance(2)  # checked once: every half has a copy now
    a = d.door.transactions.pending[0]
    end = {"producerGroup": "PG", "tranStateTableOffset": 0, "commitLogOffset": a.log_offset,
           "commitOrRollback": 12, "fromTransactionCheck": "false", "msgId": "A"}
    r = d.call(codes.END_TRANSACTION, end)  # the copy's log offset with the first half's queue offset
    assert (r.code, r.remark) == (codes.SYSTEM_ERROR, "The transaction state table offset wrong")
    # the producer's own END names the first half: it ends the transaction, copies and all
    end["commitLogOffset"] = int(sent[0].ext_fields["msgId"][-16:], 16)
    assert d.call(codes.END_TRANSACTION, end).code == codes.SUCCESS
    end.update(tranStateTableOffset=a.qoffset, commitLogOffset=a.log_offset)
    assert d.call(codes.END_TRANSACTION, end).code == codes.SYSTEM_ERROR  # already ended
    before = {r: (h.qoffset, h.checks) for r, h in d.door.transactions.pending.items()}
    assert sorted(before) == [1, 2] and {h[1] for h in before.values()} == {1}
    d.close()
    os.remove(tmp_path / "s" / "metadata.json")  # as if it crashed before its first checkpoint
    d2 = Door(tmp_path / "s", transactionTimeoutMs=1000, transactionCheckIntervalMs=1000)
    try:
        assert {r: (h.qoffset, h.checks) for r, h in d2.door.transactions.pending.items()} == before
    finally:
        d2.close()


# -- updateBrokerConfig (25) and brokerConsumeStats (317) ---------------------------------


def broker_config(d):
    r = d.call(codes.GET_BROKER_CONFIG, {})
    return dict(line.split("=", 1) for line in r.body.decode().splitlines())


def test_update_broker_config_changes_the_runtime_settings_and_keeps_them(tmp_path):
    """A Properties body as mqadmin sends it (MixAll.properties2String) changes the
    runtime settings at once and survives a restart; names the broker does not change
    at run time and unknown names are ignored, as 4.9.4 ignores unknown ones."""
    d = Door(tmp_path / "s")
    try:
        r = d.call(codes.UPDATE_BROKER_CONFIG, {}, b"autoCreateTopicEnable=false\nautoCreateSubscriptionGroup=false\n"
                                                   b"brokerName=other\ndefaultTopicQueueNums=2\nnoSuchSetting=1\n")
        assert (r.code, r.remark) == (codes.SUCCESS, None)
        assert send(d, "AutoOff").code == codes.TOPIC_NOT_EXIST
        props = broker_config(d)
        assert (props["autoCreateTopicEnable"], props["autoCreateSubscriptionGroup"]) == ("false", "false")
        assert (props["brokerName"], props["defaultTopicQueueNums"]) == ("broker-a", "4")
    finally:
        d.close()
    with open(tmp_path / "s" / "brokerConfig.json") as f:
        assert json.load(f) == {"autoCreateTopicEnable": False, "autoCreateSubscriptionGroup": False}
    d = Door(tmp_path / "s")  # the same data directory: a restart
    try:
        assert broker_config(d)["autoCreateTopicEnable"] == "false"
        assert send(d, "AutoOff").code == codes.TOPIC_NOT_EXIST
        r = d.call(codes.UPDATE_BROKER_CONFIG, {}, b"autoCreateTopicEnable = true\n")
        assert r.code == codes.SUCCESS
        assert send(d, "AutoOn").code == codes.SUCCESS
    finally:
        d.close()
    with open(tmp_path / "s" / "brokerConfig.json") as f:
        assert json.load(f) == {"autoCreateTopicEnable": True, "autoCreateSubscriptionGroup": False}


def test_update_broker_config_delay_levels_and_transaction_settings(door):
    """The delay levels apply to messages delayed from then on; the transaction check's
    timeout and limit, and the idle timeout of new connections, change too."""
    body = (b"messageDelayLevel=3s 7s\ntransactionTimeOut=2000\ntransactionCheckMax=4\n"
            b"serverChannelMaxIdleTimeSeconds=30\n")
    assert door.call(codes.UPDATE_BROKER_CONFIG, {}, body).code == codes.SUCCESS
    assert [door.door.delay_ms(level) for level in (1, 2, 3)] == [3000, 7000, 7000]
    assert (door.door.transactions.timeout_ms, door.door.transactions.check_max) == (2000, 4)
    props = broker_config(door)
    assert props["messageDelayLevel"] == "3s 7s" and props["serverChannelMaxIdleTimeSeconds"] == "30"
    fresh = door.connect()  # closed after 30 s of silence (checked every 7.5 s), not 120
    for _ in range(29):
        door.clock.advance(1)
    assert not fresh.transport.disconnecting
    for _ in range(9):
        door.clock.advance(1)
    assert fresh.transport.disconnecting


@pytest.mark.parametrize("body, remark", [
    (b"transactionCheckMax=-1\nautoCreateTopicEnable=false\n",
     "updateBrokerConfig refused: transactionCheckMax: config key 'rocketmq.transactionCheckMax' "
     "must be >= 0, not -1"),
    (b"autoCreateTopicEnable=yes\n", "updateBrokerConfig refused: autoCreateTopicEnable: config key "
                                     "'rocketmq.autoCreateTopicEnable' must be true or false, not 'yes'"),
    (b"autoCreateTopicEnable=\\u00zz\n", "string2Properties error"),
], ids=["out-of-range", "not-a-boolean", "bad-escape"])
def test_update_broker_config_refuses_what_it_cannot_take(door, tmp_path, body, remark):
    """A body Properties cannot read gets 4.9.4's SYSTEM_ERROR; a value the setting
    cannot take is refused with the reason, and nothing changes."""
    r = door.call(codes.UPDATE_BROKER_CONFIG, {}, body)
    assert (r.code, r.remark) == (codes.SYSTEM_ERROR, remark)
    assert broker_config(door)["autoCreateTopicEnable"] == "true"
    assert not (tmp_path / "s" / "brokerConfig.json").exists()
    assert door.conn.transport.connected


def test_update_broker_config_without_body_changes_nothing(door, tmp_path):
    r = door.call(codes.UPDATE_BROKER_CONFIG, {})
    assert (r.code, r.remark) == (codes.SUCCESS, None)
    assert not (tmp_path / "s" / "brokerConfig.json").exists()


def test_broker_consume_stats_lists_every_group(door):
    """GET_BROKER_CONSUME_STATS: per subscription group, a ConsumeStats per topic it has
    offsets on (write queues), the ordered topics alone with isOrder; totalDiff sums
    the backlogs (4.9.4's fetchAllConsumeStatsInBroker)."""
    door.create_topic("Bcs", 2, 6, 0, 2, 3)  # 2 read queues, 3 write queues
    door.door.topics_changed()
    ordered = make_attrs(None, 1, 1, order=True)
    door.broker.create_topic("BcsO", 0, 1, 6, ordered)
    for body in (b"a", b"b", b"c"):
        send(door, "Bcs", body)
    send(door, "BcsO")
    for group in ("G1", "G2"):
        assert door.call(codes.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {},
                         json.dumps({"groupName": group}).encode()).code == codes.SUCCESS
    for topic, offset in (("Bcs", 1), ("BcsO", 1)):
        door.call(codes.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "G1", "topic": topic, "queueId": 0,
                                                 "commitOffset": offset})
    r = door.call(codes.GET_BROKER_CONSUME_STATS, {"isOrder": "false"})
    assert (r.code, r.remark) == (codes.SUCCESS, None)
    body = mq_json(r.body)
    assert body["brokerAddr"] is None and body["totalDiff"] == 2  # Bcs: 3 - 1; BcsO: 1 - 1
    by_group = {g: stats for entry in body["consumeStatsList"] for g, stats in entry.items()}
    assert sorted(by_group)[:2] == ["G1", "G2"] and by_group["G2"] == []
    bcs, bcso = by_group["G1"]
    assert sorted(bcs["offsetTable"]) == ["Bcs/0", "Bcs/1", "Bcs/2"]
    assert bcs["offsetTable"]["Bcs/0"] == {"brokerOffset": 3, "consumerOffset": 1,
                                           "lastTimestamp": bcs["offsetTable"]["Bcs/0"]["lastTimestamp"]}
    assert bcs["offsetTable"]["Bcs/0"]["lastTimestamp"] > 0 and bcs["consumeTps"] == 0
    assert list(bcso["offsetTable"]) == ["BcsO/0"]
    only_ordered = mq_json(door.call(codes.GET_BROKER_CONSUME_STATS, {"isOrder": "true"}).body)
    by_group = {g: stats for entry in only_ordered["consumeStatsList"] for g, stats in entry.items()}
    assert [list(s["offsetTable"]) for s in by_group["G1"]] == [["BcsO/0"]]
    assert only_ordered["totalDiff"] == 0


_, held = door_fixtures(make_factory)


def test_update_broker_config_requests_in_a_row_keep_every_change(held):
    """Two updates whose writes wait for the disk: each is answered once its write is
    done, and the file ends with both changes (one update at a time, as 4.9.4's)."""
    c = held.connect(held.factory)
    first = RemotingCommand(code=codes.UPDATE_BROKER_CONFIG, opaque=1, body=b"autoCreateTopicEnable=false\n")
    second = RemotingCommand(code=codes.UPDATE_BROKER_CONFIG, opaque=2, body=b"transactionCheckMax=3\n")
    c.send(encode(first) + encode(second))
    assert c.take() == b""
    held.runner.release()
    answers = FrameDecoder().feed(c.take())
    assert [(a.opaque, a.code) for a in answers] == [(1, codes.SUCCESS), (2, codes.SUCCESS)]
    with open(os.path.join(held.store.path, "brokerConfig.json")) as f:
        assert json.load(f) == {"autoCreateTopicEnable": False, "transactionCheckMax": 3}


def test_update_broker_config_that_cannot_be_kept_changes_nothing(door, tmp_path):
    """When the settings file cannot be written the answer is SYSTEM_ERROR and the
    setting keeps its value."""
    (tmp_path / "s" / "brokerConfig.json").mkdir()  # a directory: the rename onto it fails
    r = door.call(codes.UPDATE_BROKER_CONFIG, {}, b"autoCreateTopicEnable=false\n")
    assert r.code == codes.SYSTEM_ERROR
    assert r.remark.startswith("updateBrokerConfig: writing brokerConfig.json failed: ")
    assert broker_config(door)["autoCreateTopicEnable"] == "true"
    assert send(door, "StillAuto").code == codes.SUCCESS


def test_a_topic_json_that_cannot_be_written_fails_the_send_that_auto_creates(tmp_path):
    """The auto-created topic is in the log, but topic.json cannot hold it (a full disk):
    the send gets the full-disk answer, the failure is one of the store's disk errors,
    and the next tick writes topic.json once the disk has room."""
    import errno

    from mqserver.store.fileio import FaultyIO

    io = FaultyIO()
    d = Door(tmp_path / "s", io=io)
    try:
        io.json_error = errno.ENOSPC
        r = send(d, "AutoT")
        assert r.code == codes.SERVICE_NOT_AVAILABLE and "disk is full" in r.remark, r.remark
        assert d.store.disk_errors == 1 and d.store.disk.disk_trouble.startswith("writing topic.json")
        d.door._tick()  # the disk is still full: tried again, counted again
        assert d.store.disk_errors == 2
        io.json_error = None
        d.door._tick()
        with open(tmp_path / "s" / "topic.json") as f:
            assert "AutoT" in json.load(f)["topicConfigTable"]
        assert send(d, "AutoT").code == codes.SUCCESS
    finally:
        d.close()
