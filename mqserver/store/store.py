"""The message store: one commit log, consume queues, checkpoints and recovery.

Every write is a record with a global, dense, increasing eventId. Message records are
indexed into the consume queue of their (topic, queue id); admin records (topic create
and delete, delays) are handed to a state machine (the broker's topic registry and delay
index) both when they are written and when they are replayed at start-up.

A checkpoint (``metadata.json``, written atomically once a second when anything changed)
holds the state machine's snapshot, the commit-log offset it is current to, and each
queue's length. Recovery loads it and replays the log from that offset; a missing or
damaged checkpoint, or a consume queue shorter than the checkpoint says, replays the
whole retained log.
"""

import errno
import os
import shutil
import tempfile
import time
import zlib
from dataclasses import dataclass

from twisted.internet import defer
from twisted.logger import Logger

from mqserver import speedups
from mqserver.errors import DiskFullError, StoreError
from mqserver.store import format as fmt
from mqserver.store.commitlog import CommitLog
from mqserver.store.consumequeue import ConsumeQueue, FdCache
from mqserver.store.fileio import from_environment
from mqserver.store.latency import Latency
from mqserver.store.lock import DirectoryLock
from mqserver.store.flush import (
    Flusher,
    SyncRunner,
    fsync_fds,
    fsync_paths,
    read_json,
    write_json_atomic,
)


#: The C speedup of the record packing (None: the Python loop, MessageStore._pack_py).
_pack = speedups.load("mqserver.store._pack")
#: The C speedup of the read-path record check (format.first_damaged).
_check = speedups.load("mqserver.store._check")
_first_damaged = fmt.first_damaged if _check is None else _check.first_damaged

# Module-level names for what every publish reads (a global is one lookup).
_MESSAGE_MAGIC = fmt.MESSAGE_MAGIC
_BLANK_SIZE = fmt.BLANK_SIZE
_crc32 = zlib.crc32
_perf_counter = time.perf_counter
#: One write in this many (chosen by its first eventId) is timed for write_latency.
_TIME_EVERY_MASK = 63
_tag_hash_of = fmt.tag_hash_of
_damage = fmt.record_damage


@dataclass(slots=True)
class Message:
    """A message to store. C{properties} is a RocketMQ properties string (bytes)."""

    body: bytes
    properties: bytes = b""
    flag: int = 0
    sys_flag: int = 0
    reconsume_times: int = 0
    born_ts: int = 0
    born_host: bytes = fmt.NO_HOST


class PutResult:
    """Where a put landed: the first eventId and, per message, its offsets.

    @ivar log_offsets: commit-log offset of each record.
    @ivar queue_offsets: consume-queue offset of each message (-1 for admin records).
    @ivar sizes: bytes of each record.
    """

    # A plain class, not a dataclass: it is built on every publish, and a dataclass's
    # default factories cost that path about as much as the rest of its bookkeeping.
    __slots__ = ("event_id", "queue_id", "log_offsets", "queue_offsets", "sizes", "store_ts")

    def __init__(self, event_id, queue_id, store_ts=0, log_offsets=None, queue_offsets=None,
                 sizes=None):
        self.event_id = event_id
        self.queue_id = queue_id
        self.store_ts = store_ts
        self.log_offsets = [] if log_offsets is None else log_offsets
        self.queue_offsets = [] if queue_offsets is None else queue_offsets
        self.sizes = [] if sizes is None else sizes

    def __repr__(self):
        return (f"PutResult(event_id={self.event_id}, queue_id={self.queue_id}, "
                f"log_offsets={self.log_offsets}, queue_offsets={self.queue_offsets}, "
                f"sizes={self.sizes}, store_ts={self.store_ts})")


class NullState:
    """A state machine that ignores admin records (for store-only use and tests)."""

    def apply_record(self, view, replaying):
        pass

    def snapshot_state(self):
        return {}

    def restore_state(self, state):
        pass

    def begin_full_replay(self):
        pass


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


