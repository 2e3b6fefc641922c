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
body{font:14px/1.4 sans-serif;margin:2em auto;max-width:1240px;color:#222;padding:0 1em}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:12.5px}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:right;white-space:nowrap}
th{white-space:normal;vertical-align:bottom}
th{background:#f3f3f3}
td.l,th.l{text-align:left}
td.w{white-space:normal;overflow-wrap:anywhere;min-width:14em;text-align:left}
.ok{background:#dff0d8;padding:.6em 1em}
.bad{background:#f2dede;padding:.6em 1em}
ol.findings li{margin:.6em 0}
ol.findings .what{font-weight:bold}
ol.findings .do{color:#444}
tr.bad td{background:#f9e5e5}
img,svg.chart{max-width:100%;height:auto;border:1px solid #ddd;margin:.5em 0}
"""

#: Human labels of the summary's field names, for headings and table columns.
LABELS = {
    "crc_failures": "records failing their body CRC",
    "corrupt_records": "damaged byte ranges",
    "torn_records": "torn tails",
    "unreadable_bytes": "bytes damaged",
    "missing_segments": "segment files missing",
    "event_id_gaps": "eventId gaps",
    "missing_event_ids": "eventIds missing",
    "duplicate_event_ids": "eventIds held twice",
    "tail_event_ids_missing": "eventIds missing at the tail (checkpoint's next eventId)",
    "checkpoint_beyond_log_bytes": "bytes the checkpoint covers beyond the log's end",
    "cq_missing": "consume-queue entries missing",
    "cq_extra": "consume-queue entries pointing at no record",
    "cq_wrong": "consume-queue entries pointing at the wrong record",
    "cq_torn_files": "consume-queue files ending in a partial entry",
    "changed_segments": "segments changed since the last audit",
    "missing": "missing",
    "segment": "segment (log offset)", "file_length": "file bytes", "records_end": "records end",
    "sealed": "sealed", "declared_segment_size": "declared size", "crc32": "CRC-32 of its records",
    "first_event_id": "first eventId", "last_event_id": "last eventId", "queue_id": "queue",
    "first_store_ts": "first stored (UTC)", "last_store_ts": "last stored (UTC)", "body_bytes": "body bytes",
    "per_minute": "per minute", "delay_level_messages": "delay-level messages", "delayed_fired": "delays fired",
    "event_before": "eventId before", "event_after": "eventId after", "event_id": "eventId",
    "gap_start": "first missing", "gap_end": "last missing", "queue_offset": "queue offset",
    "e_offset": "log offset (record)", "log_offset": "log offset (entry)", "e_size": "size (record)",
    "size": "size (entry)",
    "committed": "committed offset", "finished_ahead": "finished ahead", "delivered_unfinished":
    "out, unfinished", "max_offset": "queue length", "push_url": "push URL", "consumer": "consumer",
    "trigger_ms": "trigger (UTC)", "delay_count": "messages", "expire_at": "expires (UTC)",
    "create_event_id": "created at eventId", "copies": "copies", "offsets": "log offsets",
}


#: Labels of the comparison's counts (C{compare.<name>} findings).
COMPARE_LABELS = {
    "missing": "records only in this directory",
    "extra": "records only in the other directory",
    "different": "records in both, with other content",
    "from_event_id": "compared from eventId",
    "first_divergent_event_id": "first divergent eventId",
}


def label(name):
    """The human label of a summary field."""
    return LABELS.get(name, name.replace("_", " "))


#: For each finding: what to do about it.
ADVICE = {
    "crc_failures": "The record's body changed on disk after it was written (disk or memory fault). "
                    "Readers skip it; restore it from a slave (compare with --compare) if it matters.",
    "corrupt_records": "Bytes in the log are damaged. The broker steps over them as the audit does; the "
                       "records in them are lost here: recover them from a slave (--compare shows which).",
    "torn_records": "A segment ends inside a record: a write cut by a crash or a copy cut short. The broker "
                    "truncates a torn tail of its last segment at start-up.",
    "unreadable_bytes": "See the damaged ranges.",
    "missing_segments": "Segment files between the oldest and the newest are gone: restore them from a "
                        "backup or a slave; retention never removes a segment in the middle.",
    "event_id_gaps": "eventIds that were written are not in the log: records lost or cut out. Check the "
                     "damaged ranges around them and the slave.",
    "missing_event_ids": "See the eventId gaps.",
    "duplicate_event_ids": "Two records carry one eventId: a log spliced from two histories. Do not let a "
                           "slave follow this directory until it is explained.",
    "tail_event_ids_missing": "The checkpoint counted records the log no longer holds: the log's tail was "
                              "lost after the checkpoint (a torn write, a copy taken while running).",
    "checkpoint_beyond_log_bytes": "The checkpoint covers bytes past the end of the log: the log lost its "
                                   "tail; the broker rebuilds its state from the log at start-up.",
    "cq_missing": "Messages no consumer can find by queue offset. Restarting the broker rebuilds consume "
                  "queues from the checkpoint on; remove metadata.json to rebuild them all.",
    "cq_extra": "Consume-queue entries point at records the log does not hold (often those of a damaged "
                "range): readers skip them.",
    "cq_wrong": "Consume-queue entries point at another record: rebuild the consume queues (remove "
                "metadata.json and consumequeue/ with the broker stopped).",
    "cq_torn_files": "A consume-queue file ends in a partial entry: a crash mid-write; the broker rewrites "
                     "it from the log at start-up.",
    "changed_segments": "Bytes the last audit proved have changed since: find out what wrote to the log.",
    "missing": "The slave lacks these records: it is behind or lost them; let it catch up and audit again.",
    "extra": "The slave holds records this directory lacks: this directory lost them, or the slave "
             "followed another master.",
    "different": "Both hold these eventIds with other content: the two logs diverged; rebuild the slave.",
}
def _ts(ms):
    if ms is None:
        return ""
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return '<img alt="chart" src="data:image/png;base64,' + base64.b64encode(buf.getvalue()).decode() + '">'


def _cell(v, left=False, wrap=False):
    cls = ' class="w"' if wrap else (' class="l"' if left else "")
    return f"<td{cls}>{html.escape('' if v is None else str(v))}</td>"


#: Columns whose values are long text: wrapped, so the tables fit the page.
_WRAP = ("detail", "push_url", "offsets", "where")


def _table(rows, columns, left=(), fmt=None):
    fmt = fmt or {}
    if not rows:
        return "<p>none</p>"
    head = "".join(f'<th class="{"l" if c in left or c in _WRAP else ""}">{html.escape(label(c))}</th>'
                   for c in columns)
    body = []
    for r in rows:
        cells = "".join(_cell(fmt.get(c, lambda x: x)(r.get(c)), c in left, c in _WRAP) for c in columns)
        body.append(f"<tr>{cells}</tr>")
    return f"<div class='scroll'><table><tr>{head}</tr>{''.join(body)}</table></div>"


def _hex(v):
    return "" if v is None else f"{v & 0xFFFFFFFF:08x}"


def throughput_chart(rows):
    """Messages per minute of the busiest topics (line chart), or '' without data. A
    topic's line joins adjacent minutes only (a minute without its messages breaks it),
    and the time axis is labelled at minutes that hold data."""
    if not rows:
        return ""
    from spark.audit.charts import runs_of, tick_times

    utc = datetime.timezone.utc

    def when(ms):
        return datetime.datetime.fromtimestamp(ms / 1000, utc)

    fig, ax = plt.subplots(figsize=(9, 3.5))
    for n, topic in enumerate(sorted({r["topic"] for r in rows})):
        pts = [{"t": r["minute"], "v": r["messages"]} for r in rows if r["topic"] == topic]
        color = f"C{n % 10}"
        for i, run in enumerate(runs_of(pts, 60000)):
            ax.plot([when(p["t"]) for p in run], [p["v"] for p in run], color=color, marker="o", markersize=3,
                    label=topic if i == 0 else None)  # fmt: skip
    ticks = tick_times([{"t": t} for t in sorted({r["minute"] for r in rows})])
    ax.set_xticks([when(t) for t in ticks])
    long = ticks[-1] - ticks[0] >= 86_400_000
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M" if long else "%H:%M", tz=utc))
    pad = datetime.timedelta(minutes=1)
    ax.set_xlim(when(ticks[0]) - pad, when(ticks[-1]) + pad)
    ax.set_ylim(bottom=0)
    ax.set_title("Messages per minute of the busiest topics (store time, UTC)")
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


def _where(name, s):
    """Where finding C{name} of summary C{s} lies, in a line, from its first examples."""
    ex, n = s.get("integrity_examples", {}), 3

    def some(rows, fmt):
        text = "; ".join(fmt(r) for r in rows[:n])
        return text + ("; ..." if len(rows) > n else "")

    probs = ex.get("problems", [])
    if name == "crc_failures":
        return some([p for p in probs if p["problem"] == "crc"],
                    lambda p: f"eventId {p['event_id']} ({p['topic']}) at log offset {p['offset']}")
    if name in ("corrupt_records", "torn_records", "unreadable_bytes"):
        kind = {"corrupt_records": ("corrupt",), "torn_records": ("torn",)}.get(name, ("corrupt", "torn"))
        return some([p for p in probs if p["problem"] in kind],
                    lambda p: f"log offset {p['offset']}, {p['bytes']} bytes, between eventIds "
                              f"{p.get('event_before') if p.get('event_before') is not None else '?'} and "
                              f"{p.get('event_after') if p.get('event_after') is not None else '?'}: {p['detail']}")
    if name in ("event_id_gaps", "missing_event_ids"):
        return some(ex.get("event_gaps", []), lambda g: f"eventIds {g['gap_start']}-{g['gap_end']}")
    if name == "duplicate_event_ids":
        return some(ex.get("event_duplicates", []), lambda d: f"eventId {d['event_id']} at {d['offsets']}")
    if name.startswith("cq_") and name != "cq_torn_files":
        status = name[3:]
        return some([m for m in ex.get("cq_mismatches", []) if m["status"] == status],
                    lambda m: f"{m['topic']}/{m['queue_id']} offset {m['queue_offset']}")
    if name == "missing_segments":
        return ", ".join(str(o) for o in ex.get("missing_segments", [])[:n])
    if name == "tail_event_ids_missing":
        cp = s["log"].get("checkpoint") or {}
        return f"checkpoint's next eventId {cp.get('nextEventId')}, last in the log {s['log'].get('last_event_id')}"
    if name == "checkpoint_beyond_log_bytes":
        cp = s["log"].get("checkpoint") or {}
        return f"checkpoint at log offset {cp.get('logOffset')}, log ends at {s['log'].get('end_offset')}"
    if name == "changed_segments":
        changed = (s.get("incremental") or {}).get("changed_segments", [])
        return some(changed, lambda c: f"segment {c['segment']}: {c['detail']}")
    if name.startswith("compare."):
        cmp = s.get("compare") or {}
        if name.startswith("compare.other_integrity."):
            return f"in {cmp.get('other_dir')}"
        status = name.split(".")[-1]
        ids = [e["event_id"] for e in cmp.get("examples", []) if e["status"] == status]
        if ids and ids[-1] - ids[0] + 1 == len(ids) == cmp.get(status):
            return f"eventIds {ids[0]}-{ids[-1]}" if len(ids) > 1 else f"eventId {ids[0]}"
        return some(ids, lambda e: f"eventId {e}") if ids else f"from eventId {cmp.get('first_divergent_event_id')}"
    return ""


def findings_section(s):
    """What was found, where, and what to do: one item per finding of C{s["findings"]}."""
    found = s.get("findings") or {}
    if not found:
        return "<h2>What was found</h2><p>No integrity finding: every record, eventId and consume-queue entry " \
               "checked is where it belongs.</p>"
    items = []
    for key, count in found.items():
        name = key.split(".")[-1]
        other = key.startswith("compare.other_integrity.")
        text = COMPARE_LABELS[name] if key.startswith("compare.") and not other else label(name)
        what = f"{'the other directory: ' if other else ''}{text}: {count:,}"
        items.append(f"<li><span class='what'>{html.escape(what)}</span><br>"
                     f"where: {html.escape(_where(key if key.startswith('compare.') else name, s))}<br>"
                     f"<span class='do'>what to do: {html.escape(ADVICE.get(name, ''))}</span></li>")  # fmt: skip
    return "<h2>What was found</h2><ol class='findings'>" + "".join(items) + "</ol>"


def compare_section(cmp):
    """The comparison with the other directory (a slave)."""
    out = [f"<h2>Comparison with {html.escape(str(cmp['other_dir']))}</h2>"]
    rows = [{"field": COMPARE_LABELS.get(k, k.replace("_", " ")), "value": cmp[k]}
            for k in ("from_event_id", "first_divergent_event_id", "missing", "extra", "different")]  # fmt: skip
    out.append(_table(rows, ["field", "value"], left=("field",)))
    out.append(_table(cmp["examples"], ["event_id", "status", "offset", "other_offset"], left=("status",)))
    rows = [{"finding": label(k), "count": v} for k, v in cmp["other_integrity"].items() if v]
    out.append("<h3>The other directory's integrity</h3>")
    out.append(_table(rows, ["finding", "count"], left=("finding",)) if rows else "<p>no finding</p>")
    return "\n".join(out)


def render(summary, charts):
    """Return the report page for C{summary} (see L{spark.audit.summary}) as a str: the
    verdict, what was found (where, what to do), the comparison with a slave, the
    segments, then the figures."""
    s, log, integ = summary, summary["log"], summary["integrity"]
    out = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>mqserver audit</title>"
           f"<style>{_CSS}</style></head><body>"]  # fmt: skip
    out.append(f"<h1>mqserver audit: {html.escape(str(s['data_dir']))}</h1>")
    ok = s.get("verdict") == "OK"
    out.append(f'<p class="{"ok" if ok else "bad"}"><b>{html.escape(s.get("verdict", ""))}</b>'
               f" &mdash; exit code {s.get('exit_code')}; {log.get('records') or 0:,} records in "
               f"{log.get('segments')} segments, eventIds {log.get('first_event_id')} to "
               f"{log.get('last_event_id')}; as of {_ts(s['as_of_ms'])} UTC</p>")  # fmt: skip
    out.append(findings_section(s))
    cmp = s.get("compare")
    if cmp:
        out.append(compare_section(cmp))

    out.append("<h2>Segments</h2>")
    out.append(_table(s.get("segments", []), ["segment", "records", "file_length", "sealed", "first_event_id",
                                              "last_event_id", "crc32"],
                      fmt={"crc32": _hex}))  # fmt: skip

    ex = s.get("integrity_examples", {})
    for name, title, cols in [
        ("problems", "Damaged records and byte ranges", ["problem", "segment", "offset", "bytes", "event_before",
                                                         "event_after", "event_id", "topic", "detail"]),
        ("event_gaps", "eventId gaps", ["gap_start", "gap_end", "missing"]),
        ("event_duplicates", "eventIds held twice", ["event_id", "copies", "offsets"]),
        ("cq_mismatches", "Consume-queue entries out of place", ["status", "topic", "queue_id", "queue_offset",
                                                                  "e_offset", "log_offset", "e_size", "size",
                                                                  "event_id"]),
    ]:  # fmt: skip
        if ex.get(name):
            out.append(f"<h3>{html.escape(title)} (first {len(ex[name])})</h3>")
            out.append(_table(ex[name], cols, left=("problem", "topic", "status")))

    out.append("<h2>Commit log</h2>")
    keys = ["segments", "segment_size", "segment_size_source", "min_offset", "end_offset", "records",
            "messages", "admin_records", "bytes", "first_event_id", "last_event_id"]  # fmt: skip
    rows = [{"field": label(k), "value": log.get(k)} for k in keys]
    rows += [{"field": label("first_store_ts"), "value": _ts(log.get("first_store_ts"))},
             {"field": label("last_store_ts"), "value": _ts(log.get("last_store_ts"))}]  # fmt: skip
    out.append(_table(rows, ["field", "value"], left=("field",)))
    out.append("<h3>Every integrity check</h3>")
    rows = [{"finding": label(k), "count": integ[k]} for k in INTEGRITY_KEYS]
    out.append(_table(rows, ["finding", "count"], left=("finding",)))

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
                         "Messages per queue"))  # fmt: skip

    c = s["consumption"]
    out.append("<h2>Consumption</h2><h3>Lag of every consumer the broker keeps a position for</h3>")
    out.append(_table(c["lag"], ["kind", "topic", "consumer", "queue_id", "committed", "finished_ahead",
                                 "delivered_unfinished", "max_offset", "lag", "push_url"],
                      left=("kind", "topic", "consumer")))  # fmt: skip
    lag = [r for r in c["lag"] if r["lag"]][:25]
    out.append(bar_chart([f"{r['kind']} {r['consumer']} {r['topic']}/{r['queue_id']}" for r in lag],
                         [r["lag"] for r in lag], "Lag (messages not finished)", "#d99a2b"))  # fmt: skip
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
    out.append("</body></html>\n")
    return "\n".join(x for x in out if x)
