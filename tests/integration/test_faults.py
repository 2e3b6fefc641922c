"""Fault rules on the real broker process: off unless admin.faults, set with mqctl as the
docs show, seen by real clients (the RocketMQ C++ client, pynsq) and by a raw remoting
connection, and shown in /metrics while they are in force."""

import json
import struct
import subprocess
import sys
import urllib.request

import pytest

from protocols.remoting import codes
from protocols.smss.client import SmssClient, SmssError
from tests.integration.test_ops_mqctl import mqctl
from tests.support.nsq import V2, http, http_json, run_client
from tests.support.remoting_client import RemotingClient
from tests.support.rmq import namesrv_addr, run_client as run_rmq, sends
from tests.support.faults import LOOP, fault_broker
from tests.support.server import ROOT, ServerProcess
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(180)
#: A pynsq Writer on PARAMS["port"] in a script run by run_client; "seen" its answers.
PYNSQ_WRITER = """
import nsq, tornado.ioloop
loop = tornado.ioloop.IOLoop.current()
loop.call_later(20, loop.stop)
w = nsq.Writer(["127.0.0.1:%d" % PARAMS["port"]])
seen = []
"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    with fault_broker(tmp_path_factory.mktemp("faults"), "metrics", "broker", "namesrv",
                      "nsqd_tcp", "nsqd_http", "lookupd_http", "smss", "msgout") as s:
        yield s


@pytest.fixture(autouse=True)
def no_rules_left(srv):
    yield
    mqctl(srv, "fault", "clear")


def metrics(srv):
    port = srv.ports["MetricsSite"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith("mqserver_fault")}


def send_message(c, topic):
    return c.call(codes.SEND_MESSAGE, {
        "producerGroup": "PG", "topic": topic, "defaultTopic": "TBW102",
        "defaultTopicQueueNums": 4, "queueId": 0, "sysFlag": 0, "bornTimestamp": 1, "flag": 0,
        "properties": "", "reconsumeTimes": 0}, b"m")


def test_faults_are_off_unless_the_config_allows_them(tmp_path):
    """Without admin.faults the admin API refuses every fault route (403) and mqctl says
    why."""
    s = ServerProcess(tmp_path / "broker", listen={"admin": LOOP}).start()
    try:
        assert "admin.faults is true" not in s.current_log()
        port = s.ports["AdminSite"]
        status, body = http_json(port, "GET", "/faults")
        assert status == 403 and "admin.faults: true" in body["error"]
        code, _, err = mqctl(s, "fault", "add", "--door", "broker", "--drop", check=False)
        assert code == 1 and "fault rules are off" in err
    finally:
        s.stop()
        s.close()


def test_the_log_says_when_rules_are_allowed_and_in_force(srv):
    """The start-up log says admin.faults is on; a rule's start and end are logged."""
    assert "admin.faults is true: fault rules may be set" in srv.current_log()
    rule = json.loads(mqctl(srv, "--json", "fault", "add", "--door", "smss", "--command",
                            "LIST", "--drop", "--times", "1")[1])
    mqctl(srv, "fault", "clear")
    log = srv.current_log()
    assert f"fault rule {rule['id']} active: drop on door smss, command LIST" in log
    assert "fault rules cleared: 1" in log and "no fault rule is active" in log


def test_mqctl_examples_as_written(srv):
    """The two documented rules, listed, shown in /metrics, then cleared."""
    _, out, _ = mqctl(srv, "fault", "add", "--door", "broker", "--command", "10",
                      "--respond", "2", "--times", "1")
    first = int(out.split()[1])
    assert out.strip() == f"rule {first} added: respond on broker (1 use left)"
    _, out, _ = mqctl(srv, "fault", "add", "--door", "nsqd_tcp", "--command", "PUB",
                      "--respond", "E_PUB_FAILED", "--times", "1")
    assert out.strip() == f"rule {first + 1} added: respond on nsqd_tcp (1 use left)"
    _, out, _ = mqctl(srv, "fault", "list")
    header, *rows = out.splitlines()
    assert header.split() == ["ID", "DOOR", "COMMAND", "CONN", "ADDRESS", "ACTION", "VALUE",
                              "EVERY", "LEFT", "APPLIED"]
    assert [r.split()[1:] for r in rows] == [
        ["broker", "10", "*", "*", "respond", "2", "1", "1", "use", "0"],
        ["nsqd_tcp", "PUB", "*", "*", "respond", "E_PUB_FAILED", "1", "1", "use", "0"]]
    assert metrics(srv)["mqserver_fault_rules_active"] == 2
    code, _, err = mqctl(srv, "fault", "add", "--door", "nsqd_tcp", "--respond", "SYSTEM_BUSY",
                         check=False)
    assert code == 1 and "respond wants an nsqd error code" in err
    _, out, _ = mqctl(srv, "fault", "clear")
    assert out.strip() == "2 rules cleared"
    assert mqctl(srv, "fault", "list")[1].strip() == "(no fault rule)"
    assert metrics(srv)["mqserver_fault_rules_active"] == 0


