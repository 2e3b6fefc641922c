"""A manual failover with real processes: the follower promoted by restarting it as a
master starts a new term; the old master, restarted as its follower, finds the records no
one confirmed, cuts them at its next start and then follows, until both logs are equal."""

import os
import signal

import pytest

from protocols.smss.client import SmssClient, SmssError
from tests.integration.test_replication import log_records
from tests.integration.test_replication_sync import free_port, master_config, status
from tests.support.server import ServerProcess
from tests.support.smss import read_topic
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(180)

ALIVE = {"timeout": {"server": {"alive": 300}}}


def member(path, port, master_port=None):
    """A broker on smss port C{port}: a master with synchronous replication, or a
    follower of the one on C{master_port}."""
    listen = {"smss": f"tcp:{port}:interface=127.0.0.1"}
    if master_port is None:
        return ServerProcess(path, config=master_config(timeout_ms=1000), listen=listen)
    return ServerProcess(path, config=ALIVE, listen=listen,
                         extra_args=["--role", "slave", "--master", f"127.0.0.1:{master_port}"])


def confirming(port):
    return lambda: len(status(port)["sync"]["confirming"]) >= 1 and status(port)["sync"]["available"]


def test_the_old_master_cuts_what_no_one_confirmed_and_follows(tmp_path):
    pa, pb = free_port(), free_port()
    a = member(tmp_path / "a", pa).start()
    b = member(tmp_path / "b", pb, master_port=pa).start()
    try:
        wait_until(confirming(pa), 30, "b confirming to a")
        with SmssClient("127.0.0.1", pa) as c:
            c.create("t")
            for i in range(20):
                c.publish("t", [b"acked-%d" % i])
            os.kill(b.proc.pid, signal.SIGSTOP)
            for i in range(3):  # written on a, never confirmed: never acknowledged
                with pytest.raises(SmssError):
                    c.publish("t", [b"unconfirmed-%d" % i])
        a.kill()
        b.kill()  # still stopped: what a sent it since is lost with its socket

        # the operator promotes b: restarted as a master it begins term 2
        b = member(tmp_path / "b", pb).start()
        assert "master term 2 begins" in b.current_log()
        # a comes back as b's follower: its log goes on past term 1's end on b
        a = member(tmp_path / "a", pa, master_port=pb)
        a._spawn()
        assert a.proc.wait(30) == 75  # stopped to be started again (EX_TEMPFAIL)
        assert "they are cut at the next start" in a.current_log()
        a.start()
        assert "truncating the commit log after eventId" in a.current_log()
        wait_until(confirming(pb), 30, "a confirming to b")
        with SmssClient("127.0.0.1", pb) as c:
            c.publish("t", [b"after"])
        want = [b"acked-%d" % i for i in range(20)] + [b"after"]
        for server in (a, b):
            assert [m.body for m in read_topic(server, "t", until_alive=True)] == want
        a.stop()
        b.stop()
        ours, theirs = log_records(a.data), log_records(b.data)
        assert [r[0] for r in ours] == [r[0] for r in theirs]  # one eventId, one record
        assert [r[6] for r in ours] == [r[6] for r in theirs]
        assert not any(b"unconfirmed" in r[6] for r in ours)
    finally:
        for s in (a, b):
            try:
                os.kill(s.proc.pid, signal.SIGCONT)
            except (OSError, AttributeError):
                pass
            s.close()
