"""A replica group of real broker processes on loopback, for the group's integration test
and the fault harness (bench/chaos.py): each member on fixed ports (a restart keeps its
addresses) under a supervisor thread that starts it again when it exits with status 75,
as systemd's Restart=on-failure would."""

import os
import shutil
import threading

from mqserver.exitstatus import RESTART
from mqserver.store import format as fmt
from mqserver.store.fileio import FAULT_ENV
from protocols.smss.client import SmssClient, SmssError
from tests.integration.test_replication import log_records
from tests.support.etcd import free_port
from tests.support.server import ServerProcess
from tests.support.wait import wait_until

#: the client timeout of an smss request to a member (a paused one never answers)
TIMEOUT = 5.0


def member_config(etcd, name, lease_ms, members=3, replicas=1, timeout_ms=3000, **extra):
    config = {"timeout": {"server": {"alive": 300}},
              "cluster": {"etcd": etcd.endpoint, "group": "g", "name": name,
                          "members": members, "leaseMs": lease_ms},
              "replication": {"syncReplicas": replicas, "syncTimeoutMs": timeout_ms}}
    config.update(extra)
    return config


class Member:
    """One member process and its supervisor.

    @ivar ports: door -> its fixed loopback port.
    @ivar exits: every exit status the supervisor saw.
    @ivar errors: restarts that failed.
    """

    def __init__(self, data, name, config, doors=("smss",), host="127.0.0.1", netns=None,
                 disk_faults=False):
        """
        @param host: the address its doors listen on; C{netns}: the network namespace
            it runs in (the host is then one of that namespace's addresses).
        @param disk_faults: its store's writes can be made to fail (L{disk_full}).
        """
        self.name = name
        self.host = host
        self.ports = {door: free_port() for door in doors}
        #: the control directory of its store's fault injection, or None
        self.faults = str(data) + ".faults" if disk_faults else None
        env = {}
        if self.faults is not None:
            os.makedirs(self.faults, exist_ok=True)
            env[FAULT_ENV] = self.faults
        self.server = ServerProcess(data, config=config, listen={
            door: f"tcp:{port}:interface={host}" for door, port in self.ports.items()},
            env=env, command_prefix=("ip", "netns", "exec", netns) if netns else ())
        self.server.host = host
        self.exits = []
        self.errors = []
        self._done = threading.Event()
        self._thread = None

    @property
    def port(self):
        return self.ports["smss"]

    @property
    def address(self):
        return f"{self.host}:{self.port}"

    def start(self):
        """Start the process (again, after the caller killed it) and its supervisor."""
        if self._thread is not None:
            self._thread.join(30)
        self._done.clear()
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
            except Exception as e:  # the caller reports it
                self.errors.append(e)
                return

    def kill(self):
        """SIGKILL, not restarted by the supervisor."""
        self._done.set()
        self.server.kill()

    def wipe(self):
        """Remove the data directory (of a killed member)."""
        shutil.rmtree(self.server.data, ignore_errors=True)
        for suffix in (".ready.json",):
            try:
                os.remove(self.server.data + suffix)
            except FileNotFoundError:
                pass

    def disk_full(self, full=True):
        """Make every write of its store fail with ENOSPC (the disk full), or work again."""
        path = os.path.join(self.faults, "enospc")
        if full:
            open(path, "w").close()
        elif os.path.exists(path):
            os.remove(path)

    def status(self):
        """The member's $replication status, or None when it does not answer."""
        try:
            with SmssClient(self.host, self.port, timeout=TIMEOUT) as c:
                return c.topic_info("$replication")
        except (OSError, SmssError):
            return None

    def stop(self):
        self._done.set()
        if self.server.proc is not None:
            self.server.stop()
        self.server.close()


def leader_of(members, timeout):
    """Wait until exactly one member leads and every other follows it; return it."""
    seen = {}

    def one_leader():
        seen.update({m.name: m.status() for m in members})
        leaders = [m for m in members if (seen[m.name] or {}).get("role") == "master"]
        if len(leaders) != 1:
            return False
        lead = leaders[0]
        return (seen[lead.name].get("group", {}).get("role") == "leader"
                and all(seen[m.name] and seen[m.name]["role"] == "slave"
                        and seen[m.name]["group"]["leader"] == lead.name
                        for m in members if m is not lead))

    wait_until(one_leader, timeout, "one leader, followed by the others", interval=0.1)
    return next(m for m in members if seen[m.name]["role"] == "master")


def writable_leader(members, timeout, topic="t"):
    """Wait until one of C{members} takes an smss publish to C{topic}; return it."""
    found = []

    def takes_writes():
        for m in members:
            try:
                with SmssClient(m.host, m.port, timeout=TIMEOUT) as c:
                    c.publish(topic, [b"probe"])
            except (OSError, SmssError):
                continue
            found.append(m)
            return True
        return False

    wait_until(takes_writes, timeout, "a leader that takes writes", interval=0.1)
    return found[0]


def wait_converged(members, timeout):
    """Wait until every member's log equals the first's, record for record; return it."""
    def same():
        try:
            logs = [log_records(m.server.data) for m in members]
        except fmt.ScanError as e:
            if e.kind != "torn":
                raise
            # a member still appending (a follower catching up): its file ends inside
            # the record being written; read again (a tail that stays torn times out)
            return False
        return all(log == logs[0] for log in logs[1:]) and logs[0]

    return wait_until(same, timeout, "every member's log equal", interval=0.2)
