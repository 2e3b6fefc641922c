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


class Writer:
    """Owns the appending of records: the eventId counter, the packing (C speedup or
    the Python loop), the STOREHOST stamped in records, the size limit, the write
    latency, and the applying of admin records as they are written.

    @ivar next_event_id: the eventId the next record gets.
    @ivar write_latency: a L{Latency} of writes (packing, pwrite, indexing), sampled:
        one write in 64.
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
        self._after_write = notifier.after_write
        self._written = notifier.written
        #: put_messages_now may take its short path (flush levels 0 and 1; the
        #: equivalence tests turn it off to compare).
        self.usual_path = notifier.flush_level < 2
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

    def put_messages(self, topic, queue_id, messages, now_ms=None, event_id=None):
        """Append C{messages} to (topic, queue id) as one write. A message is a
        L{Message}, or bytes: a message with only a body, born at the write.

        Returns a Deferred firing with a L{PutResult} once the write is as durable as the
        flush level asks; it fails with L{StoreError} when the write or fsync fails.
        C{event_id} (a replication slave applying its master's records) gives the first
        eventId; it may skip ahead of L{next_event_id} but never go back.
        """
        try:
            result = self.put_messages_now(topic, queue_id, messages, now_ms, event_id)
        except StoreError as e:
            return defer.fail(e)
        return result if type(result) is not PutResult else defer.succeed(result)

    def put_messages_now(self, topic, queue_id, messages, now_ms=None, event_id=None,
                         answer=None):
        """L{put_messages} for a caller that answers at once when it can: returns the
        L{PutResult} itself when the write is already as durable as the flush level asks
        (levels 0 and 1), else a Deferred firing with it; raises L{StoreError} when the
        write is refused or fails.

        C{answer}: a callable the usual publish calls with the L{PutResult} as soon as
        the record is written, before the store's bookkeeping of it (the queue's entry,
        the listeners), and then returns None; any other write returns its result as
        above and leaves C{answer} uncalled. Nothing can see the store between the call
        and the bookkeeping (both run in this call, on the reactor's thread), so a client
        answered early sees what it would have seen; its round trip no longer waits for
        the bookkeeping. A failure in the bookkeeping after C{answer} is logged, not
        raised: the record stands and its client has its answer."""
        if self._disk.refusal is not None:
            raise self._disk.refusal
        # The usual publish in short, the rest through _put_any (the reference, which
        # gives the same bytes, results and calls): one message (a list of one), at the
        # next eventId and the time of the write, to a queue that is open of a topic
        # written before, packed by C (_pack.usual, which also makes the PutResult) into
        # the segment written last, at flush level 0 or 1 (usual_path).
        q = self._queues.get((topic, queue_id))
        tail = self._topic_tails.get(topic)
        if (tail is None or q is None or now_ms is not None or event_id is not None
                or _pack is None or not self.usual_path):
            return self._put_any(topic, queue_id, messages, now_ms, event_id)
        log = self.commitlog
        start = log.end
        event_id = self.next_event_id
        qoff = q.max_offset
        now = int(self._clock() * 1000)
        t0 = 0.0 if event_id & _TIME_EVERY_MASK else _perf_counter()
        # None: not a list of one, or it needs a new segment (open_end - end is the room
        # left in the open segment, none when none is open), or a body over the limit;
        # nothing is written yet
        packed = _pack.usual(messages, queue_id, qoff, start, log.open_end - start, now,
                             self.store_host, event_id, tail, self.max_message_size)
        if packed is None:
            return self._put_any(topic, queue_id, messages, None, None)
        record, entry, result = packed
        try:
            log.append_open(record)  # which leaves nothing of a failed write
        except OSError as e:
            raise self._write_failed(e) from None
        self.next_event_id = event_id + 1
        self.last_record = (topic, queue_id, qoff, start, record)
        if t0:  # the write itself: what follows is the answer and the bookkeeping
            self.write_latency.observe(_perf_counter() - t0)
        if answer is not None:
            try:
                answer(result)
            except Exception:  # the caller's fault; the bookkeeping must still be done
                _log.failure("answering the write of {topic} {queue_id} at {offset}",
                             topic=topic, queue_id=queue_id, offset=start)
            result = None
        try:
            size = len(record)
            q.add(entry, size)
            # see _append: dispatch listeners hear of records with properties or of
            # topics they named
            if self._any_dispatch_listener:
                m = messages[0]
                if type(m) is not bytes:
                    self._dispatch_one(start, topic, m.properties, now)
                elif topic in self._topic_dispatch_listeners:
                    self._dispatch_one(start, topic, b"", now)
            self._checkpoints.dirty = True
            self._written(start + size, topic, queue_id)
        except Exception:
            if answer is None:
                raise
            _log.failure("after the write of {topic} {queue_id} at {offset}, answered",
                         topic=topic, queue_id=queue_id, offset=start)
        return result

    def _put_any(self, topic, queue_id, messages, now_ms, event_id):
        # put_messages_now of any write (the refusal already checked).
        if event_id is not None:
            self._force_event_id(event_id)
        try:
            result = self._append(topic, queue_id, messages, _MESSAGE_MAGIC, 0, now_ms)
        except OSError as e:
            raise self._write_failed(e) from None
        return self._after_write(result, topic, queue_id)

    def put_admin(self, op, topic, body, now_ms=None, event_id=None):
        """Append one admin record; the state machine applies it before this returns.
        Returns a Deferred firing with the L{PutResult}. C{event_id}: as for
        L{put_messages}."""
        try:
            self._disk.check_writable()
            self._force_event_id(event_id)
            msg = Message(body=body)
            result = self._append(topic, -1, [msg], fmt.ADMIN_MAGIC, op, now_ms)
        except StoreError as e:
            return defer.fail(e)
        except OSError as e:
            return defer.fail(self._write_failed(e))
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
            tail = self._topic_tails[topic] = fmt.TOPIC_LEN.pack(len(tbytes)) + tbytes
        now = int(self._clock() * 1000) if now_ms is None else now_ms
        log = self.commitlog
        is_msg = magic == _MESSAGE_MAGIC
        if is_msg:
            q = self._queues.get((topic, queue_id)) or self._table.queue(topic, queue_id)
            first_qoff = q.max_offset
        else:
            first_qoff = -1
        event_id = self.next_event_id
        t0 = 0.0 if event_id & _TIME_EVERY_MASK else _perf_counter()
        start = log.end
        if type(messages) is not list:
            messages = list(messages)
        single = None  # the record's bytes when this append writes one message
        try:
            if _pack is None:
                result, entries, data = self._pack_py(messages, magic, queue_id, op, is_msg,
                                                      first_qoff, now, tail, event_id)
                if is_msg and len(result.sizes) == 1:
                    single = data
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
                    if is_msg and len(sizes) == 1:
                        single = data
                else:
                    result, entries = self._pack_c_rest(
                        messages, magic, queue_id, op, is_msg, first_qoff, now, tail,
                        event_id, packed)
        except BaseException:
            log.truncate(start)
            raise
        self.next_event_id = event_id + len(result.sizes)
        self.last_record = None if single is None else (
            topic, queue_id, first_qoff, start, single)
        if is_msg:
            q.write(first_qoff, entries)
            # Statistics count here, where every protocol's publish ends (once); the
            # messages are the queue's growth (ConsumeQueue.in_msgs).
            q.in_bytes += sum(result.sizes)
            # Dispatch listeners only hear of records with properties or of the topics
            # they named (Notifier.add_dispatch_listener): a publish of one bare body
            # (smss, NSQ) to any other topic skips them in a few bytecodes.
            if self._any_dispatch_listener and (
                    len(messages) != 1 or type(messages[0]) is not bytes
                    or topic in self._topic_dispatch_listeners):
                self._dispatch(topic, result.log_offsets, messages, now)
        else:
            for off, size in zip(result.log_offsets, result.sizes):
                self.apply_admin(fmt.RecordView(log.read(off, size)))
        self._checkpoints.dirty = True
        if t0:
            self.write_latency.observe(_perf_counter() - t0)
        return result
    def _pack_py(self, messages, magic, queue_id, op, is_msg, qoff, now, tail, event_id):
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

    def apply_admin(self, view, replaying=False):
        """Apply the admin record C{view}: a DELETE drops the topic's queues, and the
        store's state machine gets every one (also as recovery replays them)."""
        if view.flag == fmt.OP_DELETE:
            self._table.drop_topic(view.topic)
        self._store.state.apply_record(view, replaying)