class MessageStore:
    """The storage engine. Runs on the reactor thread; fsync runs on the runner's thread.

    @ivar next_event_id: the eventId the next record gets.
    @ivar visible_end: commit-log offset below which readers may read. At flush level 2
        it is the durable offset, so no consumer sees a message a crash could take back.
    @ivar write_latency: a L{Latency} of writes (packing, pwrite, indexing), sampled:
        one write in 64.
    """

    log = Logger()

    def __init__(
        self,
        path,
        reactor,
        *,
        segment_size=1 << 30,
        cq_entries_per_file=300_000,
        flush_level=1,
        runner=None,
        store_host=fmt.NO_HOST,
        max_message_size=4 * 1024 * 1024,
        fsync=None,
        clock=time.time,
        io=None,
        disk_max_used_ratio=0.90,
    ):
        self.path = path
        self._reactor = reactor
        self.segment_size = segment_size
        self.cq_entries = cq_entries_per_file
        self.flush_level = flush_level
        self.runner = runner or SyncRunner()
        self.store_host = store_host
        self.max_message_size = max_message_size
        self.io = io or from_environment()
        self._fsync = fsync or (lambda fds: fsync_fds(fds, self.io.fsync))
        self._clock = clock
        self.disk_max_used_ratio = disk_max_used_ratio
        #: Why writes are refused (the store is closed, the disk is over its ratio), or
        #: None: the one test the write path makes.
        self._refusal = StoreError("store is closed")
        #: None, or what is wrong with the disk (a failed write or fsync, the usage
        #: ratio); logged once when it starts and once when it ends.
        self.disk_trouble = None
        self._trouble_end = 0  # the log end when the trouble started
        self._fsync_refusal = False  # _refusal is a failed fsync's (flush levels 0, 1)
        #: Disk troubles (full, over the ratio, write or fsync errors) since start.
        self.disk_full_events = 0
        #: Writes and fsyncs that failed since start.
        self.disk_errors = 0
        self.state = NullState()
        self._arrival_listeners = []
        self._topic_tails = {}  # topic -> its name as records end with it (length, UTF-8)
        self._tails = set()  # consume queues holding buffered entries
        self._append_listeners = []
        self._dispatch_listeners = []
        self._queues = {}
        self._pending_visible = []  # (end offset, topic, queue id) waiting for fsync
        self._checkpoint_running = False
        self._dirty = False
        self.last_checkpoint_offset = 0
        self._replayed_deletes = set()  # topics a DELETE record removed during replay
        #: Commit-log offsets of the damaged records reported so far.
        self.damaged_offsets = set()
        #: Records at or above this offset were checked by recovery or written by this
        #: process: reads check their framing only. Below it, reads check body CRCs too.
        self.trusted_from = 0
        #: Damaged records found since start (recovery and reads; each counted once).
        self.damaged_records = 0
        self.opened = False
        self.write_latency = Latency()
        self._lock = DirectoryLock(path)

    # -- life cycle ----------------------------------------------------------------------

    def open(self):
        """Open the files and recover (synchronously, before any listener starts)."""
        os.makedirs(self.path, exist_ok=True)
        # Before anything else in the directory: a refused broker must change nothing.
        self._lock.acquire()
        self._cq_root = os.path.join(self.path, "consumequeue")
        os.makedirs(self._cq_root, exist_ok=True)
        trash = os.path.join(self._cq_root, ".trash")
        if os.path.isdir(trash):
            shutil.rmtree(trash, ignore_errors=True)
        self.commitlog = CommitLog(os.path.join(self.path, "commitlog"), self.segment_size,
                                   self.io)
        self._fds = FdCache(pwrite=self.io.pwrite)
        self._meta_path = os.path.join(self.path, "metadata.json")
        self._recover()
        for q in self._queues.values():  # what recovery replayed is not new input
            q.in_base = q.max_offset
        self.flusher = Flusher(self.commitlog, self.runner, self._durable, self._fsync,
                               self._disk_error)
        self.visible_end = self.commitlog.end
        self.runner.start()
        self.opened = True
        self._refusal = None
        self.check_disk()  # a start on a disk over the ratio refuses writes at once

    def close(self):
        """Flush everything and write a final checkpoint (synchronously)."""
        if not self.opened:
            return
        self.opened = False
        self._refusal = StoreError("store is closed")
        # Let a checkpoint or flush already queued on the disk thread finish first: run
        # after the final checkpoint, an older snapshot would replace it.
        self.runner.stop()
        fsync_fds(self.commitlog.take_unsynced())
        self._write_checkpoint(self._capture_checkpoint(), set(self._fds.dirty))
        self._fds.close()
        self.commitlog.close()
        self._lock.release()

    # -- queues --------------------------------------------------------------------------

    def _topic_dir(self, topic):
        """Return the consume-queue directory of C{topic}: the last line of defence
        behind each protocol's name rules and the broker's, so that no name ever
        leaves C{consumequeue/} or clashes with its C{.trash}."""
        if not safe_dir_name(topic):
            raise StoreError(f"unsafe topic name {topic!r}")
        return os.path.join(self._cq_root, topic)

    def queue(self, topic, queue_id):
        """Return the L{ConsumeQueue} of (topic, queue id), opening it when needed.

        @raise StoreError: C{topic} cannot be a directory name (see L{safe_dir_name}).
        """
        key = (topic, queue_id)
        q = self._queues.get(key)
        if q is None:
            directory = os.path.join(self._topic_dir(topic), str(int(queue_id)))
            q = self._queues[key] = ConsumeQueue(
                directory, self.cq_entries, self._fds, self._tails.add
            )
        return q

    def open_queues(self):
        """Return [((topic, queue id), L{ConsumeQueue}), ...] of every open queue."""
        return list(self._queues.items())

    def find_queue(self, topic, queue_id):
        """Return the open L{ConsumeQueue} of (topic, queue id), or None (never creates one)."""
        return self._queues.get((topic, queue_id))

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
        for key in [k for k in self._queues if k[0] == topic]:
            self._tails.discard(self._queues.pop(key))
        if not safe_dir_name(topic):
            return defer.succeed(None)  # it never had a directory (see queue)
        d = self._topic_dir(topic)
        self._fds.forget_under(d)
        if os.path.isdir(d):
            trash = os.path.join(self._cq_root, ".trash")
            os.makedirs(trash, exist_ok=True)
            # A fresh short name: "<topic>.<eventId>" outgrows NAME_MAX for long names.
            dest = os.path.join(tempfile.mkdtemp(dir=trash), "q")
            os.rename(d, dest)
            self._dirty = True
            return self.runner.run(shutil.rmtree, dest, True)
        return defer.succeed(None)

    # -- writing -------------------------------------------------------------------------

    def _check_writable(self):
        if self._refusal is not None:
            raise self._refusal

    # -- the disk --------------------------------------------------------------------------

    def disk_used_ratio(self):
        """Return the used share of the data directory's file system, as df shows it."""
        st = os.statvfs(self.path)
        used = st.f_blocks - st.f_bfree
        total = used + st.f_bavail
        return used / total if total else 0.0

    def check_disk(self):
        """Refuse writes while the disk is fuller than L{disk_max_used_ratio}, accept
        them again below it, and notice the end of a disk trouble (the service calls it
        once a second, with the checkpoint)."""
        if not self.opened:
            return
        try:
            ratio = self.disk_used_ratio()
        except OSError as e:
            self.log.warn("cannot read the disk usage of {path}: {e}", path=self.path, e=e)
            return
        limit = self.disk_max_used_ratio
        if ratio > limit:
            if self._refusal is None:
                self._refusal = DiskFullError(
                    f"disk full: {ratio:.0%} of the disk of {self.path} is used, over"
                    f" store.diskMaxUsedRatio {limit:.0%}")
                self.disk_full_events += 1
                self.log.error("{what}: publishes are refused until it is back under (reads"
                               " go on)", what=self._refusal)
        elif isinstance(self._refusal, DiskFullError):
            self._refusal = None
            self.log.warn("disk {ratio:.0%} used, under store.diskMaxUsedRatio {limit:.0%}:"
                          " publishes are accepted again", ratio=ratio, limit=limit)
        if (self.disk_trouble is not None and self.commitlog.end > self._trouble_end
                and self.flusher.failure is None):
            # A write landed since, and no fsync failed after it.
            self.log.warn("disk writes work again (after: {what}); {n} writes or fsyncs"
                          " failed so far", what=self.disk_trouble, n=self.disk_errors)
            self.disk_trouble = None

    def _trouble(self, what):
        if self.disk_trouble is None:
            self.disk_trouble = what
            self._trouble_end = self.commitlog.end
            self.disk_full_events += 1
            self.log.error("disk trouble: {what}; publishes fail until writes work again"
                           " (reads go on)", what=what)
        else:
            self._trouble_end = self.commitlog.end

    def _disk_error(self, op, error):
        # A failed write or fsync: counted, logged once per trouble. Below flush level 2
        # a publish is acknowledged before its fsync, so after a failed one publishes
        # are refused until an fsync succeeds again (the once-a-second flush retries).
        self.disk_errors += 1
        self._trouble(f"{op} failed: {error}")
        if op == "fsync" and self.flush_level < 2 and self._refusal is None:
            self._refusal = StoreError(f"fsync failed: {error}")
            self._fsync_refusal = True

    def put_messages(self, topic, queue_id, messages, now_ms=None, event_id=None):
        """Append C{messages} to (topic, queue id) as one write. A message is a
        L{Message}, or bytes: a message with only a body, born at the write.

        Returns a Deferred firing with a L{PutResult} once the write is as durable as the
        flush level asks; it fails with L{StoreError} when the write or fsync fails.
        C{event_id} (a replication slave applying its master's records) gives the first
        eventId; it may skip ahead of L{next_event_id} but never go back.
        """
        try:
            if self._refusal is not None:
                raise self._refusal
            if event_id is not None:
                self._force_event_id(event_id)
            result = self._append(topic, queue_id, messages, _MESSAGE_MAGIC, 0, now_ms)
        except StoreError as e:
            return defer.fail(e)
        except OSError as e:
            return defer.fail(self._write_failed(e))
        return self._after_write(result, topic, queue_id)

    def put_admin(self, op, topic, body, now_ms=None, event_id=None):
        """Append one admin record; the state machine applies it before this returns.
        Returns a Deferred firing with the L{PutResult}. C{event_id}: as for
        L{put_messages}."""
        try:
            self._check_writable()
            self._force_event_id(event_id)
            msg = Message(body=body)
            result = self._append(topic, -1, [msg], fmt.ADMIN_MAGIC, op, now_ms)
        except StoreError as e:
            return defer.fail(e)
        except OSError as e:
            return defer.fail(self._write_failed(e))
        return self._after_write(result, None, None)

    def _write_failed(self, e):
        self._disk_error("write", e)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            return DiskFullError(f"disk full: {e.strerror}")
        return StoreError(f"write failed: {e.strerror or e}")

    def _force_event_id(self, event_id):
        if event_id is None:
            return
        if event_id < self.next_event_id:
            raise StoreError(f"eventId {event_id} is behind the log ({self.next_event_id})")
        self.next_event_id = event_id

    def _append(self, topic, queue_id, messages, magic, op, now_ms):
        # The publish hot path: records packed by the C speedup (_pack.c) or _pack_py,
        # one pwrite per segment touched, consume-queue entries buffered (see
        # ConsumeQueue.write).
        tail = self._topic_tails.get(topic)
        if tail is None:
            # First write of this name: no record (admin records too, which a slave
            # applies straight from its master) carries a name unfit for a directory.
            if not safe_dir_name(topic):
                raise StoreError(f"unsafe topic name {topic!r}")
            tbytes = topic.encode("utf-8")
            tail = self._topic_tails[topic] = bytes((len(tbytes),)) + tbytes
        now = int(self._clock() * 1000) if now_ms is None else now_ms
        log = self.commitlog
        is_msg = magic == _MESSAGE_MAGIC
        if is_msg:
            q = self._queues.get((topic, queue_id)) or self.queue(topic, queue_id)
            first_qoff = q.max_offset
        else:
            first_qoff = -1
        event_id = self.next_event_id
        t0 = 0.0 if event_id & _TIME_EVERY_MASK else _perf_counter()
        start = log.end
        if type(messages) is not list:
            messages = list(messages)
        try:
            if _pack is None:
                result, entries = self._pack_py(messages, magic, queue_id, op, is_msg,
                                                first_qoff, now, tail, event_id)
            else:
                packed = _pack.pack(
                    messages, 0, magic, queue_id, op, is_msg, first_qoff, start,
                    log.space_left(), _BLANK_SIZE, now, self.store_host, event_id, tail,
                    self.max_message_size, _crc32, _tag_hash_of)
                if packed[5] == 0:  # all in the current segment: the usual case
                    data, entries, offs, qoffs, sizes, _ = packed
                    if sizes:
                        log.append(data)
                    result = PutResult(event_id, queue_id, now, offs, qoffs, sizes)
                else:
                    result, entries = self._pack_c_rest(
                        messages, magic, queue_id, op, is_msg, first_qoff, now, tail,
                        event_id, packed)
        except BaseException:
            log.truncate(start)
            raise
        self.next_event_id = event_id + len(result.sizes)
        if is_msg:
            q.write(first_qoff, entries)
            # Statistics count here, where every protocol's publish ends (once); the
            # messages are the queue's growth (ConsumeQueue.in_msgs).
            q.in_bytes += sum(result.sizes)
            if self._dispatch_listeners:
                for cb in self._dispatch_listeners:
                    for off, m in zip(result.log_offsets, messages):
                        cb(off, topic, b"" if type(m) is bytes else m.properties, now)
        else:
            for off, size in zip(result.log_offsets, result.sizes):
                self._apply_admin(self.read_record(off, size), False)
        self._dirty = True
        if t0:
            self.write_latency.observe(_perf_counter() - t0)
        return result

    def _pack_py(self, messages, magic, queue_id, op, is_msg, qoff, now, tail, event_id):
        # The reference packing and writing (the C speedup _pack.c packs the same bytes):
        # one pwrite per segment touched. Returns the PutResult and the consume-queue
        # entries.
        log = self.commitlog
        pos = log.end
        seg_left = log.space_left()
        seg_size = log.segment_size
        overhead = fmt.HEADER_SIZE + 2 + len(tail)
        max_size = self.max_message_size
        host = self.store_host
        pack = fmt.HEADER.pack
        crc = zlib.crc32
        result = PutResult(event_id, queue_id, now)
        offsets, qoffsets, sizes = result.log_offsets, result.queue_offsets, result.sizes
        chunk = []
        entries = []
        last = len(messages) - 1
        for i, m in enumerate(messages):
            if type(m) is bytes:
                m = Message(body=m)
            sys_flag = m.sys_flag & ~fmt.SYSFLAG_BATCH_MORE
            if is_msg and i < last:
                sys_flag |= fmt.SYSFLAG_BATCH_MORE
            body, props = m.body, m.properties
            blen = len(body)
            if blen > max_size:
                raise StoreError(f"message of {blen} bytes is over the limit")
            size = overhead + blen + len(props)
            if size + fmt.BLANK_SIZE > seg_left:
                if chunk:
                    log.append(b"".join(chunk))
                    chunk = []
                log.roll()
                pos = log.end
                seg_left = seg_size
            chunk.append(pack(
                size, magic, crc(body) & 0x7FFFFFFF, queue_id, m.flag if is_msg else op,
                qoff, pos, sys_flag, m.born_ts or now, m.born_host, now, host,
                m.reconsume_times, event_id, blen,
            ))
            chunk.append(body)
            chunk.append(tail)
            chunk.append(len(props).to_bytes(2, "big"))
            chunk.append(props)
            if is_msg:
                entries.append(fmt.CQ_ENTRY.pack(pos, size, fmt.tag_hash_of(props) if props else 0))
            offsets.append(pos)
            qoffsets.append(qoff)
            sizes.append(size)
            pos += size
            seg_left -= size
            event_id += 1
            if is_msg:
                qoff += 1
        if chunk:
            log.append(b"".join(chunk))
        return result, b"".join(entries)

    def _pack_c_rest(self, messages, magic, queue_id, op, is_msg, first_qoff, now, tail,
                     event_id, first):
        # The C packing of a write that its first call (C{first}, what _pack.pack
        # returned) did not finish: stop 1, the current segment is full (roll and go
        # on); stop 2, a body over the limit. Returns the PutResult and the entries.
        log = self.commitlog
        data, ents, offs, qoffs, sizes, stop = first
        result = PutResult(event_id, queue_id, now, offs, qoffs, sizes)
        entries = [ents]
        while True:
            if sizes:
                log.append(data)
            if stop == 0:
                return result, b"".join(entries)
            done = len(result.sizes)
            if stop == 2:
                m = messages[done]
                blen = len(m if type(m) is bytes else m.body)
                raise StoreError(f"message of {blen} bytes is over the limit")
            if not sizes and log.space_left() == log.segment_size:
                raise StoreError("a record larger than a whole segment")
            log.roll()
            data, ents, offs, qoffs, sizes, stop = _pack.pack(
                messages, done, magic, queue_id, op, is_msg,
                first_qoff + done if is_msg else first_qoff, log.end, log.space_left(),
                _BLANK_SIZE, now, self.store_host, event_id + done, tail,
                self.max_message_size, _crc32, _tag_hash_of)
            if sizes:
                result.log_offsets += offs
                result.queue_offsets += qoffs
                result.sizes += sizes
            entries.append(ents)

    def _apply_admin(self, view, replaying):
        if view.flag == fmt.OP_DELETE:
            if replaying:
                self._replayed_deletes.add(view.topic)
            self.drop_topic(view.topic)
        self.state.apply_record(view, replaying)

    def _after_write(self, result, topic, queue_id):
        end = self.commitlog.end
        if self.flush_level >= 2:
            self._pending_visible.append((end, topic, queue_id))
            return self.flusher.request(end).addCallback(lambda _: result)
        self.visible_end = end
        self._notify(topic, queue_id)
        return defer.succeed(result)

    def _durable(self, offset):
        if self._fsync_refusal:
            self._fsync_refusal = False
            self._refusal = None
        if self.flush_level < 2:
            return
        self.visible_end = max(self.visible_end, offset)
        ready = [p for p in self._pending_visible if p[0] <= offset]
        self._pending_visible = [p for p in self._pending_visible if p[0] > offset]
        seen = set()
        for _, topic, qid in ready:
            if (topic, qid) not in seen:
                seen.add((topic, qid))
                self._notify(topic, qid)

    def add_arrival_listener(self, callback):
        """Call C{callback(topic, queue_id)} whenever new messages become readable."""
        self._arrival_listeners.append(callback)

    def add_append_listener(self, callback):
        """Call C{callback()} whenever any record (message or admin) becomes readable."""
        self._append_listeners.append(callback)

    def remove_append_listener(self, callback):
        """Stop calling C{callback}."""
        if callback in self._append_listeners:
            self._append_listeners.remove(callback)

    def add_dispatch_listener(self, callback):
        """Call C{callback(offset, topic, properties, store_ts)} for every message record,
        as it is written and as it is replayed at start-up (so derived indexes such as
        L{mqserver.store.index} can be rebuilt; they must skip records they already hold)."""
        self._dispatch_listeners.append(callback)

    def _notify(self, topic, queue_id):
        # topic None: an admin record, which only log readers (replication) care about.
        if topic is not None:
            for cb in self._arrival_listeners:
                cb(topic, queue_id)
        for cb in self._append_listeners:
            cb()

    def sync(self):
        """fsync what is written (flush level 1 calls this once a second)."""
        return self.flusher.sync()

    # -- reading -------------------------------------------------------------------------

    def read_entries(self, topic, queue_id, qoffset, count):
        """Return packed consume-queue entries from C{qoffset}, only readable ones."""
        q = self._queues.get((topic, queue_id))
        if q is None:
            return b""
        data = q.read(qoffset, count)
        if not data:
            return data
        vis = self.visible_end
        off, size, _ = fmt.CQ_ENTRY.unpack_from(data, len(data) - fmt.CQ_ENTRY_SIZE)
        if off + size <= vis:
            return data
        n = 0
        for off, size, _ in fmt.CQ_ENTRY.iter_unpack(data):
            if off + size > vis:
                break
            n += 1
        return data[: n * fmt.CQ_ENTRY_SIZE]

    def read_records(self, entries):
        """Return C{(buffer, [(pos, size), ...])} holding the records of packed C{entries}.

        Records that sit close together in one segment are read with one pread. Every
        record is checked (framing and body CRC) as it comes off the disk; a damaged one
        is left out (reported once, see L{report_damage}), so C{locs} may be shorter than
        C{entries}. Entries below the log start (retention) are left out too."""
        buf, locs = self._read_spans(entries)
        # Entries are in log order: the first is the lowest.
        bad = _first_damaged(buf, locs, fmt.I64.unpack_from(entries, 0)[0] < self.trusted_from)
        if bad < 0:
            return buf, locs
        return buf, self._drop_damaged(buf, locs, bad, entries)

    def _drop_damaged(self, buf, locs, first_bad, entries):
        # The rare path: the locs without the damaged records, each reported.
        offsets = []
        self._read_spans(entries, offsets)  # again, for the offsets of the locs
        keep = locs[:first_bad]
        for i in range(first_bad, len(locs)):
            p, s = locs[i]
            why = _damage(buf, p, s)
            if why is None:
                keep.append(locs[i])
            else:
                eid = None
                if s >= fmt.HEADER_SIZE and 0 <= p and p + s <= len(buf):
                    eid = fmt.I64.unpack_from(buf, p + fmt.OFF_EVENT_ID)[0]
                self.report_damage(offsets[i], why, eid)
        return keep

    def report_damage(self, offset, detail, event_id=None):
        """Log a damaged record (once per record) and count it in L{damaged_records}.
        Returns True the first time C{offset} is reported."""
        if offset in self.damaged_offsets:
            return False
        self.damaged_offsets.add(offset)
        self.damaged_records += 1
        log = self.commitlog
        seg = fmt.segment_name(log.segment_start(offset)) if offset >= 0 else "?"
        self.log.error(
            "damaged record skipped: segment {segment} offset {offset} eventId {event_id}:"
            " {detail}",
            segment=seg, offset=offset, event_id="?" if event_id is None else event_id,
            detail=detail,
        )
        return True

    def _read_spans(self, entries, offsets=None):
        # (buffer, locs) of the records of entries; offsets, when given, gets the
        # commit-log offset of each loc.
        log = self.commitlog
        n = len(entries)
        if n >= 2 * fmt.CQ_ENTRY_SIZE:
            # The common case: a queue's next records lie in one segment within 1 MiB
            # (their entries are in log order): one pread, positions in one pass.
            first = fmt.I64.unpack_from(entries, 0)[0]
            last, last_size, _ = fmt.CQ_ENTRY.unpack_from(entries, n - fmt.CQ_ENTRY_SIZE)
            span = last + last_size - first
            if (
                first >= log.min_offset
                and 0 < span <= 1 << 20
                and first // log.segment_size == last // log.segment_size
            ):
                # Entries of one queue are appended in log order, so first..last holds
                # them all.
                locs = [(off - first, size) for off, size, _ in fmt.CQ_ENTRY.iter_unpack(entries)]
                if offsets is not None:
                    offsets.extend(off for off, _, _ in fmt.CQ_ENTRY.iter_unpack(entries))
                return log.read(first, span), locs
        parts, locs = [], []
        span_start = span_end = None
        base = 0
        seg = log.segment_size
        for off, size, _ in fmt.CQ_ENTRY.iter_unpack(entries):
            if off < log.min_offset:
                continue
            if offsets is not None:
                offsets.append(off)
            if (
                span_start is not None
                and off >= span_end
                and off + size - span_start <= 1 << 20
                and off // seg == span_start // seg
            ):
                span_end = off + size
                locs.append((base + off - span_start, size))
                continue
            if span_start is not None:
                parts.append(log.read(span_start, span_end - span_start))
                base += span_end - span_start
            span_start, span_end = off, off + size
            locs.append((base, size))
        if span_start is not None:
            parts.append(log.read(span_start, span_end - span_start))
        buf = parts[0] if len(parts) == 1 else b"".join(parts)
        return buf, locs

    def read_record(self, offset, size):
        """Return the decoded record at C{offset} as a L{fmt.RecordView}."""
        return fmt.RecordView(self.commitlog.read(offset, size))

    def damaged(self, buf, offset):
        """Return True (and report it) when the message record in C{buf} (read from
        commit-log C{offset}) fails its framing or body CRC check."""
        why = _damage(buf, 0, len(buf))
        if why is None:
            return False
        eid = fmt.I64.unpack_from(buf, fmt.OFF_EVENT_ID)[0] if len(buf) >= fmt.HEADER_SIZE else None
        self.report_damage(offset, why, eid)
        return True

    def read_sound_record(self, offset, size):
        """Return the message record at C{offset} as a L{fmt.RecordView}, or None when it
        is damaged (reported as L{read_records} does)."""
        buf = self.commitlog.read(offset, size)
        why = _damage(buf, 0, size, offset < self.trusted_from)
        if why is None:
            return fmt.RecordView(buf)
        eid = fmt.I64.unpack_from(buf, fmt.OFF_EVENT_ID)[0] if len(buf) >= fmt.HEADER_SIZE else None
        self.report_damage(offset, why, eid)
        return None

    def event_id_at(self, offset):
        """Return the eventId of the record at commit-log C{offset}."""
        return fmt.I64.unpack(self.commitlog.read(offset + fmt.OFF_EVENT_ID, 8))[0]

    def find_event(self, topic, queue_id, event_id):
        """Binary-search (topic, queue) for C{event_id}.

        Returns C{(qoffset, exact)}: the offset of the first entry whose eventId is >=
        C{event_id}, and whether it is equal."""
        q = self._queues.get((topic, queue_id))
        if q is None:
            return 0, False
        lo, hi = q.min_offset, q.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            off, _, _ = q.entry(mid)
            if off < self.commitlog.min_offset or self.event_id_at(off) < event_id:
                lo = mid + 1
            else:
                hi = mid
        exact = lo < q.max_offset and self.event_id_at(q.entry(lo)[0]) == event_id
        return lo, exact

    # -- checkpoints ---------------------------------------------------------------------

    def flush_queues(self):
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

    def _capture_checkpoint(self):
        # The checkpoint promises that the queue files hold every entry below logOffset.
        self.flush_queues()
        queues = {}
        for (topic, qid), q in self._queues.items():
            queues.setdefault(topic, {})[str(qid)] = q.max_offset
        return {
            "version": 1,
            "logOffset": self.commitlog.end,
            "nextEventId": self.next_event_id,
            "queues": queues,
            "state": self.state.snapshot_state(),
        }

    def _write_checkpoint(self, snap, cq_paths, log_fds=()):
        fsync_fds(list(log_fds))
        fsync_paths(cq_paths)
        write_json_atomic(self._meta_path, snap)

    def checkpoint(self):
        """Write a checkpoint on the disk thread if anything changed since the last one.

        Returns a Deferred. At most one runs at a time."""
        if self._checkpoint_running or not self._dirty or not self.opened:
            return defer.succeed(None)
        try:
            snap = self._capture_checkpoint()
        except OSError as e:
            self._disk_error("consume-queue write", e)
            return defer.succeed(None)
        self._dirty = False
        self._checkpoint_running = True
        paths = set(self._fds.dirty)
        self._fds.dirty.clear()
        fds = self.commitlog.take_unsynced() if self.flush_level >= 1 else []

        def done(result):
            self._checkpoint_running = False
            self.last_checkpoint_offset = snap["logOffset"]
            return result

        def failed(f):
            self._checkpoint_running = False
            self._dirty = True
            self._fds.dirty |= paths
            if f.check(OSError):
                self.commitlog.mark_all_unsynced()  # its log fsync may not have run
                self._disk_error("checkpoint", f.value)
            else:
                self.log.failure("checkpoint failed", f)

        d = self.runner.run(self._write_checkpoint, snap, paths, fds)
        return d.addCallbacks(done, failed)

    def mark_dirty(self):
        """Ask for a checkpoint at the next tick (the state machine changed)."""
        self._dirty = True

    # -- recovery ------------------------------------------------------------------------

    def _recover(self):
        log = self.commitlog
        snap = self._load_checkpoint()
        full = snap is None
        behind = []
        if snap is not None:
            try:
                self.state.restore_state(snap.get("state", {}))
            except (ValueError, TypeError, KeyError, AttributeError) as e:
                self.log.warn(
                    "checkpoint {path} holds a state that cannot be loaded ({error}):"
                    " rebuilding from the commit log", path=self._meta_path, error=e,
                )
                self.state.restore_state({})
                snap, full = None, True
        if snap is not None:
            for topic, qs in snap.get("queues", {}).items():
                for qid, count in qs.items():
                    q = self.queue(topic, int(qid))
                    if q.max_offset < count and count > q.min_offset:
                        behind.append((topic, qid, q.max_offset, count))
        if not full and snap["logOffset"] > log.end:
            # The log lost its tail after the checkpoint was written (a torn or cut
            # segment): the checkpoint is ahead of the truth, so rebuild from the log.
            self.log.warn("commit log ends before the checkpoint: rebuilding")
            full = True
        start = log.min_offset if full else snap["logOffset"]
        if full:
            self._restart_state(snap)
        self.next_event_id = 1 if full else snap["nextEventId"]
        self._replay(start, full)
        # A queue shorter than the checkpoint says is lost data, unless its topic was
        # deleted after the checkpoint (a DELETE replayed just now): then its queue was
        # dropped and, if re-created, restarted from 0, and the replay rebuilt it.
        behind = [b for b in behind if b[0] not in self._replayed_deletes]
        if not full and behind:
            for topic, qid, have, want in behind:
                self.log.warn(
                    "consume queue {topic}/{qid} is behind ({have} < {want}):"
                    " rebuilding from the commit log",
                    topic=topic, qid=qid, have=have, want=want,
                )
            self._restart_state(snap)
            self.next_event_id = 1
            start = log.min_offset
            # The second pass drops the same topics again: start it with an empty trash.
            shutil.rmtree(os.path.join(self._cq_root, ".trash"), ignore_errors=True)
            self._replay(start, True)
        # Entries that point past the end of the log (a power loss can leave consume
        # queues ahead of the log) are dropped.
        for q in list(self._queues.values()):
            while q.max_offset > q.min_offset:
                off, size, _ = q.entry(q.max_offset - 1)
                if off + size <= log.end:
                    break
                q.truncate(q.max_offset - 1)
        self.last_checkpoint_offset = start
        self.trusted_from = start
        self._dirty = True

    def _load_checkpoint(self):
        # The checkpoint, or None (a full rebuild from the log) when it is missing, or
        # unreadable, not JSON or not shaped like a checkpoint: everything in it (topics,
        # pending delays, queue lengths) is also in the log.
        try:
            snap = read_json(self._meta_path)
        except (OSError, ValueError) as e:
            self.log.warn(
                "checkpoint {path} is unreadable ({error}): rebuilding from the commit log",
                path=self._meta_path, error=e,
            )
            return None
        if snap is None:
            return None
        if isinstance(snap, dict) and snap.get("version") not in (1, None):
            raise StoreError(f"unknown metadata version in {self._meta_path}")
        if not _checkpoint_shaped(snap):
            self.log.warn(
                "checkpoint {path} is not a valid checkpoint: rebuilding from the commit log",
                path=self._meta_path,
            )
            return None
        return snap

    def _restart_state(self, snap):
        # A full replay starts from the checkpoint's state, not from nothing: records that
        # retention already removed (the CREATE of an old topic) are only there. Replaying
        # the retained log over it in order gives the right end state.
        self.state.restore_state((snap or {}).get("state", {}))
        self.state.begin_full_replay()

    def _replay(self, start, full):
        # Every replayed record is checked (framing and body CRC). A damaged one is
        # reported and stepped over; damage with no sound record after it in the last
        # segment is the torn tail, cut off. A torn record in an older segment ends that
        # segment's replay.
        log = self.commitlog
        count = 0
        damaged_before = self.damaged_records
        for seg in [s for s in log.segments if s >= log.segment_start(start)]:
            is_last = seg == log.segments[-1]
            pos = start - seg if seg <= start else 0
            buf = log.read_segment(seg, pos)
            found = []  # (offset, detail, view) of damaged records in this segment
            good_end = seg + pos
            last = None
            try:
                for offset, view in fmt.scan_buffer(
                    memoryview(buf), seg + pos, on_damage=lambda *d: found.append(d)
                ):
                    self._replay_record(view)
                    good_end = offset + view.size
                    last = view
                    count += 1
            except fmt.ScanError as e:
                found.append((e.offset, f"{e.kind} record: {e.detail}", None))
            if is_last:
                tail = [d for d in found if d[0] >= good_end]
                found = [d for d in found if d[0] < good_end]
                if tail:
                    self.log.warn(
                        "truncating the commit log at {offset}: torn tail ({detail})",
                        offset=tail[0][0], detail=tail[0][1],
                    )
                    log.truncate(tail[0][0])
                if last is not None:
                    self._end_cut_write(last)
            for offset, detail, view in found:
                self._replay_damaged(offset, detail, view)
        if count:
            self.log.info("replayed {count} records from offset {start}", count=count, start=start)
        if self.damaged_records > damaged_before:
            self.log.error(
                "recovery found {n} damaged records from offset {start} (skipped; records"
                " below it are checked when read)",
                n=self.damaged_records - damaged_before, start=start,
            )

    def _end_cut_write(self, last):
        # The log's last record says more of its write follows: a crash cut the write.
        # It ends here, so the bit goes (the replication feed must not wait for more).
        if last.magic != fmt.MESSAGE_MAGIC or not last.sys_flag & fmt.SYSFLAG_BATCH_MORE:
            return
        flag = last.sys_flag & ~fmt.SYSFLAG_BATCH_MORE
        self.commitlog.patch(last.offset + fmt.OFF_SYS_FLAG, fmt.I32.pack(flag))
        self.log.warn("the last write in the log was cut at eventId {eid} (a crash mid-write)",
                      eid=last.event_id)

    def _replay_damaged(self, offset, detail, view):
        # A record whose body fails its CRC keeps its (sound) header: its eventId is
        # taken and a message keeps its consume-queue slot, as an entry of size 0 that
        # every reader skips (the queue stays dense, the records after it reachable).
        self.report_damage(offset, detail, view.event_id if view is not None else None)
        if view is None:
            return
        if view.event_id >= self.next_event_id:
            self.next_event_id = view.event_id + 1
        if view.magic == fmt.MESSAGE_MAGIC:
            # size 0: the entry names the damaged record but no reader reads it.
            q = self.queue(view.topic, view.queue_id)
            q.write(view.queue_offset, fmt.CQ_ENTRY.pack(view.offset, 0, 0))

    def _replay_record(self, view):
        if view.event_id >= self.next_event_id:
            self.next_event_id = view.event_id + 1
        if view.magic == fmt.ADMIN_MAGIC:
            self._apply_admin(view, True)
            return
        try:
            q = self.queue(view.topic, view.queue_id)
        except StoreError as e:  # written by an older version that let such names in
            self.log.error("record at {offset} not indexed: {e}", offset=view.offset, e=e)
            return
        entry = fmt.CQ_ENTRY.pack(view.offset, view.size, fmt.tag_hash_of(view.properties))
        q.write(view.queue_offset, entry)
        for cb in self._dispatch_listeners:
            cb(view.offset, view.topic, view.properties, view.store_ts)
        self.state.apply_record(view, True)


    # -- retention -----------------------------------------------------------------------

    def clean(self, max_age_s, min_reader_offset=None):
        """Delete sealed segments older than C{max_age_s} seconds that no reader is in and
        that are below the last checkpoint, then the consume-queue files below the new
        minimum. Returns the number of segments deleted."""
        log = self.commitlog
        now = self._clock()
        limit = self.last_checkpoint_offset
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
            for q in self._queues.values():
                q.delete_files_below(log.min_offset)
            self.log.info("retention deleted {n} segments; log starts at {min}", n=deleted, min=log.min_offset)
        return deleted


def _checkpoint_shaped(snap):
    """Return True when C{snap} has the fields and types of a version-1 checkpoint."""
    if not isinstance(snap, dict) or snap.get("version") != 1:
        return False
    if not all(type(snap.get(k)) is int and snap[k] >= 0 for k in ("logOffset", "nextEventId")):
        return False
    queues = snap.get("queues", {})
    if not isinstance(queues, dict) or not isinstance(snap.get("state", {}), dict):
        return False
    for qs in queues.values():
        if not isinstance(qs, dict):
            return False
        for qid, count in qs.items():
            if not (isinstance(qid, str) and qid.lstrip("-").isdigit() and type(count) is int):
                return False
    return True
