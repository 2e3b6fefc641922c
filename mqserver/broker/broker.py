"""The broker: topics, publishing, delays, topic lifetimes and subscriptions over one store.

Protocols call this API (see L{mqserver.interfaces.IBroker}); it knows nothing of any
wire format. It is also the store's state machine: every admin record, written live or
replayed at start-up, changes topics and delays through L{Broker.apply_record}.
"""

import itertools

from twisted.internet import defer
from twisted.logger import Logger
from zope.interface import implementer

from mqserver.broker.channel_registry import ChannelRegistry
from mqserver.broker.cursor import EventNotFound, TopicCursor
from mqserver.broker.offsets import ConsumerOffsets
from mqserver.broker.queues import QueueService
from mqserver.broker.delays import DELAY_PROPERTY, DelayIndex, PendingDelay
from mqserver.broker.stats import Statistics
from mqserver.broker.storeviews import DataFiles, MessageLog, ReplicationLog, StoreStats
from mqserver.broker.topics import (
    MAX_QUEUES, TopicRegistry, create_body, valid_queue_count, validate_topic_name)
from mqserver.errors import InvalidRequest, NotMaster, StoreError, TopicExists, TopicNotFound
from mqserver.interfaces import IBroker
from mqserver.replication.logreader import LogReader
from mqserver.replication.sync import SyncGate
from mqserver.store import format as fmt
from mqserver.store.store import Message
from mqserver.wiretap import WireTap


#: A delayed message naming its queue in this property (RocketMQ's name for the queue a
#: delayed message was sent to) is delivered to that queue when the delay fires.
QUEUE_HINT_PROPERTY = b"REAL_QID"


def _check_queue_count(queues):
    if not valid_queue_count(queues):
        raise InvalidRequest(f"queue count must be 1..{MAX_QUEUES}")


def _queue_hint(properties, queues):
    """Return the queue named by C{properties}' L{QUEUE_HINT_PROPERTY} when it is one of
    C{queues} queues, else None."""
    if QUEUE_HINT_PROPERTY not in properties:
        return None
    for k, v in fmt.decode_properties(properties):
        if k == QUEUE_HINT_PROPERTY:
            return int(v) if v.isdigit() and int(v) < queues else None
    return None


