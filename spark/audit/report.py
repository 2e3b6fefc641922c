"""The self-contained HTML report: tables from the summary, charts as embedded PNGs.

Charts are drawn with matplotlib's Agg backend into base64 C{data:} URIs, and the page
has no script, stylesheet or font from anywhere else, so it opens offline.

test-case-name: tests.spark.test_audit_job
"""

import base64
import datetime
import html
import io

import matplotlib

matplotlib.use("Agg")
from matplotlib import dates as mdates  # noqa: E402  (after choosing the backend)
from matplotlib import pyplot as plt  # noqa: E402

from spark.audit.charts import section as charts_section  # noqa: E402
from spark.audit.summary import INTEGRITY_KEYS  # noqa: E402

_CSS = """
body{font:14px/1.4 sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}
td.l,th.l{text-align:left}
.ok{background:#dff0d8;padding:.6em 1em}
.bad{background:#f2dede;padding:.6em 1em}
tr.bad td{background:#f9e5e5}
img{max-width:100%;border:1px solid #ddd;margin:.5em 0}
"""


def _ts(ms):
    if ms is None:
        return ""
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return '<img alt="chart" src="data:image/png;base64,' + base64.b64encode(buf.getvalue()).decode() + '">'


def _cell(v, left=False):
    cls = ' class="l"' if left else ""
    return f"<td{cls}>{html.escape('' if v is None else str(v))}</td>"


