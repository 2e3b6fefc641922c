"""The audit job end to end: data written by the real broker, crafted damage on copies,
exact findings and exit codes, the Parquet tables and the HTML report."""

import base64
import html.parser
import json
import os
import zlib

import pytest

from spark.audit import job
from spark.audit.summary import INTEGRITY_KEYS
from tests.spark import datadirs as dd

# 600 x 200-byte bodies; "soon", delivered by a delay, with MQ_DELAY_ID "<eventId>:<13-digit
# trigger ms>" (131 bytes); "last message" (109 bytes).
ORDERS_BYTES = 600 * 297 + 131 + 109


def audit(spark, data, out, *extra):
    """Run the job in this session; returns C{(summary, exit code)}."""
    args = job.parse_args([str(data), "--out", str(out), "--quiet", "--tables", "all", *extra])
    summary, code = job.run(spark, args)
    with open(os.path.join(out, "summary.json")) as f:
        assert json.load(f) == json.loads(json.dumps(summary))
    return summary, code


def findings(summary):
    """Return only the non-zero integrity counters."""
    return {k: v for k, v in summary["integrity"].items() if v}


@pytest.fixture(scope="module")
def clean(spark, broker_dir, tmp_path_factory):
    """The audit of the untouched broker directory, compared with an exact copy."""
    data, facts = broker_dir
    base = tmp_path_factory.mktemp("clean")
    slave = dd.copy_dir(data, str(base / "slave"))
    out = base / "out"
    summary, code = audit(spark, data, out, "--compare", slave)
    return summary, code, out, dict(facts, data=data)


def test_clean_directory_has_no_findings(clean):
    """A directory the broker wrote and closed cleanly audits OK with exit code 0."""
    summary, code, _, _ = clean
    assert code == 0 and summary["verdict"] == "OK"
    assert findings(summary) == {}
    assert set(summary["integrity"]) == set(INTEGRITY_KEYS)
    log = summary["log"]
    assert (log["records"], log["messages"], log["admin_records"]) == (dd.RECORDS, dd.MESSAGES, 8)
    assert (log["first_event_id"], log["last_event_id"]) == (1, dd.LAST_EVENT)
    assert (log["segments"], log["segment_size"], log["segment_size_source"]) == (3, dd.SEGMENT, "BLANK record")
    assert log["checkpoint"]["nextEventId"] == dd.LAST_EVENT + 1


def test_clean_directory_queue_figures(clean):
    """Per-queue counts, bytes, eventIds and store times come out exact."""
    summary = clean[0]
    q = {x["topic"]: x for x in summary["queues"]}
    assert sorted(q) == ["%DLQ%g1", "%RETRY%g1", "gone", "orders", "ttl"]
    o = q["orders"]
    assert (o["messages"], o["bytes"], o["first_event_id"], o["last_event_id"]) == (602, ORDERS_BYTES, 6, 617)
    assert (o["min_queue_offset"], o["max_queue_offset"], o["delayed_fired"]) == (0, 601, 1)
    assert o["first_store_ts"] <= o["last_store_ts"]
    assert o["body_bytes"] == 600 * 200 + 4 + 12
    assert (q["%RETRY%g1"]["messages"], q["%DLQ%g1"]["messages"], q["gone"]["messages"]) == (3, 2, 1)


def test_clean_directory_consumption(clean):
    """Lag from consumerOffset.json, retry/DLQ volumes, the pending delay."""
    c = clean[0]["consumption"]
    lag = {(r["topic"], r["consumer"]): (r["committed"], r["max_offset"], r["lag"]) for r in c["lag"]}
    assert lag == {("orders", "g1"): (500, 602, 102), ("%RETRY%g1", "g1"): (3, 3, 0)}
    vols = {(r["kind"], r["consumer_group"]): (r["messages"], r["bytes"]) for r in c["retry_dlq"]}
    assert vols == {("retry", "g1"): (3, 3 * (88 + 50 + 1 + 9 + 2)), ("dlq", "g1"): (2, 2 * (88 + 40 + 1 + 7 + 2))}
    assert {k: c["delays"][k] for k in ("total", "pending", "overdue")} == {"total": 2, "pending": 1, "overdue": 0}
    assert c["expired_topics_not_reclaimed"] == []


def test_identical_copy_does_not_diverge(clean):
    """Comparing with an exact copy finds nothing missing, extra or different."""
    cmp = clean[0]["compare"]
    assert (cmp["missing"], cmp["extra"], cmp["different"], cmp["first_divergent_event_id"]) == (0, 0, 0, None)
    assert cmp["other_log"]["records"] == dd.RECORDS


def test_tables_are_parquet(spark, clean):
    """Each detail table is written as Parquet and reads back."""
    out = clean[2]
    names = sorted(os.listdir(out / "tables"))
    for name in ("queue_stats", "throughput", "problems", "event_gaps", "cq_mismatches", "consumer_lag", "compare"):
        assert name in names
    qs = spark.read.parquet(str(out / "tables" / "queue_stats"))
    assert qs.where("topic = 'orders'").first()["messages"] == 602
    assert spark.read.parquet(str(out / "tables" / "problems")).count() == 0


