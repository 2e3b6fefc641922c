"""One broker per data directory: an exclusive C{flock} on C{<store.path>/lock}.

The lock is held for the life of the process (or until the store closes). Being a
C{flock}, the kernel drops it when its holder dies in any way, SIGKILL included, so a
stale lock file never blocks a restart; the pid in the file is only there to name the
holder in the refusal. A process that fails to take the lock writes nothing: the lock
file is opened without truncation, and only the holder rewrites it.
"""

import fcntl
import os

from mqserver.errors import StartupError

LOCK_FILE = "lock"


class DirectoryLocked(StartupError):
    """Another live process holds the data directory.

    @ivar path: the data directory.
    @ivar pid: the holder's pid as its lock file says, or None when unreadable.
    """

    def __init__(self, path, pid):
        self.path = path
        self.pid = pid
        who = f"process {pid}" if pid is not None else "another process"
        super().__init__(f"data directory {path} is in use by {who} "
                         f"(lock file {os.path.join(path, LOCK_FILE)}); "
                         "one broker per data directory")


class DirectoryLock:
    """The exclusive lock of one data directory.

    @ivar path: the data directory.
    """

    def __init__(self, path):
        self.path = path
        self._fd = None

    @property
    def held(self):
        return self._fd is not None

    def acquire(self):
        """Take the lock and write our pid into the lock file.

        @raise DirectoryLocked: another live process holds it (nothing was written).
        """
        if self._fd is not None:
            return
        lock_path = os.path.join(self.path, LOCK_FILE)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise DirectoryLocked(self.path, pid) from None
        except BaseException:
            os.close(fd)
            raise
        pid = f"{os.getpid()}\n".encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, pid, 0)
        self._fd = fd

    def release(self):
        """Drop the lock (the file stays: removing it would race a starting broker)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


def _read_pid(fd):
    try:
        return int(os.pread(fd, 32, 0).split()[0])
    except (OSError, ValueError, IndexError):
        return None
