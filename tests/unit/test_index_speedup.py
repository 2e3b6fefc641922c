"""The key index's usual put in C (C{_index.put_uniq}) writes, byte for byte, what its
Python reference (L{index.put_uniq_py}) writes, and the index service gives the same
files and lookups with either."""

import importlib
import mmap
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqserver import speedups
from mqserver.store import format as fmt
from mqserver.store import index
from mqserver.store import native
from mqserver.store.index import PUT_DONE, PUT_ELSEWHERE, PUT_FULL, PUT_NONE, IndexService


def _c_put():
    if speedups.pure_python():
        pytest.skip("MQSERVER_PURE_PYTHON is set: the Python code is under test")
    return importlib.import_module("mqserver.store._index").put_uniq


def _fresh_map(slots=7, entries=16):
    m = mmap.mmap(-1, fmt.index_file_size(slots, entries))
    fmt.INDEX_HEADER.pack_into(m, 0, 0, 0, -1, -1, slots, 1)
    return m


_value = st.one_of(
    st.text("0123456789ABCDEF", max_size=32).map(str.encode),  # what clients send
    st.binary(max_size=12).filter(lambda b: b"\x02" not in b),  # anything, UTF-8 or not
)
_item = st.one_of(
    st.tuples(st.just(b"UNIQ_KEY"), _value),
    st.tuples(st.just(b"KEYS"), _value),
    st.tuples(st.sampled_from([b"TAGS", b"XUNIQ_KEY", b"UNIQ_KEYS", b"WAIT"]), _value),
)
_props = st.one_of(
    st.lists(_item, max_size=4).map(lambda items: b"".join(
        k + b"\x01" + v + b"\x02" for k, v in items)),
    st.lists(_item, min_size=1, max_size=3).map(lambda items: b"\x02".join(
        k + b"\x01" + v for k, v in items)),  # without the trailing 0x02
    st.binary(max_size=40),  # damaged: keys without 0x01, stray bytes
)
_topic = st.sampled_from(["T", "TopicTest", "%RETRY%G", "t\u00e9", "\U0001f600"])
# (topic, properties, offset step (<= 0: a replay), ms step)
_puts = st.lists(st.tuples(_topic, _props, st.integers(-3, 500), st.integers(-5000, 10**7)),
                 min_size=1, max_size=60)


@settings(max_examples=300, deadline=None)
@given(_puts, st.sampled_from([(7, 16), (1, 3), (500, 2)]))
def test_c_put_writes_what_python_writes(puts, size):
    """Whatever the properties, the C put gives the Python put's answer and bytes; where
    it leaves a record to Python (KEYS, a key that is not ASCII), the Python put then
    gives what it would have given alone."""
    c_put = _c_put()
    c_map, py_map = _fresh_map(*size), _fresh_map(*size)
    offset, ts = 100, 1_700_000_000_000
    for topic, props, step, dt in puts:
        offset += step
        ts += dt
        want = index.put_uniq_py(py_map, topic, props, offset, ts)
        got = c_put(c_map, topic, props, offset, ts)
        if got == PUT_ELSEWHERE and want != PUT_ELSEWHERE:
            key = index.uniq_key(props)
            assert b"KEYS\x01" not in props and any(b >= 0x80 for b in key)
            got = index.put_uniq_py(c_map, topic, props, offset, ts)
        assert got == want
        assert c_map[:] == py_map[:]


def test_c_put_reads_the_file_it_is_given():
    """The header is the state: puts by C and by Python may alternate on one file, and a
    full file takes nothing."""
    c_put = _c_put()
    m, ref = _fresh_map(3, 4), _fresh_map(3, 4)
    props = lambda i: b"TAGS\x01a\x02UNIQ_KEY\x01K%d\x02" % i
    for i in range(6):
        put = c_put if i % 2 else index.put_uniq_py
        assert put(m, "T", props(i), 10 * i, 1000 * i) == (PUT_DONE if i < 4 else PUT_FULL)
        index.put_uniq_py(ref, "T", props(i), 10 * i, 1000 * i)
        assert m[:] == ref[:]
    assert c_put(m, "T", props(9), 30, 0) == PUT_NONE  # at or below the newest: a replay


