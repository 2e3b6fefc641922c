"""The write path of the store: records packed and appended to the commit log, their
consume-queue entries buffered, eventIds handed out."""

import time
import zlib

from twisted.internet import defer
from twisted.logger import Logger

from mqserver.errors import StoreError
from mqserver.store import format as fmt
from mqserver.store import native
from mqserver.store.latency import Latency
from mqserver.store.message import Message, PutResult
from mqserver.store.queues import safe_dir_name

_log = Logger()


#: The C speedup of the record packing (None: the Python loop, Writer._pack_py).
_pack = native.pack

# Module-level names for what every publish reads (a global is one lookup).
_MESSAGE_MAGIC = fmt.MESSAGE_MAGIC
_BLANK_SIZE = fmt.BLANK_SIZE
_crc32 = zlib.crc32
_perf_counter = time.perf_counter
#: One write in this many (chosen by its first eventId) is timed for write_latency.
_TIME_EVERY_MASK = 63
_tag_hash_of = fmt.tag_hash_of
_BORN_HOST_SIZE = fmt.HEADER_LAYOUT.field_size("born_host")
_MAX_PROPS = (1 << 8 * fmt.PROPS_LEN.size) - 1


class Writer:
    """Owns the appending of records: the eventId counter, the packing, the STOREHOST
    stamped in records, the size limit, the write latency, and the applying of admin
    records as they are written.

    Every message write goes through L{put}. The records are packed by the C speedup
    (C{_pack.c}) when it is built, else by L{_pack_py}, its reference: the choice is
    made once, at import (L{mqserver.speedups}).

    @ivar next_event_id: the eventId the next record gets.
    @ivar write_latency: a L{Latency} of writes (packing and pwrite), sampled: one
        write in 64.
    """

    def __init__(self, store, disk, notifier, checkpoints, *, store_host, max_message_size,
                 clock):
        """
        @param store: the L{mqserver.store.store.MessageStore} (its C{state} gets the
            admin records).
        @param disk: the L{mqserver.store.disk.DiskGuard} (refuses writes, hears of
            failed ones).
        @param notifier: the L{mqserver.store.notify.Notifier} (told of every write).
        @param checkpoints: the L{mqserver.store.checkpoint.Checkpoints} (every write
            asks for the next one).
        """
        self._store = store
        self._disk = disk
        self._notifier = notifier
        self._after_write = notifier.after_write
        # the notifier's very containers: listeners are added after the writer is made
        self._any_dispatch_listener = notifier.all_dispatch_listeners
        self._topic_dispatch_listeners = notifier.topic_dispatch_listeners
        self._dispatch = notifier.dispatch
        self._dispatch_one = notifier.dispatch_one
        self._checkpoints = checkpoints
        self.store_host = store_host
        self.max_message_size = max_message_size
        self._clock = clock
        self.next_event_id = 1
        self.write_latency = Latency()
        self._topic_tails = {}  # topic -> its name as records end with it (length, UTF-8)
        # (topic, queue id, queue offset, log offset, record bytes) of the newest record
        # when the last append wrote one message, else None: a consumer at the tail
        # takes it from here instead of reading it back (mqserver.broker.cursor)
        self.last_record = None
        self.commitlog = None
        self._table = None
        self._queues = None

    def open(self, commitlog, table):
        """Write to C{commitlog}, indexing into the L{QueueTable} C{table}."""
        self.last_record = None  # recovery may have cut the log's tail
        self.commitlog = commitlog
        self._table = table
        self._queues = table.queues  # the very dict: one lookup per publish

    def put(self, topic, queue_id, messages, now_ms=None, event_id=None, answer=None,
            ends=None):
        """Append C{messages} to (topic, queue id) as one write: every publish of every
        door ends here. A message is a L{Message}, or bytes: a message with only a body,
        born at the write.

        Returns the L{PutResult} itself when the write is as durable as asked once it is
        written (flush levels 0 and 1 without a sync gate), else a Deferred firing with
        it once it is; raises L{StoreError} when the write is refused or fails.
        C{now_ms} gives the store time (else the clock's). C{event_id} (a replication
        slave applying its master's records) gives the first eventId; it may skip ahead
        of L{next_event_id} but never go back.

        C{answer}: a callable that a write complete at once calls with the L{PutResult}
        as soon as its records are written, before the store's bookkeeping of them (the
        queue's entries, the listeners); C{put} then returns None. Nothing can see the
        store between the call and the bookkeeping (both run in this call, on the
        reactor's thread), so a client answered early sees what it would have seen; its
        round trip no longer waits for the bookkeeping. A failure in the bookkeeping
        after C{answer} is logged, not raised: the records stand and the client has its
        answer. A write that is not complete at once leaves C{answer} uncalled.

        C{ends} (a replication follower applying several of its master's writes at once,
        each with the same store time): bytes as long as C{messages}, nonzero where one
        of those writes ends, so that each keeps its end in the log as the master's did
        (L{fmt.SYSFLAG_BATCH_MORE}); None: the messages are one write."""
        if self._disk.refusal is not None:
            raise self._disk.refusal
        before = self.next_event_id  # a failed write takes no eventId, given or not
        if event_id is not None:
            self._force_event_id(event_id)
        q = self._queues.get((topic, queue_id))
        tail = self._topic_tails.get(topic)
        log = self.commitlog
        start = log.end
        event_id = self.next_event_id
        now = int(self._clock() * 1000) if now_ms is None else now_ms
        t0 = 0.0 if event_id & _TIME_EVERY_MASK else _perf_counter()
        try:
            if (q is not None and tail is not None and _pack is not None
                    and (packed := _pack.usual(
                        messages, queue_id, q.max_offset, start, log.open_end - start,
                        now, self.store_host, event_id, tail, self.max_message_size))):
                # The packing of one message (a list of one) to a queue written before,
                # into the segment written last: its record, queue entry and PutResult
                # in one C call (None when it is anything else); _write packs the rest.
                data, entries, result = packed
                size = len(data)
                qoff = q.max_offset
                log.append_open(data)  # which leaves nothing of a failed write
                self.next_event_id = event_id + 1
                self.last_record = (topic, queue_id, qoff, start, data)
                if t0:
                    self.write_latency.observe(_perf_counter() - t0)
            else:
                result, entries, q, qoff = self._write(topic, queue_id, messages,
                                                       _MESSAGE_MAGIC, 0, now, ends)
                size = sum(result.sizes)
        except BaseException as e:
            self.next_event_id = before
            if isinstance(e, OSError):
                raise self._write_failed(e) from None
            raise
        answered = answer is not None and self._notifier.complete_at_write
        if answered:
            try:
                answer(result)
            except Exception:  # the caller's fault; the bookkeeping must still be done
                _log.failure("answering the write of {topic} {queue_id} at {offset}",
                             topic=topic, queue_id=queue_id, offset=result.log_offsets)
        try:
            # The bookkeeping: the queue's entries and statistics, the dispatch
            # listeners, the checkpoint, then the readers (Notifier.after_write).
            q.write(qoff, entries)
            # Statistics count here, where every protocol's publish ends (once); the
            # messages are the queue's growth (ConsumeQueue.in_msgs).
            q.in_bytes += size
            # Dispatch listeners only hear of records with properties or of the topics
            # they named (Notifier.add_dispatch_listener): a publish of one bare body
            # (smss, NSQ) to any other topic skips them in a few bytecodes.
            if self._any_dispatch_listener:
                if len(messages) != 1:
                    self._dispatch(topic, result.log_offsets, messages, result.store_ts)
                elif type(m := messages[0]) is not bytes:
                    self._dispatch_one(result.log_offsets[0], topic, m.properties,
                                       result.store_ts)
                elif topic in self._topic_dispatch_listeners:
                    self._dispatch_one(result.log_offsets[0], topic, b"", result.store_ts)
            self._checkpoints.dirty = True
            result = self._after_write(result, topic, queue_id)
        except Exception:
            if not answered:
                raise
            _log.failure("after the write of {topic} {queue_id} at {offset}, answered",
                         topic=topic, queue_id=queue_id, offset=result.log_offsets)
        return None if answered else result

    def put_messages(self, topic, queue_id, messages, now_ms=None, event_id=None, ends=None):
        """L{put} for a caller that wants a Deferred whatever the flush level: it fires
        with the L{PutResult}, or fails with L{StoreError}."""
        return defer.maybeDeferred(self.put, topic, queue_id, messages, now_ms, event_id,
                                   None, ends)

    def put_admin(self, op, topic, body, now_ms=None, event_id=None):
        """Append one admin record; the state machine applies it before this returns.
        Returns a Deferred firing with the L{PutResult}. C{event_id}: as for L{put}."""
        before = self.next_event_id  # a failed write takes no eventId, given or not
        try:
            self._disk.check_writable()
            self._force_event_id(event_id)
            result = self._write(topic, -1, [Message(body=body)], fmt.ADMIN_MAGIC, op,
                                 now_ms)[0]
        except StoreError as e:
            self.next_event_id = before
            return defer.fail(e)
        except OSError as e:
            self.next_event_id = before
            return defer.fail(self._write_failed(e))
        log = self.commitlog
        for off, size in zip(result.log_offsets, result.sizes):
            self.apply_admin(fmt.RecordView(log.read(off, size)))
        self._checkpoints.dirty = True
        result = self._after_write(result, None, None)
        return result if type(result) is not PutResult else defer.succeed(result)

    def _write_failed(self, e):
        return self._disk.failed("write", e)

    def _force_event_id(self, event_id):
        if event_id is None:
            return
        if event_id < self.next_event_id:
            raise StoreError(f"eventId {event_id} is behind the log ({self.next_event_id})")
        self.next_event_id = event_id

    def _write(self, topic, queue_id, messages, magic, op, now_ms, ends=None):
        """Pack C{messages} as records and append them to the log: one pwrite per
        segment touched. Returns the L{PutResult}, the packed consume-queue entries, the
        queue (None for admin records) and its offset of the first message; nothing of a
        write that raises stays."""
        tail = self._topic_tails.get(topic)
        if tail is None:
            # First write of this name: no record (admin records too, which a slave
            # applies straight from its master) carries a name unfit for a directory.
            if not safe_dir_name(topic):
                raise StoreError(f"unsafe topic name {topic!r}")
            tbytes = topic.encode("utf-8")
            tail = self._topic_tails[topic] = fmt.TOPIC_LEN.pack(len(tbytes)) + tbytes
        now = int(self._clock() * 1000) if now_ms is None else now_ms
        log = self.commitlog
        if magic == _MESSAGE_MAGIC:
            q = self._queues.get((topic, queue_id)) or self._table.queue(topic, queue_id)
            qoff = q.max_offset
        else:
            q = None
            qoff = -1
        event_id = self.next_event_id
        t0 = 0.0 if event_id & _TIME_EVERY_MASK else _perf_counter()
        start = log.end
        if type(messages) is not list:
            messages = list(messages)
        try:
            if _pack is None:
                result, entries, data = self._pack_py(messages, magic, queue_id, op,
                                                      q is not None, qoff, now, tail,
                                                      event_id, ends)
            else:
                result, entries, data = self._pack_c(messages, magic, queue_id, op,
                                                     q is not None, qoff, now, tail,
                                                     event_id, ends)
        except BaseException:
            log.truncate(start)
            raise
        self.next_event_id = event_id + len(result.sizes)
        # a consumer at the tail takes a lone new record from here (see last_record)
        self.last_record = (topic, queue_id, qoff, result.log_offsets[0], data) if (
            q is not None and len(result.sizes) == 1) else None
        if t0:
            self.write_latency.observe(_perf_counter() - t0)
        return result, entries, q, qoff

    def _pack_c(self, messages, magic, queue_id, op, is_msg, qoff, now, tail, event_id,
                ends=None):
        # The C packing of any write (_pack.c, whose reference is _pack_py): same
        # returns.
        log = self.commitlog
        start = log.end
        packed = _pack.pack(
            messages, 0, magic, queue_id, op, is_msg, qoff, start, log.space_left(),
            _BLANK_SIZE, now, self.store_host, event_id, tail, self.max_message_size,
            _crc32, _tag_hash_of, ends)
        data, entries, offs, qoffs, sizes, stop = packed
        result = PutResult(event_id, queue_id, now, offs, qoffs, sizes)
        entries = [entries]
        while True:
            # stop 0: all packed; 1: the current segment is full (roll and go on); 2: a
            # body over the limit, refused before what was packed with it is written
            done = len(result.sizes)
            if stop == 2:
                m = messages[done]
                blen = len(m if type(m) is bytes else m.body)
                raise StoreError(f"message of {blen} bytes is over the limit")
            if sizes:
                log.append(data)
            if stop == 0:
                return result, b"".join(entries), data
            if not sizes and log.space_left() == log.segment_size:
                raise StoreError("a record larger than a whole segment")
            log.roll()
            data, ents, offs, qoffs, sizes, stop = _pack.pack(
                messages, done, magic, queue_id, op, is_msg,
                qoff + done if is_msg else qoff, log.end, log.space_left(),
                _BLANK_SIZE, now, self.store_host, event_id + done, tail,
                self.max_message_size, _crc32, _tag_hash_of, ends)
            if sizes:
                result.log_offsets += offs
                result.queue_offsets += qoffs
                result.sizes += sizes
            entries.append(ents)

    def _pack_py(self, messages, magic, queue_id, op, is_msg, qoff, now, tail, event_id,
                 ends=None):
        # The reference packing and writing (the C speedup _pack.c packs the same bytes):
        # one pwrite per segment touched. Returns the PutResult, the consume-queue
        # entries and the bytes of the last write (a single message's record).
        log = self.commitlog
        pos = log.end
        seg_left = log.space_left()
        seg_size = log.segment_size
        overhead = fmt.HEADER_SIZE + fmt.PROPS_LEN.size + len(tail)
        max_size = self.max_message_size
        host = self.store_host
        pack = fmt.HEADER.pack
        crc, crc_mask, props_len = zlib.crc32, fmt.CRC_MASK, fmt.PROPS_LEN.pack
        result = PutResult(event_id, queue_id, now, [], [], [])
        offsets, qoffsets, sizes = result.log_offsets, result.queue_offsets, result.sizes
        chunk = []
        entries = []
        last = len(messages) - 1
        for i, m in enumerate(messages):
            if type(m) is bytes:
                m = Message(body=m)
            sys_flag = m.sys_flag & ~fmt.SYSFLAG_BATCH_MORE
            if is_msg and i < last and not (ends and ends[i]):
                sys_flag |= fmt.SYSFLAG_BATCH_MORE
            body, props = m.body, m.properties
            blen = len(body)
            if blen > max_size:
                raise StoreError(f"message of {blen} bytes is over the limit")
            # refused where the C packing refuses them (struct would fail, pad or cut)
            if len(props) > _MAX_PROPS:
                raise ValueError(f"properties over {_MAX_PROPS} bytes")
            size = overhead + blen + len(props)
            if size + fmt.BLANK_SIZE > seg_left:
                if chunk:
                    log.append(b"".join(chunk))
                    chunk = []
                log.roll()
                pos = log.end
                seg_left = seg_size
            if len(m.born_host) != _BORN_HOST_SIZE:
                raise ValueError(f"born_host must be {_BORN_HOST_SIZE} bytes")
            chunk.append(pack(
                size, magic, crc(body) & crc_mask, queue_id, m.flag if is_msg else op,
                qoff, pos, sys_flag, m.born_ts or now, m.born_host, now, host,
                m.reconsume_times, event_id, blen,
            ))
            chunk.append(body)
            chunk.append(tail)
            chunk.append(props_len(len(props)))
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
        data = b""
        if chunk:
            data = b"".join(chunk)
            log.append(data)
        return result, b"".join(entries), data

    def apply_admin(self, view, replaying=False):
        """Apply the admin record C{view}: a DELETE drops the topic's queues, and the
        store's state machine gets every one (also as recovery replays them)."""
        if view.flag == fmt.OP_DELETE:
            self._table.drop_topic(view.topic)
        self._store.state.apply_record(view, replaying)
