"""Write large, valid data directories fast, by packing records with numpy.

The layout is what the broker writes (checked by the audit itself finding nothing):
one admin record creating the topic (eventId 1), then messages of one size in batches of
C{batch}, each batch to one queue in turn, eventIds dense, BLANK-sealed segments of
C{segment_size}, consume-queue files of C{cq_entries} entries, and a checkpoint. About a
GiB every few seconds, where the store's writer takes minutes.
"""

import json
import os

import numpy as np

from mqserver.store import format as fmt

CQ_ENTRIES = 300_000


def _record(**kw):
    return np.frombuffer(fmt.pack_record(**kw), dtype=np.uint8)


def _be(values, dtype):
    return np.asarray(values).astype(dtype).view(np.uint8).reshape(len(values), -1)


class _Segments:
    def __init__(self, log_dir, size):
        self.log_dir, self.size = log_dir, size
        self.start, self.used, self.f = 0, 0, None
        self._open()

    def _open(self):
        if self.f:
            self.f.close()
        self.f = open(os.path.join(self.log_dir, fmt.segment_name(self.start)), "wb")
        self.used = 0

    def room(self, record_size):
        """Records of C{record_size} that still fit before the BLANK marker."""
        return max(0, (self.size - self.used - fmt.BLANK_SIZE) // record_size)

    def seal(self):
        self.f.write(fmt.BLANK.pack(self.size - self.used, fmt.BLANK_MAGIC))
        self.start += self.size
        self._open()

    def write(self, data):
        offset = self.start + self.used
        self.f.write(data)
        self.used += len(data)
        return offset

    def close(self):
        self.f.close()
        return self.start + self.used


def write_data_dir(path, messages, segment_size=1 << 30, body=200, topic="bench", queues=4, batch=1000,
                   cq_entries=CQ_ENTRIES, start_ms=1_700_000_000_000):  # fmt: skip
    """Write a data directory holding C{messages} messages; returns C{(records, log_bytes)}."""
    log_dir = os.path.join(path, "commitlog")
    os.makedirs(log_dir)
    tb = topic.encode()
    segs = _Segments(log_dir, segment_size)
    common = dict(sys_flag=0, born_host=fmt.NO_HOST, store_host=fmt.NO_HOST, reconsume_times=0, properties=b"")
    create = json.dumps({"queues": queues, "expireAt": 0, "perm": 6, "attrs": {}}).encode()
    segs.write(fmt.pack_record(magic=fmt.ADMIN_MAGIC, queue_id=-1, flag=fmt.OP_CREATE, queue_offset=-1,
                               physical_offset=0, born_ts=start_ms, store_ts=start_ms, event_id=1,
                               body=create, topic=tb, **common))  # fmt: skip
    size = fmt.record_size(body, len(tb), 0)
    templates = [
        _record(magic=fmt.MESSAGE_MAGIC, queue_id=0, flag=0, queue_offset=0, physical_offset=0, born_ts=0,
                store_ts=0, event_id=0, body=bytes([97 + i]) * body, topic=tb, **common)
        for i in range(26)
    ]  # fmt: skip
    cq = [[] for _ in range(queues)]
    qlen = [0] * queues
    event = 2
    for n in range(-(-messages // batch)):
        m = min(batch, messages - n * batch)
        q = n % queues
        done = 0
        while done < m:
            k = min(m - done, segs.room(size))
            if k == 0:
                segs.seal()
                continue
            block = np.tile(templates[n % 26], k).reshape(k, size)
            base = segs.start + segs.used
            phys = base + size * np.arange(k, dtype=np.int64)
            ids = event + np.arange(k, dtype=np.int64)
            ts = start_ms + ids * 3  # a few hundred thousand messages a minute
            block[:, 12:16] = _be(np.full(k, q), ">i4")
            block[:, 20:28] = _be(qlen[q] + np.arange(k), ">i8")
            block[:, 28:36] = _be(phys, ">i8")
            block[:, 40:48] = _be(ts, ">i8")
            block[:, 56:64] = _be(ts, ">i8")
            block[:, 76:84] = _be(ids, ">i8")
            segs.write(block.tobytes())
            cq[q].append(phys)
            qlen[q] += k
            event += k
            done += k
    end = segs.close()
    for q in range(queues):
        _write_cq(os.path.join(path, "consumequeue", topic, str(q)), np.concatenate(cq[q]) if cq[q] else [], size,
                  cq_entries)  # fmt: skip
    meta = {
        "version": 1, "logOffset": end, "nextEventId": event,
        "queues": {topic: {str(q): qlen[q] for q in range(queues)}},
        "state": {"topics": [{"name": topic, "queues": queues, "create_event_id": 1, "expire_at": 0,
                              "create_ts": start_ms}], "delays": []},
    }  # fmt: skip
    with open(os.path.join(path, "metadata.json"), "w") as f:
        json.dump(meta, f)
    return event - 1, end


def _write_cq(qdir, phys, size, per_file):
    os.makedirs(qdir)
    entries = np.zeros(len(phys), dtype=[("o", ">i8"), ("s", ">i4"), ("t", ">i8")])
    entries["o"], entries["s"] = phys, size
    for first in range(0, max(len(phys), 1), per_file):
        with open(os.path.join(qdir, fmt.segment_name(first * fmt.CQ_ENTRY_SIZE)), "wb") as f:
            f.write(entries[first : first + per_file].tobytes())
