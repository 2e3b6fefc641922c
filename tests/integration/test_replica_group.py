"""A replica group of three real broker processes and a real etcd on loopback: etcd
elects one leader, which acknowledges smss publishes once a follower holds them; when the
leader is killed or paused past its lease another takes over with every acknowledged
message, and the old leader, restarted by its supervisor, follows it with the same log."""

import signal
import threading
import time

import pytest

from mqserver.exitstatus import RESTART
from protocols.smss.client import SmssClient, SmssError
from tests.integration.test_replication import log_records
from tests.integration.test_replication_sync import ALIVE, free_port, status
from tests.support.server import ServerProcess
from tests.support.smss import read_topic
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(240)

LEASE_MS = 2000
#: a failure guard only: the group is meant to have a writable leader within 10 s
TAKEOVER_BOUND = 30.0


class Member:
    """One member process under a supervisor thread that starts it again when it exits
    with status 75, as systemd's Restart=on-failure would (a test kills it itself)."""

    def __init__(self, tmp_path, name, etcd):
        self.name = name
        self.port = free_port()  # fixed, so that a restart keeps its address
        config = dict(ALIVE, cluster={"etcd": etcd.endpoint, "group": "g", "name": name,
                                      "members": 3, "leaseMs": LEASE_MS},
                      replication={"syncReplicas": 1, "syncTimeoutMs": 3000})
        self.server = ServerProcess(tmp_path / name, config=config,
                                    listen={"smss": f"tcp:{self.port}:interface=127.0.0.1"})
        self.exits = []  # every exit status seen by the supervisor
        self.errors = []
        self._done = threading.Event()
        self._thread = None

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def start(self):
        self.server.start()
        self._thread = threading.Thread(target=self._supervise, daemon=True)
        self._thread.start()
        return self

    def _supervise(self):
        while not self._done.is_set():
            code = self.server.proc.wait()
            self.exits.append(code)
            if code != RESTART or self._done.is_set():
                return
            try:
                self.server.start()
            except Exception as e:  # the test fails on it below
                self.errors.append(e)
                return

    def restart(self):
        """Start it again after the test killed it."""
        self._thread.join(10)
        self.start()

    def status(self):
        try:
            return status(self.port)
        except (OSError, SmssError):
            return None

    def stop(self):
        self._done.set()
        self.server.stop()
        self.server.close()


@pytest.fixture
def group(tmp_path, etcd_server):
    members = [Member(tmp_path, n, etcd_server) for n in ("m1", "m2", "m3")]
    try:
        yield [m.start() for m in members]
    finally:
        for m in members:
            m.stop()
        for m in members:
            assert not m.errors, m.errors


def roles(members):
    return {m.name: m.status() for m in members}


def leader_of(members, timeout=TAKEOVER_BOUND):
    """Wait until exactly one member leads and every other follows it; return it."""
    seen = {}

    def one_leader():
        seen.update(roles(members))
        leaders = [m for m in members if (seen[m.name] or {}).get("role") == "master"]
        if len(leaders) != 1:
            return False
        lead = leaders[0]
        return (seen[lead.name]["group"]["role"] == "leader"
                and all(seen[m.name] and seen[m.name]["role"] == "slave"
                        and seen[m.name]["group"]["leader"] == lead.name
                        for m in members if m is not lead))

    wait_until(one_leader, timeout, "one leader, followed by the others", interval=0.1)
    return next(m for m in members if seen[m.name]["role"] == "master")


def writable_leader(members, timeout=TAKEOVER_BOUND):
    """Wait until one of C{members} takes a publish; return it."""
    found = []

    def takes_writes():
        for m in members:
            try:
                with SmssClient("127.0.0.1", m.port, timeout=5) as c:
                    c.publish("t", [b"probe"])
            except (OSError, SmssError):
                continue
            found.append(m)
            return True
        return False

    wait_until(takes_writes, timeout, "a leader that takes writes", interval=0.1)
    return found[0]


def publish(member, bodies):
    with SmssClient("127.0.0.1", member.port) as c:
        for body in bodies:
            c.publish("t", [body])


def bodies_on(member):
    return {m.body for m in read_topic(member.server, "t", settle=0.5, timeout=20)}


def wait_converged(members):
    """Wait until every member's log equals the leader's, record for record."""
    def same():
        logs = [log_records(m.server.data) for m in members]
        return all(log == logs[0] for log in logs[1:]) and logs[0]

    wait_until(same, 30, "every member's log equal", interval=0.2)


def test_the_group_fails_over_without_losing_acknowledged_messages(group):
    lead = leader_of(group)
    for m in group:
        if m is not lead:
            with SmssClient("127.0.0.1", m.port) as c, pytest.raises(
                    SmssError, match=rf"just master can pub message \(master: {lead.address}\)"):
                c.publish("t", [b"to a follower"])
    with SmssClient("127.0.0.1", lead.port) as c:
        c.create("t")
    acked = [b"first-%d" % i for i in range(20)]
    publish(lead, acked)  # each answered OK: a follower holds it

    # the leader dies: another takes over with every acknowledged message
    lead.server.kill()
    began = time.monotonic()
    rest = [m for m in group if m is not lead]
    new = writable_leader(rest)
    took = time.monotonic() - began
    assert took < TAKEOVER_BOUND
    assert set(acked) <= bodies_on(new)
    more = [b"second-%d" % i for i in range(10)]
    publish(new, more)

    # the killed member, started again, follows the new leader with the same log
    lead.restart()
    assert leader_of(group) is new
    wait_converged(group)
    assert set(acked + more) <= bodies_on(lead)

    # the leader paused past its lease: another takes over, and the old one, woken,
    # acknowledges nothing
    old = new
    old.server.proc.send_signal(signal.SIGSTOP)
    try:
        newer = writable_leader([m for m in group if m is not old])
        answers = []
        with SmssClient("127.0.0.1", old.port, timeout=20) as c:
            # sent while it sleeps; read once it wakes
            waiting = threading.Thread(
                target=lambda: answers.append(_try(c.publish, "t", [b"late"])))
            waiting.start()
            old.server.proc.send_signal(signal.SIGCONT)
            waiting.join(30)
    finally:
        old.server.proc.send_signal(signal.SIGCONT)
    assert answers and answers[0] is not None, "the woken old leader acknowledged a publish"
    wait_until(lambda: RESTART in old.exits, 30, "the old leader stopping to follow")
    assert leader_of(group) is newer
    publish(newer, [b"third"])
    wait_converged(group)
    on_newer = bodies_on(newer)
    assert set(acked + more + [b"third"]) <= on_newer
    assert b"late" not in on_newer


def _try(f, *args):
    """None when C{f(*args)} returns, else the exception it raised."""
    try:
        f(*args)
    except (OSError, SmssError) as e:
        return e
    return None
