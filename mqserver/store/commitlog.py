"""The commit log: append-only segment files named by their 20-digit start offset.

Segment ``n`` covers commit-log offsets ``[n * segment_size, (n + 1) * segment_size)``.
A record never spans two segments: when one does not fit, the writer puts an 8-byte BLANK
marker at the end of the current segment and starts the next one. Files are not
preallocated, so a sealed segment ends right after its BLANK marker.

Reads use ``os.pread`` (not mmap) so that reading a large backlog costs page cache, not
process RSS. All methods run on the reactor thread except L{CommitLog.sync}, which the
flusher calls from its own thread.
"""

import os
import threading

from mqserver.store.fileio import FileIO
from mqserver.store.format import BLANK, BLANK_MAGIC, BLANK_SIZE, segment_name

_MAX_OPEN = 64


class CommitLog:
    """The segment files of one commit log directory.

    @ivar segment_size: bytes per segment.
    @ivar end: the offset just after the last written byte.
    @ivar min_offset: the start of the oldest retained segment.
    @ivar open_end: where the segment written last ends (its start plus
        L{segment_size}) while it is open, else 0: records that end below it, written
        at L{end}, may go to L{append_open}.
    """

    def __init__(self, directory, segment_size, io=None):
        self.directory = directory
        self.segment_size = segment_size
        self._pwrite = (io or FileIO()).pwrite
        os.makedirs(directory, exist_ok=True)
        self._fds = {}  # segment start -> fd, most recently used last
        self._lock = threading.Lock()  # guards _fds against the flusher thread
        self._unsynced = set()
        self._cur = None  # (segment start, fd) of the segment being written
        self.open_end = 0  # follows _cur (_set_cur)
        starts = sorted(
            int(n) for n in os.listdir(directory) if len(n) == 20 and n.isdigit()
        )
        self.segments = starts
        if starts:
            last = starts[-1]
            self.end = last + os.path.getsize(self._path(last))
            self.min_offset = starts[0]
        else:
            self.end = 0
            self.min_offset = 0

    def _path(self, start):
        return os.path.join(self.directory, segment_name(start))

    def _fd(self, start, create=False):
        with self._lock:
            fd = self._fds.pop(start, None)
            if fd is None:
                flags = os.O_RDWR | (os.O_CREAT if create else 0)
                fd = os.open(self._path(start), flags, 0o644)
                if len(self._fds) >= _MAX_OPEN:
                    current = self.segment_start(self.end)
                    for old in list(self._fds):
                        if old not in self._unsynced and old != current:
                            os.close(self._fds.pop(old))
                            break
            self._fds[start] = fd
            return fd

    def segment_start(self, offset):
        """Return the start of the segment holding C{offset}."""
        return offset - offset % self.segment_size

    def space_left(self):
        """Return the bytes still free in the current segment."""
        return self.segment_size - self.end % self.segment_size

    def roll(self):
        """Seal the current segment with a BLANK marker; the next write starts a new one."""
        left = self.space_left()
        if left == self.segment_size and self.end not in self.segments:
            return
        if left >= BLANK_SIZE:
            start = self.segment_start(self.end)
            self._pwrite(self._fd(start), BLANK.pack(left, BLANK_MAGIC), self.end - start)
            self._unsynced.add(start)
        self.end += left

    def append(self, data):
        """Write C{data} (whole records that fit in the current segment) at L{end}.

        Returns the offset it was written at. On an I/O error the segment is cut back to
        where it was, and the error is raised: nothing of a failed write stays.
        """
        offset = self.end
        cur = self._cur
        if cur is None or not 0 <= offset - cur[0] < self.segment_size:
            self._open_for(offset, len(data))  # the segment of offset is now the open one
        self.append_open(data)
        return offset

    def _open_for(self, offset, size):
        # Open the segment a write of size bytes at offset goes to, when it is not the
        # one written last.
        start = self.segment_start(offset)
        if offset - start + size > self.segment_size:
            raise ValueError("records do not fit in the current segment")
        if start not in self.segments:
            self.segments.append(start)
        self._set_cur(start, self._fd(start, create=True))

    def _set_cur(self, start, fd):
        # The segment being written, or none (start None); open_end follows it.
        if start is None:
            self._cur = None
            self.open_end = 0
        else:
            self._cur = (start, fd)
            self.open_end = start + self.segment_size

    def append_open(self, data):
        """Write C{data}, whole records that end at or before L{open_end}, at L{end}, in
        the segment written last (L{append} once it opened the segment, and
        L{mqserver.store.writer.Writer} for one message it packed to fit there). On an I/O
        error the segment is cut back to where it was, and the error is raised: nothing
        of a failed write stays.

        @raise ValueError: they do not fit (nothing is written).
        """
        offset = self.end
        size = len(data)
        # end is never below the open segment's start (_drop forgets the segment
        # first), so a write that ends at or before open_end is inside it.
        if offset + size > self.open_end:
            raise ValueError("records do not fit in the current segment")
        start, fd = self._cur
        try:
            written = self._pwrite(fd, data, offset - start)
            if written != size:
                self._write_rest(self._pwrite, fd, data, written, offset - start)
        except OSError:
            try:
                os.ftruncate(fd, offset - start)
            except OSError:
                pass
            raise
        self._unsynced.add(start)
        self.end = offset + size

    @staticmethod
    def _write_rest(pwrite, fd, data, written, pos):
        # pwrite wrote only part: write the rest (a disk nearly full, a signal).
        view = memoryview(data)[written:]
        pos += written
        while view:
            n = pwrite(fd, view, pos)
            view = view[n:]
            pos += n

    def patch(self, offset, data):
        """Overwrite C{data} at C{offset} inside what is written (recovery only)."""
        start = self.segment_start(offset)
        self._pwrite(self._fd(start), data, offset - start)
        self._unsynced.add(start)

    def read(self, offset, size):
        """Return C{size} bytes at C{offset} (within one segment), as bytes."""
        start = self.segment_start(offset)
        return os.pread(self._fd(start), size, offset - start)

    def read_segment(self, start, pos=0):
        """Return the bytes of the segment at C{start}, from C{pos} to its end."""
        with open(self._path(start), "rb") as f:
            f.seek(pos)
            return f.read()

    def truncate(self, offset):
        """Cut the log back so that it ends at C{offset}, deleting later segments."""
        for start in [s for s in self.segments if s >= offset]:
            self._drop(start)
        start = self.segment_start(offset)
        if start in self.segments:
            os.truncate(self._path(start), offset - start)
        self.end = offset

    def _drop(self, start):
        self._set_cur(None, None)
        with self._lock:
            fd = self._fds.pop(start, None)
            if fd is not None:
                os.close(fd)
            self._unsynced.discard(start)
        if start in self.segments:
            self.segments.remove(start)
        try:
            os.unlink(self._path(start))
        except FileNotFoundError:
            pass

    def delete_segment(self, start):
        """Delete a whole sealed segment (retention). Never the current one."""
        if start == self.segment_start(self.end) or start not in self.segments:
            return False
        self._drop(start)
        self.min_offset = self.segments[0] if self.segments else self.end
        return True

    def segment_mtime(self, start):
        """Return the modification time of the segment at C{start}."""
        return os.path.getmtime(self._path(start))

    def mark_all_unsynced(self):
        """Mark every open segment as needing an fsync (one failed: the next fsync must
        cover what it covered)."""
        with self._lock:
            self._unsynced.update(self._fds)

    def take_unsynced(self):
        """Return duplicated fds that need an fsync (the caller closes them), and forget
        them (reactor thread)."""
        with self._lock:
            starts = list(self._unsynced)
            self._unsynced.clear()
            # dup: the reactor may close its fd (LRU) while the flusher still syncs
            return [os.dup(self._fds[s]) for s in starts if s in self._fds]

    def close(self):
        """Close every open file."""
        self._set_cur(None, None)
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
