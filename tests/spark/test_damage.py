"""Exact findings on damaged copies of a real broker's log: the audit steps over damage
to the next sound record as the broker's recovery does, reports each damaged byte range
with the eventIds around it and the eventIds it lost as one gap of the right size, and
never takes a damaged header's topic or queue for real."""

import pytest

from tests.spark import datadirs as dd
from tests.spark.test_audit_job import audit, findings


@pytest.fixture(scope="module")
def cut(spark, broker_dir, tmp_path_factory):
    """100 records overwritten in the middle of the second segment (records 60-159)."""
    base = tmp_path_factory.mktemp("cut")
    data = dd.copy_dir(broker_dir[0], str(base / "data"))
    damaged = dd.overwrite_records(data, 60, 100)
    summary, code = audit(spark, data, base / "out")
    return summary, code, damaged, base / "out"


@pytest.fixture(scope="module")
def header(spark, broker_dir, tmp_path_factory):
    """One record's header damaged (queue id and a topic byte), its framing intact."""
    base = tmp_path_factory.mktemp("header")
    data = dd.copy_dir(broker_dir[0], str(base / "data"))
    damaged = dd.damage_header(data, 30)
    summary, code = audit(spark, data, base / "out")
    return summary, code, damaged


@pytest.mark.parametrize("form", ["compact", "full"])
def test_cut_records_are_one_range_and_one_gap(spark, broker_dir, tmp_path, cut, form):
    """The damaged bytes are one corrupt range, exactly where and as long as the 100
    records were, between the eventIds before and after them; the walk goes on after
    it, so the eventIds lost are one gap of 100 and nothing is lost at the tail."""
    summary, code, (offset, size, before, after), _ = cut
    if form == "full":
        data = dd.copy_dir(broker_dir[0], str(tmp_path / "data"))
        assert dd.overwrite_records(data, 60, 100) == cut[2]
        summary, code = audit(spark, data, tmp_path / "out", "--full")
    assert after == before + 101
    problems = summary["integrity_examples"]["problems"]
    assert [(p["problem"], p["offset"], p["bytes"], p["event_before"], p["event_after"]) for p in problems] == [
        ("corrupt", offset, size, before, after)
    ]
    assert summary["integrity_examples"]["event_gaps"] == [{"gap_start": before + 1, "gap_end": after - 1,
                                                             "missing": 100}]  # fmt: skip
    f = findings(summary)
    assert (f["corrupt_records"], f["unreadable_bytes"], f["event_id_gaps"], f["missing_event_ids"]) == (
        1, size, 1, 100)
    assert "tail_event_ids_missing" not in f and "torn_records" not in f
    # Their consume-queue entries point at no record; no other entry is out of place.
    assert (f["cq_extra"], f.get("cq_missing", 0), f.get("cq_wrong", 0)) == (100, 0, 0)
    assert summary["log"]["records"] == dd.RECORDS - 100
    orders = [q for q in summary["queues"] if q["topic"] == "orders"][0]
    assert orders["messages"] == dd.ORDERS_MESSAGES - 100 and code == 1


def test_damaged_header_is_not_a_topic(header):
    """A record whose header names queue 65535 of a topic that is not UTF-8 is one
    corrupt range of its own size, one lost eventId, and is in no queue or topic."""
    summary, code, (offset, size, event_id) = header
    problems = summary["integrity_examples"]["problems"]
    assert [(p["problem"], p["offset"], p["bytes"], p["event_before"], p["event_after"]) for p in problems] == [
        ("corrupt", offset, size, event_id - 1, event_id + 1)
    ]
    assert "damaged header" in problems[0]["detail"]
    assert summary["integrity_examples"]["event_gaps"] == [{"gap_start": event_id, "gap_end": event_id,
                                                             "missing": 1}]  # fmt: skip
    assert (summary["integrity"]["cq_extra"], summary["integrity"]["cq_missing"]) == (1, 0)
    assert sorted({q["topic"] for q in summary["queues"]}) == ["%DLQ%g1", "%RETRY%g1", "gone", "orders", "ttl"]
    assert all(q["queue_id"] == 0 for q in summary["queues"])
    assert code == 1


def test_report_says_what_was_found_and_where(cut):
    """summary.json carries the findings as stdout's JSON does; the report opens with
    them, each saying where (the damaged range and the eventIds around it) and what to
    do."""
    from spark.audit.summary import console_summary

    summary, _, (offset, size, before, after), _ = cut
    assert summary["findings"] == console_summary(summary)["findings"]
    assert summary["findings"]["integrity.corrupt_records"] == 1
    page = (cut[3] / "report.html").read_text(encoding="utf-8")
    found = page[page.index("What was found") : page.index("<h2>Segments")]
    assert f"log offset {offset}, {size} bytes, between eventIds {before} and {after}" in found
    assert "eventIds " + f"{before + 1}-{after - 1}" in found and "what to do" in found
