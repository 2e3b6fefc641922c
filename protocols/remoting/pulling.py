"""PULL_MESSAGE (11): reading a consume queue with tag filtering (the pulls
parked for long polling are L{protocols.remoting.longpolls}'). The response body is the
stored records as they are: the store writes the RocketMQ 4.x MessageExt layout, so only
STOREHOST is patched (to the address the broker listens on now, in case it moved since
the record was written)."""

from dataclasses import dataclass

from mqserver import speedups
from mqserver import message as fmt

from protocols.remoting import codes

#: Entries looked at per pull while filtering by tag (RocketMQ's maxFilterMessageCount).
MAX_SCAN = 16000
#: Body bytes per pull; a pull returns at least one message even if it is larger.
MAX_BYTES = 1 << 20
_ENTRY = fmt.CQ_ENTRY_SIZE
#: Where a record's STOREHOST is (patched into every record a pull serves).
_HOST = fmt.OFF_STORE_HOST
_HOST_END = _HOST + fmt.HEADER_LAYOUT.field_size("store_host")


@dataclass(slots=True)
class PullResult:
    code: int
    next_offset: int
    min_offset: int
    max_offset: int
    body: bytes = b""
    count: int = 0
    remark: str = ""


def pull_once(messages, store_host, topic, queue_id, offset, max_nums, tag_codes):
    """Read up to C{max_nums} messages of (topic, queue) from C{offset} of C{messages}
    (the broker's L{mqserver.interfaces.IMessageLog}).

    @param tag_codes: set of tag hashes to keep, or None for every message.
    """
    q = messages.find_queue(topic, queue_id)
    if q is None or q.max_offset == 0:
        code = codes.PULL_OFFSET_MOVED if offset != 0 else codes.PULL_NOT_FOUND
        return PullResult(code, 0, 0, 0, remark="NO_MESSAGE_IN_QUEUE")
    lo, hi = q.min_offset, q.max_offset
    if offset < lo:
        return PullResult(codes.PULL_OFFSET_MOVED, lo, lo, hi, remark="OFFSET_TOO_SMALL")
    if offset == hi:
        return PullResult(codes.PULL_NOT_FOUND, offset, lo, hi, remark="OFFSET_OVERFLOW_ONE")
    if offset > hi:
        return PullResult(codes.PULL_OFFSET_MOVED, hi, lo, hi, remark="OFFSET_OVERFLOW_BADLY")
    max_nums = max(1, max_nums)
    if tag_codes is None and offset == hi - 1:
        # a consumer keeping up with a producer: the record just written, from memory
        newest = messages.newest_record(topic, queue_id, offset)
        if newest:
            return PullResult(codes.SUCCESS, hi, lo, hi,
                              records_body(newest, [(0, len(newest))], store_host), 1, "FOUND")
    if tag_codes is None:
        picked, pos = _pick(messages, topic, queue_id, offset, max_nums)
    else:
        picked, pos = _pick_tagged(messages, topic, queue_id, offset, max_nums, tag_codes)
    if not picked:
        if pos == offset:  # written but not yet readable (flush level 2)
            return PullResult(codes.PULL_NOT_FOUND, offset, lo, hi, remark="OFFSET_OVERFLOW_ONE")
        return PullResult(codes.PULL_RETRY_IMMEDIATELY, pos, lo, hi, remark="NO_MATCHED_MESSAGE")
    buf, locs = messages.read_records(picked)
    if not locs:
        if fmt.I64.unpack_from(picked, len(picked) - _ENTRY)[0] >= messages.min_offset:
            # Only damaged records (the store left them out and reported them): the
            # client moves past them as past unmatched ones.
            return PullResult(codes.PULL_RETRY_IMMEDIATELY, pos, lo, hi, remark="NO_MATCHED_MESSAGE")
        # the records were removed by retention meanwhile
        return PullResult(codes.PULL_OFFSET_MOVED, store_min(q, lo), lo, hi, remark="OFFSET_TOO_SMALL")
    return PullResult(codes.SUCCESS, pos, lo, hi, records_body(buf, locs, store_host), len(locs),
                      "FOUND")


def _pick(messages, topic, queue_id, pos, max_nums):
    """Return (packed entries, next offset): up to C{max_nums} readable entries from
    C{pos}, whose records take at most L{MAX_BYTES} (but at least one entry)."""
    chunks = []
    count = nbytes = 0
    while count < max_nums and nbytes < MAX_BYTES:
        want = max_nums - count
        entries = messages.read_entries(topic, queue_id, pos, want)
        if not entries:
            break
        n = len(entries) // _ENTRY
        first = fmt.I64.unpack_from(entries, 0)[0]
        last, size, _ = fmt.CQ_ENTRY.unpack_from(entries, len(entries) - _ENTRY)
        if nbytes + last + size - first <= MAX_BYTES:
            # The usual read: a queue's entries are in log order, so the records of all
            # of them lie within first..last+size and fit; no need to look at each.
            chunks.append(entries)
            count += n
            pos += n
            if n < want:  # the loop goes on (rare): it needs the exact byte count
                nbytes += sum(s for _, s, _ in fmt.CQ_ENTRY.iter_unpack(entries))
            continue
        for i in range(n):
            size = fmt.CQ_ENTRY.unpack_from(entries, i * _ENTRY)[1]
            if count and nbytes + size > MAX_BYTES:
                # the next record does not fit: the pull ends before it
                chunks.append(entries[:i * _ENTRY])
                return b"".join(chunks), pos + i
            count += 1
            nbytes += size
        chunks.append(entries)
        pos += n
    return (chunks[0] if len(chunks) == 1 else b"".join(chunks)), pos


def _pick_tagged(messages, topic, queue_id, pos, max_nums, tag_codes):
    """L{_pick} of the entries whose tag hash is in C{tag_codes}, looking at no more than
    L{MAX_SCAN} entries; the next offset is past the last entry looked at."""
    picked = []
    nbytes = 0
    scanned = 0
    while len(picked) < max_nums and scanned < MAX_SCAN and nbytes < MAX_BYTES:
        entries = messages.read_entries(topic, queue_id, pos, min(MAX_SCAN - scanned, 1000))
        if not entries:
            break
        for i in range(len(entries) // _ENTRY):
            off, size, tag = fmt.CQ_ENTRY.unpack_from(entries, i * _ENTRY)
            scanned += 1
            pos += 1
            if tag in tag_codes:
                picked.append(entries[i * _ENTRY:(i + 1) * _ENTRY])
                nbytes += size
                if len(picked) >= max_nums or nbytes >= MAX_BYTES:
                    break
    return b"".join(picked), pos


def py_records_body(buf, locs, store_host):
    """Return the PULL body: the records at C{locs} (C{(pos, size)} in C{buf}) one after
    another, each with its STOREHOST set to C{store_host}.

    The reference of the C speedup (C{_pull.c}) and its fallback."""
    body = bytearray()
    for p, s in locs:
        start = len(body)
        body += buf[p:p + s]
        if body[start + _HOST:start + _HOST_END] != store_host:
            body[start + _HOST:start + _HOST_END] = store_host
    return bytes(body)


_pull = speedups.load("protocols.remoting._pull")
if _pull is not None:
    _pull.configure(fmt.HEADER_SIZE, fmt.OFF_STORE_HOST, fmt.HEADER_LAYOUT.field_size("store_host"))
    records_body = _pull.records_body
else:
    records_body = py_records_body


def store_min(q, lo):
    return max(lo, q.min_offset)
