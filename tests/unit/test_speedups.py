"""The C speedups are built and give, byte for byte, what the Python code they speed up
gives (mqserver/speedups.py)."""

import importlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from mqserver import speedups
from mqserver.broker import channels
from mqserver.store import format as fmt
from mqserver.store import writer as store_module
from mqserver.store.store import Message, MessageStore
from protocols.nsq import frames
from protocols.smss import views

_SPEEDUPS = ["protocols.smss._push", "protocols.nsq._frames", "mqserver.store._pack",
             "mqserver.broker._inflight", "mqserver.store._check"]
#: (module, what the hot path calls, the Python reference)
_PAIRS = [(views, "encode_records", "py_encode_records"),
          (frames, "delivery_frames", "py_delivery_frames"),
          (channels, "_take_fresh", "_take_fresh_py"), (channels, "_finish", "_finish_py")]


def _c_module(name):
    if speedups.pure_python():
        pytest.skip("MQSERVER_PURE_PYTHON is set: the Python code is under test")
    return importlib.import_module(name)


@pytest.mark.parametrize("name", _SPEEDUPS)
def test_speedup_is_built(name):
    """make test installs with a C compiler (setup.py): each speedup imports, so the
    equivalence tests below run the C code, not the fallback twice."""
    _c_module(name)


@pytest.mark.parametrize("module, name, reference", _PAIRS)
def test_speedup_is_used(module, name, reference):
    """The hot path calls the C speedup unless MQSERVER_PURE_PYTHON is set."""
    assert (getattr(module, name) is getattr(module, reference)) == speedups.pure_python()
    # the store picks its packing by whether the C module loaded
    assert (store_module._pack is None) == speedups.pure_python()


_key = st.binary(min_size=0, max_size=12).filter(lambda b: b"\x01" not in b and b"\x02" not in b)
_props = st.one_of(
    st.just(b""),
    # well-formed properties strings, the hidden delay key among them sometimes
    st.lists(st.tuples(st.one_of(_key, st.just(fmt.DELAY_PROPERTY)), _key), max_size=5).map(
        lambda kv: b"".join(k + b"\x01" + v + b"\x02" for k, v in kv)),
    # anything: empty items, keys without 0x01, no trailing 0x02
    st.binary(max_size=60),
)
_message = st.fixed_dictionaries({
    "queue_id": st.integers(-1, 1023),
    "queue_offset": st.integers(-1, 2**62),
    "sys_flag": st.sampled_from([0, fmt.SYSFLAG_SMSS_FRAMED, fmt.SYSFLAG_SMSS_FRAMED | 0x3, 0x2]),
    "store_ts": st.integers(0, 2**62),
    "event_id": st.integers(1, 2**62),
    "body": st.binary(max_size=300),
    "topic": st.binary(min_size=1, max_size=255),
    "properties": _props,
})


def _pack(m):
    return fmt.pack_record(
        magic=fmt.MESSAGE_MAGIC, flag=0, physical_offset=0, born_ts=0, born_host=fmt.NO_HOST,
        store_host=fmt.NO_HOST, reconsume_times=0, **m)


def _buffer_of(messages, gap):
    """Pack C{messages} into one buffer with C{gap} before each; return it and the
    records' C{[(pos, size), ...]}."""
    parts, locs, pos = [], [], 0
    for m in messages:
        rec = _pack(m)
        parts += [gap, rec]
        pos += len(gap)
        locs.append((pos, len(rec)))
        pos += len(rec)
    return b"".join(parts), locs


@settings(max_examples=300)
@given(st.lists(_message, max_size=8), st.binary(max_size=16))
def test_smss_push_encoding_matches_python(messages, gap):
    """Records at any positions of a buffer (with bytes between them) encode alike."""
    buf, locs = _buffer_of(messages, gap)
    assert views.encode_records(buf, locs) == views.py_encode_records(buf, locs)


def test_smss_push_rejects_records_past_the_buffer():
    """A record cut short is a clear ValueError, never a read past the buffer."""
    encode = _c_module("protocols.smss._push").encode
    rec = _pack({"queue_id": 0, "queue_offset": 0, "sys_flag": 0, "store_ts": 1, "event_id": 1,
                 "body": b"x" * 50, "topic": b"t", "properties": b"a\x01b\x02"})
    for cut in (0, 10, fmt.HEADER_SIZE, fmt.HEADER_SIZE + 50, len(rec) - 1):
        with pytest.raises(ValueError):
            encode(rec[:cut], [(0, len(rec))], ())
    with pytest.raises(ValueError):
        encode(rec, [(len(rec), 0)], ())
    with pytest.raises(ValueError):
        encode(rec, [(-1, 0)], ())
    assert encode(rec, [(0, len(rec))], ()) == views.py_encode_records(rec, [(0, len(rec))])


