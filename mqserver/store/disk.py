"""The store's disk watch: whether writes are refused, and the troubles of the disk."""

import errno
import os

from mqserver.errors import DiskFullError, StoreError
from mqserver.store.logs import store_logger


class DiskGuard:
    """Owns the refusal of writes (the store is closed, the disk is over its usage
    ratio, an fsync failed) and the record of disk troubles.

    @ivar refusal: why writes are refused (a L{StoreError}), or None: the one test the
        write path makes.
    @ivar disk_trouble: None, or what is wrong with the disk (a failed write or fsync,
        the usage ratio); logged once when it starts and once when it ends.
    @ivar disk_full_events: disk troubles (full, over the ratio, write or fsync errors)
        since start.
    @ivar disk_errors: writes and fsyncs that failed since start.
    """

    def __init__(self, store, path, flush_level, max_used_ratio):
        """
        @param store: the L{mqserver.store.store.MessageStore} (its commit log's end and
            flusher tell when a trouble is over).
        """
        self.log = store_logger(self)
        self._store = store
        self.path = path
        self.flush_level = flush_level
        self.max_used_ratio = max_used_ratio
        self.refusal = StoreError("store is closed")
        self.disk_trouble = None
        self._trouble_end = 0  # the log end when the trouble started
        self._fsync_refusal = False  # refusal is a failed fsync's (flush levels 0, 1)
        self.disk_full_events = 0
        self.disk_errors = 0

    def open(self):
        """Accept writes (the store opened)."""
        self.refusal = None

    def close(self):
        """Refuse writes from now on (the store is closing)."""
        self.refusal = StoreError("store is closed")

    def check_writable(self):
        """Raise the reason writes are refused, if they are.

        @raise StoreError: they are.
        """
        if self.refusal is not None:
            raise self.refusal

    def used_ratio(self):
        """Return the used share of the data directory's file system, as df shows it."""
        st = os.statvfs(self.path)
        used = st.f_blocks - st.f_bfree
        total = used + st.f_bavail
        return used / total if total else 0.0

    def check(self):
        """Refuse writes while the disk is fuller than the ratio, accept them again below
        it, and notice the end of a disk trouble."""
        try:
            ratio = self.used_ratio()
        except OSError as e:
            self.log.warn("cannot read the disk usage of {path}: {e}", path=self.path, e=e)
            return
        limit = self.max_used_ratio
        if ratio > limit:
            if self.refusal is None:
                self.refusal = DiskFullError(
                    f"disk full: {ratio:.0%} of the disk of {self.path} is used, over"
                    f" store.diskMaxUsedRatio {limit:.0%}")
                self.disk_full_events += 1
                self.log.error("{what}: publishes are refused until it is back under (reads"
                               " go on)", what=self.refusal)
        elif isinstance(self.refusal, DiskFullError):
            self.refusal = None
            self.log.warn("disk {ratio:.0%} used, under store.diskMaxUsedRatio {limit:.0%}:"
                          " publishes are accepted again", ratio=ratio, limit=limit)
        store = self._store
        if (self.disk_trouble is not None and store.commitlog.end > self._trouble_end
                and store.flusher.failure is None):
            # A write landed since, and no fsync failed after it.
            self.log.warn("disk writes work again (after: {what}); {n} writes or fsyncs"
                          " failed so far", what=self.disk_trouble, n=self.disk_errors)
            self.disk_trouble = None

    def _trouble(self, what):
        if self.disk_trouble is None:
            self.disk_trouble = what
            self._trouble_end = self._store.commitlog.end
            self.disk_full_events += 1
            self.log.error("disk trouble: {what}; publishes fail until writes work again"
                           " (reads go on)", what=what)
        else:
            self._trouble_end = self._store.commitlog.end

    def error(self, op, error):
        """Count and log (once per trouble) the failure of C{op} ("write", "fsync", ...)."""
        # Below flush level 2 a publish is acknowledged before its fsync, so after a
        # failed one publishes are refused until an fsync succeeds again (the
        # once-a-second flush retries).
        self.disk_errors += 1
        self._trouble(f"{op} failed: {error}")
        if op == "fsync" and self.flush_level < 2 and self.refusal is None:
            self.refusal = StoreError(f"fsync failed: {error}")
            self._fsync_refusal = True

    def failed(self, op, error):
        """Count and log (L{error}) the failure of C{op} with OSError C{error}, and
        return the L{StoreError} to answer the request with: a L{DiskFullError} when the
        disk or quota is full."""
        self.error(op, error)
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            return DiskFullError(f"disk full: {error.strerror}")
        return StoreError(f"{op} failed: {error.strerror or error}")

    def fsync_worked(self):
        """An fsync succeeded: lift the refusal a failed one caused."""
        if self._fsync_refusal:
            self._fsync_refusal = False
            self.refusal = None
