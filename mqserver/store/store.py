"""The message store: one commit log, consume queues, checkpoints and recovery.

Every write is a record with a global, dense, increasing eventId. Message records are
indexed into the consume queue of their (topic, queue id); admin records (topic create
and delete, delays) are handed to a state machine (the broker's topic registry and delay
index) both when they are written and when they are replayed at start-up.

A checkpoint (``metadata.json``, written atomically once a second when anything changed)
holds the state machine's snapshot, the commit-log offset it is current to, and each
queue's length. Recovery loads it and replays the log from that offset; a missing or
damaged checkpoint, or a consume queue shorter than the checkpoint says, replays the
whole retained log.

L{MessageStore} is the facade the rest of the code uses; the work is done by its parts,
one module each: L{Writer} (writer.py), L{Reader} (reader.py), L{QueueTable}
(queues.py), L{Notifier} (notify.py), L{DiskGuard} (disk.py), L{Checkpoints}
(checkpoint.py), L{Recovery} (recovery.py) and L{Retention} (retention.py).
"""

import os
import time

from twisted.internet import defer

from mqserver.errors import StoreError
from mqserver.store import format as fmt
from mqserver.store.checkpoint import Checkpoints
from mqserver.store.commitlog import CommitLog
from mqserver.store.disk import DiskGuard
from mqserver.store.fileio import from_environment
from mqserver.store.flush import (
    Flusher, SyncRunner, fsync_fds, fsync_paths, read_json, write_json_atomic)
from mqserver.store.logs import store_logger
from mqserver.store.lock import DirectoryLock
from mqserver.store.message import Message, NullState, PutResult
from mqserver.store.notify import Notifier
from mqserver.store.queues import MAX_DIR_NAME, QueueTable, safe_dir_name
from mqserver.store.reader import Reader
from mqserver.store.recovery import Recovery
from mqserver.store.retention import Retention
from mqserver.store.writer import Writer

__all__ = ["MAX_DIR_NAME", "Message", "MessageStore", "NullState", "PutResult",
           "StoreError", "safe_dir_name"]


#: The truncation a follower asked for (see L{MessageStore.request_truncation}).
TRUNCATION_FILE = "truncate.json"


