"""The file I/O the store's write path uses, behind one seam so tests can make it fail.

L{FileIO} is the operating system's calls. L{FaultyIO} (tests only) raises chosen
errors: unit tests switch its flags, and a real-process test names a control directory
in the environment variable C{MQSERVER_FAULT_INJECT}; while a file C{enospc} (or
C{eio}) exists there, every commit-log write fails with that error, and while
C{fsync-eio} exists every fsync fails with EIO; while C{fsync-slow} exists every fsync of
the store (commit log, consume queues, checkpoint, state files) takes as many
milliseconds longer as the file says (100 when it is empty): a slow disk. The state
files written through
L{FileIO.write_json} (consumer offsets, the RocketMQ door's C{topic.json} and
C{subscriptionGroup.json}) fail with ENOSPC while C{enospc} or C{json-enospc} exists: the second alone is a disk
that still takes commit-log writes (into a segment already allocated) but no new file. The variable is read once, when a store
is made (L{from_environment}); it is for tests and has no place in production.
"""

import errno
import os
import time

from twisted.logger import Logger

from mqserver.store.flush import write_json_atomic

#: The environment variable of the test-only fault injection (see the module docstring).
FAULT_ENV = "MQSERVER_FAULT_INJECT"


class FileIO:
    """The operating system's file calls the store writes and syncs through."""

    pwrite = staticmethod(os.pwrite)
    fsync = staticmethod(os.fsync)
    write_json = staticmethod(write_json_atomic)


class FaultyIO(FileIO):
    """File calls that fail on demand (tests only).

    @ivar write_error: an errno every pwrite fails with, or None.
    @ivar fsync_error: an errno every fsync fails with, or None.
    @ivar json_error: an errno every L{write_json} fails with, or None.
    @ivar fsync_delay: seconds every fsync waits before it starts (0: none).
    @ivar control: a directory whose files C{enospc}, C{eio}, C{fsync-eio} and
        C{json-enospc} set the errors while they exist, and C{fsync-slow} the delay (a
        real-process test), or None.
    """

    #: The delay of an empty C{fsync-slow} file, in milliseconds.
    SLOW_FSYNC_MS = 100

    def __init__(self, control=None):
        self.write_error = None
        self.fsync_error = None
        self.json_error = None
        self.fsync_delay = 0.0
        self.control = control

    def _error(self, which):
        if self.control is not None:
            for name, code, kind in (("enospc", errno.ENOSPC, "write"), ("eio", errno.EIO, "write"),
                                     ("fsync-eio", errno.EIO, "fsync"),
                                     ("enospc", errno.ENOSPC, "json"),
                                     ("json-enospc", errno.ENOSPC, "json")):
                if kind == which and os.path.exists(os.path.join(self.control, name)):
                    return code
        return {"write": self.write_error, "fsync": self.fsync_error, "json": self.json_error}[which]

    def pwrite(self, fd, data, pos):
        code = self._error("write")
        if code is not None:
            raise OSError(code, os.strerror(code))
        return os.pwrite(fd, data, pos)

    def _delay(self):
        if self.control is not None:
            try:
                with open(os.path.join(self.control, "fsync-slow")) as f:
                    text = f.read().strip()
                return int(text or self.SLOW_FSYNC_MS) / 1000.0
            except (FileNotFoundError, ValueError):
                pass
        return self.fsync_delay

    def fsync(self, fd):
        code = self._error("fsync")
        if code is not None:
            raise OSError(code, os.strerror(code))
        delay = self._delay()
        if delay > 0:
            time.sleep(delay)  # where the fsync runs, as a slow disk would
        return os.fsync(fd)

    def write_json(self, path, obj):
        code = self._error("json")
        if code is not None:
            raise OSError(code, os.strerror(code))
        return write_json_atomic(path, obj, self.fsync)


def from_environment():
    """Return the store's file I/O: L{FileIO}, or a L{FaultyIO} driven by the control
    directory in C{MQSERVER_FAULT_INJECT} when a test sets it."""
    control = os.environ.get(FAULT_ENV)
    if not control:
        return FileIO()
    Logger().warn("{var} is set: file I/O faults are injected from {dir} (tests only)",
                  var=FAULT_ENV, dir=control)
    return FaultyIO(control)
