"""mqserver.cluster.etcd against a real etcd process (tests/support/etcd.py)."""

import pytest
import pytest_twisted
from twisted.internet import reactor, task

from mqserver.cluster import etcd as etcdmod
from mqserver.cluster.etcd import (
    EtcdClient,
    EtcdUnavailable,
    LeaseNotFound,
    compare,
    op_delete,
    op_get,
    op_put,
    parse_endpoints,
    prefix_end,
)
from tests.support.etcd import free_port
from tests.support.wait import deferred_wait


@pytest.fixture
def client(etcd_server):
    c = EtcdClient(reactor, [etcd_server.endpoint], timeout=2.0)
    yield c
    pytest_twisted.blockon(c.close())


def test_parse_endpoints():
    assert parse_endpoints("http://a:1, b:2,") == ["http://a:1", "http://b:2"]
    assert parse_endpoints(["http://a:1/"]) == ["http://a:1"]
    assert parse_endpoints("") == []


def test_prefix_end():
    assert prefix_end("/a/") == b"/a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") == b"\0"


@pytest_twisted.inlineCallbacks
def test_put_get_range_delete(client):
    rev1 = yield client.put("/t/a", b"1")
    rev2 = yield client.put("/t/b", b"\x00\xff")
    yield client.put("/u/c", b"3")
    assert rev2 == rev1 + 1
    kv = yield client.get("/t/b")
    assert (kv.key, kv.value, kv.create_revision, kv.version) == ("/t/b", b"\x00\xff", rev2, 1)
    assert (yield client.get("/t/none")) is None
    kvs, revision = yield client.range("/t/", prefix=True)
    assert [k.key for k in kvs] == ["/t/a", "/t/b"]
    assert revision == rev2 + 1
    assert (yield client.delete("/t/", prefix=True)) == 2
    kvs, _ = yield client.range("/t/", prefix=True)
    assert kvs == []
    # an empty value comes back empty (the gateway leaves the field out)
    yield client.put("/t/empty", b"")
    assert (yield client.get("/t/empty")).value == b""


@pytest_twisted.inlineCallbacks
def test_txn_create_once(client):
    create = [compare("/lock", "create_revision", "==", 0)]
    first = yield client.txn(create, [op_put("/lock", b"me"), op_put("/n", b"1")],
                             [op_get("/lock")])
    assert first.succeeded
    second = yield client.txn(create, [op_put("/lock", b"you")], [op_get("/lock")])
    assert not second.succeeded
    assert [kv.value for kv in second.responses[0]] == [b"me"]
    kv = yield client.get("/lock")
    guarded = yield client.txn([compare("/lock", "mod_revision", "==", kv.mod_revision),
                                compare("/lock", "value", "==", b"me")],
                               [op_delete("/lock")])
    assert guarded.succeeded and guarded.responses == [1]
    assert (yield client.get("/lock")) is None
    with pytest.raises(ValueError):
        compare("/lock", "bogus", "==", 0)


@pytest_twisted.inlineCallbacks
def test_lease_grant_keepalive_revoke(client):
    lease, ttl = yield client.lease_grant(5)
    assert ttl == 5
    yield client.put("/leased", b"x", lease=lease)
    assert (yield client.get("/leased")).lease == lease
    assert (yield client.lease_keepalive(lease)) == 5
    yield client.lease_revoke(lease)
    assert (yield client.get("/leased")) is None
    with pytest.raises(LeaseNotFound):
        yield client.lease_keepalive(lease)
    with pytest.raises(LeaseNotFound):
        yield client.put("/leased", b"x", lease=lease)
    yield client.lease_revoke(lease)  # already gone: no error


@pytest_twisted.inlineCallbacks
def test_lease_expires_without_keepalive(client):
    lease, _ = yield client.lease_grant(1)
    yield client.put("/short", b"x", lease=lease)
    start = reactor.seconds()
    while (yield client.get("/short")) is not None:
        assert reactor.seconds() - start < 10, "the lease did not expire"
        yield task.deferLater(reactor, 0.1, lambda: None)


@pytest_twisted.inlineCallbacks
def test_several_endpoints_skip_a_dead_one(etcd_server):
    dead = f"http://127.0.0.1:{free_port()}"
    c = EtcdClient(reactor, f"{dead},{etcd_server.endpoint}", timeout=2.0)
    try:
        yield c.put("/k", b"v")
        assert (yield c.get("/k")).value == b"v"
        assert c.endpoints[c._current] == etcd_server.endpoint
    finally:
        yield c.close()
    c = EtcdClient(reactor, [dead], timeout=2.0)
    with pytest.raises(EtcdUnavailable):
        yield c.get("/k")


@pytest_twisted.inlineCallbacks
def test_watch_prefix_events_in_order(client):
    seen = []
    w = client.watch("/w/", lambda events, rev: seen.extend(events), prefix=True)
    try:
        yield deferred_wait(lambda: w.connected, what="the watch to be created")
        yield client.put("/w/a", b"1")
        yield client.put("/x", b"not watched")
        yield client.put("/w/a", b"2")
        yield client.delete("/w/a")
        yield deferred_wait(lambda: len(seen) == 3, what="three events")
        assert [(e.type, e.kv.key, e.kv.value) for e in seen] == [
            ("PUT", "/w/a", b"1"), ("PUT", "/w/a", b"2"), ("DELETE", "/w/a", b"")]
    finally:
        w.stop()


@pytest_twisted.inlineCallbacks
def test_watch_from_revision(client):
    rev = yield client.put("/h/a", b"old")
    yield client.put("/h/a", b"new")
    seen = []
    w = client.watch("/h/a", lambda events, r: seen.extend(events), start_revision=rev)
    try:
        yield deferred_wait(lambda: len(seen) == 2, what="the past events")
        assert [e.kv.value for e in seen] == [b"old", b"new"]
    finally:
        w.stop()


@pytest_twisted.inlineCallbacks
def test_watch_resumes_after_etcd_restarts(etcd_server, client):
    """Changes made while the watch is disconnected arrive once etcd is back, each once."""
    seen = []
    w = client.watch("/r/", lambda events, rev: seen.extend(events), prefix=True)
    try:
        yield deferred_wait(lambda: w.connected, what="the watch to be created")
        yield client.put("/r/1", b"a")
        yield deferred_wait(lambda: len(seen) == 1, what="the first event")
        etcd_server.kill()
        yield deferred_wait(lambda: not w.connected, what="the watch to notice")
        etcd_server.start()
        # a second client writes while the first one's watch is reconnecting
        other = EtcdClient(reactor, [etcd_server.endpoint])
        yield other.put("/r/2", b"b")
        yield other.put("/r/3", b"c")
        yield other.close()
        yield deferred_wait(lambda: len(seen) == 3, what="the events after the restart")
        assert [e.kv.key for e in seen] == ["/r/1", "/r/2", "/r/3"]
        assert w.reconnects >= 1
    finally:
        w.stop()


@pytest_twisted.inlineCallbacks
def test_too_large_reply_is_refused(client, monkeypatch):
    yield client.put("/big", b"x" * 4096)
    monkeypatch.setattr(etcdmod, "MAX_REPLY", 1024)
    with pytest.raises(etcdmod.EtcdError, match="more than 1024 bytes"):
        yield client.get("/big")
