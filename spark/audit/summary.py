"""Turn the audit's DataFrames into the JSON summary and the exit code.

Only aggregates and a bounded number of examples reach the driver: counts, one row per
segment, per queue and per consumer group, and the first C{--max-examples} rows of each
finding. Never one row per record.

test-case-name: tests.spark.test_audit_job
"""

import math
import time
from concurrent.futures import ThreadPoolExecutor
from functools import reduce

from pyspark.sql import functions as F

from spark.audit import rows as RW

#: Integrity counters: any non-zero value makes the exit code 1.
INTEGRITY_KEYS = [
    "crc_failures", "corrupt_records", "torn_records", "unreadable_bytes", "missing_segments",
    "event_id_gaps", "missing_event_ids", "duplicate_event_ids", "tail_event_ids_missing",
    "checkpoint_beyond_log_bytes", "cq_missing", "cq_extra", "cq_wrong", "cq_torn_files",
    "changed_segments",
]  # fmt: skip


def _segment_size(segs, given):
    if given:
        return given, "--segment-size"
    declared = sorted({s["declared_segment_size"] for s in segs if s["declared_segment_size"]})
    if declared:
        return declared[-1], "BLANK record"
    starts = [s["segment"] for s in segs]
    if len(starts) > 1:
        return reduce(math.gcd, [b - a for a, b in zip(starts, starts[1:])]), "file-name spacing"
    return None, "unknown (one unsealed segment)"


def totals_columns():
    """The aggregate columns of the log's totals (also per segment, L{spark.audit.state})."""
    return [
        F.count("*").alias("records"),
        F.sum(F.when(F.col("magic") == "message", 1).otherwise(0)).alias("messages"),
        F.sum(F.when(F.col("magic") == "admin", 1).otherwise(0)).alias("admin_records"),
        F.sum("size").alias("bytes"),
        F.min("event_id").alias("first_event_id"),
        F.max("event_id").alias("last_event_id"),
        F.min("store_ts").alias("first_store_ts"),
        F.max("store_ts").alias("last_store_ts"),
    ]


def totals(recs):
    """The whole log's totals from every record: a one-row DataFrame."""
    return recs.agg(*totals_columns())


def totals_of_parts(t):
    """The totals (as L{totals} names them) of the compact form's sums
    (L{spark.audit.compact.totals}), which count messages and admin records apart."""
    return {
        "records": (t["messages"] or 0) + t["admin_records"], "messages": t["messages"],
        "admin_records": t["admin_records"], "bytes": (t["msg_bytes"] or 0) + (t["admin_bytes"] or 0),
        **{k: t[k] for k in ("first_event_id", "last_event_id", "first_store_ts", "last_store_ts")},
    }  # fmt: skip


def log_facts(recs, segs, meta, meta_mtime, args, known=None):
    """Return the directory-wide facts: totals (C{known} when already known: the compact
    form's, or an incremental audit's merged ones; else from every record of C{recs}),
    segment size, log bounds, eventId floor, the reference time, and what the
    checkpoint says against what the log holds."""
    t = dict(known) if known else totals(recs).first().asDict()
    for k in ("messages", "admin_records", "bytes"):
        t[k] = t[k] or 0
    size, size_source = _segment_size(segs, args.segment_size)
    log_min = segs[0]["segment"] if segs else 0
    log_end = 0
    if segs:
        last = segs[-1]
        log_end = last["segment"] + last["file_length"]
        if last["sealed"] and last["declared_segment_size"]:
            log_end = last["segment"] + last["declared_segment_size"]
    missing_segments = []
    if size and segs:
        have = {s["segment"] for s in segs}
        missing_segments = [o for o in range(log_min, segs[-1]["segment"], size) if o not in have]
    floor = 1 if log_min == 0 else (t["first_event_id"] or 1)
    as_of = args.as_of_ms or meta_mtime or t["last_store_ts"] or int(time.time() * 1000)
    checkpoint = None
    beyond = tail_missing = 0
    if meta is not None:
        checkpoint = {"logOffset": meta.get("logOffset"), "nextEventId": meta.get("nextEventId"),
                      "mtime_ms": meta_mtime}  # fmt: skip
        beyond = max(0, int(meta.get("logOffset") or 0) - log_end)
        if meta.get("nextEventId") is not None:
            tail_missing = max(0, int(meta["nextEventId"]) - 1 - (t["last_event_id"] or 0))
    return {
        "totals": t,
        "segments": segs,
        "segment_size": size,
        "segment_size_source": size_source,
        "log_min_offset": log_min,
        "log_end_offset": log_end,
        "missing_segments": missing_segments,
        "event_floor": floor,
        "as_of_ms": as_of,
        "checkpoint": checkpoint,
        "checkpoint_beyond_log_bytes": beyond,
        "tail_event_ids_missing": tail_missing,
    }


