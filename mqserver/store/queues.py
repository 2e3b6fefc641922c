"""The consume queues of a store, by (topic, queue id), under ``consumequeue/``."""

import os
import shutil
import tempfile

from twisted.internet import defer

from mqserver.errors import StoreError
from mqserver.store.consumequeue import ConsumeQueue, FdCache

#: The longest file name the usual file systems take (NAME_MAX), in bytes.
MAX_DIR_NAME = 255


def safe_dir_name(name):
    """True when C{name} (str) can be one directory name under C{consumequeue/}: 1..255
    UTF-8 bytes, no C{/}, C{\\} or NUL, and no leading dot (so not C{.}, C{..} nor
    C{.trash})."""
    if not name or name[0] == "." or "/" in name or "\\" in name or "\0" in name:
        return False
    try:
        return len(name.encode("utf-8")) <= MAX_DIR_NAME
    except UnicodeEncodeError:  # lone surrogates
        return False


class QueueTable:
    """Owns the open L{ConsumeQueue}s, their shared file descriptors, which of them hold
    buffered entries, and the directories of dropped topics (``consumequeue/.trash``).

    @ivar queues: (topic, queue id) -> L{ConsumeQueue}; the writer holds this very dict.
    @ivar fds: the L{FdCache} of the queue files (its C{dirty} paths await an fsync).
    """

    def __init__(self, root, entries_per_file, runner, pwrite, on_change):
        """
        @param on_change: called with no argument when a topic's queues are dropped (the
            next checkpoint must record it).
        """
        self.root = root
        self.entries_per_file = entries_per_file
        self._runner = runner
        self._on_change = on_change
        self.queues = {}
        self._tails = set()  # consume queues holding buffered entries
        os.makedirs(root, exist_ok=True)
        trash = os.path.join(root, ".trash")
        if os.path.isdir(trash):
            shutil.rmtree(trash, ignore_errors=True)
        self.fds = FdCache(pwrite=pwrite)

    def close(self):
        """Close every queue file."""
        self.fds.close()

    def empty_trash(self):
        """Remove what dropped topics left in C{.trash} (synchronously)."""
        shutil.rmtree(os.path.join(self.root, ".trash"), ignore_errors=True)

    def _topic_dir(self, topic):
        """Return the consume-queue directory of C{topic}: the last line of defence
        behind each protocol's name rules and the broker's, so that no name ever
        leaves C{consumequeue/} or clashes with its C{.trash}."""
        if not safe_dir_name(topic):
            raise StoreError(f"unsafe topic name {topic!r}")
        return os.path.join(self.root, topic)

    def queue(self, topic, queue_id):
        """Return the L{ConsumeQueue} of (topic, queue id), opening it when needed.

        @raise StoreError: C{topic} cannot be a directory name (see L{safe_dir_name}).
        """
        key = (topic, queue_id)
        q = self.queues.get(key)
        if q is None:
            directory = os.path.join(self._topic_dir(topic), str(int(queue_id)))
            q = self.queues[key] = ConsumeQueue(
                directory, self.entries_per_file, self.fds, self._tails.add
            )
        return q

    def queues_of(self, topic):
        """Return the open queue ids of C{topic} that have a directory on disk."""
        try:
            d = self._topic_dir(topic)
        except StoreError:
            return []
        try:
            return sorted(int(n) for n in os.listdir(d) if n.isdigit())
        except FileNotFoundError:
            return []

    def drop_topic(self, topic):
        """Remove the consume queues of C{topic} (it was deleted). The directory is moved
        aside at once, so a topic of the same name can start afresh, and removed later."""
        for key in [k for k in self.queues if k[0] == topic]:
            self._tails.discard(self.queues.pop(key))
        if not safe_dir_name(topic):
            return defer.succeed(None)  # it never had a directory (see queue)
        d = self._topic_dir(topic)
        self.fds.forget_under(d)
        if os.path.isdir(d):
            trash = os.path.join(self.root, ".trash")
            os.makedirs(trash, exist_ok=True)
            # A fresh short name: "<topic>.<eventId>" outgrows NAME_MAX for long names.
            dest = os.path.join(tempfile.mkdtemp(dir=trash), "q")
            os.rename(d, dest)
            self._on_change()
            return self._runner.run(shutil.rmtree, dest, True)
        return defer.succeed(None)

    def flush(self):
        """Write every consume queue's buffered entries to its files."""
        # Cleared in place: every queue holds this set's bound add() as its callback.
        tails = list(self._tails)
        self._tails.clear()
        for i, q in enumerate(tails):
            try:
                q.flush()
            except OSError:
                self._tails.update(tails[i:])  # still buffered: flushed next time
                raise

    def lengths(self):
        """Return {topic: {str(queue id): length}} of every open queue (a checkpoint's
        C{queues})."""
        queues = {}
        for (topic, qid), q in self.queues.items():
            queues.setdefault(topic, {})[str(qid)] = q.max_offset
        return queues

    def take_dirty_paths(self):
        """Return the queue files written since the last call (to fsync), forgetting them."""
        paths = set(self.fds.dirty)
        self.fds.dirty.clear()
        return paths

    def restore_dirty_paths(self, paths):
        """Mark C{paths} unsynced again (their fsync failed)."""
        self.fds.dirty |= paths

    def delete_files_below(self, log_offset):
        """Delete every queue's files whose entries all point below C{log_offset}."""
        for q in self.queues.values():
            q.delete_files_below(log_offset)

    def truncate_past(self, log_end):
        """Drop entries that point past C{log_end} (a power loss can leave consume queues
        ahead of the log)."""
        for q in list(self.queues.values()):
            while q.max_offset > q.min_offset:
                off, size, _ = q.entry(q.max_offset - 1)
                if off + size <= log_end:
                    break
                q.truncate(q.max_offset - 1)