def _ascii_key_hashing_to_min_value(topic, n=7):
    """An ASCII key (0x30..0x7e) whose "topic#key" has Java's hashCode Integer.MIN_VALUE."""
    lo, hi = 0x30, 0x7E
    base = fmt.java_string_hash_py(topic + "#") & 0xFFFFFFFF
    target = ((1 << 31) - base * 31**n - sum(lo * 31**i for i in range(n))) % (1 << 32)
    digits = []
    for i in range(n):
        place = 31 ** (n - 1 - i)
        digits.append(min(hi - lo, target // place))
        target -= digits[-1] * place
    assert target == 0
    return bytes(lo + d for d in digits)


def test_c_put_of_a_key_hashing_to_integer_min_value():
    """abs(Integer.MIN_VALUE) is 0 in RocketMQ's index, in C as in Python."""
    key = _ascii_key_hashing_to_min_value("T")
    assert fmt.java_string_hash_py("T#" + key.decode()) == -(1 << 31)
    c_map, py_map = _fresh_map(), _fresh_map()
    props = b"UNIQ_KEY\x01" + key
    assert _c_put()(c_map, "T", props, 5, 1) == index.put_uniq_py(py_map, "T", props, 5, 1) == PUT_DONE
    assert c_map[:] == py_map[:]
    assert fmt.INDEX_ENTRY.unpack_from(c_map, fmt.INDEX_HEADER_SIZE + 7 * 4)[0] == 0


def test_c_put_leaves_an_unpackable_time_to_python():
    """A store time too far after the file's first for the entry's 32-bit seconds: the
    Python put refuses it, and the C put leaves it to Python rather than write it."""
    c_put = _c_put()
    m = _fresh_map()
    assert c_put(m, "T", b"UNIQ_KEY\x01A", 1, 0) == PUT_DONE
    before = m[:]
    far = (2**31) * 1000
    assert c_put(m, "T", b"UNIQ_KEY\x01B", 2, far) == PUT_ELSEWHERE
    assert m[:] == before
    with pytest.raises(Exception):
        index.put_uniq_py(m, "T", b"UNIQ_KEY\x01B", 2, far)


def test_c_put_refuses_bad_arguments():
    c_put = _c_put()
    with pytest.raises(TypeError):
        c_put(_fresh_map(), b"T", b"UNIQ_KEY\x01A", 1, 1)  # topic: str
    with pytest.raises(BufferError):
        c_put(b"\0" * 200, "T", b"UNIQ_KEY\x01A", 1, 1)  # the map: writable
    with pytest.raises(TypeError):
        c_put(_fresh_map(), "T", b"UNIQ_KEY\x01A", 1)


def test_index_configure_refuses_a_layout_it_cannot_write():
    module = importlib.import_module("mqserver.store._index") if not speedups.pure_python() else None
    if module is None:
        pytest.skip("MQSERVER_PURE_PYTHON is set")
    h, s, e = fmt.INDEX_HEADER_LAYOUT, fmt.INDEX_SLOT_LAYOUT, fmt.INDEX_ENTRY_LAYOUT
    hspans = native.spans(h, native.INDEX_HEADER_FIELDS)
    sspans = native.spans(s, native.INDEX_SLOT_FIELDS)
    espans = native.spans(e, native.INDEX_ENTRY_FIELDS)
    with pytest.raises(ValueError):  # the entry count 8 bytes wide
        module.configure(h.size, hspans[:5] + ((32, 8),), s.size, sspans, e.size, espans)
    with pytest.raises(ValueError):  # entry fields overlapping
        module.configure(h.size, hspans, s.size, sspans, e.size, espans[:3] + ((0, 4),))
    m = _fresh_map()
    assert module.put_uniq(m, "T", b"UNIQ_KEY\x01A", 1, 1) == PUT_DONE  # still configured
    ref = _fresh_map()
    index.put_uniq_py(ref, "T", b"UNIQ_KEY\x01A", 1, 1)
    assert m[:] == ref[:]


# -- the service, with either put ------------------------------------------------------------

def _files(directory):
    return {n: open(os.path.join(directory, n), "rb").read() for n in sorted(os.listdir(directory))}


@settings(max_examples=60, deadline=None)
@given(_puts)
def test_service_with_c_put_matches_service_with_python_put(tmp_path_factory, puts):
    """Two index services fed the same records, one with the C put and one with the
    reference: the same files (rolled at the same records), lookups and last offsets,
    also after a reopen."""
    c_put = _c_put()
    base = tmp_path_factory.mktemp("index")
    dirs = [str(base / "c"), str(base / "py")]
    services = [IndexService(dirs[0], slots=5, max_entries=4, put_uniq=c_put),
                IndexService(dirs[1], slots=5, max_entries=4, put_uniq=index.put_uniq_py)]
    offset, ts = 100, 1_700_000_000_000
    for topic, props, step, dt in puts:
        offset += step
        ts += dt
        for s in services:
            s.dispatch(offset, topic, props, ts)
    keys = {k for _, p, _, _ in puts for k in (index.uniq_key(p), b"K")}
    for s in services:
        s.close()
    assert os.path.isdir(dirs[0]) == os.path.isdir(dirs[1])
    if not os.path.isdir(dirs[0]):
        return
    assert _files(dirs[0]) == _files(dirs[1])
    again = [IndexService(d, slots=5, max_entries=4) for d in dirs]
    try:
        assert again[0].last_offset() == again[1].last_offset()
        for k in keys:
            k = k.decode("utf-8", "replace")
            assert again[0].lookup("T", k, 64, 0, 2**62) == again[1].lookup("T", k, 64, 0, 2**62)
    finally:
        for s in again:
            s.close()


def test_service_makes_no_file_for_records_without_keys(tmp_path):
    """Records with properties but no key make no index file (nor its directory)."""
    d = str(tmp_path / "index")
    s = IndexService(d)
    s.dispatch(10, "T", b"TAGS\x01A\x02", 1)
    s.dispatch(20, "T", b"UNIQ_KEY\x01\x02", 1)  # empty
    s.dispatch(25, "T", b"KEYS\x01 \x02TAGS\x01A\x02", 1)  # KEYS without a word
    assert not os.path.exists(d)
    s.dispatch(30, "T", b"UNIQ_KEY\x01U1\x02", 1)
    assert s.lookup("T", "U1", 8, 0, 2**62) == [30]
    s.close()
    s.dispatch(40, "T", b"UNIQ_KEY\x01U2\x02", 1)  # closed: ignored
    assert IndexService(d).lookup("T", "U2", 8, 0, 2**62) == []


def test_service_rolls_to_a_new_file_when_full(tmp_path):
    d = str(tmp_path / "index")
    s = IndexService(d, slots=3, max_entries=2)
    for i in range(5):
        s.dispatch(100 + i, "T", b"UNIQ_KEY\x01U%d" % i, 1_700_000_000_000 + i)
    assert [os.path.basename(f.path) for f in s.files] == [
        fmt.segment_name(100), fmt.segment_name(102), fmt.segment_name(104)]
    assert [s.lookup("T", f"U{i}", 8, 0, 2**62) for i in range(5)] == [[100 + i] for i in range(5)]
    assert s.last_offset() == 104
    s.close()