def at_once(**work):
    """Run each of C{work}'s functions (small Spark queries) in a thread of its own;
    returns their results by name (the first exception raised, if any). Each is a job
    of a task or two on a few rows, whose cost is mostly planning and scheduling: asked
    together, those overlap."""
    with ThreadPoolExecutor(max_workers=max(1, len(work)), thread_name_prefix="audit-ask") as pool:
        futures = {name: pool.submit(fn) for name, fn in work.items()}
        return {name: f.result() for name, f in futures.items()}


def _integrity_asks(tables, n):
    # Each table is rows on the driver (rows.py) or a DataFrame (the per-record form's
    # problems, duplicates and consume-queue mismatches).
    p, g, d = tables["problems"], tables["event_gaps"], tables["event_duplicates"]
    ask = {
        "probs": lambda: RW.counts(p, "problem"),
        "unread": lambda: RW.total(RW.where(p, "problem", "!=", "crc"), "bytes"),
        "gaps": lambda: (RW.count(g), RW.total(g, "missing")),
        "dups": lambda: RW.count(d),
        "ex_problems": lambda: RW.dicts(p, ["offset"], n),
        "ex_gaps": lambda: RW.dicts(g, ["gap_start"], n),
        "ex_dups": lambda: RW.dicts(d, ["event_id"], n),
    }
    if "cq_mismatches" in tables:
        m = tables["cq_mismatches"]
        ask["cq"] = lambda: RW.counts(m, "status")
        ask["cq_torn"] = lambda: RW.count(tables["cq_problems"])
        ask["ex_cq"] = lambda: RW.dicts(m, ["topic", "queue_id", "queue_offset"], n)
    return ask


def _integrity(a, facts, n):
    probs, gaps = a["probs"], a["gaps"]
    c = {
        "crc_failures": probs.get("crc", 0),
        "corrupt_records": probs.get("corrupt", 0),
        "torn_records": probs.get("torn", 0),
        "unreadable_bytes": int(a["unread"] or 0),
        "missing_segments": len(facts["missing_segments"]),
        "event_id_gaps": gaps[0],
        "missing_event_ids": int(gaps[1] or 0),
        "duplicate_event_ids": a["dups"],
        "tail_event_ids_missing": facts["tail_event_ids_missing"],
        "checkpoint_beyond_log_bytes": facts["checkpoint_beyond_log_bytes"],
        "cq_missing": 0, "cq_extra": 0, "cq_wrong": 0, "cq_torn_files": 0,
        "changed_segments": probs.get("changed", 0),
    }  # fmt: skip
    ex = {
        "problems": a["ex_problems"],
        "event_gaps": a["ex_gaps"],
        "event_duplicates": a["ex_dups"],
        "missing_segments": facts["missing_segments"][:n],
    }
    if "cq" in a:
        cq = a["cq"]
        c["cq_missing"] = cq.get("missing", 0)
        c["cq_extra"] = cq.get("extra", 0)
        c["cq_wrong"] = cq.get("wrong", 0)
        c["cq_torn_files"] = a["cq_torn"]
        ex["cq_mismatches"] = a["ex_cq"]
    return c, ex


def integrity(tables, facts, n):
    """Return C{(counters, examples)} of the integrity findings."""
    return _integrity(at_once(**_integrity_asks(tables, n)), facts, n)


def _overdue_messages(late):
    # The messages overdue delays (rows on the driver, checks.delays) still owe.
    owed = [r["delay_count"] - r["fired"] for r in late.rows if None not in (r["delay_count"], r["fired"])]
    return sum(owed) if owed else None


def _consumption_asks(tables, n):
    d = tables["delays"]
    late = RW.where(d, "overdue", "==", True)
    return {
        "delays": lambda: {
            "delays": RW.count(d), "pending": RW.count(RW.where(d, "pending", "==", True)),
            "overdue": RW.count(late), "overdue_messages": _overdue_messages(late),
        },  # fmt: skip
        "lag": lambda: RW.dicts(tables["consumer_lag"], ["kind", "topic", "consumer", "queue_id"]),
        "retry_dlq": lambda: RW.dicts(tables["retry_dlq"], ["kind", "topic"]),
        "overdue": lambda: RW.dicts(late, ["trigger_ms"], n),
        "expired": lambda: RW.dicts(tables["expired_topics"], ["topic"]),
    }


def _consumption(a):
    # The consumption findings: lag, retry/DLQ volumes, delays, expired topics.
    agg = a["delays"]
    return {
        "lag": a["lag"],
        "retry_dlq": a["retry_dlq"],
        "delays": {
            "total": agg["delays"],
            "pending": int(agg["pending"] or 0),
            "overdue": int(agg["overdue"] or 0),
            "overdue_messages": int(agg["overdue_messages"] or 0),
            "overdue_examples": a["overdue"],
        },
        "expired_topics_not_reclaimed": a["expired"],
    }


