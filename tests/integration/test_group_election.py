"""Leader election of a replica group (mqserver.cluster.group) with a real etcd and three
in-process members, each with an eventId the test sets."""

import json
import os
import sys

import pytest
import pytest_twisted
from twisted.internet import defer, reactor

from mqserver.cluster.etcd import EtcdClient
from mqserver.cluster.group import LEADER, GroupMember, read_group
from tests.support.cut import CuttableForwarder
from tests.support.etcd import free_port
from tests.support.server import ROOT
from tests.support.wait import deferred_wait

LEASE_MS = 3000
GROUP = "g1"


class Node:
    """One member and what its callbacks saw, in one journal shared by the group
    (so the order of one member's step-down and another's election shows)."""

    def __init__(self, name, event_id, endpoints, journal, members=3):
        self.name = name
        self.event_id = event_id
        self.epoch = 0
        self.journal = journal
        self.client = EtcdClient(reactor, endpoints, timeout=LEASE_MS / 4000.0)
        self.member = GroupMember(
            reactor, self.client, GROUP, name, members, LEASE_MS,
            durable_event_id=lambda: self.event_id, epoch=lambda: self.epoch,
            addresses=lambda: {"smss": f"127.0.0.1:{12300 + ord(name[-1])}"},
            become_leader=self._lead, follow=self._follow, step_down=self._step_down)

    def _lead(self, epoch):
        self.epoch = epoch
        self.journal.append(("lead", self.name, epoch))

    def _follow(self, leader):
        self.journal.append(("follow", self.name, leader["name"], leader["epoch"]))

    def _step_down(self):
        self.journal.append(("step_down", self.name))

    def start(self):
        self.member.startService()
        return self

    @defer.inlineCallbacks
    def stop(self):
        if self.member.running:
            yield self.member.stopService()
        yield self.client.close()


@pytest.fixture
def group(etcd_server):
    """Start members: group(name=eventId, ...) -> {name: Node}; all stop at teardown."""
    journal = []
    nodes = []

    def start(endpoints=None, members=3, **event_ids):
        started = {}
        for name, event_id in event_ids.items():
            node = Node(name, event_id, endpoints or [etcd_server.endpoint], journal, members)
            nodes.append(node.start())
            started[name] = node
        return started

    start.journal = journal
    yield start
    for node in nodes:
        pytest_twisted.blockon(node.stop())


def leaders(nodes):
    return [n.name for n in nodes.values() if n.member.role == LEADER]


def leads(journal):
    return [e for e in journal if e[0] == "lead"]


def elected(journal, count):
    return lambda: len(leads(journal)) >= count


@pytest_twisted.inlineCallbacks
def test_the_highest_event_id_leads_and_the_others_follow(group, etcd_server):
    nodes = group(a=5, b=9, c=7)
    journal = group.journal
    yield deferred_wait(elected(journal, 1), 20, "a leader")
    yield deferred_wait(lambda: sum(e[0] == "follow" for e in journal) == 2, 10,
                        "both others to follow")
    assert leads(journal) == [("lead", "b", 1)]
    assert leaders(nodes) == ["b"]
    assert sorted(e for e in journal if e[0] == "follow") == [
        ("follow", "a", "b", 1), ("follow", "c", "b", 1)]
    client = EtcdClient(reactor, [etcd_server.endpoint])
    yield deferred_wait(lambda: all(n.member.view and n.member.view.members.get(n.name, {})
                                    .get("role") in ("leader", "follower")
                                    for n in nodes.values()), 10, "the roles published")
    view = yield read_group(client, GROUP)
    yield client.close()
    assert view.epoch == 1 and view.leader["name"] == "b"
    rows = {r["name"]: r for r in view.rows()}
    assert rows["b"]["role"] == "leader" and rows["b"]["lag"] == 0
    assert rows["a"]["eventId"] == 5 and rows["a"]["lag"] == 4
    assert rows["c"]["addresses"] == {"smss": "127.0.0.1:12399"}
    # the followers keep following: no second election while the leader lives
    mark = len(journal)
    yield deferred_wait(lambda: all(n.member.view.revision > view.revision + 6
                                    for n in nodes.values()), 20, "more renewals")
    assert journal[mark:] == [] and leaders(nodes) == ["b"]


@pytest_twisted.inlineCallbacks
def test_ties_are_broken_by_name(group):
    group(c=4, b=4, a=3)
    yield deferred_wait(elected(group.journal, 1), 20, "a leader")
    assert leads(group.journal) == [("lead", "b", 1)]


