"""The report's time-series charts: throughput and lag over time, from per-minute
aggregates (the decode's, or Spark's over every record), summed here into buckets of a
minute or of a few minutes on long logs, and drawn as inline SVG by this module.

Series (each a list of C{{"t": bucket start ms, ...}} rows, at most L{MAX_POINTS}):

- C{throughput}: messages and bytes stored per bucket of store time, all topics.
- C{store_lag}: per bucket of store time, the mean and the largest C{store_ts -
  born_ts} of the messages stored in it: how long a message took from its producer
  (RocketMQ's C{bornTimestamp}, the time smss and NSQ publishes arrived) to the log.
- C{replication_lag} (with C{--compare}): per bucket of this directory's store time,
  the mean and largest store time in the other directory minus the store time here,
  for the eventIds both hold: how far the slave was behind when it stored them.

The page has no script and loads nothing: the SVG is text inside the HTML.

test-case-name: tests.spark.test_charts
"""

import datetime
import html

from pyspark.sql import functions as F

from spark.audit import rows as RW

#: At most this many points per series: longer logs get wider buckets.
MAX_POINTS = 720
MINUTE = 60000


def bucket_ms(first_ts, last_ts, points=MAX_POINTS):
    """Return the bucket width (ms): a minute, or whole minutes so that the span from
    C{first_ts} to C{last_ts} fits in C{points} buckets."""
    if first_ts is None or last_ts is None:
        return MINUTE
    minutes = (last_ts - first_ts) // MINUTE + 1
    return MINUTE * max(1, -(-minutes // points))


def _bucket(col, width):
    return F.col(col) - F.col(col) % width


def _buckets(rows, width, columns):
    # Per bucket of `width` ms of the rows' minute (none for a row without one): `columns`
    # as rows.aggregate computes them, in time order, at most MAX_POINTS.
    timed = [dict(r, t=r["minute"] - r["minute"] % width) for r in RW.dicts(rows) if r["minute"] is not None]
    return sorted(RW.aggregate(timed, ["t"], columns), key=lambda r: r["t"])[:MAX_POINTS]


def throughput_series(throughput, width):
    """Messages and bytes per bucket from the C{throughput} table (topic, minute): a
    DataFrame or L{spark.audit.rows.Rows}."""
    return _buckets(throughput, width, {"messages": ("sum", "messages"), "bytes": ("sum", "bytes")})


def store_lag_series(lag_parts, width):
    """Mean and largest store lag per bucket from per-minute parts (C{minute, n,
    lag_sum, lag_max}, see L{lag_parts}): a DataFrame or L{spark.audit.rows.Rows}."""
    out = []
    sums = {"n": ("sum", "n"), "lag_sum": ("sum", "lag_sum"), "max": ("max", "lag_max")}
    for r in _buckets(lag_parts, width, sums):
        # As Spark divides two sums: as doubles, null when either is null or n is 0.
        mean = None if r["n"] in (None, 0) or r["lag_sum"] is None else float(r["lag_sum"]) / float(r["n"])
        out.append({"t": r["t"], "mean": mean, "max": r["max"]})
    return out


def replication_lag_series(mine, other, width):
    """Mean and largest replication lag per bucket of this directory's store time, over
    the eventIds both record frames (C{event_id, store_ts}) hold."""
    a = mine.select("event_id", "store_ts").dropDuplicates(["event_id"])
    b = other.select("event_id", F.col("store_ts").alias("other_ts")).dropDuplicates(["event_id"])
    lag = F.col("other_ts") - F.col("store_ts")
    df = a.join(b, "event_id").groupBy(_bucket("store_ts", width).alias("t")).agg(
        F.avg(lag).alias("mean"), F.max(lag).alias("max")
    )
    return [r.asDict() for r in df.orderBy("t").limit(MAX_POINTS).collect()]


def lag_parts(recs):
    """Per (segment, minute of store time) of the messages: count, sum and max of
    C{store_ts - born_ts} (ms): the store-lag series, mergeable across segments (an
    incremental audit keeps them per segment)."""
    lag = F.col("store_ts") - F.col("born_ts")
    return (
        recs.where(F.col("magic") == "message")
        .groupBy("segment", _bucket("store_ts", MINUTE).alias("minute"))
        .agg(F.count("*").alias("n"), F.sum(lag).alias("lag_sum"), F.max(lag).alias("lag_max"))
    )


def collect(tables, totals, lags, recs=None, other_recs=None):
    """Return the series the report draws: C{bucket_ms}, C{throughput_total},
    C{store_lag} and, given C{other_recs}, C{replication_lag}. C{totals}: the log's
    (first and last store time); C{lags}: L{lag_parts} of the whole log."""
    width = bucket_ms(totals.get("first_store_ts"), totals.get("last_store_ts"))
    out = {
        "bucket_ms": width,
        "throughput_total": throughput_series(tables["throughput"], width),
        "store_lag": store_lag_series(lags, width),
    }
    if other_recs is not None:
        out["replication_lag"] = replication_lag_series(recs, other_recs, width)
    return out


# -- drawing ------------------------------------------------------------------------------

_W, _H, _L, _R, _T, _B = 860, 240, 70, 20, 28, 36
_COLORS = ("#4a7ab5", "#d99a2b", "#c0504d", "#5b9a5b")


def _num(v):
    a = abs(v)
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if a >= div:
            return f"{v / div:.3g}{unit}"
    return f"{v:.3g}"


def _time(ms, with_date):
    t = datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)
    return t.strftime("%m-%d %H:%M" if with_date else "%H:%M")


def runs_of(rows, step):
    """Split C{rows} (sorted by C{"t"}) where a bucket of C{step} ms has no row: the
    lists of rows a line may join without crossing time that had no data."""
    out = []
    for r in rows:
        if out and step and r["t"] - out[-1][-1]["t"] <= step:
            out[-1].append(r)
        else:
            out.append([r])
    return out


def tick_times(rows, n=6):
    """Up to C{n} times of C{rows} to label the time axis with: points that hold data,
    spread over them (the first and the last included)."""
    ts = [r["t"] for r in rows]
    if len(ts) <= n:
        return ts
    return sorted({ts[round(i * (len(ts) - 1) / (n - 1))] for i in range(n)})


def line_chart(rows, lines, title, unit="", step=MINUTE):
    """Return an inline C{<svg>} line chart of C{rows} (dicts with C{"t"} in epoch ms,
    one per bucket of C{step} ms that had data) with one line per C{(key, label)} of
    C{lines}, or '' without data. Lines join adjacent buckets only: time without data
    is a break in the line, never a slope across it, and a lone point is a dot. The
    time axis is labelled at points that hold data."""
    rows = [r for r in rows if r.get("t") is not None]
    if not rows:
        return ""
    t0, t1 = rows[0]["t"], rows[-1]["t"]
    top = max([r[k] or 0 for r in rows for k, _ in lines] + [0]) or 1
    pw, ph = _W - _L - _R, _H - _T - _B

    def x(t):
        return _L + (pw * (t - t0) / (t1 - t0) if t1 > t0 else pw / 2)

    def y(v):
        return _T + ph - ph * (v or 0) / top

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{_W}" height="{_H}" '
           f'viewBox="0 0 {_W} {_H}" role="img" aria-label="{html.escape(title)}">',
           f'<text x="{_L}" y="16" font-size="13" font-weight="bold">{html.escape(title)}</text>',
           f'<rect x="{_L}" y="{_T}" width="{pw}" height="{ph}" fill="none" stroke="#bbb"/>']  # fmt: skip
    for i in range(5):
        v = top * i / 4
        out.append(f'<line x1="{_L}" y1="{y(v):.1f}" x2="{_L + pw}" y2="{y(v):.1f}" stroke="#eee"/>'
                   f'<text x="{_L - 6}" y="{y(v) + 4:.1f}" font-size="11" text-anchor="end">'
                   f"{_num(v)}{html.escape(unit)}</text>")  # fmt: skip
    with_date = t1 - t0 >= 86_400_000
    for t in tick_times(rows):
        out.append(f'<line x1="{x(t):.1f}" y1="{_T + ph}" x2="{x(t):.1f}" y2="{_T + ph + 4}" stroke="#888"/>'
                   f'<text x="{x(t):.1f}" y="{_T + ph + 16}" font-size="11" text-anchor="middle">'
                   f"{_time(t, with_date)}</text>")  # fmt: skip
    runs = runs_of(rows, step)
    for n, (key, label) in enumerate(lines):
        color = _COLORS[n % len(_COLORS)]
        for run in runs:
            if len(run) == 1:
                out.append(f'<circle cx="{x(run[0]["t"]):.1f}" cy="{y(run[0][key]):.1f}" r="3" fill="{color}"/>')
            else:
                pts = " ".join(f"{x(r['t']):.1f},{y(r[key]):.1f}" for r in run)
                out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{pts}"/>')
        lx = _L + 10 + 160 * n
        out.append(f'<rect x="{lx}" y="{_H - 12}" width="10" height="3" fill="{color}"/>'
                   f'<text x="{lx + 14}" y="{_H - 8}" font-size="11">{html.escape(label)}</text>')  # fmt: skip
    out.append("</svg>")
    return "".join(out)


def section(charts):
    """The report's "Over time" section: the charts of the series in C{charts}."""
    width = charts.get("bucket_ms", MINUTE)
    per = "minute" if width == MINUTE else f"{width // MINUTE} minutes"
    parts = [
        line_chart(charts.get("throughput_total", []), [("messages", "messages")],
                   f"Messages stored per {per} (store time, UTC)", step=width),
        line_chart(charts.get("throughput_total", []), [("bytes", "bytes")],
                   f"Bytes stored per {per} (store time, UTC)", "B", step=width),
        line_chart(charts.get("store_lag", []), [("mean", "mean"), ("max", "largest")],
                   f"Store lag per {per}: from the producer to the log (store time - born time)", "ms",
                   step=width),
        line_chart(charts.get("replication_lag", []), [("mean", "mean"), ("max", "largest")],
                   f"Replication lag per {per}: the slave's store time - this one's", "ms", step=width),
    ]  # fmt: skip
    parts = [p for p in parts if p]
    if not parts:
        return ""
    return "<h2>Over time</h2>\n" + "\n".join(f"<div>{p}</div>" for p in parts)
