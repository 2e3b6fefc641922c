"""The smss and NSQ C speedups take the layout of the heads they write from their
protocol's construct schemas, through configure() (protocols/*/wire.py)."""

import struct

import pytest

from mqserver.store import format as fmt
from protocols.nsq import frames
from protocols.nsq import wire as nsq_wire
from protocols.smss import views, wire
from tests.unit.test_speedups import _c_module, _pack

TS_NS = 1795267410341448703


def _configure_push(push, offsets, prefix_size, head_size):
    push.configure(fmt.HEADER_SIZE, fmt.OFF_QUEUE_ID, fmt.OFF_QUEUE_OFFSET, fmt.OFF_SYS_FLAG,
                   fmt.OFF_STORE_TS, fmt.OFF_EVENT_ID, fmt.OFF_BODY_LEN,
                   fmt.SYSFLAG_SMSS_FRAMED, offsets, prefix_size, head_size)


def test_smss_push_takes_the_pushed_head_layout_from_configure():
    """_push.c writes the pushed record's head where configure() says (the offsets
    derived from protocols.smss.wire.PUSHED_RECORD), not at offsets of its own, and
    refuses offsets outside the head."""
    push = _c_module("protocols.smss._push")
    rec = _pack({"queue_id": 7, "queue_offset": 41, "sys_flag": 0, "store_ts": 1000,
                 "event_id": 3, "body": b"hello", "topic": b"t", "properties": b"k\x01v\x02"})
    locs = [(0, len(rec))]
    try:
        # The head in another order: next_pos, queue id, event id, ts, then H, S.
        _configure_push(push, (24, 16, 8, 0, 36, 32), 32, 40)
        out = push.encode(rec, locs, ())
        assert struct.unpack_from("<qqqqII", out) == (42, 7, 3, 1000, 1, 15)
        with pytest.raises(ValueError):
            _configure_push(push, (0, 8, 16, 25, 32, 36), 32, 40)
        with pytest.raises(RuntimeError):
            push.encode(rec, locs, ())
    finally:
        _configure_push(push, wire.PUSHED_HEAD_OFFSETS, wire.PUSHED_PREFIX_SIZE,
                        wire.PUSHED_RECORD_HEAD_STRUCT.size)
    assert push.encode(rec, locs, ()) == views.py_encode_records(rec, locs)


def test_nsq_frames_take_the_head_layout_from_configure():
    """_frames.c writes a message frame's head where configure() says (the offsets
    derived from protocols.nsq.wire.MESSAGE_FRAME), and refuses offsets outside it."""
    c = _c_module("protocols.nsq._frames")
    items = [(TS_NS, 3, 0xABC, b"xxhelloyy", 2, 7)]
    try:
        # id first, then attempts, timestamp, frame type.
        c.configure((0, 30, 22, 20, 4), 34)
        out = c.message_frames(items, 2)
        assert struct.unpack_from(">I16sHqI", out) == (35, b"%016x" % 0xABC, 3, TS_NS, 2)
        assert out[34:] == b"hello"
        with pytest.raises(ValueError):
            c.configure((0, 4, 8, 16, 19), 34)
        with pytest.raises(RuntimeError):
            c.message_frames(items, 2)
    finally:
        c.configure(nsq_wire.MESSAGE_FRAME_OFFSETS, nsq_wire.MESSAGE_FRAME_HEADER.size)
    assert frames.delivery_frames(items) == frames.py_delivery_frames(items)
