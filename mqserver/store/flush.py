"""Durability: fsync on a dedicated thread, group commit, and atomic metadata files.

The reactor never waits for the disk. A write is acknowledged at flush level 2 only once
an fsync that started after it has finished; every write that arrived while one fsync
ran is covered by the next one (group commit).
"""

import json
import os
import threading
import time

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.threadpool import ThreadPool

from mqserver.errors import StoreError
from mqserver.store.latency import Latency


class ThreadRunner:
    """Runs blocking calls on a private one-thread pool and returns Deferreds.

    Tests replace it with L{SyncRunner} to run the same code synchronously.

    @param around: calls a function with arguments (C{around(f, *args)}); the results
        reach their Deferreds' callbacks through it, in the reactor thread. The broker
        gives L{mqserver.runtime.output.together}, so that the answers a group commit
        releases leave in one send per connection.
    """

    def __init__(self, reactor, name="mqserver-disk", around=None):
        self._reactor = reactor
        self._around = around or _call
        self._pool = ThreadPool(1, 1, name=name)
        self._started = False

    def start(self):
        """Start the thread."""
        if not self._started:
            self._pool.start()
            self._started = True

    def stop(self):
        """Stop the thread after the calls already queued."""
        if self._started:
            self._pool.stop()
            self._started = False

    def run(self, f, *args):
        """Call C{f(*args)} on the thread; return a Deferred with its result."""
        d = defer.Deferred()

        def done(ok, result):
            # on the pool's thread; the Deferred fires in the reactor's
            self._reactor.callFromThread(self._around, d.callback if ok else d.errback, result)

        self._pool.callInThreadWithCallback(done, f, *args)
        return d


def _call(f, *args):
    return f(*args)


class SyncRunner:
    """A runner that calls functions at once, for tests and for shutdown."""

    def start(self):
        pass

    def stop(self):
        pass

    def run(self, f, *args):
        return defer.maybeDeferred(f, *args)


def fsync_fds(fds, fsync=os.fsync):
    """fsync and close every fd in C{fds} (duplicates handed over by the commit log)."""
    try:
        for fd in fds:
            fsync(fd)
    finally:
        for fd in fds:
            os.close(fd)


class FlushError(StoreError):
    """An fsync failed: the writes it covered are not durable and were not acknowledged."""


class Flusher:
    """Group commit for one commit log.

    @ivar durable: the commit-log offset up to which every byte is known to be on disk.
    @ivar failure: the last fsync failure, or None once an fsync succeeded after it. A
        failed fsync fails the writes it covered (they were not acknowledged at level 2)
        and the next request tries again: a full disk that gets space back, or a
        transient I/O error, does not stop the store.
    @ivar fsync_latency: a L{Latency} of every fsync of the commit log.
    """

    log = Logger()

    def __init__(self, commitlog, runner, on_durable, fsync=fsync_fds, on_error=None):
        self.fsync_latency = Latency()
        self._log_file = commitlog
        self._runner = runner
        self._on_durable = on_durable
        self._on_error = on_error
        self._fsync = fsync
        self._waiters = []  # (offset, Deferred), offsets increasing
        self._running = None
        self.durable = commitlog.end
        self.failure = None

    def request(self, offset):
        """Return a Deferred that fires once everything below C{offset} is durable."""
        if offset <= self.durable:
            return defer.succeed(None)
        d = defer.Deferred()
        self._waiters.append((offset, d))
        self._kick()
        return d

    def sync(self):
        """Start an fsync of everything written so far (the once-a-second flush)."""
        if self.durable < self._log_file.end:
            self._kick(force=True)
        return self._running or defer.succeed(None)

    def _kick(self, force=False):
        if self._running is not None or not (self._waiters or force):
            return
        target = self._log_file.end
        fds = self._log_file.take_unsynced()
        d = self._running = self._runner.run(self._timed_fsync, fds)
        d.addCallbacks(self._synced, self._failed, (target,))

    def _timed_fsync(self, fds):
        # on the disk thread: one fsync (of several files) per group commit
        t0 = time.perf_counter()
        self._fsync(fds)
        self.fsync_latency.observe(time.perf_counter() - t0)

    def _synced(self, _, target):
        self._running = None
        self.failure = None
        self.durable = max(self.durable, target)
        ready = [w for w in self._waiters if w[0] <= target]
        self._waiters = [w for w in self._waiters if w[0] > target]
        self._on_durable(self.durable)
        # The writes that came during this fsync start their own before this one's are
        # answered: the disk works while the reactor writes the answers.
        self._kick()
        for _, d in ready:
            d.callback(None)

    def _failed(self, failure):
        self._running = None
        self.failure = failure.value
        # The segments it covered still need an fsync (the next one must cover them).
        self._log_file.mark_all_unsynced()
        if self._on_error is not None:
            self._on_error("fsync", failure.value)
        else:
            self.log.error("fsync failed: {error}", error=failure.value)
        waiters, self._waiters = self._waiters, []
        for _, d in waiters:
            d.errback(FlushError(f"fsync failed: {failure.value}"))


def write_json_atomic(path, obj, fsync=os.fsync):
    """Write C{obj} as JSON to C{path}: temp file, fsync, rename, fsync of the directory
    (each fsync through C{fsync}).

    The temp file's name is unique to the calling thread, so two writers never share
    (and interleave bytes in) one temp file; the last rename wins."""
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    data = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        fsync(dfd)
    finally:
        os.close(dfd)


def fsync_paths(paths, fsync=os.fsync):
    """fsync (through C{fsync}) each file in C{paths} that still exists."""
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            fsync(fd)
        finally:
            os.close(fd)


def read_json(path):
    """Return the JSON in C{path}, or None when it does not exist."""
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        return None
