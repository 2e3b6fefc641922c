"""The store's checkpoint, ``metadata.json``: what recovery can start from."""

import os

from twisted.internet import defer

from mqserver.errors import StoreError
from mqserver.store.flush import FlushError, fsync_fds, fsync_paths, read_json, write_json_atomic
from mqserver.store.logs import store_logger


class Checkpoints:
    """Owns the checkpoint file: whether one is due (L{dirty}), capturing the store's
    state and writing it on the disk thread (one at a time), and loading it at start.

    A checkpoint holds the state machine's snapshot, the commit-log offset it is current
    to, the next eventId and each queue's length.

    @ivar dirty: something changed since the last checkpoint.
    @ivar last_checkpoint_offset: the commit-log offset the last written checkpoint (or
        recovery) is current to; retention deletes nothing above it.
    """

    def __init__(self, store, path):
        """
        @param store: the L{mqserver.store.store.MessageStore} whose commit log, queues,
            eventIds and state machine are captured.
        """
        self.log = store_logger(self)
        self._store = store
        self.path = os.path.join(path, "metadata.json")
        self.dirty = False
        self._running = False
        self._in_flight = set()  # the queue files the running checkpoint fsyncs
        self.last_checkpoint_offset = 0

    def capture(self):
        """Return the checkpoint of the store as it is now (flushing the queues' buffered
        entries first)."""
        # The checkpoint promises that the queue files hold every entry below logOffset.
        store = self._store
        store.queue_table.flush()
        return {
            "version": 1,
            "logOffset": store.commitlog.end,
            "nextEventId": store.next_event_id,
            "queues": store.queue_table.lengths(),
            "state": store.state.snapshot_state(),
        }

    def write(self, snap, cq_paths, log_fds=()):
        """Write C{snap} after fsyncing C{log_fds} and the queue files C{cq_paths}
        (synchronously)."""
        fsync = self._store.io.fsync
        fsync_fds(list(log_fds), fsync)
        fsync_paths(cq_paths, fsync)
        write_json_atomic(self.path, snap, fsync)

    def checkpoint(self):
        """Write a checkpoint if anything changed since the last one: once the group
        commit has made the commit log durable up to the checkpoint's offset (at flush
        levels 1 and 2), the queue files and the checkpoint file are fsynced and written
        on the housekeeping thread, so a group commit never waits behind them.

        Returns a Deferred. At most one runs at a time."""
        store = self._store
        if self._running or not self.dirty or not store.opened:
            return defer.succeed(None)
        try:
            snap = self.capture()
        except OSError as e:
            store.disk.error("consume-queue write", e)
            return defer.succeed(None)
        self.dirty = False
        self._running = True
        paths = self._in_flight = store.queue_table.take_dirty_paths()

        def done(result):
            self._running = False
            self._in_flight = set()
            self.last_checkpoint_offset = snap["logOffset"]
            return result

        def failed(f):
            self._running = False
            self._in_flight = set()
            self.dirty = True
            store.queue_table.restore_dirty_paths(paths)
            if f.check(OSError):
                store.disk.error("checkpoint", f.value)
            elif not f.check(FlushError):  # the flusher reported its own failure
                self.log.failure("checkpoint failed", f)

        # The log's part is the group commit's (one fsync thread for the log, never
        # queued behind the files below); the checkpoint never claims more of the log
        # than is durable.
        if store.flush_level >= 1:
            d = store.flusher.request(snap["logOffset"])
        else:
            d = defer.succeed(None)

        def write(_):
            if not store.opened:  # closed meanwhile: close wrote the last checkpoint
                return None
            return store.housekeeping.run(self.write, snap, paths)

        d.addCallback(write)
        return d.addCallbacks(done, failed)

    def unwritten_paths(self):
        """Return the queue files a checkpoint still in flight was to fsync, and every
        one written since (what a final checkpoint must fsync)."""
        return set(self._in_flight) | set(self._store.queue_table.fds.dirty)

    def load(self):
        """Return the checkpoint, or None (a full rebuild from the log) when it is
        missing, unreadable, not JSON or not shaped like a checkpoint: everything in it
        (topics, pending delays, queue lengths) is also in the log.

        @raise StoreError: it is of an unknown version.
        """
        try:
            snap = read_json(self.path)
        except (OSError, ValueError) as e:
            self.log.warn(
                "checkpoint {path} is unreadable ({error}): rebuilding from the commit log",
                path=self.path, error=e,
            )
            return None
        if snap is None:
            return None
        if isinstance(snap, dict) and snap.get("version") not in (1, None):
            raise StoreError(f"unknown metadata version in {self.path}")
        if not _checkpoint_shaped(snap):
            self.log.warn(
                "checkpoint {path} is not a valid checkpoint: rebuilding from the commit log",
                path=self.path,
            )
            return None
        return snap


def _checkpoint_shaped(snap):
    """Return True when C{snap} has the fields and types of a version-1 checkpoint."""
    if not isinstance(snap, dict) or snap.get("version") != 1:
        return False
    if not all(type(snap.get(k)) is int and snap[k] >= 0 for k in ("logOffset", "nextEventId")):
        return False
    queues = snap.get("queues", {})
    if not isinstance(queues, dict) or not isinstance(snap.get("state", {}), dict):
        return False
    for qs in queues.values():
        if not isinstance(qs, dict):
            return False
        for qid, count in qs.items():
            if not (isinstance(qid, str) and qid.lstrip("-").isdigit() and type(count) is int):
                return False
    return True
