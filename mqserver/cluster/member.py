"""A broker as a member of a replica group: what etcd decides becomes the broker's role.

The member starts with no role (it refuses writes and follows nobody) and publishes its
durable eventId, its epoch and its doors' addresses through L{GroupMember}. Elected, it
becomes the master in the epoch etcd chose; told of another leader, it follows that
leader's smss door. A leader that loses its leadership acknowledges nothing from then
on, and stops the process with L{exitstatus.RESTART}: started again by its supervisor,
it follows the new leader and, if its log went on past what the group confirmed, cuts
it first (the follower's comparison of terms).
"""

from twisted.application import service
from twisted.internet import defer
from twisted.internet.error import ReactorNotRunning
from twisted.logger import Logger

from mqserver import exitstatus
from mqserver.cluster.etcd import EtcdClient
from mqserver.cluster.group import LEADER, GroupMember
from mqserver.config import etcd_endpoints
from mqserver.service import local_ipv4

#: the door whose address followers follow
REPLICATION_DOOR = "smss"

#: what the writes waiting for confirmation fail with when leadership is lost
LEADERSHIP_LOST = "leadership lost"

_ANY_HOST = ("", "0.0.0.0", "::")


def door_addresses(listeners):
    """C{{door: "host:port"}} of the TCP doors among C{listeners} (L{ListenerService}s)
    that listen; a door bound to every interface is named by this host's address."""
    out = {}
    for listener in listeners:
        where = listener.bound()
        if not where or "port" not in where:
            continue
        host = where["host"]
        if host in _ANY_HOST:
            host = local_ipv4()
        out[listener.door] = (f"[{host}]:{where['port']}" if ":" in host
                              else f"{host}:{where['port']}")
    return out


class GroupService(service.MultiService):
    """The broker's membership of its replica group (a child of the service tree, after
    the doors: it starts once they listen, and steps down before they close).

    @ivar member: the L{GroupMember}.
    @ivar stepped_down: True once this broker lost a leadership it held.
    """

    log = Logger()

    def __init__(self, broker, listeners, config, reactor):
        """
        @param listeners: callable returning the broker's L{ListenerService}s.
        """
        super().__init__()
        self.setName("group")
        self.broker = broker
        self.reactor = reactor
        self.stepped_down = False
        self._listeners = listeners
        lease_ms = config["cluster.leaseMs"]
        # a call to an etcd that does not answer must fail well inside a renewal period
        self.client = EtcdClient(reactor, etcd_endpoints(config["cluster.etcd"]),
                                 timeout=lease_ms / 4000.0)
        self.member = GroupMember(
            reactor, self.client, config["cluster.group"], config["cluster.name"],
            config["cluster.members"], lease_ms,
            durable_event_id=self.durable_event_id, epoch=lambda: broker.epoch,
            addresses=self.addresses, become_leader=self.become_leader,
            follow=self.follow, step_down=self.step_down)
        self.member.setServiceParent(self)

    @defer.inlineCallbacks
    def stopService(self):
        yield super().stopService()
        yield self.client.close()

    # -- what the member publishes --

    def durable_event_id(self):
        return self.broker.store.next_event_id - 1

    def addresses(self):
        return door_addresses(self._listeners())

    def leader_address(self, door):
        """The address (HOST:PORT) the leader publishes for its C{door}, or None (no
        leader known, or it does not listen on that door)."""
        return ((self.member.leader or {}).get("addresses") or {}).get(door)

    def status(self):
        """The member as the replication status shows it."""
        m = self.member
        leader = m.leader or {}
        return {"group": m.group, "name": m.name, "role": m.role,
                "epoch": m.epoch_led if m.role == LEADER else leader.get("epoch", 0),
                "leader": m.name if m.role == LEADER else leader.get("name"),
                "etcdReachable": m.etcd_reachable}

    # -- what the group decides --

    def become_leader(self, epoch):
        def promoted(_):
            if self.stepped_down:
                # the leadership was lost while the follower service stopped: the
                # promotion that just finished must not take writes
                self._refuse_writes()

        self.broker.roles.promote(epoch).addCallback(promoted).addErrback(
            lambda f: self.log.failure("could not take the leadership in epoch {epoch}", f,
                                       epoch=epoch))

    def follow(self, leader):
        if self.broker.is_master:
            # it led, and another leads now: what it wrote that no one confirmed must be
            # cut before it can follow, which only a restart does
            self.step_down()
            return
        address = (leader.get("addresses") or {}).get(REPLICATION_DOOR)
        if not address:
            self.log.warn("the leader {name} publishes no {door} address to follow",
                          name=leader.get("name"), door=REPLICATION_DOOR)
            return
        self.broker.roles.follow(address).addErrback(
            lambda f: self.log.failure("could not follow {address}", f, address=address))

    def step_down(self):
        """Stop acknowledging at once: refuse new writes, fail those waiting for their
        confirmation; then, unless the broker is stopping anyway, stop the process to be
        started again as a follower."""
        if self.stepped_down:
            return
        self.stepped_down = True
        self._refuse_writes()
        if not self.member.running:
            return  # stopping: the leadership went with the service
        self.log.warn("leadership lost: stopping, to follow the new leader once restarted")
        exitstatus.request(exitstatus.RESTART)
        try:
            self.reactor.stop()
        except ReactorNotRunning:
            pass

    def _refuse_writes(self):
        self.broker.set_role(False, None)
        gate = self.broker.sync_gate
        if gate is not None:
            gate.fail_all(LEADERSHIP_LOST)
