"""Incremental audits (--since-state): a grown log audited with the state finds what a
full audit finds while reading less; a changed old segment is a finding; a damaged
state is bad input."""

import json
import os

import pytest

from protocols.smss.client import SmssClient
from spark.audit import job
from spark.audit import state
from tests.spark import datadirs as dd
from tests.support.server import ServerProcess


def audit(spark, data, out, *extra):
    """Run the job in this session; returns C{(summary, exit code)}."""
    args = job.parse_args([str(data), "--out", str(out), "--quiet", "--tables", "all", *extra])
    return job.run(spark, args)


def grow(data, messages):
    """Run the real broker again on C{data} and publish C{messages} more to orders."""
    server = ServerProcess(data, config={"store": {"maxLogSize": dd.SEGMENT}})
    server.start()
    try:
        c = SmssClient("127.0.0.1", server.smss_port)
        for i in range(messages // 10):
            c.publish("orders", [bytes([97 + i % 26]) * 200 for _ in range(10)])
        c.close()
    finally:
        code = server.stop()
        server.close()
    assert code in (0, -15), server.read_log()


def log_bytes(data):
    return sum(os.path.getsize(p) for p in dd.segments(data))


def table(out, name, order):
    """The rows of the Parquet table C{name} the job wrote under C{out}, ordered by the
    columns C{order} (read with pyarrow: no Spark job for a few small files)."""
    import pyarrow.parquet as pq

    rows = pq.read_table(f"{out}/tables/{name}").to_pylist()
    return sorted(rows, key=lambda r: [(r[c] is None, r[c]) for c in order])


@pytest.mark.timeout(1200)  # three audits and a broker run, on a shared 2-core machine
@pytest.mark.parametrize("form", [(), ("--full",)], ids=["compact", "per-record"])
def test_grown_log_audited_from_state_finds_what_a_full_audit_finds(spark, broker_dir, tmp_path, form):
    """Audit, grow the log by the broker (the last segment and a new one), audit again
    with the state: the summary and tables equal a full audit's of the grown log, and
    only the open and new segments were read; the sealed ones were carried. In both
    forms: the compact one carries the segments' items, the per-record one their parts
    of the per-record tables."""
    data = dd.copy_dir(broker_dir[0], str(tmp_path / "data"))
    st = str(tmp_path / "state")
    first, code = audit(spark, data, tmp_path / "o1", "--since-state", st, *form)
    assert code == 0
    assert (first["incremental"]["mode"], first["incremental"]["full_reason"]) == ("full", "no state yet")
    (gen,) = [p for p in os.listdir(st) if p.startswith("gen-")]
    assert os.listdir(os.path.join(st, gen, "parts")) and sorted(
        p for p in os.listdir(os.path.join(st, gen, "parts")) if not p.startswith(".")
    ) == sorted(state.PARTS[state.RECORDS if form else state.COMPACT])
    before = [os.path.getsize(p) for p in dd.segments(data)]

    grow(data, 300)
    after = [os.path.getsize(p) for p in dd.segments(data)]
    assert len(after) > len(before) and after[len(before) - 1] > before[-1]  # the open one grew, new ones came

    inc, inc_code = audit(spark, data, tmp_path / "o2", "--since-state", st, *form)
    full, full_code = audit(spark, data, tmp_path / "o3", *form)
    info = inc.pop("incremental")
    assert (inc_code, full_code) == (0, 0)
    assert inc == full
    assert inc["log"]["messages"] == dd.MESSAGES + 300
    assert info["mode"] == "incremental" and info["changed_segments"] == []
    assert info["segments_carried"] == len(before) - 1
    assert info["bytes_carried"] == sum(before[:-1])
    assert info["segments_read"] == len(after) - len(before) + 1
    # The open segment that grew is resumed (compact form): its proven prefix is not read.
    assert info["bytes_read"] + info["bytes_carried"] + info["bytes_resumed_after"] == log_bytes(data)
    assert info["segments_resumed"] == (0 if form else 1)
    for name, order in [("throughput", ["topic", "minute"]), ("segments", ["segment"]),
                        ("queue_stats", ["topic", "queue_id"]), ("cq_mismatches", ["topic", "queue_offset"])]:
        assert table(tmp_path / "o2", name, order) == table(tmp_path / "o3", name, order), name


def test_a_check_that_needs_carried_records_makes_a_full_audit(spark, broker_dir, tmp_path):
    """Compact form: consume-queue entries that point into a carried segment are
    swapped after an audit with the state. The signatures differ, and listing the
    mismatches needs the carried segment's records: the run reads every segment (saying
    why) and finds exactly what a full audit finds."""
    data = dd.copy_dir(broker_dir[0], str(tmp_path / "data"))
    st = str(tmp_path / "state")
    assert audit(spark, data, tmp_path / "o1", "--since-state", st)[1] == 0
    dd.swap_cq_entries(data, "orders", 10, 11)  # their records are in the first segment
    inc, code = audit(spark, data, tmp_path / "o2", "--since-state", st)
    full, full_code = audit(spark, data, tmp_path / "o3")
    info = inc.pop("incremental")
    assert (code, full_code) == (1, 1)
    assert inc == full
    assert inc["integrity"]["cq_wrong"] == 2
    assert info["mode"] == "full" and info["full_reason"].startswith("the consume queues differ from the log")
    order = ["topic", "queue_id", "queue_offset"]
    assert table(tmp_path / "o2", "cq_mismatches", order) == table(tmp_path / "o3", "cq_mismatches", order)


def test_state_of_the_other_form_is_not_carried(spark, broker_dir, tmp_path):
    """A state kept by a compact audit is not carried by a --full one (its parts are
    not what that form merges): the run reads every segment and says why."""
    data = dd.copy_dir(broker_dir[0], str(tmp_path / "data"))
    st = str(tmp_path / "state")
    assert audit(spark, data, tmp_path / "o1", "--since-state", st)[1] == 0
    summary, code = audit(spark, data, tmp_path / "o2", "--since-state", st, "--full")
    assert code == 0
    info = summary["incremental"]
    assert (info["mode"], info["segments_carried"]) == ("full", 0)
    assert info["full_reason"] == "the state holds the parts of the compact form, this audit runs in the per-record form"


def test_changed_old_segment_is_a_finding(spark, broker_dir, tmp_path):
    """After an audit with the state, a body byte of the first segment is flipped and
    bytes are appended to the second (sealed: no record reads them): each is a changed
    segment, saying what changed, and both are read again (the flip is a CRC failure)."""
    data = dd.copy_dir(broker_dir[0], str(tmp_path / "data"))
    st = str(tmp_path / "state")
    assert audit(spark, data, tmp_path / "o1", "--since-state", st)[1] == 0
    dd.flip_body_byte(data, 10)
    second = dd.segments(data)[1]
    length = os.path.getsize(second)
    with open(second, "ab") as f:
        f.write(b"\x01\x02\x03\x04")

    summary, code = audit(spark, data, tmp_path / "o2", "--since-state", st)
    assert code == 1
    found = {k: v for k, v in summary["integrity"].items() if v}
    assert found == {"changed_segments": 2, "crc_failures": 1}
    changed = summary["incremental"]["changed_segments"]
    assert changed == [
        {"segment": 0, "detail": f"digest of the first {os.path.getsize(dd.segments(data)[0])} bytes differs "
                                 "from the audited one"},
        {"segment": dd.SEGMENT, "detail": f"length {length} -> {length + 4} bytes"},
    ]  # fmt: skip
    problems = [p for p in summary["integrity_examples"]["problems"] if p["problem"] == "changed"]
    assert [p["segment"] for p in problems] == [0, dd.SEGMENT]
    # Only the third, open segment is carried: nothing was appended to it since.
    assert summary["incremental"]["segments_carried"] == 1


def test_damaged_state_is_bad_input(spark, broker_dir, tmp_path):
    """A manifest that is not JSON, of another version or missing a field stops the job
    with a clear error (exit status 2 from main), before anything is written."""
    data = dd.copy_dir(broker_dir[0], str(tmp_path / "data"))
    st = tmp_path / "state"
    audit(spark, data, tmp_path / "o1", "--since-state", str(st))
    (gen,) = [p for p in st.iterdir() if p.name.startswith("gen-")]
    manifest = gen / state.MANIFEST
    crc = gen / f".{state.MANIFEST}.crc"  # Hadoop's local file system checks it on reading
    assert crc.exists()
    good = json.loads(manifest.read_text())
    missing = json.loads(manifest.read_text())
    del missing["segments"][0]["digest"]
    for damage, why in [(b"{\x00not json", "cannot be read .*ChecksumException"),
                        (b"{\x00not json", "is not valid JSON"),
                        (json.dumps(dict(good, version=99)).encode(), "manifest version 99"),
                        (json.dumps(missing).encode(), "lacks digest")]:  # fmt: skip
        manifest.write_bytes(damage)
        if "Checksum" not in why:
            crc.unlink(missing_ok=True)
        with pytest.raises(SystemExit, match=f"the state in .* cannot be used: .*{why}"):
            audit(spark, data, tmp_path / "o2", "--since-state", str(st))
        assert not (tmp_path / "o2" / "summary.json").exists()


def test_cq_file_wanted():
    """A consume-queue file is read when it holds an entry at or above the queue's low
    mark: names are the first entry's byte offset, entries are 20 bytes."""
    low = {("orders", 0): 300}
    assert not state.cq_file_wanted(low, "orders", "0", f"{0:020d}", 300 * 20)
    assert state.cq_file_wanted(low, "orders", "0", f"{0:020d}", 301 * 20)
    assert state.cq_file_wanted(low, "orders", "0", f"{300 * 20:020d}", 20)
    assert state.cq_file_wanted(low, "orders", "1", f"{0:020d}", 20)  # a queue the state does not know
    assert state.cq_file_wanted(None, "orders", "0", f"{0:020d}", 20)


def test_merge_totals():
    """Per-segment totals merge into the log's: sums, and min/max ignoring empty ones."""
    parts = [
        {"records": 2, "messages": 1, "admin_records": 1, "bytes": 10, "first_event_id": 1, "last_event_id": 2,
         "first_store_ts": 5, "last_store_ts": 6},
        {"records": 0, "messages": 0, "admin_records": 0, "bytes": 0, "first_event_id": None, "last_event_id": None,
         "first_store_ts": None, "last_store_ts": None},
        {"records": 3, "messages": 3, "admin_records": 0, "bytes": 30, "first_event_id": 3, "last_event_id": 5,
         "first_store_ts": 7, "last_store_ts": 9},
    ]  # fmt: skip
    assert state.merge_totals(parts) == {"records": 5, "messages": 4, "admin_records": 1, "bytes": 40,
                                         "first_event_id": 1, "last_event_id": 5, "first_store_ts": 5,
                                         "last_store_ts": 9}  # fmt: skip


def write_messages(data, batches, first=0):
    """Run the real broker (default segment size: the log stays one open segment) on
    C{data} and publish C{batches} batches of 20 messages to two topics, alternating."""
    server = ServerProcess(data)
    server.start()
    try:
        c = SmssClient("127.0.0.1", server.smss_port)
        for t in ("alpha", "beta"):
            if not first:
                c.create(t)
        for i in range(first, first + batches):
            c.publish(("alpha", "beta")[i % 2], [b"%d-%d" % (i, j) * 10 for j in range(20)])
        c.close()
    finally:
        code = server.stop()
        server.close()
    assert code in (0, -15), server.read_log()


@pytest.mark.timeout(1200)
def test_open_segment_grown_by_5_percent_reads_5_percent(spark, tmp_path):
    """A log that is one open segment, audited with a state, then grown by about 5% by
    the broker: the next audit checks the proven prefix's digest, decodes only the
    bytes appended after it (reported as C{incremental.bytes_read}) and finds what a
    full audit of the grown log finds."""
    data = str(tmp_path / "data")
    write_messages(data, 100)
    (segment,) = dd.segments(data)
    st = str(tmp_path / "state")
    first, code = audit(spark, data, tmp_path / "o1", "--since-state", st)
    assert code == 0 and first["incremental"]["bytes_read"] == os.path.getsize(segment)
    proven = os.path.getsize(segment)

    write_messages(data, 5, first=100)
    grown = os.path.getsize(segment)
    assert dd.segments(data) == [segment] and 0.03 < (grown - proven) / grown < 0.07

    inc, inc_code = audit(spark, data, tmp_path / "o2", "--since-state", st)
    info = inc.pop("incremental")
    assert (info["mode"], info["full_reason"], info["changed_segments"]) == ("incremental", None, [])
    assert (info["segments_resumed"], info["bytes_resumed_after"]) == (1, proven)
    assert info["bytes_read"] == grown - proven
    full, full_code = audit(spark, data, tmp_path / "o3")
    assert (inc_code, full_code) == (0, 0)
    assert inc == full
    assert inc["log"]["messages"] == 105 * 20

    # The state it saved resumes from the grown end: a third run with nothing new reads nothing.
    again, _ = audit(spark, data, tmp_path / "o4", "--since-state", st)
    assert (again["incremental"]["bytes_read"], again["incremental"]["mode"]) == (0, "incremental")
