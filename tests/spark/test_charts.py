"""The report's time series: aggregated in Spark per minute, drawn as inline SVG; and
when Spark's console progress bar is on."""

import io
import xml.etree.ElementTree as ET

import pytest

from spark.audit import charts as C
from spark.audit import job

T0 = 1_700_000_040_000  # a whole minute


def test_bucket_width():
    """A minute, or whole minutes so that the span fits in MAX_POINTS buckets."""
    assert C.bucket_ms(T0, T0 + 59_999) == C.MINUTE
    assert C.bucket_ms(T0, T0 + C.MINUTE * (C.MAX_POINTS - 1)) == C.MINUTE
    assert C.bucket_ms(T0, T0 + C.MINUTE * C.MAX_POINTS) == 2 * C.MINUTE
    assert C.bucket_ms(T0, T0 + 30 * 86_400_000 - 1) == 60 * C.MINUTE  # 43,200 minutes
    assert C.bucket_ms(None, None) == C.MINUTE


def _recs(spark, rows):
    return spark.createDataFrame(rows, "segment bigint, event_id bigint, magic string, born_ts bigint, store_ts bigint")


def test_store_lag_per_minute(spark):
    """Mean and largest store_ts - born_ts of the messages of each minute (admin
    records left out), merged from per-segment parts."""
    recs = _recs(spark, [
        (0, 1, "admin", T0, T0 + 9999),
        (0, 2, "message", T0, T0 + 10),
        (0, 3, "message", T0 + 5, T0 + 35),
        (65536, 4, "message", T0 + 59_000, T0 + 59_100),
        (65536, 5, "message", T0 + 60_000, T0 + 60_004),
    ])  # fmt: skip
    assert C.store_lag_series(C.lag_parts(recs), C.MINUTE) == [
        {"t": T0, "mean": (10 + 30 + 100) / 3, "max": 100},
        {"t": T0 + C.MINUTE, "mean": 4.0, "max": 4},
    ]
    assert C.store_lag_series(C.lag_parts(recs), 2 * C.MINUTE) == [{"t": T0, "mean": 36.0, "max": 100}]


def test_replication_lag_per_minute(spark):
    """The other directory's store time minus this one's, for eventIds both hold."""
    mine = _recs(spark, [(0, 1, "message", T0, T0), (0, 2, "message", T0, T0 + 100), (0, 3, "message", T0, T0 + 200)])
    other = _recs(spark, [(0, 1, "message", T0, T0 + 50), (0, 2, "message", T0, T0 + 250)])
    assert C.replication_lag_series(mine, other, C.MINUTE) == [{"t": T0, "mean": 100.0, "max": 150}]


def test_throughput_per_bucket(spark):
    """Messages and bytes of every topic summed per bucket."""
    tp = spark.createDataFrame([("a", T0, 3, 300), ("b", T0, 1, 50), ("a", T0 + C.MINUTE, 2, 200)],
                               "topic string, minute bigint, messages bigint, bytes bigint")  # fmt: skip
    assert C.throughput_series(tp, C.MINUTE) == [
        {"t": T0, "messages": 4, "bytes": 350}, {"t": T0 + C.MINUTE, "messages": 2, "bytes": 200}]


def test_line_chart_is_inline_svg():
    """Well-formed SVG, one polyline per line with a point per row, labels escaped,
    nothing loaded from anywhere."""
    rows = [{"t": T0 + i * C.MINUTE, "mean": i * 10.0, "max": i * 20} for i in range(5)]
    svg = C.line_chart(rows, [("mean", "mean <ms>"), ("max", "max")], "lag & more", "ms")
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    lines = root.findall(f"{ns}polyline")
    assert len(lines) == 2 and all(len(p.get("points").split()) == 5 for p in lines)
    ys = [float(pt.split(",")[1]) for pt in lines[1].get("points").split()]
    assert ys == sorted(ys, reverse=True)  # rising values go up the page
    assert "lag &amp; more" in svg and "mean &lt;ms&gt;" in svg
    assert "href" not in svg and "<script" not in svg
    assert C.line_chart([], [("mean", "mean")], "empty") == ""


def test_line_chart_breaks_at_time_without_data():
    """Two bursts an hour apart and a lone minute between: each burst is a line of its
    own, the lone minute a dot, nothing is drawn across the empty minutes, and the time
    axis is labelled at minutes that hold data."""
    rows = ([{"t": T0 + i * C.MINUTE, "messages": 10} for i in range(3)]
            + [{"t": T0 + 30 * C.MINUTE, "messages": 5}]
            + [{"t": T0 + (60 + i) * C.MINUTE, "messages": 20} for i in range(4)])  # fmt: skip
    root = ET.fromstring(C.line_chart(rows, [("messages", "messages")], "messages"))
    ns = "{http://www.w3.org/2000/svg}"
    assert [len(p.get("points").split()) for p in root.findall(f"{ns}polyline")] == [3, 4]
    assert len(root.findall(f"{ns}circle")) == 1
    stamps = {C._time(r["t"], False) for r in rows}
    labels = [t.text for t in root.findall(f"{ns}text") if t.text and ":" in t.text]
    assert labels and set(labels) <= stamps
    assert labels[0] == C._time(T0, False) and labels[-1] == C._time(T0 + 63 * C.MINUTE, False)


def test_section_names_the_bucket():
    """The section says the bucket width and draws only the series it has."""
    rows = [{"t": T0, "messages": 1, "bytes": 2}]
    page = C.section({"bucket_ms": 5 * C.MINUTE, "throughput_total": rows})
    assert page.count("<svg") == 2 and "per 5 minutes" in page
    assert C.section({}) == ""


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_console_progress_choice():
    """Spark's progress bar: on a terminal by default, when asked, never with --quiet."""
    def on(*argv, stream):
        return job.console_progress(job.parse_args(["data", *argv]), stream)

    assert on(stream=_Tty()) and not on(stream=io.StringIO())
    assert on("--progress", "always", stream=io.StringIO())
    assert not on("--progress", "never", stream=_Tty())
    assert not on("--quiet", stream=_Tty()) and not on("--quiet", "--progress", "always", stream=_Tty())


def test_tables_written_only_when_asked():
    """No Parquet table by default (each costs Spark jobs); C{all}, or the names given;
    a name the run has no table of is bad input."""
    tables = {"segments": 1, "problems": 2, "consumer_lag": 3}
    assert job.parse_args(["data"]).tables == "none"
    assert job.wanted_tables("none", tables) == []
    assert job.wanted_tables("all", tables) == list(tables)
    assert job.wanted_tables("consumer_lag, problems", tables) == ["consumer_lag", "problems"]
    with pytest.raises(SystemExit, match="no table 'lag'"):
        job.wanted_tables("lag", tables)
