"""A replica group of three real broker processes and a real etcd on loopback: etcd
elects one leader, which acknowledges smss publishes once a follower holds them; when the
leader is killed or paused past its lease another takes over with every acknowledged
message, and the old leader, restarted (by the test, or by its supervisor after it exits
with status 75), follows it with the same log."""

import signal
import subprocess
import sys
import threading
import time

import pytest

from mqserver.exitstatus import RESTART
from protocols.smss.client import SmssClient, SmssError
from tests.support.group import Member, leader_of, member_config, wait_converged, writable_leader
from tests.support.server import ROOT
from tests.support.smss import read_topic
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(240)

LEASE_MS = 2000
#: a failure guard only: the group is meant to have a writable leader within 10 s
TAKEOVER_BOUND = 30.0


@pytest.fixture
def group(tmp_path, etcd_server):
    members = [Member(tmp_path / name, name, member_config(etcd_server, name, LEASE_MS))
               for name in ("m1", "m2", "m3")]
    try:
        yield [m.start() for m in members]
    finally:
        for m in members:
            m.stop()
        for m in members:
            assert not m.errors, m.errors


def publish(member, bodies):
    with SmssClient("127.0.0.1", member.port) as c:
        for body in bodies:
            c.publish("t", [body])


def bodies_on(member):
    return {m.body for m in read_topic(member.server, "t", settle=0.5, timeout=20)}


def _try(f, *args):
    """None when C{f(*args)} returns, else the exception it raised."""
    try:
        f(*args)
    except (OSError, SmssError) as e:
        return e
    return None


def test_the_group_fails_over_without_losing_acknowledged_messages(group):
    lead = leader_of(group, TAKEOVER_BOUND)
    for m in group:
        if m is not lead:
            with SmssClient("127.0.0.1", m.port) as c, pytest.raises(
                    SmssError, match=rf"just master can pub message \(master: {lead.address}\)"):
                c.publish("t", [b"to a follower"])
    with SmssClient("127.0.0.1", lead.port) as c:
        c.create("t")
    acked = [b"first-%d" % i for i in range(20)]
    publish(lead, acked)  # each answered OK: a follower holds it
    follower = next(m for m in group if m is not lead)
    with SmssClient("127.0.0.1", follower.port, follow_master=True) as c:
        c.publish("t", [b"via-a-follower"])  # refused there, sent to the leader it names
        assert c.address == ("127.0.0.1", lead.port)
    acked.append(b"via-a-follower")

    # the leader dies: another takes over with every acknowledged message
    lead.kill()
    began = time.monotonic()
    rest = [m for m in group if m is not lead]
    new = writable_leader(rest, TAKEOVER_BOUND)
    assert time.monotonic() - began < TAKEOVER_BOUND
    assert set(acked) <= bodies_on(new)
    more = [b"second-%d" % i for i in range(10)]
    publish(new, more)

    # the killed member, started again, follows the new leader with the same log
    lead.start()
    assert leader_of(group, TAKEOVER_BOUND) is new
    wait_converged(group, 30)
    assert set(acked + more) <= bodies_on(lead)

    # the leader paused past its lease: another takes over, and the old one, woken,
    # acknowledges nothing
    old = new
    old.server.proc.send_signal(signal.SIGSTOP)
    try:
        newer = writable_leader([m for m in group if m is not old], TAKEOVER_BOUND)
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
    assert leader_of(group, TAKEOVER_BOUND) is newer
    publish(newer, [b"third"])
    wait_converged(group, 30)
    on_newer = bodies_on(newer)
    assert set(acked + more + [b"third"]) <= on_newer
    assert b"late" not in on_newer


def test_mqctl_sends_a_write_a_follower_refuses_to_the_leader(tmp_path, etcd_server):
    """A follower's admin door refuses `mqctl topic create` naming the leader's admin
    door, and mqctl sends the request there once more."""
    members = [Member(tmp_path / name, name, member_config(etcd_server, name, LEASE_MS),
                      doors=("smss", "admin")) for name in ("m1", "m2", "m3")]
    try:
        for m in members:
            m.start()
        lead = leader_of(members, TAKEOVER_BOUND)
        wait_until(lambda: lead.status().get("sync", {}).get("available"), TAKEOVER_BOUND,
                   "a follower confirming to the leader", interval=0.1)
        follower = next(m for m in members if m is not lead)
        p = subprocess.run(
            [sys.executable, "-m", "protocols.admin.ctl", "--url",
             f"http://127.0.0.1:{follower.ports['admin']}", "topic", "create", "x"],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
            env={"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin"})
        assert p.returncode == 0, p.stderr
        assert f"127.0.0.1:{lead.ports['admin']}" in p.stderr
        with SmssClient("127.0.0.1", lead.port) as c:
            assert c.topic_info("x")["name"] == "x"
    finally:
        for m in members:
            m.stop()
