"""Membership and leader election of a replica group, decided in etcd.

Each member of a group publishes a record under C{/mqserver/<group>/members/<name>}
(its addresses, its durable eventId, its epoch and its role), attached to a lease of its
own that it keeps alive, so the record vanishes when the member does. The leader holds
C{/mqserver/<group>/leader}, attached to the same lease; C{/mqserver/<group>/epoch}
holds the last epoch a leader took.

The election (L{GroupMember}):
  - a member campaigns only when it has seen no leader key for a whole lease period
    (C{cluster.leaseMs}): a leader whose lease was revoked under it has stepped down by
    then, as it never keeps its role longer than that after its last renewal;
  - and only once a majority of C{cluster.members} have live records;
  - and only if it has the highest durable eventId among them (ties: the smallest name);
  - it takes the leader key in one etcd transaction that also writes the next epoch (the
    highest of the stored epoch and every published one, plus one), guarded by the leader
    key not existing and the epoch key not having changed, then calls
    C{become_leader(epoch)}.

A leader renews its lease every third of the lease. When it has not renewed it for the
lease minus a safety margin (a third of the lease), whatever the reason (etcd down,
slow, or out of reach), it calls C{step_down()}: before etcd can let the lease lapse and
another member take the key. Followers watch the leader key and call
C{follow(leader)} when another member takes it. While etcd is unreachable nobody is
elected, since taking the key needs etcd: the leader keeps its role until its lease
would lapse (minus the margin), followers keep following the leader they knew.
"""

import json
import math

from twisted.application import service
from twisted.internet import defer, task
from twisted.logger import Logger

from mqserver.cluster.etcd import (
    EtcdError,
    EtcdUnavailable,
    LeaseNotFound,
    compare,
    op_put,
)

PREFIX = "/mqserver/"

#: the roles a member record shows
STARTING, FOLLOWER, LEADER = "starting", "follower", "leader"


def group_prefix(group):
    return f"{PREFIX}{group}/"


def majority(members):
    """How many members of a group of C{members} make a majority."""
    return members // 2 + 1


class GroupView:
    """What etcd holds about a group at one revision.

    @ivar members: name -> the member's record (a dict), in name order.
    @ivar leader: the leader record (a dict with C{name}, C{lease}, C{epoch}, ...) or None.
    @ivar leader_lease: the lease the leader key is attached to (0: no leader).
    @ivar epoch: the last epoch a leader took (0: none yet).
    @ivar epoch_mod_revision: the epoch key's mod_revision (0: absent).
    @ivar revision: etcd's revision of this view.
    """

    def __init__(self, group, kvs, revision):
        base = group_prefix(group)
        self.members = {}
        self.leader = None
        self.leader_lease = 0
        self.epoch = 0
        self.epoch_mod_revision = 0
        self.revision = revision
        for kv in kvs:
            rest = kv.key[len(base):]
            if rest.startswith("members/"):
                record = _decode(kv.value)
                if record is not None:
                    self.members[rest[len("members/"):]] = record
            elif rest == "leader":
                self.leader = _decode(kv.value)
                self.leader_lease = kv.lease
            elif rest == "epoch":
                try:
                    self.epoch = int(kv.value)
                except ValueError:
                    self.epoch = 0
                self.epoch_mod_revision = kv.mod_revision

    def rows(self):
        """One dict per member for display: name, role (the leader key decides who is
        leader), epoch, eventId, lag (the leader's eventId minus its own; None when
        there is no leader), addresses."""
        leader_name = (self.leader or {}).get("name")
        leader_event = None
        if leader_name in self.members:
            leader_event = self.members[leader_name].get("eventId", 0)
        out = []
        for name, record in sorted(self.members.items()):
            event = record.get("eventId", 0)
            role = record.get("role", FOLLOWER)
            if name == leader_name:
                role = LEADER
            elif role == LEADER:  # a record not yet rewritten since it stepped down
                role = FOLLOWER
            out.append({
                "name": name,
                "role": role,
                "epoch": record.get("epoch", 0),
                "eventId": event,
                "lag": None if leader_event is None else max(0, leader_event - event),
                "addresses": record.get("addresses", {}),
            })
        return out