_delivery = st.tuples(
    st.integers(0, 2**63 - 1),  # ts_ns
    st.integers(0, 65535),  # attempts
    st.integers(0, 2**64 - 1),  # eventId
    st.binary(max_size=300),  # buffer
    st.integers(0, 300), st.integers(0, 300),
).map(lambda t: t[:4] + (min(t[4], len(t[3])), max(min(t[4], len(t[3])), min(t[5], len(t[3])))))


@settings(max_examples=300)
@given(st.lists(_delivery, max_size=8))
def test_nsq_delivery_frames_match_python(items):
    """Any deliveries (bodies anywhere in their buffers, any ids) frame alike."""
    assert frames.delivery_frames(items) == frames.py_delivery_frames(items)
    # memoryview and bytearray buffers too (a requeued message's body is a view)
    views_ = [(t[0], t[1], t[2], memoryview(bytearray(t[3])), t[4], t[5]) for t in items]
    assert frames.delivery_frames(views_) == frames.py_delivery_frames(items)


def test_nsq_delivery_frames_reject_bad_spans():
    """A span outside its buffer or an attempts count past u16 is an error, not a read."""
    message_frames = _c_module("protocols.nsq._frames").message_frames
    for bad in [(1, 1, 1, b"abc", 2, 4), (1, 1, 1, b"abc", -1, 2), (1, 1, 1, b"abc", 2, 1)]:
        with pytest.raises(ValueError):
            message_frames([(1, 1, 1, b"ok", 0, 2), bad], 2)
    with pytest.raises(OverflowError):
        message_frames([(1, 65536, 1, b"abc", 0, 3)], 2)
    with pytest.raises(TypeError):
        message_frames([(1, 1, 1, b"abc", 0)], 2)


# -- store record packing ---------------------------------------------------------------

_tags_props = st.one_of(
    st.just(b""),
    st.sampled_from([b"TAGS\x01tagA\x02", b"KEYS\x01k\x02TAGS\x01\xe4\xb8\xad\x02",
                     b"XTAGS\x01a\x02"]),
    _props,
)
_store_message = st.builds(
    Message,
    body=st.binary(max_size=700),
    properties=_tags_props,
    flag=st.integers(-(2**31), 2**31 - 1),
    sys_flag=st.integers(0, 2**31 - 1),
    reconsume_times=st.integers(0, 100),
    born_ts=st.integers(0, 2**40),
    born_host=st.binary(min_size=8, max_size=8),
)
# a batch, sent to a queue or as admin records (put_admin: one message, an op)
_puts = st.lists(
    st.one_of(
        st.tuples(st.just("msg"), st.sampled_from(["a", "topic-b"]), st.integers(0, 2),
                  st.lists(st.one_of(_store_message, st.binary(max_size=700)),  # bytes: a body
                           min_size=1, max_size=12)),
        st.tuples(st.just("admin"), st.sampled_from(["a", "z"]), st.just(-1),
                  st.binary(max_size=300)),
    ),
    min_size=1, max_size=6)


def _run_puts(path, puts, packer):
    s = MessageStore(str(path), Clock(), clock=lambda: 1_700_000_000.0, segment_size=4096,
                     cq_entries_per_file=10, max_message_size=600,
                     store_host=b"\x7f\x00\x00\x01\x00\x00\x30\x39")
    s.open()
    outcomes = []
    with _packer(packer):
        for kind, topic, qid, arg in puts:
            if kind == "msg":
                d = s.put_messages(topic, qid, arg)
            else:
                d = s.put_admin(fmt.OP_UPDATE, topic, arg)
            got = []
            d.addBoth(got.append)
            r = got[0]
            outcomes.append(
                ("error", str(r.value)) if hasattr(r, "value") else
                (r.event_id, r.queue_id, r.log_offsets, r.queue_offsets, r.sizes, r.store_ts))
    log = s.commitlog.read_segment  # every segment's bytes, and every queue's entries
    segments = [log(start) for start in s.commitlog.segments]
    queues = {key: s.read_entries(key[0], key[1], 0, 10_000) for key in sorted(s.queue_table.queues)}
    s.close()
    return outcomes, segments, queues


class _packer:
    """Use the Python (C{"py"}) or the C (C{"c"}) record packing inside the block."""

    def __init__(self, which):
        self.which = which

    def __enter__(self):
        self.saved = store_module._pack
        if self.which == "py":
            store_module._pack = None
        else:
            store_module._pack = _c_module("mqserver.store._pack")

    def __exit__(self, *exc):
        store_module._pack = self.saved


