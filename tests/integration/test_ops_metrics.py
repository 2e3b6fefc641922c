"""/metrics on the metrics door, parsed with prometheus_client's own parser, against the
real broker: topic and queue counters, consumers, connections per door, store histograms
and sizes, replication."""

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from protocols.smss.client import SmssClient
from tests.support.nsq import V2, nsq_listen
from tests.support.server import ServerProcess
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(120)
LOOP = "tcp:0:interface=127.0.0.1"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    listen = dict(nsq_listen(), smss=LOOP, metrics=LOOP)
    s = ServerProcess(tmp_path_factory.mktemp("metrics") / "broker", listen=listen,
                      config={"store": {"flushLevel": 2}}).start()
    try:
        yield s
    finally:
        s.stop()
        s.close()


def scrape(srv):
    # what Prometheus 2.x asks for
    req = urllib.request.Request(f"http://127.0.0.1:{srv.ports['MetricsSite']}/metrics",
                                 headers={"Accept": "text/plain;version=0.0.4;q=0.9,*/*;q=0.1"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def test_metrics_parse_and_follow_the_broker(srv):
    """Counters move with what smss and NSQ publish and an NSQ channel consumes; the
    store's histograms, sizes and the connections per door are there."""
    smss = SmssClient("127.0.0.1", srv.smss_port)
    smss.create("mt")
    smss.publish("mt", [b"one", b"two"])
    c = V2(srv.ports["NsqdFactory"])
    c.send(b"SUB mt ch\nRDY 1\n")
    assert c.frame() == (0, b"OK")
    c.messages(1)
    m = scrape(srv)
    assert m[("mqserver_messages_in_total", (("queue", "0"), ("topic", "mt")))] == 2
    assert m[("mqserver_bytes_in_total", (("queue", "0"), ("topic", "mt")))] > 6
    key = (("consumer", "ch"), ("kind", "channel"), ("topic", "mt"))
    assert m[("mqserver_consumer_messages_out_total", key)] == 1
    assert m[("mqserver_consumer_in_flight_messages", key)] == 1
    assert m[("mqserver_consumer_lag_messages", key)] == 1
    assert m[("mqserver_connections", (("door", "nsqd_tcp"),))] == 1
    assert m[("mqserver_connections", (("door", "smss"),))] == 1
    assert m[("mqserver_store_write_seconds_count", ())] >= 0
    assert m[("mqserver_store_fsync_seconds_count", ())] >= 1  # flush level 2 fsyncs
    assert m[("mqserver_store_segments", ())] >= 1
    assert m[("mqserver_store_disk_bytes", ())] > 0
    assert 0 < m[("mqserver_store_disk_used_ratio", ())] < 1
    assert m[("mqserver_store_disk_max_used_ratio", ())] == 0.9  # store.diskMaxUsedRatio
    assert m[("mqserver_replication_is_slave", ())] == 0
    smss.publish("mt", [b"three"])
    assert scrape(srv)[("mqserver_messages_in_total", (("queue", "0"), ("topic", "mt")))] == 3
    smss.close()
    c.sock.close()


def test_other_paths_are_not_found(srv):
    """Only /metrics is served."""
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{srv.ports['MetricsSite']}/nope", timeout=10)
    except urllib.error.HTTPError as e:
        assert e.code == 404
    else:
        raise AssertionError("expected 404")


def test_replication_lag_on_master_and_slave(server_factory):
    """A master shows each following slave's lag in eventIds; the slave its role and its
    lag in ms (and the master's eventIds it applied)."""
    listen = {"smss": LOOP, "metrics": LOOP}
    master = server_factory("m", listen=listen)
    slave = server_factory("s", listen=listen, extra_args=[
        "--role", "slave", "--master", f"127.0.0.1:{master.smss_port}"])
    with SmssClient("127.0.0.1", master.smss_port) as c:
        c.create("rep")
        c.publish("rep", [b"a", b"b", b"c"])
        head = c.topic_info("$replication")["appliedEventId"]
    seen = {}

    def caught_up():
        seen["s"], seen["m"] = s, m = scrape(slave), scrape(master)
        lag = [v for (name, _), v in m.items() if name == "mqserver_replication_slave_lag_events"]
        return s[("mqserver_replication_applied_event_id", ())] == head and lag == [0]

    wait_until(caught_up, 30, "the slave caught up, as both brokers' metrics show", interval=0.1)
    s, m = seen["s"], seen["m"]
    assert s[("mqserver_replication_is_slave", ())] == 1
    assert ("mqserver_replication_lag_ms", ()) in s
    assert m[("mqserver_replication_is_slave", ())] == 0
