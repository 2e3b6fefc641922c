"""Store recovery at start-up: the checkpoint loaded, the commit log replayed from it."""


from mqserver.errors import StoreError
from mqserver.store import format as fmt
from mqserver.store.logs import store_logger


class Recovery:
    """Owns one start-up's replay: it loads the checkpoint, replays the log from the
    offset it is current to (or the whole retained log when it is missing, damaged or
    ahead of the log, or a queue is shorter than it says), rebuilds the consume queues,
    the next eventId and the state machine, cuts what follows the last sound record and
    reports damaged records.

    Recovery leaves its results in the store's parts: the writer's C{next_event_id},
    the reader's C{trusted_from} and damage counts, the checkpoints' last offset.
    """

    def __init__(self, store):
        """
        @param store: the L{mqserver.store.store.MessageStore}, its files open.
        """
        self.log = store_logger(self)
        self._store = store
        self.commitlog = store.commitlog
        self._writer = store.writer
        self._reader = store.reader
        self._table = store.queue_table
        self._checkpoints = store.checkpoints
        self._dispatch = store.notifier.dispatch_one
        self._replayed_deletes = set()  # topics a DELETE record removed during replay

    @property
    def state(self):
        return self._store.state

    def run(self):
        """Recover (synchronously)."""
        log = self.commitlog
        snap = self._checkpoints.load()
        full = snap is None
        behind = []
        if snap is not None:
            try:
                self.state.restore_state(snap.get("state", {}))
            except (ValueError, TypeError, KeyError, AttributeError) as e:
                self.log.warn(
                    "checkpoint {path} holds a state that cannot be loaded ({error}):"
                    " rebuilding from the commit log", path=self._checkpoints.path, error=e,
                )
                self.state.restore_state({})
                snap, full = None, True
        if snap is not None:
            for topic, qs in snap.get("queues", {}).items():
                for qid, count in qs.items():
                    q = self._table.queue(topic, int(qid))
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
        self._writer.next_event_id = 1 if full else snap["nextEventId"]
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
            self._writer.next_event_id = 1
            start = log.min_offset
            # The second pass drops the same topics again: start it with an empty trash.
            self._table.empty_trash()
            self._replay(start, True)
        # Entries that point past the end of the log (a power loss can leave consume
        # queues ahead of the log) are dropped.
        self._table.truncate_past(log.end)
        self._checkpoints.last_checkpoint_offset = start
        self._reader.trusted_from = start
        self._checkpoints.dirty = True

    def _restart_state(self, snap):
        # A full replay starts from the checkpoint's state, not from nothing: records that
        # retention already removed (the CREATE of an old topic) are only there. Replaying
        # the retained log over it in order gives the right end state.
        self.state.restore_state((snap or {}).get("state", {}))
        self.state.begin_full_replay()

    def _replay(self, start, full):
        # Every replayed record is checked (framing and body CRC). A damaged one is
        # reported and stepped over (a run of zeros too); whatever follows the last
        # sound record of the last segment is the tail, cut off. A torn record in an
        # older segment ends that segment's replay.
        log = self.commitlog
        count = 0
        damaged_before = self._reader.damaged_records
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
                self._cut_tail(seg, good_end, tail, buf[good_end - seg - pos :])
                if last is not None:
                    self._end_cut_write(last)
            for offset, detail, view in found:
                self._replay_damaged(offset, detail, view)
        if count:
            self.log.info("replayed {count} records from offset {start}", count=count, start=start)
        if self._reader.damaged_records > damaged_before:
            self.log.error(
                "recovery found {n} damaged records from offset {start} (skipped; records"
                " below it are checked when read)",
                n=self._reader.damaged_records - damaged_before, start=start,
            )

    def _cut_tail(self, seg, good_end, tail, rest):
        # The log ends after its last sound record, whatever follows it in the last
        # segment: a torn record, garbage, or zeros (a file the crash extended but never
        # wrote). Kept, they would hide every record written after them from the next
        # full rebuild, which would then hand out their eventIds again.
        log = self.commitlog
        if log.end <= good_end:
            return
        sealed = (not tail and len(rest) >= fmt.BLANK_SIZE
                  and fmt.BLANK.unpack_from(rest)[1] == fmt.BLANK_MAGIC)
        keep = good_end + fmt.BLANK_SIZE if sealed else good_end
        if log.end > keep:
            self.log.warn(
                "truncating the commit log at {offset}: cut {size} bytes after the last"
                " sound record of segment {segment} ({detail})",
                offset=keep, size=log.end - keep, segment=fmt.segment_name(seg),
                detail=tail[0][1] if tail else (
                    "bytes after its end-of-segment marker" if sealed else fmt.ZEROED),
            )
        log.truncate(good_end)
        if sealed:
            # A crash between sealing the segment and the first write of the next: the
            # segment stays sealed (roll writes the same BLANK again) and the next record
            # starts the next segment, where readers look for it.
            log.roll()

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
        self._reader.report_damage(offset, detail, view.event_id if view is not None else None)
        if view is None:
            return
        if view.event_id >= self._writer.next_event_id:
            self._writer.next_event_id = view.event_id + 1
        if view.magic == fmt.MESSAGE_MAGIC:
            # size 0: the entry names the damaged record but no reader reads it.
            q = self._table.queue(view.topic, view.queue_id)
            q.write(view.queue_offset, fmt.CQ_ENTRY.pack(view.offset, 0, 0))

    def _replay_record(self, view):
        if view.event_id >= self._writer.next_event_id:
            self._writer.next_event_id = view.event_id + 1
        if view.magic == fmt.ADMIN_MAGIC:
            if view.flag == fmt.OP_DELETE:
                self._replayed_deletes.add(view.topic)
            self._writer.apply_admin(view, True)
            return
        try:
            q = self._table.queue(view.topic, view.queue_id)
        except StoreError as e:  # written by an older version that let such names in
            self.log.error("record at {offset} not indexed: {e}", offset=view.offset, e=e)
            return
        entry = fmt.CQ_ENTRY.pack(view.offset, view.size, fmt.tag_hash_of(view.properties))
        q.write(view.queue_offset, entry)
        self._dispatch(view.offset, view.topic, view.properties, view.store_ts)
        self.state.apply_record(view, True)
