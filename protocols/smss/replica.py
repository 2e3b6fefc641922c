"""The master side of smss replication: a REPLICA stream of binlog blocks.

The feed is a push producer on the connection: it stops reading the log while the
socket's buffer is full, so a slow slave costs a bounded amount of memory. When it has
sent everything it waits for the next append, and sends ALIVE when idle.

The records appended in one reactor turn go out together at the end of that turn, in one
send straight to the socket: a write waiting for its follower's confirmation (synchronous
replication) waits for no reactor turn more than the round trip itself.

The followers of a master are usually at the same place in its log, and their feeds run in
the same turn: the first to read a stretch of the log turns it into frames, and the others
at the same place send those very bytes (L{SharedFrames}) instead of reading the records
back and turning them into binlog blocks again. The second copy cost a master with two
followers about a sixth of its CPU per message.
"""

from twisted.internet.interfaces import IPushProducer
from twisted.logger import Logger
from zope.interface import implementer

from mqserver.runtime.soon import call_soon

from protocols.smss import codec, wire
from protocols.smss.binlog import (
    commit_block, continues, is_epoch, plain_frames, record_to_block, records_to_block)
from protocols.smss.keepalive import IdleAlive

_READS_PER_TURN = 8


class SharedFrames:
    """The frames the feeds of one door made in the current turn of the reactor, by
    where they start in the log, for the other feeds there: (offset, confirms) ->
    (frames, reader offset after them, records, last eventId sent).

    Only a read that started and ended between writes (no write left open) is shared:
    its frames are then the same for every feed that starts there and does (or does not)
    confirm. What is kept is dropped at the start of the next turn, so it holds at most
    one turn's reads, and never outlives the log bytes it was made from; nothing is kept
    while fewer than two feeds run.

    @ivar feeds: the feeds running (L{join}, L{leave}).
    @ivar reused: reads one feed made and another sent.
    """

    def __init__(self, reactor):
        self._reactor = reactor
        self._frames = {}
        self._clear_call = None
        self.feeds = 0
        self.reused = 0

    def join(self):
        """A feed starts."""
        self.feeds += 1

    def leave(self):
        """A feed stops: with fewer than two left, nothing is kept any more."""
        self.feeds -= 1
        if self.feeds < 2:
            if self._clear_call is not None:
                self._clear_call.cancel()
            self._clear()

    def get(self, key):
        """Return what L{put} kept under C{key} this turn, or None."""
        return self._frames.get(key)

    def put(self, key, entry):
        """Keep C{entry} under C{key} until the next turn."""
        self._frames[key] = entry
        if self._clear_call is None:
            self._clear_call = call_soon(self._reactor, self._clear)

    def _clear(self):
        self._clear_call = None
        self._frames.clear()


@implementer(IPushProducer)
class ReplicaFeed:
    """Streams the commit log after an eventId to one slave.

    @ivar sent: records sent so far.
    @ivar last_event_id: the eventId of the last record sent (the slave's lag in eventIds
        is the log's last eventId minus this; see L{mqserver.broker.stats}).
    @ivar peer: the slave's address.
    """

    log = Logger()

    def __init__(self, proto, reader, after_event_id=0, confirms=False, shared=None):
        """
        @param shared: the L{SharedFrames} of the door's feeds, or None (this feed reads
            and encodes everything itself).
        """
        self._proto = proto
        self._shared = shared
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
        if self._shared is not None:
            self._shared.join()
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
                self._send_commit_now()
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
        self._pump_reads()
        # the commit point that moved in this turn, when no records went out with it
        self._send_commit_now()

    def _send(self, data):
        # The commit point that moved in this turn goes in front of the records: one
        # send to the follower where there were two (a leader answering writes as
        # followers confirm them moves it nearly every turn).
        commit = self._commit_frame()
        self._proto.write_through(commit + data if commit else data)
        self._alive.wrote()

    def _pump_reads(self):
        for _ in range(_READS_PER_TURN):
            if not self._active or self._paused:
                return
            reader = self._reader
            shared = self._shared
            if shared is not None and (self._write or shared.feeds < 2):
                shared = None
            if shared is not None:
                key = (reader.offset, self.confirms)
                made = shared.get(key)
                if made is not None:
                    data, reader.offset, n, self.last_event_id = made
                    shared.reused += 1
                    self.sent += n
                    if data:
                        self._send(data)
                    continue
            # a write split over two reads waits for its end in the Python path
            made, views = reader.read_encoded(None if self._write else plain_frames)
            if made is not None:
                data, _, n, self.last_event_id = made
            elif not views:
                return
            else:
                frames = []
                for block in self._blocks(views):
                    frames.append(wire.REPLICA_FRAME_HEADER_STRUCT.pack(wire.STATUS_OK, len(block)))
                    frames.append(block)
                n = len(views)
                # the last eventId sent (a write still open waits in _write, unsent)
                self.last_event_id = self._write[0].event_id - 1 if self._write else views[-1].event_id
                data = b"".join(frames)
            self.sent += n
            if shared is not None and not self._write:
                shared.put(key, (data, reader.offset, n, self.last_event_id))
            if data:
                self._send(data)
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
        if self._pump_call is None:  # else records go out this turn: it goes with them
            self._send_commit_now()

    def _send_commit_now(self):
        if self._active:
            frame = self._commit_frame()
            if frame:
                self._proto.write_through(frame)

    def _commit_frame(self):
        # The frame of the commit point when it moved since the last one sent, else b"".
        if self._gate is None:
            return b""
        point = self._gate.committed_event_id
        if point == self._commit_sent:
            return b""
        self._commit_sent = point
        return codec.replica_frame(commit_block(point, self._proto.broker.now_ms()))

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
        if self._active and self._shared is not None:
            self._shared.leave()
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
