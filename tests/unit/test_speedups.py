"""The C speedups are built and give, byte for byte, what the Python code they speed up
gives (mqserver/speedups.py)."""

import array
import importlib
import struct
import zlib

import pytest
from construct import Struct
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from mqserver import speedups
from mqserver.broker import channels
from mqserver.store import format as fmt
from mqserver.store import index
from mqserver.store import native
from mqserver.store import writer as store_module
from mqserver.layout import layout
from mqserver.store.store import Message, MessageStore
from protocols.nsq import frames
from protocols.remoting import pulling
from protocols.smss import client_codec as smss_client
from protocols.smss import codec as smss_codec
from protocols.smss import views
from protocols.smss import wire as smss_wire
from protocols.smss.messages import Pub

_SPEEDUPS = ["protocols.smss._push", "protocols.smss._pub", "protocols.nsq._frames",
             "mqserver.store._pack", "mqserver.broker._inflight", "mqserver.store._check",
             "protocols.remoting._pull", "mqserver.store._hash", "protocols.remoting._header",
             "mqserver.store._index", "protocols.smss._feed"]
#: (module, what the hot path calls, the Python reference)
_PAIRS = [(views, "encode_records", "py_encode_records"),
          (smss_codec, "_one_pub", "py_one_pub"),
          (frames, "delivery_frames", "py_delivery_frames"),
          (channels, "_take_fresh", "_take_fresh_py"), (channels, "_finish", "_finish_py"),
          (pulling, "records_body", "py_records_body"),
          (fmt, "java_string_hash", "java_string_hash_py"),
          (fmt, "tag_hash_of", "tag_hash_of_py"), (fmt, "index_key_hash", "index_key_hash_py"),
          (index, "put_uniq", "put_uniq_py")]


def _c_module(name):
    if speedups.pure_python():
        pytest.skip("MQSERVER_PURE_PYTHON is set: the Python code is under test")
    return importlib.import_module(name)


@pytest.mark.parametrize("name", _SPEEDUPS)
def test_speedup_is_built(name):
    """make test installs with a C compiler (setup.py): each speedup imports, so the
    equivalence tests below run the C code, not the fallback twice."""
    _c_module(name)


def test_the_replication_streams_c_path_is_used():
    """The leader's feed and the follower take plain writes the C way unless
    MQSERVER_PURE_PYTHON is set (their Python path is the reference: test_feed_frames)."""
    from protocols.smss import binlog, replica
    assert (binlog.plain_frames is None) == speedups.pure_python()
    assert (binlog.plain_run is None) == speedups.pure_python()
    assert replica.plain_frames is binlog.plain_frames


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


def _smss_request(code, topic, trace, announced, payload, extra):
    return smss_client.encode_request(code, topic, trace, announced, payload) + extra


_smss_payload = st.one_of(
    # one record without headers, its S right or a little off
    st.tuples(st.binary(max_size=40), st.integers(-2, 2)).map(
        lambda t: smss_wire.MESSAGE_PREFIX_STRUCT.pack(max(0, len(t[0]) + t[1]), 0) + t[0]),
    # a record with a header count, or anything at all
    st.tuples(st.binary(max_size=30), st.integers(0, 3)).map(
        lambda t: smss_wire.MESSAGE_PREFIX_STRUCT.pack(len(t[0]), t[1]) + t[0]),
    st.binary(max_size=50),
)


@settings(max_examples=500)
@given(code=st.sampled_from([smss_wire.CMD_PUB] * 4 + [smss_wire.CMD_DELAY, smss_wire.CMD_SUB]),
       topic=st.binary(max_size=14), trace=st.binary(max_size=4), payload=_smss_payload,
       announced_delta=st.integers(-2, 2), extra=st.binary(max_size=3),
       max_topic=st.integers(0, 16), max_payload=st.integers(0, 60))