def _decode(value):
    try:
        record = json.loads(value)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _encode(record):
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode("utf-8")


@defer.inlineCallbacks
def read_group(client, group):
    """Return the L{GroupView} of C{group} as etcd holds it now."""
    kvs, revision = yield client.range(group_prefix(group), prefix=True)
    return GroupView(group, kvs, revision)


def choose_candidate(records):
    """The name of the member that should lead among C{records} (name -> record): the
    highest eventId, ties broken by the smallest name. None when there are none."""
    if not records:
        return None
    return min(records, key=lambda name: (-int(records[name].get("eventId", 0)), name))


class GroupMember(service.Service):
    """One member of a replica group (see the module docstring).

    @param client: an L{mqserver.cluster.etcd.EtcdClient}; its C{timeout} should be at
        most a third of the lease, so that a call to an unreachable etcd fails in time.
    @param durable_event_id: callable returning this member's durable eventId.
    @param epoch: callable returning this member's epoch.
    @param addresses: callable returning a JSON-able description of where clients and
        followers reach this member (a dict of door -> "host:port", say).
    @param become_leader: called with the new epoch once this member leads.
    @param follow: called with the leader's record (a dict: C{name}, C{addresses},
        C{epoch}, C{eventId}) when another member leads, or leads anew.
    @param step_down: called when this member stops leading; from then on it must
        acknowledge no write.

    @ivar role: L{STARTING}, L{FOLLOWER} or L{LEADER}.
    @ivar leader: the record of the leader this member follows (None: none known).
    @ivar epoch_led: the epoch this member took when it last became leader.
    @ivar view: the last L{GroupView} read.
    @ivar etcd_reachable: whether the last call to etcd succeeded.
    """

    log = Logger()

    def __init__(self, reactor, client, group, name, members, lease_ms,
                 durable_event_id, epoch, addresses, become_leader, follow, step_down):
        self.reactor = reactor
        self.client = client
        self.group = group
        self.name = name
        self.members = members
        self.lease_ms = lease_ms
        self.durable_event_id = durable_event_id
        self.epoch = epoch
        self.addresses = addresses
        self.become_leader = become_leader
        self.follow = follow
        self.step_down = step_down
        self.role = STARTING
        self.leader = None
        self.epoch_led = 0
        self.view = None
        self.etcd_reachable = False
        self.lease = 0
        # the time (on the reactor's clock) the last successful grant or keepalive of
        # the lease was sent: etcd holds the lease until at least that plus its TTL
        self.renewed_at = None
        self._prefix = group_prefix(group)
        self._leader_key = self._prefix + "leader"
        self._member_key = self._prefix + "members/" + name
        self._epoch_key = self._prefix + "epoch"
        self._interval = lease_ms / 3000.0
        self._margin = lease_ms / 3000.0
        self._ttl = max(1, math.ceil(lease_ms / 1000.0))
        self._no_leader_since = None
        self._leader_revision = 0
        self._deadline = None
        self._watch = None
        self._loops = []
        self._campaigning = False

    # -- service --

    def startService(self):
        super().startService()
        self._watch = self.client.watch(self._leader_key, self._leader_events)
        for f in (self._renew, self._tick):
            loop = task.LoopingCall(self._guarded(f))
            loop.clock = self.reactor
            loop.start(self._interval, now=True)
            self._loops.append(loop)

    @defer.inlineCallbacks
    def stopService(self):
        """Stop the loops and the watch; a leader steps down; the lease is revoked, so
        the member record (and the leader key) go at once."""
        super().stopService()
        for loop in self._loops:
            if loop.running:
                loop.stop()
        self._loops = []
        if self._watch is not None:
            self._watch.stop()
            self._watch = None
        self._cancel_deadline()
        if self.role == LEADER:
            yield self._lose_leadership("stopping")
        else:
            yield self._abandon_lease()

    def _abandon_lease(self):
        """Forget the lease and revoke it (its keys go with it); a new one is granted on
        the next renewal. Returns a Deferred that never fails."""
        lease, self.lease, self.renewed_at = self.lease, 0, None
        if not lease:
            return defer.succeed(None)

        def failed(f):
            f.trap(EtcdError)
            # etcd lets it lapse by itself: nobody keeps it alive any more
            self.log.warn("could not revoke the group lease {lease}: {e}", lease=lease,
                          e=f.value)

        return self.client.lease_revoke(lease).addErrback(failed)

    def _guarded(self, f):
        """C{f} for a LoopingCall: its failures are logged, never stop the loop."""
        def call():
            if not self.running:
                return None
            d = defer.maybeDeferred(f)
            d.addErrback(self._log_failure)
            return d
        return call

    def _log_failure(self, failure):
        if failure.check(EtcdUnavailable):
            if self.etcd_reachable:
                self.log.warn("etcd unreachable: {e}", e=failure.value)
            self.etcd_reachable = False
        elif failure.check(EtcdError):
            self.log.warn("etcd error: {e}", e=failure.value)
        else:
            self.log.failure("replica group member {name}", failure, name=self.name)

    def _reached(self):
        if not self.etcd_reachable:
            self.log.info("etcd reachable")
        self.etcd_reachable = True

    # -- the lease --

    @defer.inlineCallbacks
    def _renew(self):
        if not self.lease:
            sent = self.reactor.seconds()
            lease, _ = yield self.client.lease_grant(self._ttl)
            if not self.running:
                yield self.client.lease_revoke(lease)
                return
            self.lease, self.renewed_at = lease, sent
            self._reached()
            return
        sent = self.reactor.seconds()
        try:
            yield self.client.lease_keepalive(self.lease)
        except LeaseNotFound:
            self._reached()
            self.log.warn("the group lease {lease} is gone (expired or revoked)", lease=self.lease)
            if self.role == LEADER:
                yield self._lose_leadership("its lease is gone")
            else:
                self.lease, self.renewed_at = 0, None
            return
        self._reached()
        if self.lease and (self.renewed_at is None or sent > self.renewed_at):
            self.renewed_at = sent
            if self.role == LEADER:
                self._arm_deadline()

    def _arm_deadline(self):
        """Step down at the renewal time plus the lease minus the margin, unless a later
        renewal moves it."""
        self._cancel_deadline()
        when = self.renewed_at + self.lease_ms / 1000.0 - self._margin
        self._deadline = self.reactor.callLater(max(0.0, when - self.reactor.seconds()),
                                                self._deadline_passed)

    def _cancel_deadline(self):
        if self._deadline is not None and self._deadline.active():
            self._deadline.cancel()
        self._deadline = None

    def _deadline_passed(self):
        self._deadline = None
        if self.role == LEADER:
            self._lose_leadership("the lease could not be renewed in time")

    def _lose_leadership(self, why):
        """Step down, then give up the lease: were it kept alive once etcd answers
        again, the leader key would stay with a member that no longer leads. Returns
        the Deferred of the revocation."""
        self.log.warn("{name} steps down as leader of {group}: {why}",
                      name=self.name, group=self.group, why=why)
        self._cancel_deadline()
        self.role = FOLLOWER
        self.leader = None
        # a new election waits a whole lease from now, like everyone else's
        self._no_leader_since = None
        self.step_down()
        return self._abandon_lease()

    # -- what etcd shows --

    @defer.inlineCallbacks
    def _tick(self):
        if self.lease:
            yield self.client.put(self._member_key, _encode(self._record()), lease=self.lease)
        view = yield read_group(self.client, self.group)
        self._reached()
        self.view = view
        self._leader_seen(view.leader, view.leader_lease, view.revision)
        if self._electable(view):
            yield self._campaign(view)

    def _record(self):
        return {"name": self.name, "addresses": self.addresses(),
                "eventId": int(self.durable_event_id()), "epoch": int(self.epoch()),
                "role": self.role}

    def _leader_events(self, events, revision):
        for event in events:
            if event.type == "DELETE":
                self._leader_seen(None, 0, event.kv.mod_revision)
            else:
                self._leader_seen(_decode(event.kv.value), event.kv.lease,
                                  event.kv.mod_revision)

    def _leader_seen(self, record, lease, revision):
        """The leader key as of etcd's C{revision}: C{record} (None: no leader)."""
        if revision < self._leader_revision or not self.running:
            return  # an older view than one already taken into account
        self._leader_revision = revision
        if record is None:
            if self._no_leader_since is None:
                self._no_leader_since = self.reactor.seconds()
            if self.role == LEADER:
                self._lose_leadership("the leader key is gone")
            return
        self._no_leader_since = None
        mine = record.get("name") == self.name and lease == self.lease and self.lease
        if self.role == LEADER:
            if not mine:
                self._lose_leadership(f"{record.get('name')} holds the leader key")
            else:
                return
        if mine:
            if not self._campaigning:
                # Our lease holds the key but we do not lead (a campaign whose answer was
                # lost, or taken too late): give the key up, or nobody would ever lead.
                self.log.warn("{name} holds the leader key without leading; giving it up",
                              name=self.name)
                self._abandon_lease()
            return
        if record.get("name") == self.name:
            return  # a former incarnation of ours: its lease lapses soon
        if self.leader is None or (self.leader.get("name"), self.leader.get("epoch")) != (
                record.get("name"), record.get("epoch")):
            self.leader = record
            self.role = FOLLOWER
            self.log.info("{name} follows {leader} (epoch {epoch})", name=self.name,
                          leader=record.get("name"), epoch=record.get("epoch"))
            self.follow(record)

    def _electable(self, view):
        """Whether this member should campaign now."""
        if self._campaigning or self.role == LEADER or not self.lease:
            return False
        if view.leader is not None or self._no_leader_since is None:
            return False
        if self.reactor.seconds() - self._no_leader_since < self.lease_ms / 1000.0:
            return False
        if len(view.members) < majority(self.members):
            return False
        return choose_candidate(view.members) == self.name

    @defer.inlineCallbacks
    def _campaign(self, view):
        self._campaigning = True
        lease, renewed_at = self.lease, self.renewed_at
        published = [int(r.get("epoch", 0)) for r in view.members.values()]
        epoch = max([view.epoch, int(self.epoch())] + published) + 1
        record = dict(self._record(), role=LEADER, epoch=epoch, lease=str(lease))
        try:
            result = yield self.client.txn(
                [compare(self._leader_key, "create_revision", "==", 0),
                 compare(self._epoch_key, "mod_revision", "==", view.epoch_mod_revision)],
                [op_put(self._leader_key, _encode(record), lease=lease),
                 op_put(self._epoch_key, str(epoch).encode("ascii"))])
            won = result.succeeded
        except EtcdUnavailable:
            # the transaction may have happened: the leader key says
            leader = yield self.client.get(self._leader_key)
            won = (leader is not None and leader.lease == lease
                   and (_decode(leader.value) or {}).get("epoch") == epoch)
        finally:
            self._campaigning = False
        if not won or not self.running or lease != self.lease:
            return
        now = self.reactor.seconds()
        if renewed_at is None or now >= renewed_at + self.lease_ms / 1000.0 - self._margin:
            self.log.warn("{name} took the leader key too late to lead on it", name=self.name)
            yield self._abandon_lease()
            return
        self.role = LEADER
        self.leader = record
        self.epoch_led = epoch
        self._no_leader_since = None
        self.renewed_at = max(self.renewed_at or 0, renewed_at)
        self._arm_deadline()
        self.log.info("{name} leads {group} in epoch {epoch}", name=self.name,
                      group=self.group, epoch=epoch)
        self.become_leader(epoch)