@settings(max_examples=150, deadline=None)
@given(_puts)
def test_store_packing_matches_python(tmp_path_factory, puts):
    """Batches across segment rolls, over-limit bodies (the whole batch fails), tagged
    messages, plain bodies and admin records: the C packing writes the same log, queues
    and results."""
    py = _run_puts(tmp_path_factory.mktemp("py"), puts, "py")
    c = _run_puts(tmp_path_factory.mktemp("c"), puts, "c")
    assert c == py


# -- channel in-flight table ------------------------------------------------------------


@settings(max_examples=200)
@given(st.lists(_message, max_size=8), st.binary(max_size=16))
def test_channel_take_matches_python(messages, gap):
    """Fresh records become the same in-flight entries and delivery items."""
    inflight = _c_module("mqserver.broker._inflight")
    buf, locs = _buffer_of(messages, gap)
    owner, deadline, now = object(), 12.5, 2.5
    results = []
    for take in (channels._take_fresh_py, inflight.take):
        table, out = {7: ["older"]}, []
        take(buf, locs, table, deadline, owner, now, 1_000_000, out)
        results.append((list(table.items()), out))
    assert results[0] == results[1]


def test_channel_take_rejects_records_past_the_buffer():
    take = _c_module("mqserver.broker._inflight").take
    rec = _pack({"queue_id": 0, "queue_offset": 0, "sys_flag": 0, "store_ts": 1, "event_id": 1,
                 "body": b"x" * 50, "topic": b"t", "properties": b""})
    for buf, pos in [(rec[:fmt.HEADER_SIZE + 10], 0), (rec, len(rec)), (rec, -1)]:
        table = {}
        with pytest.raises(ValueError):
            take(buf, [(pos, 0)], table, 1.0, None, 0.0, 1, [])
        assert table == {}


_fin_case = st.fixed_dictionaries({
    # in-flight messages: (eid, qid, qoff, owner index)
    "flight": st.lists(st.tuples(st.integers(0, 40), st.integers(0, 1), st.integers(0, 30),
                                 st.integers(0, 1)), max_size=25, unique_by=lambda t: t[0]),
    "floor": st.tuples(st.integers(0, 10), st.integers(0, 10)),
    "done": st.tuples(st.sets(st.integers(0, 35), max_size=8),
                      st.sets(st.integers(0, 35), max_size=8)),
    "fins": st.lists(st.integers(0, 45), max_size=30),
})


@settings(max_examples=300)
@given(_fin_case)
def test_channel_finish_matches_python(case):
    """A run of FINs (some unknown, some another consumer's, repeats) stops at the same
    place and leaves the same table, floors and done sets."""
    inflight = _c_module("mqserver.broker._inflight")
    owners = [object(), object()]
    results = []
    for finish in (channels._finish_py, inflight.finish):
        table = {eid: [eid, qid, qoff, 0, 100, 1, 9.0, owners[o], 1.0]
                 for eid, qid, qoff, o in case["flight"]}
        floor = dict(enumerate(case["floor"]))
        done = {q: set(d) for q, d in enumerate(case["done"])}
        n = finish(case["fins"], table, owners[0], floor, done)
        results.append((n, list(table.items()), floor, done))
    assert results[0] == results[1]


# -- the read-path record check ----------------------------------------------------------


@settings(max_examples=300)
@given(st.lists(_message, min_size=1, max_size=6), st.binary(max_size=16),
       st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 255)), max_size=3),
       st.booleans(), st.lists(st.tuples(st.integers(-5, 3000), st.integers(-5, 600)), max_size=2))
def test_record_check_matches_python(messages, gap, flips, check_crc, extra_locs):
    """The C check finds the same first damaged record as format.first_damaged, with bytes
    flipped anywhere (framing, CRC, body) and with locations that are no record at all."""
    check = _c_module("mqserver.store._check")
    buf, locs = _buffer_of(messages, gap)
    buf = bytearray(buf)
    for at, xor in flips:
        if at < len(buf):
            buf[at] ^= xor
    buf = bytes(buf)
    locs = locs + extra_locs
    assert check.first_damaged(buf, locs, check_crc) == fmt.first_damaged(buf, locs, check_crc)


def test_record_check_sees_a_flipped_body_byte():
    check = _c_module("mqserver.store._check")
    rec = bytearray(_pack({"queue_id": 0, "queue_offset": 0, "sys_flag": 0, "store_ts": 1,
                           "event_id": 1, "body": b"x" * 50, "topic": b"t", "properties": b""}))
    locs = [(0, len(rec))]
    assert check.first_damaged(bytes(rec), locs, True) == -1
    rec[fmt.HEADER_SIZE + 10] ^= 1
    assert check.first_damaged(bytes(rec), locs, True) == 0
    assert check.first_damaged(bytes(rec), locs, False) == -1  # framing only
