"""RocketMQ transactional messages against the real server process, with raw
frames shaped like the Java 4.9.4 client's TransactionMQProducer: half messages,
END_TRANSACTION (37), CHECK_TRANSACTION_STATE (39) back to the producer group, the
check limit, and a restart in between. The Python client of PyPI (C++ 1.2.3) has no
transaction producer."""

import json
import time

import pytest

from mqserver.store.format import RecordView, decode_properties
from protocols.remoting import codes
from tests.support.remoting_client import RemotingClient, records
from tests.support.rmq import broker_port, rocket_server
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(120)

TX_CONFIG = {"rocketmq": {"transactionTimeoutMs": 300, "transactionCheckIntervalMs": 100,
                          "transactionCheckMax": 3, "longPollMaxMs": 5000}}
COMMIT, ROLLBACK, UNKNOW = 8, 12, 0


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = rocket_server(tmp_path_factory.mktemp("tx") / "broker", config=TX_CONFIG)
    with s.start():
        yield s


def java_client(srv, group):
    """A connection shaped like a Java 4.9.4 producer of C{group} (heartbeat sent)."""
    c = RemotingClient("127.0.0.1", broker_port(srv), language="JAVA", version=codes.VERSION_V4_9_4)
    body = json.dumps({"clientID": f"192.0.2.2@{group}#1", "consumerDataSet": [],
                       "producerDataSet": [{"groupName": group}, {"groupName": "CLIENT_INNER_PRODUCER"}]})
    assert c.call(codes.HEART_BEAT, {}, body.encode()).code == codes.SUCCESS
    return c


def send_half(c, topic, group, uniq, body=b"tx-body", queue=0):
    """SEND_MESSAGE_V2 as DefaultMQProducerImpl.sendKernelImpl sends a transaction's half."""
    props = f"TRAN_MSG\x01true\x02PGROUP\x01{group}\x02KEYS\x01k-{uniq}\x02UNIQ_KEY\x01{uniq}\x02WAIT\x01true\x02TAGS\x01TagA"
    r = c.call(codes.SEND_MESSAGE_V2, {
        "a": group, "b": topic, "c": "TBW102", "d": "4", "e": str(queue), "f": str(codes.MSG_TRANSACTION_PREPARED_TYPE),
        "g": str(int(time.time() * 1000)), "h": "0", "i": props, "j": "0", "k": "false"}, body)
    assert r.code == codes.SUCCESS, r.remark
    return r


def end_tx(c, group, send_or_check, uniq, kind, from_check=False, oneway=False):
    """END_TRANSACTION as the Java client sends it after the local transaction or a check."""
    ext = send_or_check.ext_fields
    if from_check:
        log_off, table_off = ext["commitLogOffset"], ext["tranStateTableOffset"]
    else:
        log_off, table_off = str(int(ext["msgId"][-16:], 16)), ext["queueOffset"]
    fields = {"producerGroup": group, "tranStateTableOffset": table_off, "commitLogOffset": log_off,
              "commitOrRollback": kind, "fromTransactionCheck": "true" if from_check else "false", "msgId": uniq}
    if from_check:
        fields["transactionId"] = uniq
    if oneway:
        c.send(codes.END_TRANSACTION, fields, flag=codes.FLAG_ONEWAY)
        return None
    return c.call(codes.END_TRANSACTION, fields)


def pull(c, topic, offset=0, queue=0, suspend_ms=0, group="GTX"):
    r = c.call(codes.PULL_MESSAGE, {
        "consumerGroup": group, "topic": topic, "queueId": queue, "queueOffset": offset, "maxMsgNums": 32,
        "sysFlag": 6 if suspend_ms else 4, "commitOffset": 0, "suspendTimeoutMillis": suspend_ms,
        "subscription": "*", "subVersion": 0}, timeout=suspend_ms / 1000.0 + 10)
    return r, records(r.body) if r.code == codes.SUCCESS else []


