"""The audit's executor-side decoding (plain Python, no Spark) and the --py-files zip."""

import subprocess
import sys
import zipfile

from mqserver.store import format as fmt
from spark.audit import records as rec
from spark.audit.package import build_pyfiles

SEG = 4096
COLS = [c.split()[0] for c in rec.ITEM_DDL.split(", ")]


def _record(offset, event_id, body=b"hello", topic=b"t", props=b"", magic=fmt.MESSAGE_MAGIC, flag=0, qoff=0):
    return fmt.pack_record(
        magic=magic, queue_id=0 if magic == fmt.MESSAGE_MAGIC else -1, flag=flag, queue_offset=qoff,
        physical_offset=offset, sys_flag=0, born_ts=1, born_host=fmt.NO_HOST, store_ts=60_000 + event_id,
        store_host=fmt.NO_HOST, reconsume_times=0, event_id=event_id, body=body, topic=topic, properties=props,
    )  # fmt: skip


def _segment(start, records, seal=True):
    buf = bytearray()
    for make in records:
        buf += make(start + len(buf))
    if seal:
        buf += fmt.BLANK.pack(SEG - len(buf), fmt.BLANK_MAGIC)
    return bytes(buf)


def _rows(items):
    return [dict(zip(COLS, i)) for i in items]


def test_sealed_segment_decodes_every_record():
    """Records come out in order with their fields; the BLANK gives the segment size."""
    props = fmt.encode_properties([("MQ_DELAY_ID", "7"), ("TAGS", "a")])
    seg = _segment(SEG, [lambda o: _record(o, 10), lambda o: _record(o, 11, props=props, qoff=1)])
    rows = _rows(rec.decode_segment(f"file:/d/commitlog/{fmt.segment_name(SEG)}", seg))
    assert [r["kind"] for r in rows] == ["record", "record", "segment"]
    a, b, s = rows
    assert (a["event_id"], a["offset"], a["topic"], a["body_len"], a["crc_ok"], a["magic"]) == (
        10, SEG, "t", 5, True, "message")  # fmt: skip
    assert (b["delay_id"], b["tag_hash"], b["queue_offset"]) == (7, fmt.java_string_hash("a"), 1)
    assert (s["seg_records"], s["seg_sealed"], s["seg_declared_size"], s["size"]) == (2, True, SEG, len(seg))


def test_admin_delay_and_create_fields():
    """A DELAY admin record exposes its trigger time and count; CREATE its expireAt."""
    delay = fmt.DELAY_PREFIX.pack(123456) + fmt.I32.pack(2) + b"\x00" * 8
    create = b'{"queues":1,"expireAt":99,"perm":6,"attrs":{}}'
    seg = _segment(0, [
        lambda o: _record(o, 1, body=create, magic=fmt.ADMIN_MAGIC, flag=fmt.OP_CREATE, qoff=-1),
        lambda o: _record(o, 2, body=delay, magic=fmt.ADMIN_MAGIC, flag=fmt.OP_DELAY, qoff=-1),
    ], seal=False)  # fmt: skip
    a, b, s = _rows(rec.decode_segment("/d/commitlog/" + fmt.segment_name(0), seg))
    assert (a["magic"], a["expire_at"]) == ("admin", 99)
    assert (b["trigger_ms"], b["delay_count"]) == (123456, 2)
    assert (s["seg_sealed"], s["seg_declared_size"]) == (False, None)


def test_crc_failure_stays_a_record():
    """A flipped body byte keeps the record (its eventId counts) with crc_ok false."""
    seg = bytearray(_segment(0, [lambda o: _record(o, 1)]))
    seg[fmt.HEADER_SIZE] ^= 1
    rows = _rows(rec.decode_segment(fmt.segment_name(0), bytes(seg)))
    assert [(r["kind"], r["crc_ok"]) for r in rows] == [("record", False), ("segment", None)]


def test_torn_tail_and_corruption_are_problems():
    """A record cut short is a torn problem; a bad magic is a corrupt one; both give
    the number of bytes that could not be read."""
    whole = _segment(0, [lambda o: _record(o, 1), lambda o: _record(o, 2)], seal=False)
    first = len(_record(0, 1))
    rows = _rows(rec.decode_segment(fmt.segment_name(0), whole[:-3]))
    assert [(r["kind"], r["problem"], r["offset"], r["size"]) for r in rows[1:2]] == [
        ("problem", "torn", first, len(whole) - 3 - first)
    ]
    bad = bytearray(whole)
    bad[first + 4] ^= 0xFF
    rows = _rows(rec.decode_segment(fmt.segment_name(0), bytes(bad)))
    assert [r["problem"] for r in rows] == [None, "corrupt", None]
    assert rows[2]["seg_records"] == 1


def test_digest_ignores_offset_and_store_host_only():
    """The compare digest is equal for the same record at another offset, and differs
    when the body differs."""
    a = _record(0, 5)
    b = _record(4096, 5)
    c = _record(0, 5, body=b"HELLO")
    assert rec.digest(a, 0, len(a)) == rec.digest(b, 0, len(b))
    assert rec.digest(a, 0, len(a)) != rec.digest(c, 0, len(c))


def test_consume_queue_file():
    """Entries get their queue offset from the file name; holes are skipped; a partial
    entry is a problem; the topic name is percent-decoded from the URI."""
    data = fmt.CQ_ENTRY.pack(0, 100, 0) + b"\x00" * 20 + fmt.CQ_ENTRY.pack(200, 90, 7) + b"\x01\x02"
    path = "file:/d/consumequeue/%25RETRY%25g/3/" + fmt.segment_name(40 * 20)
    rows = list(rec.decode_cq_file(path, data))
    assert rows == [
        ("%RETRY%g", 3, 40, 0, 100, 0, None),
        ("%RETRY%g", 3, 42, 200, 90, 7, None),
        ("%RETRY%g", 3, 43, None, 2, None, "cq_torn"),
    ]


def test_pyfiles_zip_needs_no_twisted(tmp_path):
    """The --py-files zip holds the job, the format module and construct, and no other
    part of the core; decoding works from it in a clean interpreter."""
    z = build_pyfiles(str(tmp_path / "audit.zip"))
    names = zipfile.ZipFile(z).namelist()
    assert "mqserver/store/format.py" in names and "spark/audit/records.py" in names
    assert "mqserver/layout.py" in names  # format.py derives its structs with it
    assert "construct/__init__.py" in names
    assert not [n for n in names if n.startswith(("mqserver/broker", "twisted", "protocols"))]
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from spark.audit import records; import sys as s;"
        "assert 'twisted' not in s.modules; print('ok')"
    )
    out = subprocess.run([sys.executable, "-S", "-c", code, z], capture_output=True, text=True, cwd=tmp_path)
    assert out.stdout.strip() == "ok", out.stderr
