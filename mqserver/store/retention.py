"""Retention: deleting what the store no longer keeps."""

from mqserver.store.logs import store_logger


class Retention:
    """Owns the deletion of old data: sealed commit-log segments past their age that no
    reader needs and no recovery would replay, then the queue files below the log."""

    def __init__(self, store, clock):
        """
        @param store: the L{mqserver.store.store.MessageStore} (its commit log, queues
            and last checkpoint).
        @param clock: returns the time in seconds (segment ages are measured with it).
        """
        self.log = store_logger(self)
        self._store = store
        self._clock = clock

    def clean(self, max_age_s, min_reader_offset=None):
        """Delete sealed segments older than C{max_age_s} seconds that no reader is in and
        that are below the last checkpoint, then the consume-queue files below the new
        minimum. Returns the number of segments deleted."""
        store = self._store
        log = store.commitlog
        now = self._clock()
        limit = store.checkpoints.last_checkpoint_offset
        if min_reader_offset is not None:
            limit = min(limit, min_reader_offset)
        deleted = 0
        for seg in list(log.segments[:-1]):
            if seg + log.segment_size > limit:
                break
            if now - log.segment_mtime(seg) < max_age_s:
                break
            if log.delete_segment(seg):
                deleted += 1
        if deleted:
            store.queue_table.delete_files_below(log.min_offset)
            self.log.info("retention deleted {n} segments; log starts at {min}", n=deleted, min=log.min_offset)
        return deleted
