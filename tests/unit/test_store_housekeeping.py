"""A group commit never waits behind the housekeeping's fsyncs (the checkpoint's queue
files and metadata, state files): with those held on a slow disk, a flush-level-2 write is
made durable and acknowledged while a checkpoint's fsync is still in progress, and the
checkpoint, once done, claims no more of the log than is durable. Real store files and
real disk threads; the test's thread stands in for the reactor's (it runs what the
threads hand back, in order)."""

import json
import os
import queue
import threading
import time

import pytest

from mqserver.store.fileio import FaultyIO
from mqserver.store.flush import ThreadRunner
from mqserver.store.store import MessageStore


class ReactorThread:
    """What the disk threads need of a reactor: C{callFromThread}. L{run_until} runs the
    calls they hand back, in order, on the test's thread."""

    def __init__(self):
        self._calls = queue.Queue()

    def callFromThread(self, f, *args, **kw):
        self._calls.put((f, args, kw))

    def run_until(self, done, what, limit=10.0):
        # (done may also be set by a disk thread, with no call handed back)
        deadline = time.monotonic() + limit
        while not done():
            try:
                f, args, kw = self._calls.get(timeout=0.02)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{what}: not within {limit}s") from None
                continue
            f(*args, **kw)


class HeldHousekeeping(FaultyIO):
    """A disk whose fsyncs of anything but the commit log wait until L{release}d."""

    def __init__(self, log_dir):
        super().__init__()
        self.log_dir = log_dir
        self.held = threading.Event()  # a housekeeping fsync is waiting
        self.released = threading.Event()
        self.log_fsyncs = 0  # commit-log fsyncs, counted while one is held

    def fsync(self, fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.startswith(self.log_dir):
            if self.held.is_set() and not self.released.is_set():
                self.log_fsyncs += 1
        else:
            self.held.set()
            self.released.wait(30)
        return super().fsync(fd)


def fired(d):
    box = []
    d.addBoth(lambda r: box.append(r) or r)
    return box


@pytest.fixture
def store(tmp_path):
    reactor = ReactorThread()
    io = HeldHousekeeping(str(tmp_path / "commitlog"))
    s = MessageStore(str(tmp_path), reactor, segment_size=1 << 20, flush_level=2, io=io,
                     runner=ThreadRunner(reactor),
                     housekeeping=ThreadRunner(reactor, name="test-housekeeping"))
    s.open()
    s.test_reactor, s.test_io = reactor, io
    yield s
    io.released.set()
    s.close()


def test_a_group_commit_does_not_wait_behind_a_checkpoint_fsync(store):
    reactor, io = store.test_reactor, store.test_io
    first = fired(store.put_messages("t", 0, [b"one"]))
    reactor.run_until(lambda: first, "the first write made durable")

    checkpoint = fired(store.checkpoint())
    reactor.run_until(io.held.is_set, "the checkpoint fsyncing a queue file")

    second = fired(store.put_messages("t", 0, [b"two"]))
    reactor.run_until(lambda: second, "the second write made durable")
    # durable while the checkpoint's fsync still waits: it never queued behind it
    assert not io.released.is_set() and not checkpoint
    assert io.log_fsyncs >= 1
    assert store.flusher.durable == store.commitlog.end

    io.released.set()
    reactor.run_until(lambda: checkpoint, "the checkpoint written")
    with open(os.path.join(store.path, "metadata.json")) as f:
        meta = json.load(f)
    # captured after the first write: it claims that write, which was durable, and no more
    assert first[0].log_offsets[0] < meta["logOffset"] <= second[0].log_offsets[0]
    assert meta["queues"] == {"t": {"0": 1}}


def test_a_checkpoint_claims_only_what_the_group_commit_made_durable(tmp_path):
    """At flush level 1 nothing is fsynced per write: the checkpoint has the group commit
    fsync the log up to its offset before it writes the file."""
    reactor = ReactorThread()
    io = FaultyIO()
    s = MessageStore(str(tmp_path), reactor, segment_size=1 << 20, flush_level=1, io=io,
                     runner=ThreadRunner(reactor),
                     housekeeping=ThreadRunner(reactor, name="test-housekeeping"))
    s.open()
    try:
        s.put_messages("t", 0, [b"one", b"two"])
        end = s.commitlog.end
        assert s.flusher.durable < end
        done = fired(s.checkpoint())
        reactor.run_until(lambda: done, "the checkpoint written")
        with open(os.path.join(str(tmp_path), "metadata.json")) as f:
            assert json.load(f)["logOffset"] == end
        assert s.flusher.durable >= end
    finally:
        s.close()