def test_smss_one_pub_matches_python(code, topic, trace, payload, announced_delta, extra,
                                     max_topic, max_payload):
    """Any request bytes and limits: the C fast decode of one PUB returns what the
    Python one does (the same topic, trace and payload, or None)."""
    data = _smss_request(code, topic, trace, max(0, len(payload) + announced_delta), payload,
                         extra)
    one_pub = _c_module("protocols.smss._pub").one_pub
    fast = one_pub(data, max_topic, max_payload)
    reference = smss_codec.py_one_pub(data, max_topic, max_payload)
    assert fast == reference
    if fast is not None:  # equality ignores messages, derived from the payload
        assert fast.messages == reference.messages


def test_smss_one_pub_takes_only_bytes_and_int_limits():
    """Not bytes (Twisted reads bytes): declined as by the Python code; limits that are
    not ints: TypeError; a module used before configure(): RuntimeError, not a guess."""
    one_pub = _c_module("protocols.smss._pub").one_pub
    payload = smss_wire.MESSAGE_PREFIX_STRUCT.pack(2, 0) + b"hi"
    pub = smss_client.encode_pub(b"t", payload)
    assert one_pub(pub, 10, 100) == Pub(b"t", b"", payload)
    for other in (bytearray(pub), memoryview(pub), pub.decode("latin-1")):
        assert one_pub(other, 10, 100) is None is smss_codec.py_one_pub(other, 10, 100)
    with pytest.raises(TypeError):
        one_pub(pub, "10", 100)
    with pytest.raises(TypeError):
        one_pub(pub, 10)
    configure = _c_module("protocols.smss._pub").configure
    try:
        with pytest.raises(ValueError):  # a field of another width than the C reads
            configure(20, ((0, 1), (1, 2), (3, 2), (19, 1)), 8,
                      smss_wire.MESSAGE_PREFIX_SPANS, 1, Pub)
        with pytest.raises(RuntimeError):  # a failed configure() leaves it off
            one_pub(pub, 10, 100)
    finally:
        configure(smss_wire.REQUEST_HEADER_SIZE, smss_wire.PUB_HEADER_SPANS,
                  smss_wire.MESSAGE_PREFIX_SIZE, smss_wire.MESSAGE_PREFIX_SPANS,
                  smss_wire.CMD_PUB, Pub)
    assert one_pub(pub, 10, 100) == Pub(b"t", b"", payload)
    assert type(one_pub(pub, 10, 100).payload) is bytes
    assert one_pub(pub, 10, 100).messages == [b"hi"]


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


# -- RocketMQ PULL bodies -----------------------------------------------------------------

_HOST = b"\x7f\x00\x00\x01\x00\x00\x30\x39"


@settings(max_examples=300)
@given(st.lists(_message, max_size=8), st.binary(max_size=16), st.booleans(),
       st.sampled_from([fmt.NO_HOST, _HOST]))
def test_pull_body_matches_python(messages, gap, reverse, host):
    """Records at any positions of a buffer (bytes between them, any order), with the
    stored host or another, make the same PULL body."""
    buf, locs = _buffer_of(messages, gap)
    if reverse:
        locs.reverse()
    body = pulling.records_body(buf, locs, host)
    assert body == pulling.py_records_body(buf, locs, host)
    assert len(body) == sum(s for _, s in locs)
    pos = 0
    for p, s in locs:
        assert body[pos:pos + s] == buf[p:p + fmt.OFF_STORE_HOST] + host + buf[p + fmt.OFF_STORE_HOST + 8:p + s]
        pos += s


def test_pull_body_rejects_bad_locations():
    """A record past the buffer, shorter than its header, or a host of the wrong size is
    a clear error, never a read past the buffer."""
    body = _c_module("protocols.remoting._pull").records_body
    rec = _pack({"queue_id": 0, "queue_offset": 0, "sys_flag": 0, "store_ts": 1, "event_id": 1,
                 "body": b"x" * 50, "topic": b"t", "properties": b"a\x01b\x02"})
    for bad in [(0, len(rec) + 1), (1, len(rec)), (-1, 10), (0, fmt.HEADER_SIZE - 1),
                (len(rec), 0)]:
        with pytest.raises(ValueError):
            body(rec, [(0, len(rec)), bad], _HOST)
    with pytest.raises(ValueError):
        body(rec, [(0, len(rec))], _HOST[:7])
    with pytest.raises(TypeError):
        body(rec, [(0,)], _HOST)
    assert body(rec, [], _HOST) == b""


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