def test_a_send_answers_system_busy_once(srv):
    """The issue's first example on a raw connection: one SEND answers code 2 with a
    remark, the next SEND_OK; /metrics counts the one application."""
    c = RemotingClient("127.0.0.1", srv.ports["BrokerDoor"])
    try:
        assert send_message(c, "FBusy").code == codes.SUCCESS
        rule = json.loads(mqctl(srv, "--json", "fault", "add", "--door", "broker", "--command",
                                "10", "--respond", "2", "--times", "1")[1])
        busy = send_message(c, "FBusy")
        assert (busy.code, busy.remark) == (
            codes.SYSTEM_BUSY, f"[FAULT] rule {rule['id']}: SYSTEM_BUSY injected by mqserver")
        assert send_message(c, "FBusy").code == codes.SUCCESS
    finally:
        c.close()
    assert metrics(srv)['mqserver_fault_applied_total{action="respond",door="broker"}'] == 1


def test_rocketmq_cpp_client_retries_on_system_busy(srv):
    """The C++ client: while every SEND answers SYSTEM_BUSY it retries (three tries in
    all) and then send_sync fails (the C++ client words it "No route info"); with one
    use, its retry succeeds and the message is kept once."""
    ns = namesrv_addr(srv)
    run_rmq(srv.home, "produce", ns, "FCpp", "--count", 1, "--group", "PF0")  # route known
    mqctl(srv, "fault", "add", "--door", "broker", "--command", "SEND_MESSAGE",
          "--respond", "SYSTEM_BUSY")
    # one send as the application makes it (no second send after "No route info")
    lines = run_rmq(srv.home, "produce", ns, "FCpp", "--count", 1, "--group", "PF1",
                    "--send-attempts", 1)
    (failed,) = [x for x in lines if "error" in x]
    assert failed["error"].startswith("No route info of this topic: FCpp")
    (rule,) = json.loads(mqctl(srv, "--json", "fault", "list")[1])
    assert rule["applied"] == 3
    mqctl(srv, "fault", "clear")
    before = metrics(srv)
    mqctl(srv, "fault", "add", "--door", "broker", "--command", "10", "--respond", "2",
          "--times", "1")
    r = sends(run_rmq(srv.home, "produce", ns, "FCpp", "--count", 1, "--group", "PF2"))
    assert [x["status"] for x in r] == [0]
    key = 'mqserver_fault_applied_total{action="respond",door="broker"}'
    assert metrics(srv)[key] == before[key] + 1
    stored = json.loads(mqctl(srv, "--json", "peek", "FCpp", "-n", "10")[1])
    assert len(stored) == 2  # the first run's and the retried one


def test_pynsq_writer_gets_e_pub_failed_once(srv):
    """The issue's second example with pynsq: one PUB's callback gets E_PUB_FAILED, the
    next PUB's OK, on the same connection."""
    mqctl(srv, "fault", "add", "--door", "nsqd_tcp", "--command", "PUB",
          "--respond", "E_PUB_FAILED", "--times", "1")
    got = run_client(PYNSQ_WRITER + """
def answered(conn, data):
    seen.append([id(conn), str(data) if isinstance(data, Exception) else data.decode()])
    if len(seen) == 1:
        # on the next turn: pynsq hands an error to every callback waiting on the
        # connection, one queued from inside this callback too
        loop.add_callback(lambda: w.pub("f_nsq", b"two", callback=answered))
    else:
        loop.stop()
loop.call_later(1.0, lambda: w.pub("f_nsq", b"one", callback=answered))
loop.start()
print(json.dumps(seen))
""", port=srv.ports["NsqdFactory"])
    (conn1, first), (conn2, second) = got
    assert "E_PUB_FAILED" in first and "injected by mqserver fault rule" in first
    assert second == "OK" and conn1 == conn2
    stored = json.loads(mqctl(srv, "--json", "peek", "f_nsq")[1])
    assert [m["body"] for m in stored] == ["two"]


def test_smss_client_gets_the_rules_error_once(srv):
    """The repo's smss client: a PUB answered by a rule raises the rule's text, the
    connection stays and the next PUB is stored."""
    mqctl(srv, "fault", "add", "--door", "smss", "--command", "PUB", "--respond",
          "store busy, try again", "--times", "1")
    c = SmssClient("127.0.0.1", srv.smss_port)
    try:
        c.create("f_smss")
        with pytest.raises(SmssError, match="store busy, try again"):
            c.publish("f_smss", [b"one"])
        c.publish("f_smss", [b"two"])
    finally:
        c.close()
    stored = json.loads(mqctl(srv, "--json", "peek", "f_smss")[1])
    assert [m["body"] for m in stored] == ["two"]