class MessageStore:
    """The storage engine. Runs on the reactor thread; the group commit's fsyncs run on
    the runner's thread, and the housekeeping's (checkpoints, state files, removing a
    deleted topic's files) on the housekeeping runner's, so a commit never waits for them.

    Owns the life cycle (the directory lock, opening the files, closing them) and hands
    everything else to its parts. C{put} (every message write), C{put_messages} (the
    same, as a Deferred), C{read_entries} and C{read_records}, the per-message paths,
    are the parts' own bound methods (no facade call on them).

    @ivar writer: the L{Writer} (appending, eventIds).
    @ivar reader: the L{Reader} (reading and checking records).
    @ivar queue_table: the L{QueueTable} (the consume queues; open from L{open}).
    @ivar notifier: the L{Notifier} (visibility, listeners).
    @ivar disk: the L{DiskGuard} (refused writes, disk troubles).
    @ivar checkpoints: the L{Checkpoints} (metadata.json).
    @ivar state: the state machine admin records go to (the broker sets itself).
    """

    def __init__(
        self,
        path,
        reactor,
        *,
        segment_size=1 << 30,
        cq_entries_per_file=300_000,
        flush_level=1,
        runner=None,
        housekeeping=None,
        store_host=fmt.NO_HOST,
        max_message_size=4 * 1024 * 1024,
        fsync=None,
        clock=time.time,
        io=None,
        disk_max_used_ratio=0.90,
    ):
        self.path = path
        self._reactor = reactor
        self._log = store_logger(self)
        self.segment_size = segment_size
        self.cq_entries = cq_entries_per_file
        self.flush_level = flush_level
        self.runner = runner or SyncRunner()
        #: runs the housekeeping's disk work (L{runner} runs only the group commit's)
        self.housekeeping = housekeeping or SyncRunner()
        self.io = io or from_environment()
        self._fsync = fsync or (lambda fds: fsync_fds(fds, self.io.fsync))
        self.state = NullState()
        self.opened = False
        self._lock = DirectoryLock(path)
        self.commitlog = self.queue_table = self.flusher = None
        self.disk = DiskGuard(self, path, flush_level, disk_max_used_ratio)
        self.notifier = Notifier(flush_level)
        self.checkpoints = Checkpoints(self, path)
        self.writer = Writer(self, self.disk, self.notifier, self.checkpoints,
                             store_host=store_host, max_message_size=max_message_size,
                             clock=clock)
        self.reader = Reader(self.notifier)
        self._retention = Retention(self, clock)
        # The per-message paths go straight to their part (one call, not two).
        self.put = self.writer.put
        self.put_messages = self.writer.put_messages
        self.read_entries = self.reader.read_entries
        self.read_records = self.reader.read_records

    # -- life cycle ----------------------------------------------------------------------

    def open(self):
        """Open the files and recover (synchronously, before any listener starts)."""
        os.makedirs(self.path, exist_ok=True)
        # Before anything else in the directory: a refused broker must change nothing.
        self._lock.acquire()
        self.queue_table = QueueTable(os.path.join(self.path, "consumequeue"),
                                      self.cq_entries, self.housekeeping, self.io.pwrite,
                                      self.mark_dirty)
        self.commitlog = CommitLog(os.path.join(self.path, "commitlog"), self.segment_size,
                                   self.io)
        self.writer.open(self.commitlog, self.queue_table)
        self.reader.open(self.commitlog, self.queue_table)
        truncation = self._begin_truncation()
        Recovery(self, None if truncation is None else truncation["afterEventId"]).run()
        for q in self.queue_table.queues.values():  # what recovery replayed is not new input
            q.in_base = q.max_offset
        self.flusher = Flusher(self.commitlog, self.runner, self._durable, self._fsync,
                               self.disk.error)
        self.notifier.open(self.commitlog, self.flusher)
        self.runner.start()
        self.housekeeping.start()
        self.opened = True
        if truncation is not None:
            self._end_truncation(truncation)
        self.disk.open()
        self.check_disk()  # a start on a disk over the ratio refuses writes at once

    def hide_after(self, offset, writes):
        """Show readers only the log below C{offset} until the sync gate confirms the
        C{writes} after it (see L{Notifier.hide_after})."""
        self.notifier.hide_after(offset, writes)

    def follow_commits(self, event_id):
        """Show readers only what the master followed committed, up to C{event_id} now
        (see L{Notifier.follow_commits})."""
        self.notifier.follow_commits(event_id)

    def stop_following_commits(self):
        """Show readers every write once durable here (see
        L{Notifier.stop_following_commits})."""
        self.notifier.stop_following_commits()

    @property
    def commit_point(self):
        """The master's commit point this follower shows readers up to, or None."""
        return self.notifier.commit_point

    # -- truncation ----------------------------------------------------------------------
    # A follower whose log goes on past where its new master's parts from it asks for its
    # tail to be cut (request_truncation): the cut is done at the next open, before
    # recovery, which rebuilds everything derived from the log. The request stays on disk
    # until the cut log and a checkpoint after it are durable, so a crash anywhere in
    # between only means that the next open does it again.

    def request_truncation(self, after_event_id, offset):
        """Have the next L{open} cut the log at C{offset}, after the record (and write) of
        eventId C{after_event_id} (synchronously, durable when this returns)."""
        write_json_atomic(os.path.join(self.path, TRUNCATION_FILE),
                          {"afterEventId": after_event_id, "offset": offset})

    def pending_truncation(self):
        """Return the truncation L{request_truncation} asked for, or None."""
        return read_json(os.path.join(self.path, TRUNCATION_FILE))

    def _begin_truncation(self):
        request = self.pending_truncation()
        if request is None:
            return None
        offset = max(request["offset"], self.commitlog.min_offset)
        if offset < self.commitlog.end:
            self._log.warn(
                "truncating the commit log after eventId {eid}: cutting {size} bytes at"
                " offset {offset} (records no master confirmed, or of a term the master"
                " does not have)", eid=request["afterEventId"],
                size=self.commitlog.end - offset, offset=offset)
            self.commitlog.truncate(offset)
        return request

    def _end_truncation(self, request):
        # the cut segment and a checkpoint of what recovery rebuilt, durable first
        self.commitlog.mark_all_unsynced()
        self.checkpoints.write(self.checkpoints.capture(), set(self.queue_table.fds.dirty),
                               self.commitlog.take_unsynced())
        os.remove(os.path.join(self.path, TRUNCATION_FILE))
        fsync_paths([self.path])  # the request gone for good: never cut again
        self._log.info("commit log truncated after eventId {eid}; next eventId {next}",
                       eid=request["afterEventId"], next=self.next_event_id)

    def close(self):
        """Flush everything and write a final checkpoint (synchronously)."""
        if not self.opened:
            return
        self.opened = False
        self.disk.close()
        # Let a checkpoint or flush already queued on the disk threads finish first: run
        # after the final checkpoint, an older snapshot would replace it.
        self.stop_threads()
        fsync_fds(self.commitlog.take_unsynced())
        # a checkpoint waiting for the group commit when the threads stopped never runs
        self.checkpoints.write(self.checkpoints.capture(), self.checkpoints.unwritten_paths())
        self.queue_table.close()
        self.commitlog.close()
        self._lock.release()

    def stop_threads(self):
        """Stop the disk threads once the work already queued on them is done."""
        self.housekeeping.stop()
        self.runner.stop()

    def _durable(self, offset):
        self.disk.fsync_worked()
        self.notifier.durable(offset)

    # -- what the parts own, read where it always was --------------------------------------

    @property
    def next_event_id(self):
        """The eventId the next record gets."""
        return self.writer.next_event_id

    @property
    def store_host(self):
        """The STOREHOST written in records (a door sets it once it knows its address)."""
        return self.writer.store_host

    @store_host.setter
    def store_host(self, value):
        self.writer.store_host = value

    @property
    def max_message_size(self):
        """The largest body a write takes."""
        return self.writer.max_message_size

    @property
    def write_latency(self):
        """A L{mqserver.store.latency.Latency} of writes, sampled: one write in 64."""
        return self.writer.write_latency

    @property
    def replicable_end(self):
        """Commit-log offset below which records may be sent to followers."""
        return self.notifier.replicable_end

    @property
    def visible_end(self):
        """Commit-log offset below which readers may read (see L{Notifier})."""
        return self.notifier.visible_end

    @property
    def trusted_from(self):
        """Reads check body CRCs of records below this offset (see L{Reader})."""
        return self.reader.trusted_from

    @property
    def damaged_offsets(self):
        """Commit-log offsets of the damaged records reported so far."""
        return self.reader.damaged_offsets

    @property
    def damaged_records(self):
        """Damaged records found since start (recovery and reads; each counted once)."""
        return self.reader.damaged_records

    @property
    def last_checkpoint_offset(self):
        """The commit-log offset the last checkpoint is current to."""
        return self.checkpoints.last_checkpoint_offset

    @property
    def disk_trouble(self):
        """None, or what is wrong with the disk (see L{DiskGuard})."""
        return self.disk.disk_trouble

    @property
    def disk_full_events(self):
        """Disk troubles since start."""
        return self.disk.disk_full_events

    @property
    def disk_errors(self):
        """Writes and fsyncs that failed since start."""
        return self.disk.disk_errors

    @property
    def disk_max_used_ratio(self):
        """The usage ratio of the disk over which writes are refused."""
        return self.disk.max_used_ratio

    # -- queues --------------------------------------------------------------------------

    def queue(self, topic, queue_id):
        """Return the L{ConsumeQueue} of (topic, queue id), opening it when needed.

        @raise StoreError: C{topic} cannot be a directory name (see L{safe_dir_name}).
        """
        return self.queue_table.queue(topic, queue_id)

    def open_queues(self):
        """Return [((topic, queue id), L{ConsumeQueue}), ...] of every open queue."""
        return list(self.queue_table.queues.items())

    def find_queue(self, topic, queue_id):
        """Return the open L{ConsumeQueue} of (topic, queue id), or None (never creates one)."""
        return self.queue_table.queues.get((topic, queue_id))

    def queues_of(self, topic):
        """Return the open queue ids of C{topic} that have a directory on disk."""
        return self.queue_table.queues_of(topic)

    def drop_topic(self, topic):
        """Remove the consume queues of C{topic} (it was deleted); Deferred."""
        self.writer.last_record = None  # a queue made again starts at offset 0
        return self.queue_table.drop_topic(topic)

    def newest_record(self, topic, queue_id, qoffset):
        """What a reader of (C{topic}, C{queue_id}) at C{qoffset} finds, when the last
        append wrote one message of that queue (a consumer keeping up with a publisher):
        the bytes of that record when C{qoffset} is its offset and it is visible to
        readers, b"" when C{qoffset} is just past it (the queue holds nothing more), else
        None (read the queue). Saves reading back the record just written, and looking
        for the next one."""
        last = self.writer.last_record
        if last is None or last[1] != queue_id or last[0] != topic:
            return None
        at = last[2]
        if at == qoffset:
            if last[3] + len(last[4]) <= self.notifier.visible_end:
                return last[4]
            return None
        return b"" if at == qoffset - 1 else None

    def flush_queues(self):
        """Write every consume queue's buffered entries to its files."""
        self.queue_table.flush()

    # -- writing -------------------------------------------------------------------------

    def put_admin(self, op, topic, body, now_ms=None, event_id=None):
        """Append one admin record (see L{Writer.put_admin}); Deferred of a L{PutResult}."""
        return self.writer.put_admin(op, topic, body, now_ms, event_id)

    def sync(self):
        """fsync what is written (flush level 1 calls this once a second)."""
        return self.flusher.sync()

    def durable_now(self):
        """Return a Deferred firing once everything written so far is as durable as the
        flush level asks (at once below level 2)."""
        if self.flush_level < 2:
            return defer.succeed(None)
        return self.flusher.request(self.commitlog.end)

    def set_sync_gate(self, gate):
        """Acknowledge every later write only once C{gate}
        (L{mqserver.replication.sync.SyncGate}) says enough followers hold it, and show
        it to consumers only then (L{Notifier.set_gate})."""
        self.notifier.set_gate(gate)

    # -- the disk ------------------------------------------------------------------------

    def disk_used_ratio(self):
        """Return the used share of the data directory's file system, as df shows it."""
        return self.disk.used_ratio()

    def check_disk(self):
        """Refuse writes while the disk is fuller than L{disk_max_used_ratio}, accept
        them again below it, and notice the end of a disk trouble (the service calls it
        once a second, with the checkpoint)."""
        if self.opened:
            self.disk.check()

    # -- listeners -----------------------------------------------------------------------

    def add_arrival_listener(self, callback):
        """Call C{callback(topic, queue_id)} whenever new messages become readable."""
        self.notifier.add_arrival_listener(callback)

    def add_append_listener(self, callback):
        """Call C{callback()} whenever any record (message or admin) becomes readable."""
        self.notifier.add_append_listener(callback)

    def remove_append_listener(self, callback):
        """Stop calling C{callback}."""
        self.notifier.remove_append_listener(callback)

    def add_dispatch_listener(self, callback, topics=None):
        """Call C{callback(offset, topic, properties, store_ts)} for every message record
        with properties (C{topics} None) or of C{topics}, written or replayed (see
        L{Notifier.add_dispatch_listener})."""
        self.notifier.add_dispatch_listener(callback, topics)

    # -- reading -------------------------------------------------------------------------

    def report_damage(self, offset, detail, event_id=None):
        """Log and count a damaged record once (see L{Reader.report_damage})."""
        return self.reader.report_damage(offset, detail, event_id)

    def read_record(self, offset, size):
        """Return the decoded record at C{offset} as a L{fmt.RecordView}."""
        return self.reader.read_record(offset, size)

    def damaged(self, buf, offset):
        """Return True (and report it) when the message record in C{buf} (read from
        commit-log C{offset}) fails its framing or body CRC check."""
        return self.reader.damaged(buf, offset)

    def read_sound_record(self, offset, size):
        """Return the message record at C{offset}, or None when it is damaged."""
        return self.reader.read_sound_record(offset, size)

    def event_id_at(self, offset):
        """Return the eventId of the record at commit-log C{offset}."""
        return self.reader.event_id_at(offset)

    def find_event(self, topic, queue_id, event_id):
        """Return C{(qoffset, exact)} of C{event_id} in (topic, queue) (see
        L{Reader.find_event})."""
        return self.reader.find_event(topic, queue_id, event_id)

    # -- checkpoints and retention -------------------------------------------------------

    def checkpoint(self):
        """Write a checkpoint on the disk thread if anything changed since the last one.

        Returns a Deferred. At most one runs at a time."""
        return self.checkpoints.checkpoint()

    def mark_dirty(self):
        """Ask for a checkpoint at the next tick (the state machine changed)."""
        self.checkpoints.dirty = True

    def clean(self, max_age_s, min_reader_offset=None):
        """Delete what retention no longer keeps (see L{Retention.clean}); returns the
        number of segments deleted."""
        return self._retention.clean(max_age_s, min_reader_offset)
