"""Consume queues: entries of C{CQ_ENTRY_SIZE} bytes (commit-log offset, size, tag hash;
C{format.CQ_ENTRY_SCHEMA}) per (topic, queue).

They are derived data: the commit log is the truth, and every message record carries its
own QueueOffset, so writing an entry is idempotent (entry ``q`` always lives at byte
``q * CQ_ENTRY_SIZE``). Recovery replays records into them, and a queue whose files are missing is
rebuilt from the log. Files live in ``consumequeue/<topic>/<queueId>/`` and are named by
the 20-digit byte offset of their first entry, as in RocketMQ.
"""

import os
from collections import OrderedDict

from mqserver.store.format import CQ_ENTRY, CQ_ENTRY_SIZE, segment_name


class FdCache:
    """A bounded LRU of open file descriptors keyed by path, shared by all queues.

    @ivar dirty: paths written since the last checkpoint, to fsync before it.
    @ivar pwrite: the write call queues use (the store's file I/O seam).
    """

    def __init__(self, limit=256, pwrite=os.pwrite):
        self._fds = OrderedDict()
        self._limit = limit
        self.dirty = set()
        self.pwrite = pwrite

    def get(self, path, create=False):
        """Return an fd for C{path}, opening (and maybe creating) it."""
        fd = self._fds.get(path)
        if fd is not None:
            self._fds.move_to_end(path)
            return fd
        fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
        self._fds[path] = fd
        if len(self._fds) > self._limit:
            _, old = self._fds.popitem(last=False)
            os.close(old)
        return fd

    def forget_under(self, directory):
        """Close every fd of a file below C{directory} (before deleting or moving it)."""
        prefix = directory.rstrip(os.sep) + os.sep
        for path in [p for p in self._fds if p.startswith(prefix)]:
            os.close(self._fds.pop(path))
        self.dirty = {p for p in self.dirty if not p.startswith(prefix)}

    def forget(self, path):
        """Close the fd of C{path} if it is open."""
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)
        self.dirty.discard(path)

    def close(self):
        """Close every fd."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


class ConsumeQueue:
    """The entries of one (topic, queue id).

    @ivar max_offset: the next queue offset to write (the number of entries ever written).
    @ivar min_offset: the first queue offset still on disk.
    @ivar in_base: L{max_offset} when the store opened (or made this queue): messages
        in since then are L{in_msgs}, which costs the publish path nothing.
    @ivar in_bytes: record bytes the store appended here since it opened (statistics).
    """

    #: Entries appended at the end wait in memory until this many are buffered (or the
    #: store flushes them for a checkpoint): one pwrite per 256 messages, not per message.
    TAIL_LIMIT = 256 * CQ_ENTRY_SIZE

    def __init__(self, directory, entries_per_file, fds, on_tail=None):
        self.directory = directory
        self.file_bytes = entries_per_file * CQ_ENTRY_SIZE
        self._fds = fds
        self._on_tail = on_tail
        self._tail = bytearray()
        self._paths = {}
        os.makedirs(directory, exist_ok=True)
        starts = sorted(int(n) for n in os.listdir(directory) if len(n) == 20 and n.isdigit())
        self.files = starts
        if starts:
            last = starts[-1]
            size = os.path.getsize(self._path(last))
            size -= size % CQ_ENTRY_SIZE
            self.max_offset = (last + size) // CQ_ENTRY_SIZE
            self.min_offset = starts[0] // CQ_ENTRY_SIZE
        else:
            self.max_offset = 0
            self.min_offset = 0
        self._tail_start = self.max_offset
        self.in_base = self.max_offset
        self.in_bytes = 0

    @property
    def in_msgs(self):
        """Messages the store appended here since it opened (statistics)."""
        return self.max_offset - self.in_base

    def _path(self, start):
        p = self._paths.get(start)
        if p is None:
            p = self._paths[start] = os.path.join(self.directory, segment_name(start))
        return p

    def write(self, qoffset, entries):
        """Write packed C{entries} (a multiple of C{CQ_ENTRY_SIZE} bytes) starting at entry C{qoffset}.

        Entries that extend the queue are buffered (see L{TAIL_LIMIT}); others, and the
        buffer when it is full, go to the files."""
        tail = self._tail
        # max_offset is always _tail_start plus the entries buffered
        if qoffset == self.max_offset:
            if not tail and self._on_tail is not None:
                self._on_tail(self)
            tail += entries
            self.max_offset = qoffset + len(entries) // CQ_ENTRY_SIZE
            if len(tail) >= self.TAIL_LIMIT:
                try:
                    self.flush()
                except OSError:
                    pass  # a full disk: the entries stay buffered; the checkpoint retries
            return
        self.flush()
        self._write_files(qoffset, entries)
        self._tail_start = self.max_offset

    def flush(self):
        """Write the buffered entries to the files."""
        if self._tail:
            # Written before the buffer is let go: a failed write (a full disk) keeps
            # every entry buffered for the next flush.
            self._write_files(self._tail_start, bytes(self._tail))
            self._tail = bytearray()
        self._tail_start = self.max_offset

    def _write_files(self, qoffset, entries):
        pos = qoffset * CQ_ENTRY_SIZE
        data = memoryview(entries)
        while data:
            start = pos - pos % self.file_bytes
            n = min(len(data), start + self.file_bytes - pos)
            if start not in self.files:
                self.files.append(start)
                self.files.sort()
                # A queue rebuilt from a log whose oldest segments retention removed
                # starts at a later file: nothing below it exists.
                self.min_offset = max(self.min_offset, self.files[0] // CQ_ENTRY_SIZE)
            path = self._path(start)
            self._fds.pwrite(self._fds.get(path, create=True), data[:n], pos - start)
            self._fds.dirty.add(path)
            data = data[n:]
            pos += n
        end = pos // CQ_ENTRY_SIZE
        if end > self.max_offset:
            self.max_offset = end

    def read(self, qoffset, count):
        """Return up to C{count} packed entries from C{qoffset}, within one file and
        the in-memory buffer after it: a read stops at the end of a file only when
        the buffer does not start there."""
        if qoffset < self.min_offset:
            qoffset = self.min_offset
        count = min(count, self.max_offset - qoffset)
        if count <= 0:
            return b""
        if qoffset >= self._tail_start:
            i = (qoffset - self._tail_start) * CQ_ENTRY_SIZE
            return bytes(self._tail[i : i + count * CQ_ENTRY_SIZE])
        in_files = min(count, self._tail_start - qoffset)
        pos = qoffset * CQ_ENTRY_SIZE
        start = pos - pos % self.file_bytes
        n = min(in_files * CQ_ENTRY_SIZE, start + self.file_bytes - pos)
        data = os.pread(self._fds.get(self._path(start)), n, pos - start)
        data = data[: len(data) - len(data) % CQ_ENTRY_SIZE]
        if count > in_files and len(data) == in_files * CQ_ENTRY_SIZE:
            # The files end where the buffer starts: go on into it, so that a reader
            # gets the entries written since the last flush with the ones before it
            # (a batch is not cut short where a flush happened to fall).
            data += self._tail[: (count - in_files) * CQ_ENTRY_SIZE]
        return data

    def entry(self, qoffset):
        """Return the entry C{(log_offset, size, tag_hash)} at C{qoffset}."""
        return CQ_ENTRY.unpack(self.read(qoffset, 1))

    def truncate(self, qoffset):
        """Drop every entry at or after C{qoffset}."""
        self.flush()
        pos = qoffset * CQ_ENTRY_SIZE
        for start in [s for s in self.files if s >= pos and not (s == 0 and pos == 0)]:
            self._fds.forget(self._path(start))
            os.unlink(self._path(start))
            self.files.remove(start)
        start = pos - pos % self.file_bytes
        if start in self.files:
            os.truncate(self._path(start), pos - start)
        self.max_offset = qoffset
        if self.min_offset > qoffset:
            self.min_offset = qoffset
        self._tail_start = qoffset

    def delete_files_below(self, log_min_offset):
        """Delete whole files whose every entry points below C{log_min_offset} (retention).
        The last file is always kept. Returns the number of files deleted."""
        deleted = 0
        while len(self.files) > 1:
            start = self.files[0]
            last_q = start // CQ_ENTRY_SIZE + self.file_bytes // CQ_ENTRY_SIZE - 1
            log_offset, size, _ = self.entry(last_q)
            if log_offset + size > log_min_offset:
                break
            self._fds.forget(self._path(start))
            os.unlink(self._path(start))
            self.files.pop(0)
            deleted += 1
        if self.files:
            self.min_offset = max(self.min_offset, self.files[0] // CQ_ENTRY_SIZE)
        return deleted
