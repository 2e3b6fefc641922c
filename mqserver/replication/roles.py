"""The broker's replication role at run time: a master, or a follower of one master.

A follower is promoted in place (an operator's C{mqctl promote}, or a replica group's
election): it stops following, becomes the master and, with synchronous replication,
starts a term. A master does not turn into a follower in place: the records it wrote that
no follower confirmed must be cut first, which a follower does at its next start (see
L{protocols.smss.follower}), so a master that must follow is restarted as a follower.
"""

from twisted.application import service
from twisted.internet import defer
from twisted.logger import Logger


class RoleError(Exception):
    """A role change that cannot be made; the text says why."""


class Roles(service.MultiService):
    """Owns the follower service while the broker follows, and the changes of role.

    @ivar master: the address (HOST:PORT) of the master followed, or None on a master.
    @ivar follower: the service following it, or None.
    """

    log = Logger()

    def __init__(self, broker, make_follower, replicas=0, timeout_ms=5000):
        """
        @param make_follower: C{make_follower(master)} returns the service that follows
            the master at C{master} (built by the front door that speaks replication).
        @param replicas: the synchronous replicas a master waits for
            (C{replication.syncReplicas}), and C{timeout_ms} how long.
        """
        super().__init__()
        self.setName("roles")
        self.broker = broker
        self._make_follower = make_follower
        self._replicas = replicas
        self._timeout_ms = timeout_ms
        self.master = None
        self.follower = None

    def follow(self, master):
        """Follow the master at C{master} (HOST:PORT), instead of any other. Returns a
        Deferred firing once the follower service runs (or is set to, before start)."""
        if self.broker.is_master:
            return defer.fail(RoleError(
                "a master follows another only after a restart (what it wrote that no"
                " follower confirmed must be cut first)"))
        if master == self.master and self.follower is not None:
            return defer.succeed(None)

        def start(_):
            self.master = master
            self.follower = self._make_follower(master)
            self.follower.setServiceParent(self)
            self.broker.set_role(False, master)
            self.log.info("following the master at {master}", master=master)

        return self._stop_follower().addCallback(start)

    def promote(self, epoch=None):
        """Stop following and become the master (with synchronous replication, starting
        term C{epoch}, or the next after the log's last). Returns a Deferred firing with
        the term begun (None without synchronous replication)."""
        if self.broker.is_master:
            return defer.succeed(self.broker.epoch if self.broker.sync_gate else None)

        def become(_):
            was = self.master
            self.master = None
            term = self.broker.become_master(self._replicas, self._timeout_ms, epoch)
            self.log.info("promoted to master (was following {was}){term}", was=was,
                          term="" if term is None else f", term {term}")
            return term

        return self._stop_follower().addCallback(become)

    def _stop_follower(self):
        follower, self.follower = self.follower, None
        if follower is None:
            return defer.succeed(None)
        return defer.maybeDeferred(follower.disownServiceParent)
