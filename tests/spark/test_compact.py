"""The compact audit (partial aggregates decoded per range, the default) against the
reference: the same job with C{--full}, today's implementation, one row per record
through every check. On every test directory, the summary.json files are byte for byte
the same and so are the rows of every Parquet table."""

import glob
import io
import json
import os
import re

import pytest

from spark.audit import job
from tests.spark import datadirs as dd


def _tables(out):
    """Each Parquet table the job wrote under C{out}: its columns and its rows, sorted.
    Read with pyarrow, not Spark: two readings of a dozen small tables per comparison
    were dozens of Spark jobs, while what is compared is the same either way."""
    import pyarrow.parquet as pq

    tables = {}
    for path in sorted(glob.glob(os.path.join(out, "tables", "*"))):
        table = pq.read_table(path)
        tables[os.path.basename(path)] = (
            table.column_names, sorted(repr(tuple(row.values())) for row in table.to_pylist()))
    return tables


def _run(spark, data, out, *extra):
    args = job.parse_args([str(data), "--out", str(out), "--quiet", "--tables", "all", *extra])
    _, code = job.run(spark, args)
    with open(os.path.join(out, "summary.json"), "rb") as f:
        return f.read(), code


def _over_time(out):
    """The report's "Over time" section (the SVG charts of the per-minute series)."""
    with open(os.path.join(out, "report.html"), encoding="utf-8") as f:
        page = f.read()
    return re.search(r"<h2>Over time</h2>.*?(?=<h2>|</body>|$)", page, re.S).group(0)


def assert_same_as_full(spark, data, tmp_path, *extra):
    """Audit C{data} compact and C{--full}: same exit code, summary bytes, tables and
    charts over time (the store lag comes from the compact form's per-minute parts)."""
    compact, code = _run(spark, data, tmp_path / "compact", *extra)
    reference, ref_code = _run(spark, data, tmp_path / "full", "--full", *extra)
    assert code == ref_code
    assert compact == reference
    assert _tables(tmp_path / "compact") == _tables(tmp_path / "full")
    charts = _over_time(tmp_path / "compact")
    assert "Store lag per minute" in charts and charts == _over_time(tmp_path / "full")
    return code


@pytest.mark.parametrize("damage", ["none", "all", "others", "exact"])
def test_compact_matches_full(spark, broker_dir, tmp_path, damage):
    """The broker's directory, sound and with every kind of damage (a CRC failure, a
    relabelled eventId, swapped and missing consume-queue entries and a torn tail in
    one copy; a torn consume-queue file, a rewritten body and a corrupt record in
    another; 100 records overwritten and a damaged header in a third), judged when the
    1 h delay is overdue and ttl expired."""
    data, facts = broker_dir
    copy = dd.copy_dir(data, str(tmp_path / "data"))
    dd.damage(copy, damage)
    as_of = str(facts["ttl_expire"] + 30 * 60 * 1000)
    code = assert_same_as_full(spark, copy, tmp_path, "--as-of-ms", as_of)
    assert code == (0 if damage == "none" else 1)


def test_compact_matches_full_in_small_ranges_and_live(spark, broker_dir, tmp_path):
    """4 KiB ranges (boundaries inside records, rewalks) and C{--live}."""
    data = dd.copy_dir(broker_dir[0], str(tmp_path / "data"))
    dd.set_event_id(data, 200, 201)
    assert_same_as_full(spark, data, tmp_path / "small", "--split-mb", str(4096 / (1 << 20)))
    assert_same_as_full(spark, data, tmp_path / "live", "--live")


def test_compact_store_lag_matches_full(spark, broker_dir, tmp_path):
    """The store-lag chart comes from the compact form's per-minute parts: messages
    stored 7 s and 12 s after they were born (not records the compact form keeps as
    rows) show in it as in C{--full}'s."""
    data = dd.copy_dir(broker_dir[0], str(tmp_path / "data"))
    lagged = [e for e, lag in ((40, 7000), (41, 12345)) if dd.set_store_lag(data, e, lag).magic == dd.fmt.MESSAGE_MAGIC]
    assert len(lagged) == 2
    assert_same_as_full(spark, data, tmp_path)


def test_too_many_rows_for_the_driver_audits_in_the_per_record_form(spark, broker_dir, tmp_path, monkeypatch):
    """The compact form's rows go to the driver, each decode task's at most its share of
    C{COMPACT_ROWS_MAX}; past it the directory is audited in the per-record form instead
    (the same summary, said on the progress stream), and under it the compact form runs."""
    data = dd.copy_dir(broker_dir[0], str(tmp_path / "data"))

    def audit(out):
        stream = io.StringIO()
        args = job.parse_args([str(data), "--out", str(tmp_path / out), "--tables", "all"])
        summary, _ = job.run(spark, args, progress=job.Progress(stream=stream))
        return summary, stream.getvalue()

    normal, said = audit("normal")
    assert "per-record form" not in said
    monkeypatch.setattr(job, "COMPACT_ROWS_MAX", 10)
    capped, said = audit("capped")
    assert "again, in the per-record form: a task of the compact decode made" in said
    reference, _ = _run(spark, data, tmp_path / "full", "--full")
    assert json.dumps(capped, sort_keys=True) == json.dumps(normal, sort_keys=True) == json.dumps(
        json.loads(reference), sort_keys=True)
    assert _tables(tmp_path / "capped") == _tables(tmp_path / "full")
