"""What the replica group relies on from etcd, run against a real etcd and against the
in-memory one (tests/support/memory_etcd.py) the timing tests use, so they agree."""

import pytest
import pytest_twisted
from twisted.internet import reactor

from mqserver.cluster.etcd import EtcdClient, LeaseNotFound, compare, op_get, op_put
from tests.support.memory_etcd import MemoryEtcd
from tests.support.wait import deferred_wait


@pytest.fixture(params=["real", "memory"])
def etcd(request):
    if request.param == "memory":
        yield MemoryEtcd(reactor)
        return
    server = request.getfixturevalue("etcd_server")
    client = EtcdClient(reactor, [server.endpoint])
    yield client
    pytest_twisted.blockon(client.close())


@pytest_twisted.inlineCallbacks
def test_create_once_transaction_and_epoch_guard(etcd):
    guard = [compare("/g/leader", "create_revision", "==", 0),
             compare("/g/epoch", "mod_revision", "==", 0)]  # a missing key's is 0
    first = yield etcd.txn(guard, [op_put("/g/leader", b"a"), op_put("/g/epoch", b"1")],
                           [op_get("/g/leader")])
    assert first.succeeded and first.responses == [None, None]
    second = yield etcd.txn(guard, [op_put("/g/leader", b"b")], [op_get("/g/leader")])
    assert not second.succeeded
    assert [kv.value for kv in second.responses[0]] == [b"a"]
    epoch = yield etcd.get("/g/epoch")
    assert epoch.value == b"1" and epoch.mod_revision == first.revision
    assert (yield etcd.get("/g/none")) is None


@pytest_twisted.inlineCallbacks
def test_prefix_range_in_key_order(etcd):
    for key in ("/p/b", "/p/a", "/q", "/p0"):
        yield etcd.put(key, b"x")
    kvs, revision = yield etcd.range("/p/", prefix=True)
    assert [kv.key for kv in kvs] == ["/p/a", "/p/b"]
    assert revision >= max(kv.mod_revision for kv in kvs)


@pytest_twisted.inlineCallbacks
def test_a_lapsed_lease_takes_its_keys_and_watches_see_it(etcd):
    seen = []
    w = etcd.watch("/l/", lambda events, rev: seen.extend(events), prefix=True)
    try:
        yield deferred_wait(lambda: w.connected, 10, "the watch")
        # (etcd's least TTL is 2 s with its default election timeout)
        lease, ttl = yield etcd.lease_grant(2)
        assert ttl == 2
        yield etcd.put("/l/k", b"v", lease=lease)
        assert (yield etcd.get("/l/k")).lease == lease
        yield deferred_wait(lambda: [e.type for e in seen] == ["PUT", "DELETE"], 10,
                            "the lease to lapse")
        assert (yield etcd.get("/l/k")) is None
        with pytest.raises(LeaseNotFound):
            yield etcd.lease_keepalive(lease)
        with pytest.raises(LeaseNotFound):
            yield etcd.put("/l/k", b"v", lease=lease)
    finally:
        w.stop()


@pytest_twisted.inlineCallbacks
def test_revoke_takes_the_keys_at_once(etcd):
    lease, _ = yield etcd.lease_grant(30)
    yield etcd.put("/r/k", b"v", lease=lease)
    assert (yield etcd.lease_keepalive(lease)) == 30
    yield etcd.lease_revoke(lease)
    assert (yield etcd.get("/r/k")) is None
    yield etcd.lease_revoke(lease)  # gone already: no error
