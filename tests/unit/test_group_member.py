"""A broker as a replica group's member, in process: the group's decisions become the
broker's roles (mqserver/cluster/member.py, on a MemoryReactorClock with the in-memory
etcd of tests/support/memory_etcd.py, over a real store)."""

import pytest
from twisted.application import service
from twisted.internet import defer

from mqserver import exitstatus
from mqserver.cluster.group import LEADER
from mqserver.cluster.member import LEADERSHIP_LOST, GroupService, door_addresses
from mqserver.config import build_config
from mqserver.errors import NotMaster, ReplicationError
from mqserver.replication.applier import Applier
from mqserver.replication.roles import Roles
from mqserver.replication.status import replication_status
from protocols.admin.door import AdminResource
from protocols.metrics.collector import BrokerCollector
from protocols.smss import client_codec as cc
from protocols.smss.factory import make_factory as smss_factory
from protocols.smss.messages import ErrResponse
from tests.support.inprocess import Node, failure_of
from tests.support.memory_etcd import MemoryEtcd
from tests.unit.test_sync_replication import Follower, fired

LEASE_MS = 3000
LEADER_ADDRESS = "10.0.0.2:12301"
PUB_T = bytes.fromhex("0101000d00000000000000000000000000000000") + b"t" \
    + bytes.fromhex("050000000000000068656c6c6f")


@pytest.fixture(autouse=True)
def exit_status(monkeypatch):
    """The status the process would exit with, reset for each test."""
    monkeypatch.setattr(exitstatus, "_status", 0)


class Member:
    """A broker in process with the service tree's roles and group membership; etcd is
    in memory, on the broker's clock."""

    def __init__(self, path, members=1, replicas=1):
        self.node = Node(path)
        self.broker = self.node.broker
        self.clock = self.node.clock
        # Twisted 25.5's MemoryReactor starts with hasStopped set: the tests ask whether
        # the member stopped it
        self.clock.hasStopped = False
        self.followed = []
        self.broker.is_master = False  # a member starts with no role
        self.roles = Roles(self.broker, self._make_follower, replicas, 2000)
        self.broker.roles = self.roles
        self.roles.startService()
        config = build_config({"cluster": {"etcd": "http://127.0.0.1:1", "group": "g",
                                           "name": "m1", "members": members,
                                           "leaseMs": LEASE_MS},
                               "replication": {"syncReplicas": replicas}})
        self.group = GroupService(self.broker, lambda: [], config, self.clock)
        self.etcd = MemoryEtcd(self.clock, timeout=LEASE_MS / 4000)
        self.group.member.client = self.etcd
        self.broker.group = self.group

    def _make_follower(self, master):
        self.followed.append(master)
        if self.broker.state_of(Applier.state_name) is None:
            Applier(self.broker)  # what the replication client applies with
        return service.Service()  # stands in for the replication client (no sockets)

    def run(self, seconds, step=0.05):
        for _ in range(round(seconds / step)):
            self.clock.advance(step)

    def close(self):
        if self.group.running:
            self.group.stopService()
        self.run(LEASE_MS / 1000)
        self.roles.stopService()
        self.node.close()


@pytest.fixture
def member(tmp_path):
    m = Member(tmp_path / "m1")
    yield m
    m.close()


def test_an_elected_member_becomes_master_in_the_epoch_etcd_chose(member):
    member.group.startService()
    assert not member.broker.is_master
    member.run(2 * LEASE_MS / 1000)
    assert member.group.member.role == LEADER
    assert member.broker.is_master and member.broker.epoch == 1
    assert member.group.status() == {"group": "g", "name": "m1", "role": "leader",
                                     "epoch": 1, "leader": "m1", "etcdReachable": True}


def group_metrics(broker):
    return {f.name: f.samples[0].value for f in BrokerCollector(broker).collect()
            if f.name.startswith("mqserver_group_")}


def test_the_status_and_metrics_show_the_members_role_and_epoch(member):
    member.group.startService()
    member.run(0.5)
    assert replication_status(member.broker)["role"] == "none"
    assert group_metrics(member.broker) == {"mqserver_group_leader": 0,
                                            "mqserver_group_epoch": 0}
    member.run(2 * LEASE_MS / 1000)
    status = replication_status(member.broker)
    assert status["role"] == "master" and status["group"]["role"] == "leader"
    assert group_metrics(member.broker) == {"mqserver_group_leader": 1,
                                            "mqserver_group_epoch": 1}


