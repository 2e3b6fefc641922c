"""The replica group's timing on a MemoryReactorClock, with the in-memory etcd of
tests/support/memory_etcd.py (which tests/integration/test_memory_etcd.py holds to a real
etcd's behaviour): when a leader steps down, when an election may happen, and that none
does while etcd is out of reach."""

from twisted.internet.testing import MemoryReactorClock

from mqserver.cluster.group import LEADER, GroupMember
from tests.support.memory_etcd import Line, MemoryEtcd

LEASE = 3.0  # seconds (cluster.leaseMs 3000)
MARGIN = LEASE / 3


class Group:
    def __init__(self, **event_ids):
        self.clock = MemoryReactorClock()
        self.etcd = MemoryEtcd(self.clock, timeout=LEASE / 4)
        self.journal = []  # (what, name, epoch or None, time)
        self.lines, self.members = {}, {}
        for name, event_id in event_ids.items():
            self.add(name, event_id)

    def add(self, name, event_id):
        line = self.lines[name] = Line(self.etcd)
        member = GroupMember(
            self.clock, line, "g", name, 3, int(LEASE * 1000),
            durable_event_id=lambda: event_id, epoch=lambda: 0, addresses=lambda: {},
            become_leader=lambda epoch: self.note("lead", name, epoch),
            follow=lambda leader: self.note("follow", name, leader["epoch"]),
            step_down=lambda: self.note("step_down", name))
        self.members[name] = member
        member.startService()

    def note(self, what, name, epoch=None):
        self.journal.append((what, name, epoch, self.clock.seconds()))

    def run(self, seconds, step=0.05):
        for _ in range(round(seconds / step)):
            self.clock.advance(step)

    def run_until(self, predicate, limit=60.0, step=0.05):
        start = self.clock.seconds()
        while not predicate():
            assert self.clock.seconds() - start < limit, "not within the limit (clock time)"
            self.clock.advance(step)

    def events(self, what):
        return [e for e in self.journal if e[0] == what]

    def leaders(self):
        return [n for n, m in self.members.items() if m.role == LEADER]


def test_the_first_election_waits_a_whole_lease_and_picks_the_most_advanced():
    g = Group(a=5, b=9, c=7)
    g.run_until(lambda: g.events("lead"))
    (_, name, epoch, when), = g.events("lead")
    assert (name, epoch) == ("b", 1)
    assert when >= LEASE
    g.run(10 * LEASE)
    assert len(g.events("lead")) == 1 and g.leaders() == ["b"]
    assert sorted(e[1] for e in g.events("follow")) == ["a", "c"]


def test_a_cut_off_leader_steps_down_two_thirds_into_its_lease_before_it_lapses():
    g = Group(a=5, b=9, c=7)
    g.run_until(lambda: g.leaders() == ["b"])
    g.run(LEASE)  # settled
    b = g.members["b"]
    lease = b.lease
    g.lines["b"].cut = True
    renewed = b.renewed_at
    g.run_until(lambda: lease not in g.etcd._leases)  # etcd lets b's lease lapse
    lapsed = g.clock.seconds()
    g.run_until(lambda: len(g.events("lead")) == 2)
    (_, _, _, down), = g.events("step_down")
    assert down <= renewed + LEASE - MARGIN + 0.05  # one clock step
    assert down < lapsed
    (_, name, epoch, when) = g.events("lead")[1]
    assert (name, epoch) == ("c", 2)
    # the new leader waited a whole lease after the key went
    assert when >= lapsed + LEASE
    g.lines["b"].mend()
    g.run_until(lambda: ("b", 2) in [(e[1], e[2]) for e in g.events("follow")])
    assert g.leaders() == ["c"]


def test_nobody_leads_while_etcd_is_out_of_reach_and_someone_does_after():
    g = Group(a=5, b=9, c=7)
    g.run_until(lambda: g.leaders() == ["b"])
    g.run(LEASE)
    renewed = g.members["b"].renewed_at
    for line in g.lines.values():
        line.cut = True
    g.run(20 * LEASE)
    (_, _, _, down), = g.events("step_down")
    assert down <= renewed + LEASE - MARGIN + 0.05
    assert len(g.events("lead")) == 1 and g.leaders() == []
    assert not any(m.etcd_reachable for m in g.members.values())
    for line in g.lines.values():
        line.mend()
    g.run_until(lambda: len(g.events("lead")) == 2)
    assert g.events("lead")[1][1:3] == ("b", 2)


def test_a_minority_never_elects():
    g = Group(a=5)
    g.run(20 * LEASE)
    assert g.events("lead") == []
    g.add("b", 1)
    g.run_until(lambda: g.events("lead"))
    assert g.events("lead")[0][1:3] == ("a", 1)


def test_a_stopped_leader_steps_down_and_frees_the_key_at_once():
    g = Group(a=5, b=9, c=7)
    g.run_until(lambda: g.leaders() == ["b"])
    g.members["b"].stopService()
    assert g.events("step_down")[0][1] == "b"
    gone = g.clock.seconds()
    g.run_until(lambda: len(g.events("lead")) == 2)
    (_, name, epoch, when) = g.events("lead")[1]
    assert (name, epoch) == ("c", 2)
    assert gone + LEASE <= when < gone + 2 * LEASE