def _walk_py(buf, pos, stop, limit):
    """The audit's record walk step (spark/audit/scan.py walk), as _check.walk's contract
    says: records with either magic and a size that ends within limit and buf."""
    limit, out = min(limit, len(buf)), []
    while pos < stop and 0 <= pos and pos + fmt.BLANK_SIZE <= len(buf):
        size, magic = fmt.BLANK.unpack_from(buf, pos)
        if magic not in (fmt.MESSAGE_MAGIC, fmt.ADMIN_MAGIC) or size < fmt.MIN_RECORD_SIZE or size > limit - pos:
            break
        out.append(pos)
        pos += size
    return out, pos


def _admin(body):
    return fmt.pack_record(
        magic=fmt.ADMIN_MAGIC, flag=fmt.OP_CREATE, physical_offset=0, born_ts=0, born_host=fmt.NO_HOST,
        store_host=fmt.NO_HOST, reconsume_times=0, queue_id=0, queue_offset=0, sys_flag=0, store_ts=1,
        event_id=1, body=body, topic=b"t", properties=b"")


@settings(max_examples=300)
@given(st.lists(st.one_of(_message, st.binary(max_size=40)), min_size=1, max_size=8),
       st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 255)), max_size=3),
       st.integers(0, 40), st.integers(0, 4000), st.integers(-10, 4000), st.integers(0, 60))
def test_record_walk_matches_python(items, flips, start, stop, limit, cut):
    """The C walk steps over the same records and stops at the same place as the
    Python step, through message and admin records, flipped bytes, stops and limits
    anywhere, and a buffer cut short."""
    check = _c_module("mqserver.store._check")
    buf = bytearray(b"".join(_pack(m) if isinstance(m, dict) else _admin(m) for m in items))
    for at, xor in flips:
        if at < len(buf):
            buf[at] ^= xor
    buf = bytes(buf[: max(0, len(buf) - cut)])
    start = min(start, len(buf))
    found, pos = check.walk(buf, start, stop, limit)
    assert (list(struct.unpack(f"={len(found) // 8}q", found)), pos) == _walk_py(buf, start, stop, limit)


def test_record_walk_steps_over_a_log():
    check = _c_module("mqserver.store._check")
    recs = [_pack({"queue_id": 0, "queue_offset": i, "sys_flag": 0, "store_ts": 1, "event_id": i + 1,
                   "body": b"x" * i, "topic": b"t", "properties": b""}) for i in range(50)]
    buf = b"".join(recs) + bytes(64)
    found, pos = check.walk(buf, 0, len(buf), len(buf))
    starts = [sum(map(len, recs[:i])) for i in range(50)]
    assert list(struct.unpack(f"={len(found) // 8}q", found)) == starts
    assert pos == sum(map(len, recs)), "it stops at the zeros after the last record"


@settings(max_examples=200)
@given(st.binary(max_size=600), st.lists(st.tuples(st.integers(0, 600), st.integers(0, 600)), max_size=12))
def test_crc32s_match_zlib(buf, spans):
    """The C CRCs of many spans give zlib's CRC-32 of each; a span outside the buffer is
    refused with ValueError, never read."""
    check = _c_module("mqserver.store._check")
    starts, lengths = array.array("q", [a for a, _ in spans]), array.array("q", [n for _, n in spans])
    if all(a + n <= len(buf) for a, n in spans):
        got = check.crc32s(buf, starts, lengths)
        assert list(array.array("I", got)) == [zlib.crc32(buf[a:a + n]) for a, n in spans]
    else:
        with pytest.raises(ValueError):
            check.crc32s(buf, starts, lengths)