def pull_wait(c, topic, timeout=10.0):
    """Long-poll C{topic} queue 0 until it holds messages (it may not exist yet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        resp, recs = pull(c, topic, suspend_ms=1000)
        if recs:
            return recs
        if resp.code == codes.TOPIC_NOT_EXIST:
            c.call(codes.GET_MAX_OFFSET, {"topic": topic, "queueId": 0})  # a round trip, then retry
    raise TimeoutError(topic)


def props_of(view):
    return {k.decode(): v.decode() for k, v in decode_properties(view.properties)}


def test_commit_makes_the_message_visible_once(srv):
    c = java_client(srv, "PG1")
    try:
        r = send_half(c, "TxCommit", "PG1", "U1", queue=1)
        assert r.ext_fields["queueId"] == "1"
        assert pull(c, "TxCommit", queue=1)[0].code == codes.PULL_NOT_FOUND  # a half is invisible
        assert end_tx(c, "PG1", r, "U1", COMMIT).code == codes.SUCCESS
        resp, recs = pull(c, "TxCommit", queue=1)
        assert [bytes(v.body) for v in recs] == [b"tx-body"]
        v = recs[0]
        p = props_of(v)
        assert (v.topic, v.queue_id, p["UNIQ_KEY"], p["TAGS"]) == ("TxCommit", 1, "U1", "TagA")
        # as the 4.9 broker stores it: the half's properties and the COMMIT bits
        assert p["REAL_TOPIC"] == "TxCommit" and p["REAL_QID"] == "1" and p["PGROUP"] == "PG1"
        assert v.sys_flag & 0xC == COMMIT
        # repeated (as a late check would): refused, nothing written
        again = end_tx(c, "PG1", r, "U1", COMMIT)
        assert again.code == codes.SYSTEM_ERROR
        assert end_tx(c, "PG1", r, "U1", ROLLBACK).code == codes.SYSTEM_ERROR
        assert len(pull(c, "TxCommit", queue=1)[1]) == 1
        # a wrong group is refused as by the 4.9 broker
        r2 = send_half(c, "TxCommit", "PG1", "U1b", queue=1)
        bad = end_tx(c, "PGX", r2, "U1b", COMMIT)
        assert (bad.code, bad.remark) == (codes.SYSTEM_ERROR, "The producer group wrong")
        assert end_tx(c, "PG1", r2, "U1b", ROLLBACK).code == codes.SUCCESS
    finally:
        c.close()


def test_java_oneway_commit_reaches_a_long_poll(srv):
    c = java_client(srv, "PG2")
    try:
        r = send_half(c, "TxOneway", "PG2", "U2")
        end_tx(c, "PG2", r, "U2", COMMIT, oneway=True)
        recs = pull_wait(c, "TxOneway")
        assert [props_of(v)["UNIQ_KEY"] for v in recs] == ["U2"]
    finally:
        c.close()


def test_rollback_is_never_delivered_nor_checked(srv):
    c = java_client(srv, "PG3")
    try:
        r = send_half(c, "TxRollback", "PG3", "U3")
        assert end_tx(c, "PG3", r, "U3", ROLLBACK).code == codes.SUCCESS
        # a second half with no decision is checked back; the rolled-back one never is
        send_half(c, "TxRollback", "PG3", "U3-open")
        check = c.wait_request(codes.CHECK_TRANSACTION_STATE)
        assert check.ext_fields["msgId"] == "U3-open"
        assert end_tx(c, "PG3", check, "U3-open", ROLLBACK, from_check=True).code == codes.SUCCESS
        assert pull(c, "TxRollback")[0].code == codes.PULL_NOT_FOUND
        assert c.call(codes.GET_MAX_OFFSET, {"topic": "TxRollback", "queueId": 0}).ext_fields["offset"] == "0"
        assert [x for x in c.requests() if x.ext_fields.get("msgId") == "U3"] == []
    finally:
        c.close()


def test_unknown_then_check_commit(srv):
    c = java_client(srv, "PG4")
    try:
        r = send_half(c, "TxCheck", "PG4", "U4", body=b"checked", queue=2)
        assert end_tx(c, "PG4", r, "U4", UNKNOW, oneway=True) is None
        check = c.wait_request(codes.CHECK_TRANSACTION_STATE)
        assert check.flag & codes.FLAG_ONEWAY
        ext = check.ext_fields
        assert set(ext) == {"tranStateTableOffset", "commitLogOffset", "msgId", "transactionId", "offsetMsgId"}
        assert ext["msgId"] == ext["transactionId"] == "U4"
        # the message as the Java client decodes it: real topic and queue, the half's fields
        v = RecordView(check.body)
        assert v.size == len(check.body)
        assert (v.topic, v.queue_id, bytes(v.body)) == ("TxCheck", 2, b"checked")
        p = props_of(v)
        assert p["PGROUP"] == "PG4" and p["TRANSACTION_CHECK_TIMES"] == "1"
        assert int(ext["offsetMsgId"][-16:], 16) == int(ext["commitLogOffset"]) == v.offset
        assert v.queue_offset == int(ext["tranStateTableOffset"])
        assert pull(c, "TxCheck", queue=2)[0].code == codes.PULL_NOT_FOUND
        assert end_tx(c, "PG4", check, "U4", COMMIT, from_check=True).code == codes.SUCCESS
        recs = pull(c, "TxCheck", queue=2)[1]
        assert [bytes(x.body) for x in recs] == [b"checked"]
        # the producer's first answer arriving late changes nothing
        assert end_tx(c, "PG4", r, "U4", COMMIT).code == codes.SYSTEM_ERROR
        assert len(pull(c, "TxCheck", queue=2)[1]) == 1
    finally:
        c.close()


def test_unknown_then_check_rollback(srv):
    c = java_client(srv, "PG5")
    try:
        send_half(c, "TxCheckRb", "PG5", "U5")
        check = c.wait_request(codes.CHECK_TRANSACTION_STATE)
        assert end_tx(c, "PG5", check, "U5", ROLLBACK, from_check=True).code == codes.SUCCESS
        assert pull(c, "TxCheckRb")[0].code == codes.PULL_NOT_FOUND
    finally:
        c.close()


def test_check_max_discards_the_half(srv):
    c = java_client(srv, "PG6")
    try:
        send_half(c, "TxMax", "PG6", "U6")
        times = [props_of(RecordView(c.wait_request(codes.CHECK_TRANSACTION_STATE).body))["TRANSACTION_CHECK_TIMES"]
                 for _ in range(3)]
        assert times == ["1", "2", "3"]
        recs = pull_wait(c, "TRANS_CHECK_MAX_TIME_TOPIC")
        assert [props_of(v)["UNIQ_KEY"] for v in recs] == ["U6"]
        assert "checked 3 times, so discard it" in srv.current_log()
        assert [x for x in c.requests() if x.code == codes.CHECK_TRANSACTION_STATE] == []
        assert pull(c, "TxMax")[0].code == codes.PULL_NOT_FOUND
    finally:
        c.close()


def test_pending_half_survives_a_restart(tmp_path):
    cfg = {"rocketmq": dict(TX_CONFIG["rocketmq"], transactionTimeoutMs=1000)}
    s = rocket_server(tmp_path / "broker", config=cfg)
    s.start()
    try:
        c = java_client(s, "PG7")
        send_half(c, "TxRestart", "PG7", "U7-open", body=b"open")
        r = send_half(c, "TxRestart", "PG7", "U7-done", body=b"done")
        assert end_tx(c, "PG7", r, "U7-done", COMMIT).code == codes.SUCCESS
        c.close()
        s.kill()  # no final checkpoint: the halves and the decision are replayed from the log
        s.start()
        c = java_client(s, "PG7")
        check = c.wait_request(codes.CHECK_TRANSACTION_STATE)
        assert check.ext_fields["msgId"] == "U7-open"
        assert end_tx(c, "PG7", check, "U7-open", COMMIT, from_check=True).code == codes.SUCCESS
        c.close()
        s.stop()
        s.start()  # and once more: both decisions are in the log
        c = java_client(s, "PG7")
        recs = pull(c, "TxRestart")[1]
        assert sorted(bytes(v.body) for v in recs) == [b"done", b"open"]
        # nothing pending any more: a fresh half is the only one checked
        send_half(c, "TxRestart", "PG7", "U7-new")
        assert c.wait_request(codes.CHECK_TRANSACTION_STATE).ext_fields["msgId"] == "U7-new"
        c.close()
    finally:
        try:
            s.stop()
        finally:
            s.close()


def test_halves_and_decisions_replicate_to_a_slave(tmp_path):
    """Half, op and committed records are ordinary log records: a slave holds them as
    the master does, serves only the committed message, and refuses END_TRANSACTION."""
    from protocols.smss.client import SmssClient
    from tests.support.server import ServerProcess

    listen = {"smss": "tcp:0:interface=127.0.0.1", "broker": "tcp:0:interface=127.0.0.1"}
    master = ServerProcess(tmp_path / "master", config=TX_CONFIG, listen=dict(listen)).start()
    slave = None
    try:
        slave = ServerProcess(tmp_path / "slave", config=TX_CONFIG, listen=dict(listen),
                              extra_args=["--role", "slave", "--master", f"127.0.0.1:{master.smss_port}"]).start()
        c = java_client(master, "PG8")
        r = send_half(c, "TxRepl", "PG8", "U8-commit", body=b"yes")
        assert end_tx(c, "PG8", r, "U8-commit", COMMIT).code == codes.SUCCESS
        r2 = send_half(c, "TxRepl", "PG8", "U8-rollback", body=b"no")
        assert end_tx(c, "PG8", r2, "U8-rollback", ROLLBACK).code == codes.SUCCESS
        c.close()
        with SmssClient("127.0.0.1", master.smss_port) as m:
            head = m.topic_info("$replication")["appliedEventId"]
        with SmssClient("127.0.0.1", slave.smss_port) as s:
            wait_until(lambda: s.topic_info("$replication")["appliedEventId"] == head, 20,
                       "the slave to apply the master's eventIds", interval=0.1)
        sc = RemotingClient("127.0.0.1", broker_port(slave), language="JAVA", version=codes.VERSION_V4_9_4)
        try:
            assert [bytes(v.body) for v in pull(sc, "TxRepl")[1]] == [b"yes"]
            assert [bytes(v.body) for v in pull(sc, "RMQ_SYS_TRANS_HALF_TOPIC")[1]] == [b"yes", b"no"]
            assert [bytes(v.body) for v in pull(sc, "RMQ_SYS_TRANS_OP_HALF_TOPIC")[1]] == [b"0", b"1"]
            assert end_tx(sc, "PG8", r, "U8-commit", COMMIT).code == codes.SLAVE_NOT_AVAILABLE
        finally:
            sc.close()
    finally:
        for s in (slave, master):
            if s is not None:
                try:
                    s.stop()
                finally:
                    s.close()