@implementer(IBroker)
class Broker:
    """Topics, publishing, delays and subscriptions over a L{MessageStore}.

    @ivar store: the L{MessageStore} (the core's; front doors use the four below).
    @ivar messages: the L{MessageLog} (L{mqserver.interfaces.IMessageLog}).
    @ivar replication_log: the L{ReplicationLog} (L{mqserver.interfaces.IReplicationLog}).
    @ivar store_stats: the L{StoreStats} (L{mqserver.interfaces.IStoreStats}).
    @ivar files: the L{DataFiles} (L{mqserver.interfaces.IDataFiles}).
    @ivar registry: the L{TopicRegistry}.
    @ivar delays: the L{DelayIndex}.
    @ivar is_master: False on a replication slave, which refuses writes.
    @ivar sync_gate: the L{SyncGate} of synchronous replication (a write is acknowledged
        once enough followers hold it), or None (L{require_replicas}).
    @ivar offsets: the L{ConsumerOffsets} of consumer groups (loaded at L{start}).
    @ivar channels: the L{ChannelRegistry} (channel consumption, e.g. NSQ's).
    @ivar queues: the L{QueueService} (msgout queue attributes, sessions, receipts and
        push subscriptions; checkpointed as "msgout").
    @ivar stats: the L{Statistics} every protocol counts into and reads.
    @ivar extensions: protocol name -> per-broker object a protocol shares between its
        front doors (e.g. NSQ's TCP, HTTP and lookupd doors); the core never reads it.
    @ivar wiretap: the L{WireTap}: fault rules, and whether front doors must look at
        each request.
    """

    log = Logger()

    def __init__(self, store, reactor, is_master=True):
        self.store = store
        self.messages = MessageLog(store)
        self.replication_log = ReplicationLog(store)
        self.store_stats = StoreStats(store)
        self.files = DataFiles(store)
        self._reactor = reactor
        self.registry = TopicRegistry()
        self.delays = DelayIndex()
        self.is_master = is_master
        self.sync_gate = None
        #: the master's address while following one (for errors that name it), else None
        self.master_address = None
        self._role_listeners = []
        #: the L{mqserver.replication.roles.Roles} that changes the role at run time (set
        #: by the service tree), or None
        self.roles = None
        #: the L{mqserver.cluster.member.GroupService} of a replica group's member, or None
        self.group = None
        #: [epoch, first eventId] of every master term in the log, oldest first
        self.epochs = []
        #: the master's commit point a follower knew at the last checkpoint, or None
        self._commit_point = None
        self._watchers = {}  # topic -> set of watchers (data_available / topic_deleted)
        self._claims = {}  # (topic, who) -> subscriber
        self._rr = {}  # topic -> round-robin counter
        self._delay_call = None
        self._life_call = None
        self._cursors = set()
        self._extensions = {}  # name -> object with snapshot_state/restore_state
        self._ext_state = {}
        self.offsets = ConsumerOffsets(store.path, store.io.write_json)
        self.channels = ChannelRegistry(self, reactor)
        self.stats = Statistics(self, reactor.seconds)
        self.extensions = {}
        self.queues = QueueService(self)
        self.wiretap = WireTap(reactor)
        self.register_state("msgout", self.queues)
        store.state = self
        store.add_arrival_listener(self._arrived)

    # -- life cycle ----------------------------------------------------------------------

    def start(self):
        """Load consumer offsets, arm the delay and lifetime timers (after the store is open)."""
        self.offsets.load()
        if self.sync_gate is None and not self.is_master:
            # a follower shows its consumers only what its master had committed, as it
            # did before the restart, until the master tells it more
            committed = self._restored_commit_point()
            if committed is not None:
                self.store.follow_commits(committed)
                self._hide_unconfirmed(committed, "the master's commit")
        if self.sync_gate is not None:
            self._hide_unconfirmed(self.sync_gate.restored_event_id)
            if self.is_master:
                # a master that followers confirm to starts a term of its own: a follower
                # that held records of an older term no one confirmed finds and drops
                # them (docs/replication.md, "Epochs")
                self.begin_epoch().addErrback(lambda f: f.trap(StoreError))
        self._schedule_delays()
        self._schedule_life()
        self.channels.start()

    def _restored_commit_point(self):
        # the master's commit point the follower last knew, or, on a master that is
        # now started as a follower, its own
        if self._commit_point is not None:
            return self._commit_point
        return (self._ext_state.get("sync") or {}).get("committedEventId")

    def _hide_unconfirmed(self, committed, what="the followers' confirmation"):
        # The writes after the commit point the checkpoint kept were not confirmed by
        # enough followers (or not known to be): consumers see them once they are.
        store = self.store
        if committed is None or committed >= store.next_event_id - 1:
            return
        try:
            reader = (LogReader.after_event(store, committed) if committed
                      else LogReader(store, store.commitlog.min_offset))
        except EventNotFound:
            reader = LogReader(store, store.commitlog.min_offset)
        start = reader.offset
        writes = []
        while True:
            views = reader.read()
            if not views:
                break
            for v in views:
                if v.magic == fmt.MESSAGE_MAGIC and v.sys_flag & fmt.SYSFLAG_BATCH_MORE:
                    continue  # the write goes on: its last record ends it
                topic = v.topic if v.magic == fmt.MESSAGE_MAGIC else None
                writes.append((v.event_id, v.offset + v.size, topic, v.queue_id))
        if writes:
            self.log.info("{n} writes after eventId {eid} wait for {what}",
                          n=len(writes), eid=committed, what=what)
            store.hide_after(start, writes)

    def stop(self):
        """Cancel the timers."""
        self.channels.stop()
        for call in (self._delay_call, self._life_call):
            if call is not None and call.active():
                call.cancel()
        self._delay_call = self._life_call = None
        if self.sync_gate is not None:
            self.sync_gate.stop()

    def require_replicas(self, replicas, timeout_ms, fallbehind_bytes=None):
        """Acknowledge a write, and show it to consumers, only once C{replicas} followers
        hold it durably; one that they do not confirm within C{timeout_ms} fails with
        L{mqserver.errors.ReplicationTimeout}, and one written while fewer are connected
        (or more than C{fallbehind_bytes} of log behind) with
        L{mqserver.errors.ReplicasUnavailable}. Called again (a front door asking for
        its own protocol's semantics), the larger count and the later timeout hold.
        Returns the L{SyncGate}."""
        gate = self.sync_gate
        if gate is None:
            gate = self.sync_gate = SyncGate(self._reactor, replicas, timeout_ms,
                                             fallbehind_bytes)
            self.register_state("sync", gate)
            self.store.set_sync_gate(gate)
            return gate
        gate.replicas = max(gate.replicas, replicas)
        gate.timeout = timeout_ms / 1000.0
        if fallbehind_bytes is not None:
            gate.fallbehind_bytes = fallbehind_bytes
        return gate

    def now_ms(self):
        """Return the current time in ms."""
        return int(self._reactor.seconds() * 1000)

    # -- state machine (called by the store) --------------------------------------------

    def apply_record(self, view, replaying):
        """Apply one admin record, or note a replayed delayed message's origin."""
        if view.magic == fmt.MESSAGE_MAGIC:
            if replaying and DELAY_PROPERTY in view.properties:
                for k, v in fmt.decode_properties(view.properties):
                    if k == DELAY_PROPERTY:
                        self.delays.note_applied(fmt.parse_delay_marker(v)[0])
            return
        name = view.topic
        if view.flag == fmt.OP_CREATE:
            self.registry.apply_create(name, view.body, view.event_id, view.store_ts)
        elif view.flag == fmt.OP_UPDATE:
            self.registry.apply_update(name, view.body, view.event_id, view.store_ts)
        elif view.flag == fmt.OP_DELETE:
            self.registry.apply_delete(name)
            self._rr.pop(name, None)
            if not replaying:
                self.offsets.drop_topic(name)
                self._topic_deleted(name)
        elif view.flag == fmt.OP_EPOCH:
            # a replay over a checkpoint that holds it already adds nothing
            if not self.epochs or view.event_id > self.epochs[-1][1]:
                self.epochs.append([fmt.I64.unpack_from(view.body, 0)[0], view.event_id])
            return
        elif view.flag == fmt.OP_DELAY:
            (trigger,) = fmt.DELAY_PREFIX.unpack_from(view.body, 0)
            (count,) = fmt.I32.unpack_from(view.body, fmt.DELAY_PREFIX.size)
            self.delays.add(
                PendingDelay(view.event_id, trigger, name, view.offset, view.size, count)
            )
        if not replaying:
            self._schedule_life()
            self._schedule_delays()

    def snapshot_state(self):
        """Return topics, pending delays, channels and registered state for the checkpoint."""
        ext = dict(self._ext_state)
        for name, obj in self._extensions.items():
            ext[name] = obj.snapshot_state()
        return {"topics": self.registry.snapshot(), "delays": self.delays.snapshot(),
                "channels": self.channels.snapshot(), "epochs": self.epochs, "ext": ext,
                "commitPoint": self.store.commit_point}

    def restore_state(self, state):
        """Load what L{snapshot_state} returned."""
        self.registry.restore(state.get("topics", []))
        self.delays.restore(state.get("delays", []))
        # checkpoints written before channels existed have no "channels" key
        self.channels.restore(state.get("channels") or {})
        self.epochs = [list(e) for e in state.get("epochs", [])]
        self._commit_point = state.get("commitPoint")
        self._ext_state = dict(state.get("ext", {}))
        for name, obj in self._extensions.items():
            obj.restore_state(self._ext_state.get(name))

    def state_changed(self):
        """State kept with L{register_state} changed: have the next checkpoint take it."""
        self.store.mark_dirty()

    def state_of(self, name):
        """Return the object registered with L{register_state} as C{name}, or None."""
        return self._extensions.get(name)

    def forget_after(self, event_id):
        """The log was cut after C{event_id} (a truncation before following a new
        master): forget what the restored checkpoint holds of records after it (topics
        they created, delays, epochs); the replay of the log rebuilds the rest."""
        reg = self.registry.topics
        for name in [n for n, t in reg.items() if t.create_event_id > event_id]:
            del reg[name]
        for eid in [e for e in self.delays.pending if e > event_id]:
            self.delays.remove(eid)
        self.epochs = [e for e in self.epochs if e[1] <= event_id]

    @property
    def epoch(self):
        """The current epoch (0 before the first epoch record)."""
        return self.epochs[-1][0] if self.epochs else 0

    def add_role_listener(self, callback):
        """Call C{callback(is_master)} whenever the broker's role changes (a front door
        that registers differently as master and follower)."""
        self._role_listeners.append(callback)

    def set_role(self, is_master, master_address=None):
        """Take the role of a master, or of a follower of the master at
        C{master_address}, and tell the role listeners."""
        self.is_master = is_master
        self.master_address = None if is_master else master_address
        for cb in self._role_listeners:
            cb(is_master)

    def become_master(self, replicas=0, timeout_ms=5000, epoch=None):
        """Become the master (a follower promoted): with C{replicas} synchronous
        replicas, or those a front door asks for when told (RocketMQ's SYNC_MASTER),
        write the epoch record of term C{epoch} (default: the next). Returns the term
        begun, or None without synchronous replication."""
        if replicas:
            self.require_replicas(replicas, timeout_ms)
        self.set_role(True)
        if self.sync_gate is None:
            # what the old master had not committed is shown now: nothing will commit
            # it, and without synchronous replication nothing waits for followers
            self.store.stop_following_commits()
            return None
        self.begin_epoch(epoch).addErrback(lambda f: f.trap(StoreError))
        return self.epoch

    def begin_epoch(self, epoch=None):
        """Start a master term, C{epoch} or the one after the log's last: write its epoch
        record (its eventId is the term's first). Returns the Deferred of the write; the
        epoch is in L{epochs} at once."""
        body = fmt.I64.pack(max(self.epoch + 1, epoch or 0))
        d = self.store.put_admin(fmt.OP_EPOCH, fmt.EPOCH_RECORD_NAME, body)
        self.log.info("master term {epoch} begins at eventId {eid}", epoch=self.epoch,
                      eid=self.store.next_event_id - 1)
        return d

    def begin_full_replay(self):
        """The whole retained log is about to be replayed over the restored state: delayed
        messages already in the log are counted again from zero."""
        for d in self.delays.pending.values():
            d.applied = 0

    def register_state(self, name, obj):
        """Keep C{obj}'s state (C{snapshot_state()}/C{restore_state(data)}) in the
        checkpoint under C{name}. State of extensions not registered in this run is kept."""
        self._extensions[name] = obj
        obj.restore_state(self._ext_state.get(name))

    # -- topics --------------------------------------------------------------------------

    def _require_master(self, what):
        if not self.is_master:
            raise NotMaster(what, self.master_address)

    def topic(self, name):
        """Return the L{Topic} called C{name} if it exists and is valid, else None."""
        t = self.registry.topics.get(name)
        if t is None or not t.valid(self.now_ms()):
            return None
        return t

    def topics(self):
        """Return every topic in the registry (also expired ones not yet deleted), by name."""
        return [self.registry.topics[n] for n in sorted(self.registry.topics, key=lambda n: n.encode())]

    def create_topic(self, name, expire_at=0, queues=1, perm=6, attrs=None):
        """Create a topic. Returns a Deferred firing with its L{Topic}."""
        def write():
            validate_topic_name(name)
            self._require_master("manage topic")
            if name in self.registry.topics:
                raise TopicExists(name)
            _check_queue_count(queues)
            return self.store.put_admin(fmt.OP_CREATE, name, create_body(queues, expire_at, perm, attrs))

        return defer.maybeDeferred(write).addCallback(lambda _: self.registry.get(name))

    def update_topic(self, name, queues=None, perm=None, attrs=None):
        """Change a topic's queue count, permissions or attributes (creating it when
        missing). Returns a Deferred firing with its L{Topic}."""
        t = self.registry.get(name)
        count = queues or (t.queues if t else 1)

        def write():
            validate_topic_name(name)
            self._require_master("manage topic")
            _check_queue_count(count)
            body = create_body(
                count,
                t.expire_at if t else 0,
                perm if perm is not None else (t.perm if t else 6),
                attrs if attrs is not None else (t.attrs if t else {}),
            )
            return self.store.put_admin(fmt.OP_UPDATE, name, body)

        return defer.maybeDeferred(write).addCallback(lambda _: self.registry.get(name))

    def delete_topic(self, name):
        """Delete a topic: every watcher is told, its queues go. Returns a Deferred."""
        def write():
            self._require_master("manage topic")
            if name not in self.registry.topics:
                raise TopicNotFound(name)
            return self.store.put_admin(fmt.OP_DELETE, name, b"")

        return defer.maybeDeferred(write)

    # -- publishing ----------------------------------------------------------------------

    def _writable(self, name):
        self._require_master("pub message")
        t = self.topic(name)
        if t is None:
            raise TopicNotFound(name)
        return t

    def _pick_queue(self, t, queue_id):
        if queue_id is not None:
            if not 0 <= queue_id < t.queues:
                raise InvalidRequest(f"queue {queue_id} out of range")
            return queue_id
        if t.queues == 1:
            return 0
        n = self._rr.get(t.name)
        if n is None:
            n = self._rr[t.name] = itertools.count()
        return next(n) % t.queues

    def publish(self, topic, messages, queue_id=None):
        """Store C{messages} (L{Message} objects, or bytes: a message with only a body)
        in one write.

        Returns a Deferred firing with the L{PutResult} when the write is as durable as
        the flush level asks."""
        return defer.maybeDeferred(self.publish_now, topic, messages, queue_id)

    def publish_now(self, topic, messages, queue_id=None, answer=None):
        """L{publish} for a front door that answers at once when it can: returns the
        L{PutResult} itself when the write is already as durable as the flush level asks
        (levels 0 and 1), else a Deferred firing with it. Raises L{BrokerError} when
        the publish is refused or the write fails.

        C{answer}: called with the L{PutResult} as soon as a write complete at once is
        written, before the store's bookkeeping, and then None is returned (see
        L{mqserver.store.writer.Writer.put}); left uncalled otherwise."""
        t = self.registry.topics.get(topic)
        if (t is None or t.state or not self.is_master
                or (t.expire_at and not t.valid(self.now_ms()))):
            # not a writable topic on a master, as far as one lookup tells (a topic that
            # never expires needs no clock): _writable says why, or finds it after all
            t = self._writable(topic)
        if queue_id is None:
            queue_id = 0 if t.queues == 1 else self._pick_queue(t, None)
        elif not 0 <= queue_id < t.queues:
            self._pick_queue(t, queue_id)  # which says it is out of range
        return self.store.put(topic, queue_id, messages, None, None, answer)

    def delay(self, topic, delay_ms, messages):
        """Store C{messages} to be published C{delay_ms} from now. Returns a Deferred
        firing with the delay's eventId."""
        def write():
            self._writable(topic)
            if delay_ms < 0:
                raise InvalidRequest("negative delay")
            body = fmt.DELAY_PREFIX.pack(self.now_ms() + delay_ms) + fmt.encode_message_list(messages)
            return self.store.put_admin(fmt.OP_DELAY, topic, body)

        return defer.maybeDeferred(write).addCallback(lambda r: r.event_id)

    def _schedule_delays(self):
        nxt = self.delays.next_trigger()
        if self._delay_call is not None and self._delay_call.active():
            self._delay_call.cancel()
        self._delay_call = None
        if nxt is not None and self.is_master:
            wait = max(0.0, (nxt - self.now_ms()) / 1000.0)
            self._delay_call = self._reactor.callLater(wait, self._fire_delays)

    def _fire_delays(self):
        self._delay_call = None
        for d in self.delays.due(self.now_ms()):
            self.delays.remove(d.event_id)
            if self.topic(d.topic) is None:
                self.log.info("delay {id} dropped: topic {topic} is gone", id=d.event_id, topic=d.topic)
                self.store.mark_dirty()
                continue
            view = self.store.read_record(d.log_offset, d.size)
            if not view.crc_ok():
                self.store.report_damage(d.log_offset, "body CRC mismatch", view.event_id)
                self.log.error("delay {id} dropped: its record is damaged", id=d.event_id)
                self.store.mark_dirty()
                continue
            items = fmt.decode_message_list(view.body, fmt.DELAY_PREFIX.size)[d.applied :]
            marker = fmt.encode_properties([(DELAY_PROPERTY, fmt.delay_marker(d.event_id, d.trigger_ms))])
            msgs = [
                Message(body=body, properties=props + marker, flag=flag, sys_flag=sysf,
                        reconsume_times=rc)
                for flag, sysf, rc, body, props in items
            ]
            t = self.registry.get(d.topic)
            qid = _queue_hint(items[0][4], t.queues) if items else None
            self.store.put_messages(d.topic, self._pick_queue(t, qid), msgs).addErrback(
                lambda f, eid=d.event_id: self.log.failure("delay {id} failed", f, id=eid)
            )
            self.store.mark_dirty()
        self._schedule_delays()

    # -- lifetimes -----------------------------------------------------------------------

    def _schedule_life(self):
        if self._life_call is not None and self._life_call.active():
            self._life_call.cancel()
        self._life_call = None
        if not self.is_master:
            return
        times = [t.expire_at for t in self.registry.topics.values() if t.expire_at]
        if times:
            wait = max(0.0, (min(times) - self.now_ms()) / 1000.0)
            self._life_call = self._reactor.callLater(wait, self._expire)

    def _expire(self):
        self._life_call = None
        now = self.now_ms()
        for t in list(self.registry.topics.values()):
            if t.expire_at and t.expire_at <= now:
                self.log.info("topic {name} expired", name=t.name)
                self.delete_topic(t.name).addErrback(
                    lambda f: self.log.failure("expiring a topic failed", f)
                )
        self._schedule_life()

    # -- subscriptions -------------------------------------------------------------------

    def open_cursor(self, topic, after_event_id):
        """Return a L{TopicCursor} just after C{after_event_id} (see
        L{TopicCursor.after_event}). Raises L{TopicNotFound} or L{EventNotFound}."""
        t = self.topic(topic)
        if t is None:
            raise TopicNotFound(topic)
        c = TopicCursor.after_event(self.store, topic, range(t.queues), after_event_id)
        self._cursors.add(c)
        return c

    def track_cursor(self, cursor):
        """Count C{cursor} (made elsewhere, e.g. by a channel) in L{min_reader_offset}."""
        self._cursors.add(cursor)

    def close_cursor(self, cursor):
        """Forget C{cursor} (it no longer holds back retention)."""
        self._cursors.discard(cursor)

    def min_reader_offset(self):
        """Return the lowest commit-log offset an open cursor still has to read."""
        offs = [o for o in (c.log_offset() for c in self._cursors) if o is not None]
        return min(offs) if offs else None

    def claim(self, topic, who, subscriber):
        """Register C{subscriber} as the one live subscription of (topic, who); returns
        False when another one holds it."""
        key = (topic, who)
        if key in self._claims:
            return False
        self._claims[key] = subscriber
        return True

    def release(self, topic, who, subscriber):
        """Give up a claim made with L{claim}."""
        if self._claims.get((topic, who)) is subscriber:
            del self._claims[(topic, who)]

    def watch(self, topic, watcher):
        """Call C{watcher.data_available(topic, queue_id)} when messages arrive in C{topic},
        and C{watcher.topic_deleted(topic)} when it is deleted or expires."""
        self._watchers.setdefault(topic, set()).add(watcher)

    def unwatch(self, topic, watcher):
        """Stop calling C{watcher} for C{topic}."""
        ws = self._watchers.get(topic)
        if ws is not None:
            ws.discard(watcher)
            if not ws:
                del self._watchers[topic]

    def _arrived(self, topic, queue_id):
        # every publish calls this: a topic nobody watches costs a lookup
        watchers = self._watchers.get(topic)
        if watchers:
            for w in list(watchers):
                w.data_available(topic, queue_id)

    def _topic_deleted(self, topic):
        for key in [k for k in self._claims if k[0] == topic]:
            del self._claims[key]
        for w in list(self._watchers.pop(topic, ())):
            w.topic_deleted(topic)
