"""The master side of smss replication: a REPLICA stream of binlog blocks.

The feed is a push producer on the connection: it stops reading the log while the
socket's buffer is full, so a slow slave costs a bounded amount of memory. When it has
sent everything it waits for the next append, and sends ALIVE when idle.

The records appended in one reactor turn go out together at the end of that turn, in one
send straight to the socket: a write waiting for its follower's confirmation (synchronous
replication) waits for no reactor turn more than the round trip itself.
"""

from twisted.internet.interfaces import IPushProducer
from twisted.logger import Logger
from zope.interface import implementer

from mqserver.runtime.soon import call_soon

from protocols.smss import codec, wire
from protocols.smss.binlog import (
    commit_block, continues, is_epoch, record_to_block, records_to_block)
from protocols.smss.keepalive import IdleAlive

_READS_PER_TURN = 8


@implementer(IPushProducer)
class ReplicaFeed:
    """Streams the commit log after an eventId to one slave.

    @ivar sent: records sent so far.
    @ivar last_event_id: the eventId of the last record sent (the slave's lag in eventIds
        is the log's last eventId minus this; see L{mqserver.broker.stats}).
    @ivar peer: the slave's address.
    """

    log = Logger()

    def __init__(self, proto, reader, after_event_id=0, confirms=False):
        self._proto = proto
        self.confirms = confirms
        self._gate = proto.broker.sync_gate if confirms else None
        self.confirmed_event_id = None
        self._reader = reader
        self._replication_log = proto.broker.replication_log
        self._reactor = proto.factory.reactor
        self._paused = False
        self._active = False
        self._pump_call = None
        self._alive = IdleAlive(self._reactor, proto.factory.alive_interval, self._send_alive)
        self._write = []  # message records of a write whose last record is not read yet
        self._commit_sent = None  # the commit point last sent to the follower
        self._commit_call = None
        self.sent = 0
        self.last_event_id = after_event_id
        peer = proto.transport.getPeer()
        self.peer = f"{getattr(peer, 'host', '?')}:{getattr(peer, 'port', '?')}"

    def start(self):
        """Register as the connection's producer and start sending."""
        self._active = True
        self._proto.broker.stats.add_replica(self)
        if self.confirms:
            # an empty block: "send your confirmations" (a reference smss master never
            # sends one, so a follower that sees none keeps quiet)
            self._proto.write_through(
                wire.REPLICA_FRAME_HEADER_STRUCT.pack(wire.STATUS_OK, 0))
            self.confirmed_event_id = 0
            if self._gate is not None:
                self._gate.attach(self)
                # before any record: the follower shows its consumers only what the
                # commit points cover
                self._send_commit()
                self._gate.add_commit_listener(self._committed)
        self._proto.transport.registerProducer(self, True)
        self._replication_log.add_append_listener(self._wake)
        self._alive.start()
        self._pump()

    def _wake(self):
        if self._active and not self._paused and self._pump_call is None:
            self._pump_call = call_soon(self._reactor, self._pump)

    def _pump(self):
        self._pump_call = None
        for _ in range(_READS_PER_TURN):
            if not self._active or self._paused:
                return
            views = self._reader.read()
            if not views:
                return
            frames = []
            for block in self._blocks(views):
                frames.append(wire.REPLICA_FRAME_HEADER_STRUCT.pack(wire.STATUS_OK, len(block)))
                frames.append(block)
            self.sent += len(views)
            # the last eventId sent (a write still open waits in _write, unsent)
            self.last_event_id = self._write[0].event_id - 1 if self._write else views[-1].event_id
            if frames:
                self._proto.write_through(b"".join(frames))
                self._alive.wrote()
        # More may be waiting: yield to the reactor between rounds.
        self._wake()

    def _blocks(self, views):
        # The binlog blocks of views: the records of one write (a multi-message PUB,
        # MPUB or batch) make one block, as smss writes it. A write split over two reads
        # waits in _write for its end; one with a gap in its eventIds (a damaged record
        # left out) is cut there, so each block's ids stay first + i.
        write = self._write
        for view in views:
            if write and (view.event_id != write[-1].event_id + 1 or view.topic != write[0].topic):
                yield records_to_block(write)
                write.clear()
            if write or continues(view):
                write.append(view)
                if not continues(view):
                    yield records_to_block(write)
                    write.clear()
            elif is_epoch(view) and not self.confirms:
                continue  # a reference smss slave has no such record
            else:
                yield record_to_block(view)

    def confirmed(self, event_id):
        """The follower holds every record up to C{event_id} durably. Only what was
        sent to it counts: it cannot hold more of this log than that."""
        if not self.confirms:
            return
        event_id = min(event_id, self.last_event_id)
        if event_id > self.confirmed_event_id:
            self.confirmed_event_id = event_id
            if self._gate is not None:
                self._gate.confirm(self, event_id)

    def _committed(self):
        # The commit points of one turn of the reactor go out as one block.
        if self._active and self._commit_call is None:
            self._commit_call = call_soon(self._reactor, self._send_commit)

    def _send_commit(self):
        self._commit_call = None
        point = self._gate.committed_event_id
        if not self._active or point == self._commit_sent:
            return
        self._commit_sent = point
        block = commit_block(point, self._proto.broker.now_ms())
        self._proto.write_through(
            wire.REPLICA_FRAME_HEADER_STRUCT.pack(wire.STATUS_OK, len(block)) + block)

    def behind_bytes(self):
        """Return how many bytes of the log this follower has not been sent yet."""
        return max(0, self._replication_log.end - self._reader.offset)

    def _send_alive(self):
        if not self._active:
            return False
        self._proto.write_through(codec.alive())
        return True

    # IPushProducer

    def pauseProducing(self):
        self._paused = True

    def resumeProducing(self):
        self._paused = False
        self._wake()

    def stopProducing(self):
        self.stop()

    def stop(self):
        """Stop streaming (the connection is gone)."""
        self._active = False
        self._proto.broker.stats.remove_replica(self)
        if self._gate is not None:
            self._gate.detach(self)
            self._gate.remove_commit_listener(self._committed)
        if self._commit_call is not None and self._commit_call.active():
            self._commit_call.cancel()
        self._commit_call = None
        self._replication_log.remove_append_listener(self._wake)
        self._alive.stop()
        if self._pump_call is not None and self._pump_call.active():
            self._pump_call.cancel()
        self._pump_call = None