def summarize(tables, facts, args):
    """Build the summary dict of one directory (no C{compare} part, no exit code)."""
    n = args.max_examples
    # Every question of the summary asked at once (see at_once).
    ask = {f"i_{k}": fn for k, fn in _integrity_asks(tables, n).items()}
    ask.update({f"c_{k}": fn for k, fn in _consumption_asks(tables, n).items()})
    ask["stats"] = lambda: RW.dicts(tables["queue_stats"], ["topic", "queue_id"])
    a = at_once(**ask)
    counters, examples = _integrity({k[2:]: v for k, v in a.items() if k.startswith("i_")}, facts, n)
    t = facts["totals"]
    return {
        "data_dir": args.data_dir,
        "as_of_ms": facts["as_of_ms"],
        "log": {
            "segments": len(facts["segments"]),
            "segment_size": facts["segment_size"],
            "segment_size_source": facts["segment_size_source"],
            "min_offset": facts["log_min_offset"],
            "end_offset": facts["log_end_offset"],
            "checkpoint": facts["checkpoint"],
            "read_up_to": facts.get("read_up_to"),
            **t,
        },
        "segments": facts["segments"],
        "queues": a["stats"],
        "integrity": counters,
        "integrity_examples": examples,
        "consumption": _consumption({k[2:]: v for k, v in a.items() if k.startswith("c_")}),
    }


def compare_summary(diff, other_tables, other_facts, floor, args):
    """Summarize a comparison with the other directory."""
    counts = RW.counts(diff, "status")
    first = diff.agg(F.min("event_id")).first()[0]
    other_integrity, _ = integrity(other_tables, other_facts, args.max_examples)
    return {
        "other_dir": args.compare,
        "from_event_id": floor,
        "first_divergent_event_id": first,
        "missing": counts.get("missing", 0),
        "extra": counts.get("extra", 0),
        "different": counts.get("different", 0),
        "examples": RW.dicts(diff, ["event_id"], args.max_examples),
        "other_log": {k: other_facts["totals"][k] for k in ("records", "first_event_id", "last_event_id")},
        "other_integrity": other_integrity,
    }


def integrity_total(summary):
    """Return the number of integrity findings in C{summary} (compare included)."""
    total = sum(summary["integrity"][k] for k in INTEGRITY_KEYS)
    cmp = summary.get("compare")
    if cmp:
        total += cmp["missing"] + cmp["extra"] + cmp["different"]
        total += sum(v for v in cmp["other_integrity"].values())
    return total


def findings_by_kind(summary):
    """Return every non-zero finding of C{summary}, of every kind, as C{{name: count}}:
    C{integrity.<counter>}, C{compare.<missing|extra|different>} and
    C{compare.other_integrity.<counter>}."""
    out = {f"integrity.{k}": summary["integrity"][k] for k in INTEGRITY_KEYS if summary["integrity"][k]}
    cmp = summary.get("compare")
    if cmp:
        out.update({f"compare.{k}": cmp[k] for k in ("missing", "extra", "different") if cmp[k]})
        out.update({f"compare.other_integrity.{k}": v for k, v in cmp["other_integrity"].items() if v})
    return out


def console_summary(summary):
    """Return what the job prints on stdout (JSON): the verdict and exit code, every
    finding by kind, the integrity counters, and with C{--compare} the comparison's
    counts, first divergent eventId and the other directory's integrity."""
    out = {
        "verdict": summary["verdict"],
        "exit_code": summary["exit_code"],
        "findings": findings_by_kind(summary),
        "integrity": summary["integrity"],
    }
    cmp = summary.get("compare")
    if cmp:
        out["compare"] = {k: cmp[k] for k in ("other_dir", "from_event_id", "first_divergent_event_id", "missing",
                                              "extra", "different", "other_integrity")}  # fmt: skip
    return out


def exit_code(summary):
    """Return 1 when C{summary} holds any integrity finding, else 0; sets the verdict
    and the C{findings} (L{findings_by_kind}, as stdout's JSON has them)."""
    bad = integrity_total(summary)
    summary["verdict"] = "INTEGRITY FINDINGS" if bad else "OK"
    summary["findings"] = findings_by_kind(summary)
    return 1 if bad else 0


def chart_data(tables, top=8, points=2000):
    """Collect what the report's charts draw: messages per minute of the busiest
    C{top} topics (at most C{points} rows)."""
    per_topic = {}
    for r in RW.dicts(tables["queue_stats"]):
        per_topic[r["topic"]] = (per_topic.get(r["topic"]) or 0) + (r["messages"] or 0)
    busiest = {t for t in sorted((t for t in per_topic if t is not None), key=lambda t: (-per_topic[t], t))[:top]}
    tp = [r for r in RW.dicts(tables["throughput"]) if r["topic"] in busiest]
    return {"throughput": sorted(tp, key=lambda r: RW.null_first(r, ["minute", "topic"]))[:points]}