def _table(rows, columns, left=(), fmt=None):
    fmt = fmt or {}
    if not rows:
        return "<p>none</p>"
    head = "".join(f'<th class="{"l" if c in left else ""}">{html.escape(c)}</th>' for c in columns)
    body = []
    for r in rows:
        cells = "".join(_cell(fmt.get(c, lambda x: x)(r.get(c)), c in left) for c in columns)
        body.append(f"<tr>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def throughput_chart(rows):
    """Messages per minute per topic (line chart), or '' without data."""
    if not rows:
        return ""
    fig, ax = plt.subplots(figsize=(9, 3.5))
    for topic in sorted({r["topic"] for r in rows}):
        pts = [r for r in rows if r["topic"] == topic]
        xs = [datetime.datetime.fromtimestamp(r["minute"] / 1000, datetime.timezone.utc) for r in pts]
        ax.plot(xs, [r["messages"] for r in pts], marker="o", markersize=3, label=topic)
    lo = min(r["minute"] for r in rows)
    hi = max(r["minute"] for r in rows)
    pad = datetime.timedelta(minutes=1)
    utc = datetime.timezone.utc
    ax.set_xlim(datetime.datetime.fromtimestamp(lo / 1000, utc) - pad, datetime.datetime.fromtimestamp(hi / 1000, utc) + pad)
    if hi - lo < 86_400_000:
        step = max(1, (hi - lo) // 60000 // 8)
        ax.xaxis.set_major_locator(mdates.MinuteLocator(interval=int(step), tz=utc))
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M", tz=utc))
    ax.set_ylim(bottom=0)
    ax.set_title("messages per minute (store time, UTC)")
    ax.set_ylabel("messages")
    ax.legend(fontsize=8, loc="best")
    fig.autofmt_xdate()
    return _png(fig)


def bar_chart(labels, values, title, color="#4a7ab5"):
    """A horizontal bar chart, or '' without data."""
    if not labels:
        return ""
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(labels) + 1.2))
    ax.barh(range(len(labels)), values, color=color)
    ax.set_yticks(range(len(labels)), labels=labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_title(title)
    return _png(fig)


def render(summary, charts):
    """Return the report page for C{summary} (see L{spark.audit.summary}) as a str."""
    s, log, integ = summary, summary["log"], summary["integrity"]
    out = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>mqserver audit</title>"
           f"<style>{_CSS}</style></head><body>"]  # fmt: skip
    out.append(f"<h1>mqserver audit: {html.escape(str(s['data_dir']))}</h1>")
    ok = s.get("verdict") == "OK"
    out.append(f'<p class="{"ok" if ok else "bad"}"><b>{html.escape(s.get("verdict", ""))}</b>'
               f" &mdash; exit code {s.get('exit_code')}; as of {_ts(s['as_of_ms'])} UTC</p>")  # fmt: skip

    out.append("<h2>Commit log</h2>")
    keys = ["segments", "segment_size", "segment_size_source", "min_offset", "end_offset", "records",
            "messages", "admin_records", "bytes", "first_event_id", "last_event_id"]  # fmt: skip
    rows = [{"field": k, "value": log.get(k)} for k in keys]
    rows += [{"field": "first_store_ts", "value": _ts(log.get("first_store_ts"))},
             {"field": "last_store_ts", "value": _ts(log.get("last_store_ts"))}]  # fmt: skip
    out.append(_table(rows, ["field", "value"], left=("field",)))

    out.append("<h2>Integrity</h2>")
    rows = [{"finding": k, "count": integ[k]} for k in INTEGRITY_KEYS]
    out.append(_table(rows, ["finding", "count"], left=("finding",)))
    bad = [r for r in rows if r["count"]]
    out.append(bar_chart([r["finding"] for r in bad], [r["count"] for r in bad], "integrity findings", "#c0504d"))
    ex = s.get("integrity_examples", {})
    for name, cols in [
        ("problems", ["problem", "segment", "offset", "bytes", "event_before", "event_after", "event_id", "topic",
                      "detail"]),
        ("event_gaps", ["gap_start", "gap_end", "missing"]),
        ("event_duplicates", ["event_id", "copies", "offsets"]),
        ("cq_mismatches", ["status", "topic", "queue_id", "queue_offset", "e_offset", "log_offset",
                           "e_size", "size", "event_id"]),
    ]:  # fmt: skip
        if ex.get(name):
            out.append(f"<h3>{name} (first {len(ex[name])})</h3>")
            out.append(_table(ex[name], cols, left=("problem", "topic", "detail", "status", "offsets")))

    out.append("<h2>Topics and queues</h2>")
    out.append(_table(
        s["queues"],
        ["topic", "queue_id", "messages", "bytes", "body_bytes", "first_store_ts", "last_store_ts",
         "first_event_id", "last_event_id", "per_minute", "delay_level_messages", "delayed_fired"],
        left=("topic",), fmt={"first_store_ts": _ts, "last_store_ts": _ts},
    ))  # fmt: skip
    out.append(throughput_chart(charts.get("throughput", [])))
    out.append(charts_section(charts))
    top = sorted(s["queues"], key=lambda q: -q["messages"])[:25]
    out.append(bar_chart([f"{q['topic']}/{q['queue_id']}" for q in top], [q["messages"] for q in top],
                         "messages per queue"))  # fmt: skip

    c = s["consumption"]
    out.append("<h2>Consumption</h2><h3>Lag of every consumer the broker keeps a position for</h3>")
    out.append(_table(c["lag"], ["kind", "topic", "consumer", "queue_id", "committed", "finished_ahead",
                                 "delivered_unfinished", "max_offset", "lag", "push_url"],
                      left=("kind", "topic", "consumer", "push_url")))  # fmt: skip
    lag = [r for r in c["lag"] if r["lag"]][:25]
    out.append(bar_chart([f"{r['kind']} {r['consumer']} {r['topic']}/{r['queue_id']}" for r in lag],
                         [r["lag"] for r in lag], "lag (messages)", "#d99a2b"))  # fmt: skip
    out.append("<h3>Retry and dead-letter topics</h3>")
    out.append(_table(c["retry_dlq"], ["kind", "consumer_group", "topic", "messages", "bytes"],
                      left=("kind", "consumer_group", "topic")))  # fmt: skip
    d = c["delays"]
    out.append("<h3>Delayed messages</h3>")
    out.append(_table([d], ["total", "pending", "overdue", "overdue_messages"]))
    if d["overdue_examples"]:
        out.append(_table(d["overdue_examples"], ["event_id", "topic", "trigger_ms", "delay_count", "fired"],
                          left=("topic",), fmt={"trigger_ms": _ts}))  # fmt: skip
    out.append("<h3>Expired topics not reclaimed</h3>")
    out.append(_table(c["expired_topics_not_reclaimed"], ["topic", "expire_at", "create_event_id"],
                      left=("topic",), fmt={"expire_at": _ts}))  # fmt: skip

    cmp = s.get("compare")
    if cmp:
        out.append(f"<h2>Compare with {html.escape(str(cmp['other_dir']))}</h2>")
        rows = [{"field": k, "value": cmp[k]} for k in
                ("from_event_id", "first_divergent_event_id", "missing", "extra", "different")]  # fmt: skip
        out.append(_table(rows, ["field", "value"], left=("field",)))
        out.append(_table(cmp["examples"], ["event_id", "status", "offset", "other_offset"], left=("status",)))
        rows = [{"finding": k, "count": v} for k, v in cmp["other_integrity"].items()]
        out.append("<h3>Other directory's integrity</h3>")
        out.append(_table(rows, ["finding", "count"], left=("finding",)))
    out.append("</body></html>\n")
    return "\n".join(x for x in out if x)