def test_crc32s_refuse_spans_of_two_lengths():
    check = _c_module("mqserver.store._check")
    with pytest.raises(ValueError):
        check.crc32s(b"abc", array.array("q", [0, 1]), array.array("q", [1]))
    with pytest.raises(ValueError):
        check.crc32s(b"abc", array.array("q", [-1]), array.array("q", [1]))


# -- the C layouts come from configure() ---------------------------------------------------

#: The record schema with its header fields in reverse order: a layout no C code could
#: know unless configure() told it.
_REVERSED = Struct(*reversed(fmt.RECORD.subcons[:len(fmt.HEADER_LAYOUT.names)]),
                   *fmt.RECORD.subcons[len(fmt.HEADER_LAYOUT.names):])
_REVERSED_HEADER = layout(_REVERSED, prefix=True)
_REVERSED_ENTRY = layout(Struct(*reversed(fmt.CQ_ENTRY_SCHEMA.subcons)))


def _c_pack(pack, messages):
    return pack.pack(messages, 0, fmt.MESSAGE_MAGIC, 3, 0, True, 10, 1000, 1 << 20,
                     fmt.BLANK_SIZE, 1_700_000_000_000, b"\x7f\x00\x00\x01\x00\x00\x30\x39",
                     42, b"\x01t", 1 << 16, zlib.crc32, fmt.tag_hash_of)


def test_pack_writes_the_layout_it_is_configured_with():
    """_pack.c writes each header and entry field where configure() says: with the header
    fields reversed, what it packs parses with the reversed schema, field for field."""
    pack = _c_module("mqserver.store._pack")
    messages = [Message(body=b"abc", properties=b"TAGS\x01A\x02", flag=7, sys_flag=1,
                        reconsume_times=2, born_ts=5, born_host=b"12345678"), b"plain"]
    expected = _c_pack(pack, messages)
    try:
        native.configure_pack(pack, _REVERSED_HEADER, _REVERSED_ENTRY)
        data, entries, offsets, qoffsets, sizes, stop = _c_pack(pack, messages)
    finally:
        native.configure_pack(pack)
    assert (offsets, qoffsets, sizes, stop) == expected[2:]
    assert len(data) == len(expected[0])
    pos = 0
    for i, size in enumerate(sizes):
        mine = _REVERSED.parse(data[pos:pos + size])
        ref = fmt.RECORD.parse(expected[0][pos:pos + size])
        assert {k: v for k, v in mine.items() if k != "_io"} == {
            k: v for k, v in ref.items() if k != "_io"}
        entry = _REVERSED_ENTRY.struct.unpack_from(entries, i * fmt.CQ_ENTRY_SIZE)
        assert entry[::-1] == fmt.CQ_ENTRY.unpack_from(expected[1], i * fmt.CQ_ENTRY_SIZE)
        pos += size
    assert _c_pack(pack, messages) == expected  # the real layout again


def test_check_reads_the_layout_it_is_configured_with():
    """_check.c reads size, magic, CRC and body length where configure() says."""
    check = _c_module("mqserver.store._check")
    fields = dict(total_size=0, magic=fmt.MESSAGE_MAGIC, body_crc=fmt.body_crc(b"x" * 40),
                  queue_id=0, flag=0, queue_offset=0, physical_offset=0, sys_flag=0,
                  born_timestamp=0, born_host=fmt.NO_HOST, store_timestamp=0,
                  store_host=fmt.NO_HOST, reconsume_times=0, event_id=1, body=b"x" * 40,
                  topic="t", properties=b"")
    size = len(_REVERSED.build(fields))
    rec = bytearray(_REVERSED.build(dict(fields, total_size=size)))
    locs = [(0, size)]
    try:
        native.configure_check(check, _REVERSED_HEADER)
        sound = check.first_damaged(bytes(rec), locs, True)
        rec[_REVERSED_HEADER.size + 3] ^= 1
        flipped = check.first_damaged(bytes(rec), locs, True)
    finally:
        native.configure_check(check)
    assert (sound, flipped) == (-1, 0)
    assert check.first_damaged(bytes(rec), locs, True) == 0  # not a record of the real layout