def test_http_doors_answer_the_rules_status(srv):
    """nsqd HTTP and msgout: the rule's status with each door's error body, once."""
    mqctl(srv, "fault", "add", "--door", "nsqd_http", "--command", "POST /pub",
          "--respond", "503", "--times", "1")
    port = srv.ports["NsqdHttpSite"]
    status, _, body = http(port, "POST", "/pub?topic=f_http", b"one")
    assert status == 503 and json.loads(body)["message"].startswith("injected by mqserver")
    assert http(port, "POST", "/pub?topic=f_http", b"two")[:3:2] == (200, b"OK")
    mqctl(srv, "fault", "add", "--door", "msgout", "--command", "/v1/queues",
          "--respond", "500", "--remark", "msgout is resting", "--times", "1")
    port = srv.ports["MsgoutSite"]
    assert http_json(port, "GET", "/v1/queues") == (500, {"error": "msgout is resting"})
    assert http_json(port, "GET", "/v1/queues")[0] == 200


def test_real_clients_read_a_split_answer(srv):
    """Half-received frames: the C++ client's send and pynsq's PUB get answers written
    3 bytes at a time and read them whole; the rules say they acted."""
    ns = namesrv_addr(srv)
    run_rmq(srv.home, "produce", ns, "FSplit", "--count", 1, "--group", "PS0")  # route known
    mqctl(srv, "fault", "add", "--door", "broker", "--command", "10", "--split", "3",
          "--times", "1")
    mqctl(srv, "fault", "add", "--door", "nsqd_tcp", "--command", "PUB", "--split", "3",
          "--times", "1")
    r = sends(run_rmq(srv.home, "produce", ns, "FSplit", "--count", 2, "--group", "PS1"))
    assert [x["status"] for x in r] == [0, 0]
    got = run_client(PYNSQ_WRITER + """
def answered(conn, data):
    seen.append(str(data) if isinstance(data, Exception) else data.decode())
    loop.stop()
loop.call_later(1.0, lambda: w.pub("f_split", b"one", callback=answered))
loop.start()
print(json.dumps(seen))
""", port=srv.ports["NsqdFactory"])
    assert got == ["OK"]
    assert json.loads(mqctl(srv, "--json", "fault", "list")[1]) == []  # both used
    m = metrics(srv)
    assert m['mqserver_fault_applied_total{action="split",door="broker"}'] == 1
    assert m['mqserver_fault_applied_total{action="split",door="nsqd_tcp"}'] == 1


class Trace:
    """A running C{mqctl trace} (JSON lines), started once the broker subscribed it."""

    def __init__(self, srv, *args):
        self.srv = srv
        started = srv.current_log().count("wire trace of")
        url = f"http://127.0.0.1:{srv.ports['AdminSite']}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "protocols.admin.ctl", "--url", url, *args],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin"})
        wait_until(lambda: srv.current_log().count("wire trace of") > started, 20,
                   "the broker to start the trace")

    def lines(self):
        """Wait for mqctl to end (it stops after --count frames); return its lines."""
        out, err = self.proc.communicate(timeout=30)
        assert self.proc.returncode == 0, err
        return out.splitlines()


def test_mqctl_trace_shows_the_frames_the_client_sent(srv):
    """mqctl trace on each TCP door: the frames a raw client sends and gets, decoded, with
    their bytes; the broker ends the subscription when mqctl goes."""
    t = Trace(srv, "--json", "trace", "broker", "--raw", "--count", "2")
    c = RemotingClient("127.0.0.1", srv.ports["BrokerDoor"])
    try:
        ext = {"producerGroup": "PG", "topic": "FTrace", "defaultTopic": "TBW102",
               "defaultTopicQueueNums": 4, "queueId": 0, "sysFlag": 0, "bornTimestamp": 1,
               "flag": 0, "properties": "", "reconsumeTimes": 0}
        opaque, frame = c.request_frame(codes.SEND_MESSAGE, ext, b"traced")
        c.send_raw(frame)
        answer = c.recv(opaque)
    finally:
        c.close()
    inn, out = [json.loads(x) for x in t.lines()]
    assert (inn["dir"], inn["command"], inn["raw"]) == ("in", "SEND_MESSAGE", frame.hex())
    assert inn["fields"]["ext"] == {k: str(v) for k, v in ext.items()}
    assert inn["fields"]["opaque"] == opaque and inn["fields"]["body"] == 6
    assert (out["dir"], out["command"], out["fields"]["opaque"]) == ("out", "SUCCESS", opaque)
    assert out["fields"]["ext"] == answer.ext_fields
    wait_until(lambda: "wire trace of broker stopped" in srv.current_log(), 20,
               "the broker to end the trace")

    t = Trace(srv, "trace", "nsqd_tcp", "--raw", "--count", "2")
    v2 = V2(srv.ports["NsqdFactory"])
    sent = b"PUB f_trace\n" + struct.pack(">I", 5) + b"hello"
    try:
        v2.send(sent)
        assert v2.frame() == (0, b"OK")
    finally:
        v2.close()
    pub, ok = t.lines()
    # time, door#conn, peer, direction, command, size, fields, raw
    assert pub.split()[1].startswith("nsqd_tcp#")
    assert pub.split()[3:] == [">", "PUB", f"{len(sent)}", "B", "topic=f_trace", "body=5",
                               f"raw={sent.hex()}"]
    assert ok.split()[3:] == ["<", "RESPONSE", "10", "B", "data=OK",
                              "raw=0000000600000000" + b"OK".hex()]

    t = Trace(srv, "--json", "trace", "smss", "--command", "PUB", "--count", "1")
    s = SmssClient("127.0.0.1", srv.smss_port)
    try:
        s.create("f_trace_s")
        s.publish("f_trace_s", [b"abc"])
    finally:
        s.close()
    (pub,) = [json.loads(x) for x in t.lines()]
    assert (pub["command"], pub["fields"]["topic"]) == ("PUB", "f_trace_s")