class _Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.images, self.text, self.external, self.svg_titles = [], [], [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "svg":
            self.svg_titles.append(a.get("aria-label", ""))
        if tag == "img":
            self.images.append(a.get("src", ""))
        for k in ("src", "href"):
            if a.get(k, "").startswith(("http:", "https:", "//")):
                self.external.append(a[k])

    def handle_data(self, data):
        self.text.append(data.strip())


def test_html_report_is_self_contained(clean):
    """The report parses, embeds its charts as PNG data URIs, loads nothing from
    elsewhere, and shows the figures of the summary."""
    out = clean[2]
    page = _Page()
    with open(out / "report.html", encoding="utf-8") as f:
        page.feed(f.read())
    assert page.external == []
    assert len(page.images) >= 2
    for src in page.images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    # Throughput and lag over time (with --compare, replication lag too) as inline SVG.
    assert [t.split(" per ")[0] for t in page.svg_titles] == [
        "Messages stored", "Bytes stored", "Store lag", "Replication lag"]
    cells = [t for t in page.text if t]
    assert "OK" in cells
    for figure in ("617", "602", str(ORDERS_BYTES), "102", "%RETRY%g1", "%DLQ%g1"):
        assert figure in cells, figure


def test_report_opens_with_the_findings_then_the_slave(clean):
    """The page opens with what was found (nothing here), then the comparison with the
    slave, then the segments (each with its records, eventIds and CRC-32), before the
    figures; summary.json carries the findings as stdout's JSON does."""
    from spark.audit.summary import console_summary

    summary, _, out, _ = clean
    page = (out / "report.html").read_text(encoding="utf-8")
    heads = [page.index(h) for h in ("What was found", "Comparison with", "<h2>Segments", "<h2>Commit log",
                                     "<h2>Topics and queues")]  # fmt: skip
    assert heads == sorted(heads)
    assert "No integrity finding" in page
    assert summary["findings"] == console_summary(summary)["findings"] == {}
    segs = summary["segments"]
    assert [s["records"] for s in segs] and sum(s["records"] for s in segs) == dd.RECORDS
    assert segs[0]["first_event_id"] == 1 and segs[-1]["last_event_id"] == dd.LAST_EVENT
    for s in segs:
        with open(dd.segments(clean[3]["data"])[segs.index(s)], "rb") as f:
            assert s["crc32"] == zlib.crc32(f.read()[: s["records_end"] - s["segment"]])
        assert f"{s['crc32']:08x}" in page


@pytest.fixture(scope="module")
def damaged(spark, broker_dir, tmp_path_factory):
    """One copy with four independent kinds of damage, judged 90 minutes later:
    eventId 100's first body byte flipped; eventId 200 relabelled 201; orders/0's
    consume-queue entries 10 and 11 swapped and its last entry removed."""
    data, facts = broker_dir
    base = tmp_path_factory.mktemp("damaged")
    copy = dd.copy_dir(data, str(base / "data"))
    dd.flip_body_byte(copy, 100)
    dd.set_event_id(copy, 200, 201)
    dd.swap_cq_entries(copy, "orders", 10, 11)
    dd.drop_last_cq_entry(copy, "orders")
    as_of = facts["ttl_expire"] + 30 * 60 * 1000
    summary, code = audit(spark, copy, base / "out", "--as-of-ms", str(as_of))
    return summary, code


def test_damage_is_found_exactly(damaged):
    """Each crafted damage is counted exactly once, and the exit code is 1."""
    summary, code = damaged
    assert code == 1 and summary["verdict"] == "INTEGRITY FINDINGS"
    assert findings(summary) == {
        "crc_failures": 1,
        "event_id_gaps": 1,
        "missing_event_ids": 1,
        "duplicate_event_ids": 1,
        "cq_missing": 1,
        "cq_wrong": 2,
    }


def test_flipped_body_byte_is_a_crc_problem(damaged):
    """The flipped byte is a CRC failure of eventId 100 in orders."""
    [p] = damaged[0]["integrity_examples"]["problems"]
    assert (p["problem"], p["event_id"], p["topic"]) == ("crc", 100, "orders")


def test_relabelled_event_id_is_a_gap_and_a_duplicate(damaged):
    """A record relabelled with its neighbour's eventId leaves a gap and a duplicate."""
    ex = damaged[0]["integrity_examples"]
    assert ex["event_gaps"] == [{"gap_start": 200, "gap_end": 200, "missing": 1}]
    assert [(d["event_id"], d["copies"]) for d in ex["event_duplicates"]] == [(201, 2)]


def test_consume_queue_damage(damaged):
    """Swapped entries point at the wrong record; the removed one is missing."""
    got = [(m["status"], m["queue_offset"], m["event_id"]) for m in damaged[0]["integrity_examples"]["cq_mismatches"]]
    assert got == [("wrong", 10, 16), ("wrong", 11, 17), ("missing", 601, 617)]


def test_later_audit_time_reports_overdue_and_expired(damaged):
    """Judged 90 minutes later, the 1 h delay is overdue and ttl has expired without
    being reclaimed; neither is an integrity finding."""
    c = damaged[0]["consumption"]
    assert (c["delays"]["overdue"], c["delays"]["overdue_messages"]) == (1, 1)
    assert [e["event_id"] for e in c["delays"]["overdue_examples"]] == [615]
    assert [t["topic"] for t in c["expired_topics_not_reclaimed"]] == ["ttl"]


@pytest.fixture(scope="module")
def torn(spark, broker_dir, tmp_path_factory):
    """A master whose tail was cut 10 bytes short, compared with a slave that stops
    before eventId 600, holds another body for eventId 300, and has no checkpoint."""
    data = broker_dir[0]
    base = tmp_path_factory.mktemp("torn")
    master = dd.copy_dir(data, str(base / "master"))
    dd.truncate_tail(master, 10)
    slave = dd.copy_dir(data, str(base / "slave"))
    dd.cut_log_at(slave, 600)
    dd.rewrite_body(slave, 300)
    os.unlink(os.path.join(slave, "metadata.json"))
    return audit(spark, master, base / "out", "--compare", slave)


def test_truncated_tail(torn):
    """A tail cut 10 bytes short: a torn record, its eventId missing against the
    checkpoint, the checkpoint beyond the log, and its consume-queue entry dangling."""
    summary, code = torn
    assert code == 1
    assert findings(summary) == {
        "torn_records": 1,
        "unreadable_bytes": 109 - 10,
        "tail_event_ids_missing": 1,
        "checkpoint_beyond_log_bytes": 10,
        "cq_extra": 1,
    }
    [p] = summary["integrity_examples"]["problems"]
    assert p["problem"] == "torn"
    [m] = summary["integrity_examples"]["cq_mismatches"]
    assert (m["status"], m["topic"], m["queue_offset"]) == ("extra", "orders", 601)


def test_compare_with_damaged_slave(torn):
    """The first divergence is eventId 300 (another body); 600..616 are missing on the
    slave (617 is torn on the master too); the slave itself is sound."""
    cmp = torn[0]["compare"]
    assert (cmp["first_divergent_event_id"], cmp["missing"], cmp["extra"], cmp["different"]) == (300, 17, 0, 1)
    first = cmp["examples"][0]
    assert (first["event_id"], first["status"], first["offset"]) == (300, "different", first["other_offset"])
    assert [e["event_id"] for e in cmp["examples"][1:4]] == [600, 601, 602]
    assert not any(cmp["other_integrity"].values())


def test_small_ranges_give_the_same_summary(spark, damaged, tmp_path):
    """Split into 4 KiB ranges (many per 64 KiB segment, boundaries inside records and
    next to the damage), the damaged copy audits to the same summary."""
    summary, _ = damaged
    again, code = audit(spark, summary["data_dir"], tmp_path / "out", "--as-of-ms", str(summary["as_of_ms"]),
                        "--split-mb", str(4096 / (1 << 20)))  # fmt: skip
    assert code == 1
    assert again == summary


def test_console_shows_findings_found_only_by_the_comparison(spark, broker_dir, tmp_path):
    """A sound master compared with a slave holding another body for eventId 300: the
    integrity block is all zero, and what the job prints names the comparison's
    finding, its count and the first divergent eventId."""
    from spark.audit.summary import console_summary

    slave = dd.copy_dir(broker_dir[0], str(tmp_path / "slave"))
    dd.rewrite_body(slave, 300)
    summary, code = audit(spark, broker_dir[0], tmp_path / "out", "--compare", slave)
    assert code == 1 and findings(summary) == {}
    printed = console_summary(summary)
    assert printed["verdict"] == "INTEGRITY FINDINGS"
    assert printed["findings"] == {"compare.different": 1}
    assert (printed["compare"]["first_divergent_event_id"], printed["compare"]["different"]) == (300, 1)
    assert json.loads(json.dumps(printed)) == printed


def test_interpreted_queries_compile_no_code(spark):
    """L{job.interpreted} makes the session's queries interpret their expressions: a
    query that compiles several Java classes by default compiles at most one (turning
    a Python RDD's rows into Spark's is always compiled). The setting is internal to
    Spark SQL: this fails if the pinned pyspark stops honouring it."""
    from pyspark.sql import functions as F

    metrics = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics

    def compiles(salt):
        before = metrics.METRIC_COMPILATION_TIME().getCount()
        df = spark.createDataFrame([(i, f"t{i % 3}") for i in range(50)], "a int, t string")
        df.where(F.col("a") > salt).groupBy("t").agg(F.max("a") + salt, F.count("*")).collect()
        return metrics.METRIC_COMPILATION_TIME().getCount() - before

    try:
        job.interpreted(spark, True)
        assert spark.conf.get("spark.sql.codegen.factoryMode") == "NO_CODEGEN"
        fewer = compiles(7)
    finally:
        job.interpreted(spark, False)
    assert fewer <= 1 < 3 <= compiles(11)
