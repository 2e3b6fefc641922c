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


class UnusableDirectory(StartupError):
    """The data directory (C{store.path}) cannot be made or used."""

    def __init__(self, path, why):
        self.path = path
        super().__init__(f"store.path {path} cannot be used: {why}")


def check_directory(path):
    """Raise what would stop a store from opening in C{path}, found without writing
    anything: L{UnusableDirectory} when C{path} or a parent is not a directory, or
    L{DirectoryLocked} when a live process holds its lock.

    A check before start-up, so that an operator sees the reason before anything runs;
    the store's own open (L{DirectoryLock.acquire}) stays the authority."""
    probe = path
    while not os.path.lexists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if os.path.lexists(probe) and not os.path.isdir(probe):
        what = "it is" if probe == path else f"{probe} is"
        raise UnusableDirectory(path, f"{what} a file, not a directory")
    try:
        fd = os.open(os.path.join(path, LOCK_FILE), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return  # no lock file (nobody holds it), or one the store's own open will report
    try:
        # a shared lock: it conflicts only with a holder's exclusive one
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise DirectoryLocked(path, _read_pid(fd)) from None
    except OSError:
        pass
    finally:
        os.close(fd)


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