@pytest_twisted.inlineCallbacks
def test_no_election_without_a_majority_of_records(group):
    nodes = group(a=5)
    member = nodes["a"].member
    # long enough without a leader to campaign, seen in views read after that
    yield deferred_wait(lambda: member._no_leader_since is not None and member.view
                        and reactor.seconds() - member._no_leader_since > 2 * LEASE_MS / 1000
                        and len(member.view.members) == 1, 20, "a lone member's views")
    assert leads(group.journal) == [] and member.role != LEADER
    nodes.update(group(b=1))
    yield deferred_wait(elected(group.journal, 1), 20, "a leader once two of three are up")
    assert leads(group.journal) == [("lead", "a", 1)]


@pytest.fixture
def line(etcd_server):
    """A line to etcd the test can cut (tests/support/cut.py): its client URL."""
    port = int(etcd_server.endpoint.rsplit(":", 1)[1])
    forwarder = CuttableForwarder("127.0.0.1", port)
    forwarder.url = f"http://127.0.0.1:{forwarder.listen()}"
    yield forwarder
    pytest_twisted.blockon(forwarder.close())


@pytest_twisted.inlineCallbacks
def test_revoked_lease_the_leader_steps_down(group, etcd_server):
    nodes = group(a=5, b=9, c=7)
    journal = group.journal
    yield deferred_wait(elected(journal, 1), 20, "a leader")
    nodes["b"].event_id = 1  # c is now the most advanced
    client = EtcdClient(reactor, [etcd_server.endpoint])
    yield client.lease_revoke(nodes["b"].member.lease)
    yield client.close()
    yield deferred_wait(elected(journal, 2), 20, "the next leader")
    assert leads(journal) == [("lead", "b", 1), ("lead", "c", 2)]
    assert journal.index(("step_down", "b")) < journal.index(("lead", "c", 2))
    yield deferred_wait(lambda: ("follow", "b", "c", 2) in journal, 10, "b to follow c")
    assert leaders(nodes) == ["c"]


@pytest_twisted.inlineCallbacks
def test_lease_revoked_behind_a_cut_off_leader(group, etcd_server, line):
    """The leader's lease is revoked while it cannot hear of it: the next leader waits
    a whole lease after the leader key went, by when the old one stepped down on its own
    (its renewals failing)."""
    nodes = group(endpoints=[line.url], b=9)
    nodes.update(group(a=5, c=7))
    journal = group.journal
    yield deferred_wait(elected(journal, 1), 20, "a leader")
    line.cut = True
    client = EtcdClient(reactor, [etcd_server.endpoint])
    yield client.lease_revoke(nodes["b"].member.lease)
    yield client.close()
    yield deferred_wait(elected(journal, 2), 20, "the next leader")
    assert leads(journal)[1] == ("lead", "c", 2)
    assert journal.index(("step_down", "b")) < journal.index(("lead", "c", 2))


@pytest_twisted.inlineCallbacks
def test_leader_cut_off_from_etcd_steps_down_before_its_lease_lapses(group, etcd_server, line):
    """The leader's keepalives stop reaching etcd (the line is cut, silently): it steps
    down before etcd lets its lease lapse, which is before anyone else leads."""
    nodes = group(endpoints=[line.url], b=9)
    nodes.update(group(a=5, c=7))
    journal = group.journal
    yield deferred_wait(elected(journal, 1), 20, "a leader")
    assert leads(journal) == [("lead", "b", 1)]
    lease = nodes["b"].member.lease
    # etcd's own account of when b's lease lapsed: the keys attached to it go
    client = EtcdClient(reactor, [etcd_server.endpoint])

    def lapsed(events, revision):
        journal.extend(("lapsed", e.kv.key) for e in events if e.type == "DELETE")

    watch = client.watch(f"/mqserver/{GROUP}/leader", lapsed)
    yield deferred_wait(lambda: watch.connected, 10, "the watch")
    line.cut = True
    yield deferred_wait(elected(journal, 2), 30, "the next leader")
    watch.stop()
    assert leads(journal)[1] == ("lead", "c", 2)
    gone = journal.index(("lapsed", f"/mqserver/{GROUP}/leader"))
    assert journal.index(("step_down", "b")) < gone < journal.index(("lead", "c", 2))
    view = yield read_group(client, GROUP)
    yield client.close()
    assert view.leader["name"] == "c" and view.leader_lease != lease
    assert "b" not in view.members  # etcd let b's lease lapse
    line.cut = False
    yield deferred_wait(lambda: ("follow", "b", "c", 2) in journal, 20,
                        "b to follow c once the line is back")
    assert leaders(nodes) == ["c"]