def test_mqctl_trace_shows_the_batches_an_smss_subscription_pushes(srv):
    """A subscriber's batches, as the real client read them: count, first and last
    eventId, body size and bytes."""
    s = SmssClient("127.0.0.1", srv.smss_port)
    try:
        s.create("f_trace_b")
        s.publish("f_trace_b", [b"one", b"two", b"three"])
    finally:
        s.close()
    t = Trace(srv, "--json", "trace", "smss", "--command", "BATCH", "--raw", "--count", "1")
    s = SmssClient("127.0.0.1", srv.smss_port)
    try:
        batch = s.subscribe("f_trace_b", batch=5, who=b"w_trace").next_batch(timeout=20)
    finally:
        s.close()
    (e,) = [json.loads(x) for x in t.lines()]
    ids = [m.event_id for m in batch.messages]
    assert [m.body for m in batch.messages] == [b"one", b"two", b"three"]
    assert (e["dir"], e["command"]) == ("out", "BATCH")
    assert e["fields"] == {"status": 200, "count": 3, "first": ids[0], "last": ids[-1],
                           "body": e["size"] - 10}
    raw = bytes.fromhex(e["raw"])
    assert len(raw) == e["size"] and struct.unpack_from("<HB", raw) == (200, 3)


def test_http_answers_are_traced_split_and_corrupted(srv):
    """A real HTTP client (urllib) on the HTTP doors: mqctl trace shows each answer after
    its request; a split answer is read whole; a corrupted one has an intact head and one
    byte of its body inverted."""
    port = srv.ports["NsqdHttpSite"]
    t = Trace(srv, "--json", "trace", "nsqd_http", "--command", "POST /pub", "--count", "2")
    assert http(port, "POST", "/pub?topic=f_http_t", b"traced")[::2] == (200, b"OK")
    inn, out = [json.loads(x) for x in t.lines()]
    assert (inn["dir"], inn["command"], inn["fields"]["body"]) == ("in", "POST /pub", 6)
    assert (out["dir"], out["command"], out["conn"]) == ("out", "200", inn["conn"])
    assert out["fields"] == {"status": 200, "route": "POST /pub", "body": 2}

    t = Trace(srv, "trace", "lookupd_http", "--count", "2")
    status, _, body = http(srv.ports["LookupdHttpSite"], "GET", "/topics")
    assert status == 200
    _, out = t.lines()
    assert out.split()[3:] == ["<", "200", "status=200", "route=GET", "/topics",
                               f"body={len(body)}"]

    port = srv.ports["MsgoutSite"]
    whole = http_json(port, "GET", "/v1/queues")
    mqctl(srv, "fault", "add", "--door", "msgout", "--command", "GET /v1/queues",
          "--split", "5", "--times", "1")
    assert http_json(port, "GET", "/v1/queues") == whole
    port = srv.ports["NsqdHttpSite"]
    mqctl(srv, "fault", "add", "--door", "nsqd_http", "--command", "/ping", "--corrupt", "0",
          "--times", "1")
    status, headers, body = http(port, "GET", "/ping")
    assert (status, headers["content-length"], body) == (200, "2", bytes([ord("O") ^ 0xFF]) + b"K")
    assert http(port, "GET", "/ping")[::2] == (200, b"OK")
    assert json.loads(mqctl(srv, "--json", "fault", "list")[1]) == []  # both used
    m = metrics(srv)
    assert m['mqserver_fault_applied_total{action="split",door="msgout"}'] == 1
    assert m['mqserver_fault_applied_total{action="corrupt",door="nsqd_http"}'] == 1