@pytest.mark.parametrize("change", [
    lambda h, e: ((h[0], h[1] + ((0, 8),) + h[1][1:], *e)),   # one field too many
    lambda h, e: ((h[0], ((0, 8),) + h[1][1:], *e)),          # TotalSize 8 bytes wide
    lambda h, e: ((h[0], ((4, 4),) + h[1][1:], *e)),          # overlaps MagicCode
    lambda h, e: ((h[0] + 4, h[1], *e)),                      # 4 bytes nothing writes
    lambda h, e: ((*h, e[0], ((0, 4),) + e[1][1:], *e[2:])),   # entry offset 4 bytes wide
    lambda h, e: ((*h, *e[:2], 4, e[3])),                     # u32 properties length
])
def test_pack_configure_refuses_a_layout_it_cannot_write(change):
    """configure() checks every size against the width the C code writes and that the
    fields cover the header once; a refused call leaves the layout as it was."""
    pack = _c_module("mqserver.store._pack")
    header = (fmt.HEADER_SIZE, native.spans(fmt.HEADER_LAYOUT, native.PACK_FIELDS))
    rest = (fmt.CQ_ENTRY_SIZE, native.spans(fmt.CQ_LAYOUT, native.ENTRY_FIELDS),
            fmt.PROPS_LEN.size, fmt.SYSFLAG_BATCH_MORE)
    before = _c_pack(pack, [b"body"])
    with pytest.raises((ValueError, TypeError)):
        pack.configure(*change(header, rest))
    assert _c_pack(pack, [b"body"]) == before


def test_check_configure_refuses_a_layout_it_cannot_read():
    check = _c_module("mqserver.store._check")
    spans = native.spans(fmt.HEADER_LAYOUT, native.CHECK_FIELDS)
    with pytest.raises(ValueError):
        check.configure(fmt.HEADER_SIZE, ((0, 8),) + spans[1:], fmt.MIN_RECORD_SIZE, fmt.MESSAGE_MAGIC, fmt.ADMIN_MAGIC)
    with pytest.raises(ValueError):
        check.configure(fmt.HEADER_SIZE, spans, fmt.HEADER_SIZE - 1, fmt.MESSAGE_MAGIC, fmt.ADMIN_MAGIC)
    rec = _pack({"queue_id": 0, "queue_offset": 0, "sys_flag": 0, "store_ts": 1, "event_id": 1,
                 "body": b"x", "topic": b"t", "properties": b""})
    assert check.first_damaged(rec, [(0, len(rec))], True) == -1


@settings(max_examples=500)
@given(st.one_of(
    st.text(max_size=80),
    # lone surrogates and characters past the BMP (Java hashes their surrogate pairs)
    st.text(st.characters(min_codepoint=0xD7F0, max_codepoint=0x10FFFF), max_size=20),
    st.text(st.characters(max_codepoint=0x7F), min_size=60, max_size=300),
))
def test_java_string_hash_matches_python(s):
    hashed = _c_module("mqserver.store._hash").java_string_hash(s)
    assert hashed == fmt.java_string_hash_py(s)
    assert -(1 << 31) <= hashed < 1 << 31


def test_java_string_hash_known_values_in_c():
    h = _c_module("mqserver.store._hash").java_string_hash
    # Java: "TagA".hashCode(), and "\uD83D\uDE00" (one emoji, a surrogate pair)
    assert h("TagA") == 2598919
    assert h("\U0001F600") == 0xD83D * 31 + 0xDE00
    assert h("x" * 50) == fmt.java_string_hash_py("x" * 50)
    with pytest.raises(TypeError):
        h(b"TagA")


_tag_props = st.one_of(
    _props,
    # TAGS first, later, as a value, a key's tail or head, without a value, not UTF-8
    st.lists(st.sampled_from([b"TAGS\x01a", b"TAGS", b"TAGS\x01", b"xTAGS\x01b", b"TAGSx\x01c",
                              b"k\x01TAGS", b"TAGS\x01\xff\xfe", b"TAGS\x01\xc3\xa9\xf0\x9f\x98\x80",
                              b"", b"\x01", b"UNIQ_KEY\x01u"]), max_size=5).map(b"\x02".join),
)


