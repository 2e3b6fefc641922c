"""The replica-group keys (cluster.*) and their checks against replication.syncReplicas."""

import pytest

from mqserver.cluster.group import GroupView, choose_candidate, majority
from mqserver.cluster.etcd import KeyValue
from mqserver.config import ConfigError, build_config, etcd_endpoints

GROUP = {"etcd": "http://127.0.0.1:2379", "group": "g", "name": "m1"}


def test_defaults_are_no_group():
    cfg = build_config({})
    assert cfg["cluster.etcd"] == "" and cfg["cluster.leaseMs"] == 3000
    assert cfg["cluster.members"] == 3
    assert etcd_endpoints(cfg["cluster.etcd"]) == []


def test_endpoints_as_list_or_string():
    cfg = build_config({"cluster": dict(GROUP, etcd=["10.0.0.1:2379", "http://h2:2379/"]),
                        "replication": {"syncReplicas": 1}})
    assert etcd_endpoints(cfg["cluster.etcd"]) == ["http://10.0.0.1:2379", "http://h2:2379"]
    assert etcd_endpoints("http://a:1, b:2,") == ["http://a:1", "http://b:2"]


@pytest.mark.parametrize("etcd", ["ftp://h:1", "http://h", "http://h:0", "h:99999", 7,
                                  ["http://h:1", 3]])
def test_bad_endpoints(etcd):
    with pytest.raises(ConfigError, match="config key 'cluster.etcd' must be"):
        build_config({"cluster": dict(GROUP, etcd=etcd), "replication": {"syncReplicas": 1}})


@pytest.mark.parametrize("key, value", [("name", "a/b"), ("group", "x" * 65),
                                        ("leaseMs", 1000), ("members", 0)])
def test_bad_values(key, value):
    with pytest.raises(ConfigError, match=f"config key 'cluster.{key}' must be"):
        build_config({"cluster": dict(GROUP, **{key: value}), "replication": {"syncReplicas": 1}})


@pytest.mark.parametrize("missing", ["group", "name"])
def test_group_and_name_required_with_etcd(missing):
    cluster = dict(GROUP)
    del cluster[missing]
    with pytest.raises(ConfigError, match=f"'cluster.{missing}' is required with cluster.etcd"):
        build_config({"cluster": cluster, "replication": {"syncReplicas": 1}})


@pytest.mark.parametrize("members, least", [(1, 0), (2, 1), (3, 1), (4, 2), (5, 2), (7, 3)])
def test_sync_replicas_at_least_a_majority_minus_one(members, least):
    assert least == majority(members) - 1
    ok = build_config({"cluster": dict(GROUP, members=members),
                       "replication": {"syncReplicas": least}})
    assert ok["replication.syncReplicas"] == least
    if least:
        with pytest.raises(ConfigError) as e:
            build_config({"cluster": dict(GROUP, members=members),
                          "replication": {"syncReplicas": least - 1}})
        text = str(e.value)
        assert "\n" not in text
        assert "'replication.syncReplicas' must be at least %d" % least in text
        assert f"group of {members} (cluster.members)" in text


def test_no_group_no_check():
    assert build_config({"replication": {"syncReplicas": 0}})["replication.syncReplicas"] == 0


def test_candidate_highest_event_id_then_smallest_name():
    assert choose_candidate({}) is None
    assert choose_candidate({"a": {"eventId": 3}, "b": {"eventId": 9}}) == "b"
    assert choose_candidate({"c": {"eventId": 9}, "b": {"eventId": 9}, "a": {}}) == "b"


def test_group_view_rows():
    kvs = [KeyValue("/mqserver/g/members/a", b'{"name":"a","eventId":7,"epoch":2,"role":"follower"}'),
           KeyValue("/mqserver/g/members/b", b'{"name":"b","eventId":9,"epoch":2,"role":"leader"}'),
           KeyValue("/mqserver/g/members/bad", b"not json"),
           KeyValue("/mqserver/g/leader", b'{"name":"b","epoch":2}', lease=5),
           KeyValue("/mqserver/g/epoch", b"2", mod_revision=4)]
    view = GroupView("g", kvs, 10)
    assert (view.epoch, view.epoch_mod_revision, view.leader_lease) == (2, 4, 5)
    assert [(r["name"], r["role"], r["lag"]) for r in view.rows()] == [
        ("a", "follower", 2), ("b", "leader", 0)]
    leaderless = GroupView("g", kvs[:2], 10)
    assert [(r["role"], r["lag"]) for r in leaderless.rows()] == [
        ("follower", None), ("follower", None)]  # b's record is not the leader key


@pytest.mark.parametrize("role", [{"role": "slave", "master": "127.0.0.1:12301"},
                                  {"master": "127.0.0.1:12301"}])
def test_a_member_takes_no_role_or_master_of_its_own(role):
    with pytest.raises(ConfigError, match="etcd decides which member leads"):
        build_config(dict(role, cluster=GROUP, replication={"syncReplicas": 1}))