@pytest_twisted.inlineCallbacks
def test_etcd_killed_and_restarted(group, etcd_server):
    """While etcd is gone nobody promotes itself and the leader steps down when its lease
    would lapse; once etcd is back a leader is elected again, in a new epoch."""
    nodes = group(a=5, b=9, c=7)
    journal = group.journal
    yield deferred_wait(elected(journal, 1), 20, "a leader")
    yield deferred_wait(lambda: sum(e[0] == "follow" for e in journal) == 2, 10, "followers")
    etcd_server.kill()
    yield deferred_wait(lambda: ("step_down", "b") in journal, 10, "the leader to step down")
    yield deferred_wait(lambda: not any(n.member.etcd_reachable for n in nodes.values()), 10,
                        "every member to notice")
    # a whole lease more without etcd: still nobody leads
    down = reactor.seconds()
    yield deferred_wait(lambda: reactor.seconds() - down > LEASE_MS / 1000
                        and all(n.member.role != LEADER for n in nodes.values()), 10,
                        "a lease without etcd")
    assert len(leads(journal)) == 1 and leaders(nodes) == []
    etcd_server.start()
    yield deferred_wait(elected(journal, 2), 30, "a leader after etcd is back")
    assert leads(journal)[1] == ("lead", "b", 2)
    assert leaders(nodes) == ["b"]


def mqctl(*args):
    """Run mqctl as a process without blocking the reactor (the members keep renewing);
    fires with (stdout, stderr, exit status)."""
    from twisted.internet import utils

    env = dict(os.environ, PYTHONPATH=ROOT)
    return utils.getProcessOutputAndValue(
        sys.executable, ["-m", "protocols.admin.ctl", *args], env=env, path=ROOT)


@pytest_twisted.inlineCallbacks
def test_mqctl_cluster_prints_the_members(group, etcd_server):
    nodes = group(a=5, b=9, c=7)
    yield deferred_wait(lambda: all(n.member.view and n.member.view.members.get(n.name, {})
                                    .get("role") in ("leader", "follower")
                                    for n in nodes.values()), 20, "the roles published")
    out, err, status = yield mqctl("cluster", "--etcd", etcd_server.endpoint, "--group", GROUP)
    assert status == 0, err
    lines = out.decode().splitlines()
    assert lines[0] == f"group {GROUP}: leader b, epoch 1"
    rows = {line.split()[0]: line.split()[1:5] for line in lines[3:]}
    assert lines[2].split()[:6] == ["NAME", "ROLE", "EPOCH", "EVENTID", "LAG", "ADDRESSES"]
    assert rows == {"a": ["follower", "0", "5", "4"], "b": ["leader", "1", "9", "0"],
                    "c": ["follower", "0", "7", "2"]}
    out, err, status = yield mqctl("--json", "cluster", "--etcd", etcd_server.endpoint,
                                   "--group", GROUP)
    data = json.loads(out)
    assert data["leader"] == "b" and [m["name"] for m in data["members"]] == ["a", "b", "c"]
    assert data["members"][0]["addresses"] == {"smss": "127.0.0.1:12397"}
    # no etcd there: exit 2 with a message
    dead = f"http://127.0.0.1:{free_port()}"
    out, err, status = yield mqctl("cluster", "--etcd", dead, "--group", GROUP)
    assert status == 2 and b"no etcd answers" in err


@pytest_twisted.inlineCallbacks
def test_a_leader_key_held_by_a_member_that_does_not_lead_is_given_up(group, etcd_server):
    """The key under a member's lease without the member leading (what a campaign whose
    answer was lost leaves): the member gives it up and an election follows."""
    nodes = group(a=5)
    yield deferred_wait(lambda: nodes["a"].member.lease, 10, "a's lease")
    client = EtcdClient(reactor, [etcd_server.endpoint])
    yield client.put(f"/mqserver/{GROUP}/leader", json.dumps({"name": "a", "epoch": 1}),
                     lease=nodes["a"].member.lease)
    yield client.close()
    nodes.update(group(b=9))
    yield deferred_wait(elected(group.journal, 1), 20, "a leader")
    assert leads(group.journal) == [("lead", "b", 1)]


@pytest_twisted.inlineCallbacks
def test_etcd_paused_answers_nothing(group, etcd_server):
    """etcd stopped (SIGSTOP): connections open, nothing answers, watches hang. The leader
    steps down in time all the same, nobody promotes itself, and once etcd runs again
    (every lease lapsed meanwhile) a leader is elected in a new epoch."""
    nodes = group(a=5, b=9, c=7)
    journal = group.journal
    yield deferred_wait(elected(journal, 1), 20, "a leader")
    etcd_server.pause()
    try:
        yield deferred_wait(lambda: ("step_down", "b") in journal, 10, "the leader to step down")
        yield deferred_wait(lambda: not any(n.member.etcd_reachable for n in nodes.values()),
                            10, "every member to notice")
        assert len(leads(journal)) == 1 and leaders(nodes) == []
    finally:
        etcd_server.resume()
    yield deferred_wait(elected(journal, 2), 30, "a leader after etcd runs again")
    assert leads(journal)[1] == ("lead", "b", 2)