@settings(max_examples=1000)
@given(_tag_props)
def test_tag_hash_of_matches_python(props):
    tag_hash_of = _c_module("mqserver.store._hash").tag_hash_of
    assert tag_hash_of(props) == fmt.tag_hash_of_py(props)
    assert tag_hash_of(memoryview(props)) == fmt.tag_hash_of_py(memoryview(props))


@settings(max_examples=500)
@given(st.text(max_size=20), st.text(max_size=20) | st.text(
    st.characters(min_codepoint=0xD7F0, max_codepoint=0x10FFFF), max_size=10))
def test_index_key_hash_matches_python(topic, key):
    index_key_hash = _c_module("mqserver.store._hash").index_key_hash
    assert index_key_hash(topic, key) == fmt.index_key_hash_py(topic, key)


def _key_hashing_to_min_value(topic):
    """A key whose "topic#key" has Java's hashCode Integer.MIN_VALUE."""
    n = 5
    target = ((1 << 31) - (fmt.java_string_hash_py(topic + "#") & 0xFFFFFFFF) * 31**n) % (1 << 32)
    digits = []
    for i in range(n):
        place = 31 ** (n - 1 - i)
        digits.append(min(0xD7FF, target // place))
        target -= digits[-1] * place
    return "".join(map(chr, digits))


def test_index_key_hash_of_integer_min_value_is_zero():
    """abs(Integer.MIN_VALUE) stays negative in Java; RocketMQ's index uses 0 for it."""
    key = _key_hashing_to_min_value("t")
    assert fmt.java_string_hash_py("t#" + key) == -(1 << 31)
    index_key_hash = _c_module("mqserver.store._hash").index_key_hash
    assert index_key_hash("t", key) == fmt.index_key_hash_py("t", key) == 0
    with pytest.raises(TypeError):
        index_key_hash("t", b"k")


def _usual(pack, messages, room=1 << 20, max_size=1 << 16):
    return pack.usual(messages, 3, 10, 1000, room, 1_700_000_000_000,
                      b"\x7f\x00\x00\x01\x00\x00\x30\x39", 42, b"\x01t", max_size)


@settings(max_examples=100)
@given(st.one_of(_store_message, st.binary(max_size=700)))
def test_pack_usual_is_pack_of_one_message(message):
    """usual() gives pack()'s record and entry of a list of one message, and the PutResult
    Writer._append makes of them."""
    pack = _c_module("mqserver.store._pack")
    record, entry, result = _usual(pack, [message])
    data, entries, offsets, qoffsets, sizes, stop = _c_pack(pack, [message])
    assert (record, entry, stop) == (data, entries, 0)
    assert type(result) is store_module.PutResult
    assert (result.event_id, result.queue_id, result.store_ts, result.log_offsets,
            result.queue_offsets, result.sizes) == (42, 3, 1_700_000_000_000, offsets,
                                                    qoffsets, sizes)


def test_pack_usual_leaves_the_rest_to_the_general_path():
    """None (nothing done) for what is not one message in a list, a record that leaves no
    room for a BLANK marker in the segment, and a body over the limit."""
    pack = _c_module("mqserver.store._pack")
    one = [b"x" * 100]
    size = len(_usual(pack, one)[0])
    assert _usual(pack, one, room=size + fmt.BLANK_SIZE) is not None
    for messages, room, max_size in [([], 1 << 20, 1 << 16), ([b"a", b"b"], 1 << 20, 1 << 16),
                                     ((b"a",), 1 << 20, 1 << 16), (one, size + 7, 1 << 16),
                                     (one, 0, 1 << 16), (one, -5, 1 << 16), (one, 1 << 20, 99)]:
        assert _usual(pack, messages, room, max_size) is None
    with pytest.raises(TypeError):
        pack.usual(one)