def test_a_leader_that_cannot_renew_its_lease_fails_every_waiting_write(member):
    member.group.startService()
    member.run(2 * LEASE_MS / 1000)
    gate = member.broker.sync_gate
    follower = Follower()
    gate.attach(follower, member.broker.store.next_event_id - 1)
    d = member.broker.create_topic("t")
    assert not fired(d)  # waits for the follower's confirmation
    member.etcd.set_reachable(False)
    member.run(LEASE_MS / 1000)
    failure = failure_of(d)
    assert failure.check(ReplicationError) and str(failure.value) == LEADERSHIP_LOST
    assert not member.broker.is_master
    # nothing more is acknowledged, even once the follower confirms it
    assert failure_of(gate.wait(member.broker.store.next_event_id + 5)).check(ReplicationError)
    # and the process stops, to be started again as a follower
    assert exitstatus.status() == exitstatus.RESTART and member.clock.hasStopped


def test_a_member_follows_the_leaders_smss_door_and_names_it_in_refusals(member):
    member.group.follow({"name": "m2", "epoch": 4,
                         "addresses": {"smss": LEADER_ADDRESS, "nsqd_tcp": "10.0.0.2:4150"}})
    assert member.followed == [LEADER_ADDRESS]
    assert member.broker.master_address == LEADER_ADDRESS
    # mqctl stats (the admin API) shows the master followed
    replication = AdminResource(member.broker).stats_answer()["replication"]
    assert replication["role"] == "slave" and replication["master"] == LEADER_ADDRESS
    c = member.node.connect(member.node.door(smss_factory))
    c.send(PUB_T)
    (answer,) = cc.ResponseDecoder(cc.Expect.SIMPLE).feed(c.take())
    assert isinstance(answer, ErrResponse)
    assert answer.text == f"just master can pub message (master: {LEADER_ADDRESS})"
    assert exitstatus.status() == 0


def test_a_master_told_of_another_leader_steps_down(member):
    member.group.startService()
    member.run(2 * LEASE_MS / 1000)
    assert member.broker.is_master
    member.group.follow({"name": "m2", "epoch": 9, "addresses": {"smss": LEADER_ADDRESS}})
    assert not member.broker.is_master and member.followed == []
    assert exitstatus.status() == exitstatus.RESTART and member.clock.hasStopped


def test_a_leader_stopping_steps_down_without_asking_for_a_restart(member):
    member.group.startService()
    member.run(2 * LEASE_MS / 1000)
    member.group.stopService()
    member.run(1)
    assert not member.broker.is_master
    assert exitstatus.status() == 0 and not member.clock.hasStopped


def test_door_addresses_name_tcp_doors_and_this_host_for_a_wildcard_bind():
    class Listening:
        def __init__(self, door, where):
            self.door, self.where = door, where

        def bound(self):
            return self.where

    out = door_addresses([Listening("smss", {"host": "127.0.0.1", "port": 12301}),
                          Listening("nsqd_tcp", {"host": "0.0.0.0", "port": 4150}),
                          Listening("ctl", {"path": "/run/mq.sock"}),
                          Listening("off", None)])
    assert out["smss"] == "127.0.0.1:12301"
    assert set(out) == {"smss", "nsqd_tcp"} and not out["nsqd_tcp"].startswith("0.0.0.0")


def test_a_leadership_lost_while_the_promotion_waits_takes_no_writes(member):
    """The promotion waits for the follower service to stop; a step-down meanwhile
    leaves the broker refusing writes once it finishes."""
    member.group.follow({"name": "m2", "epoch": 1, "addresses": {"smss": LEADER_ADDRESS}})
    stopping = defer.Deferred()
    member.roles.follower.stopService = lambda: stopping  # its connection still closing
    member.group.become_leader(2)
    member.group.step_down()
    stopping.callback(None)
    assert not member.broker.is_master
    assert failure_of(member.broker.create_topic("t")).check(NotMaster)
