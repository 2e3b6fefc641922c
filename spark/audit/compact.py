"""The compact form's tables, on the driver: from the partial aggregates the decode
tasks leave (L{spark.audit.columns.compact_batches}: a few rows per range and queue,
minute or block), collected once, the tables the per-record form computes in Spark
(L{spark.audit.transforms}) over every record. C{tests/spark/test_compact.py} holds the
two forms to the same bytes.

Each function takes the collected rows (dicts of L{spark.audit.records.ITEM_DDL} or
C{CQ_COMPACT_DDL}) and returns a L{spark.audit.rows.Rows} of the per-record table's
schema, or plain values.

test-case-name: tests.spark.test_compact
"""

from spark.audit import rows as R
from spark.audit.rows import Rows

OP_DELAY = 3  # the DELAY admin operation (spark.audit.transforms.OP_DELAY)
RETRY_PREFIX, DLQ_PREFIX = "%RETRY%", "%DLQ%"

SEGMENTS_DDL = ("segment bigint, file_length int, records int, records_end bigint, sealed boolean,"
                " declared_segment_size bigint, crc32 bigint, first_event_id bigint, last_event_id bigint")
PROBLEMS_DDL = ("segment bigint, offset bigint, bytes int, problem string, detail string, event_id bigint,"
                " topic string, event_before bigint, event_after bigint")
QUEUE_STATS_DDL = ("topic string, queue_id int, messages bigint, bytes bigint, body_bytes bigint,"
                   " first_store_ts bigint, last_store_ts bigint, first_event_id bigint, last_event_id bigint,"
                   " min_queue_offset bigint, max_queue_offset bigint, delay_level_messages bigint,"
                   " delayed_fired bigint, per_minute double")
THROUGHPUT_DDL = "topic string, minute bigint, messages bigint, bytes bigint"
GAPS_DDL = "gap_start bigint, gap_end bigint, missing bigint"
DUPLICATES_DDL = "event_id bigint, copies bigint, offsets array<bigint>"
TOPICS_DDL = "topic string, queues int, create_event_id bigint, expire_at bigint, create_ts bigint"
CQ_MISMATCHES_DDL = ("topic string, queue_id int, queue_offset bigint, status string, e_offset bigint,"
                     " e_size int, e_tag bigint, log_offset bigint, size int, tag_hash bigint, event_id bigint")
CQ_PROBLEMS_DDL = ("topic string, queue_id int, queue_offset bigint, log_offset bigint, size int,"
                   " tag_hash bigint, problem string")
ENDS_DDL = "topic string, queue_id int, max_offset bigint"
LAG_DDL = ("kind string, source string, topic string, consumer string, queue_id int, committed bigint,"
           " finished_ahead bigint, delivered_unfinished bigint, max_offset bigint, lag bigint, push_url string")
RETRY_DLQ_DDL = "kind string, consumer_group string, topic string, messages bigint, bytes bigint"
DELAYS_DDL = ("event_id bigint, topic string, trigger_ms bigint, delay_count int, fired bigint,"
              " pending boolean, overdue boolean")
EXPIRED_DDL = "topic string, expire_at bigint, create_event_id bigint"
LAG_PARTS_DDL = "segment bigint, minute bigint, n bigint, lag_sum bigint, lag_max bigint"


def of_kind(items, *kinds):
    """The items of C{kinds}."""
    return [r for r in items if r["kind"] in kinds]


def records(items):
    """The records the compact form keeps one by one (admin records, CRC failures)."""
    return of_kind(items, "record")


def segments(items):
    """L{spark.audit.transforms.segments}: one row per segment, in offset order."""
    ids = {r["segment"]: r for r in R.aggregate(of_kind(items, "run"), ["segment"], {
        "first_event_id": ("min", "event_id"), "last_event_id": ("max", "run_end")})}
    out = []
    for r in of_kind(items, "segment"):
        i = ids.get(r["segment"], {})
        out.append({
            "segment": r["segment"], "file_length": r["size"], "records": r["seg_records"],
            "records_end": r["seg_end"], "sealed": r["seg_sealed"], "declared_segment_size": r["seg_declared_size"],
            "crc32": r["sig_lo"], "first_event_id": i.get("first_event_id"), "last_event_id": i.get("last_event_id"),
        })  # fmt: skip
    return Rows(SEGMENTS_DDL, sorted(out, key=lambda r: R.null_first(r, ["segment"])))


def problems(items, more=()):
    """L{spark.audit.transforms.problems}, and the rows C{more} (dicts)."""
    out = [{"segment": r["segment"], "offset": r["offset"], "bytes": r["size"], "problem": r["problem"],
            "detail": r["detail"], "event_before": r["min_eid"], "event_after": r["max_eid"]}
           for r in of_kind(items, "problem")]  # fmt: skip
    out += [{"segment": r["segment"], "offset": r["offset"], "bytes": r["size"], "problem": "crc",
             "detail": "body CRC mismatch", "event_id": r["event_id"], "topic": r["topic"]}
            for r in records(items) if r["crc_ok"] is False]  # fmt: skip
    return Rows(PROBLEMS_DDL, out + list(more))


#: L{spark.audit.transforms.QUEUE_STATS} from the C{"qstat"} parts.
_QUEUE_PARTS = {
    "messages": ("sum", "n"), "bytes": ("sum", "sum_size"), "body_bytes": ("sum", "sum_body"),
    "first_store_ts": ("min", "min_ts"), "last_store_ts": ("max", "max_ts"),
    "first_event_id": ("min", "min_eid"), "last_event_id": ("max", "max_eid"),
    "min_queue_offset": ("min", "min_qo"), "max_queue_offset": ("max", "max_qo"),
    "delay_level_messages": ("sum", "n_level"), "delayed_fired": ("sum", "n_delay"),
}  # fmt: skip


def queue_stats(items):
    """L{spark.audit.transforms.queue_stats} from the C{"qstat"} parts."""
    out = R.aggregate(of_kind(items, "qstat"), ["topic", "queue_id"], _QUEUE_PARTS)
    for r in out:
        span = None
        if r["last_store_ts"] is not None and r["first_store_ts"] is not None:
            span = (r["last_store_ts"] - r["first_store_ts"]) / 60000.0
        minutes = R.greatest(1.0, span)
        r["per_minute"] = None if r["messages"] is None else R.spark_round(r["messages"] / minutes, 3)
    return Rows(QUEUE_STATS_DDL, out)


def throughput(items):
    """L{spark.audit.transforms.throughput} from the C{"minute"} parts."""
    out = R.aggregate(of_kind(items, "minute"), ["topic", "key"], {"messages": ("sum", "n"),
                                                                   "bytes": ("sum", "sum_size")})
    return Rows(THROUGHPUT_DDL, [dict(r, minute=r["key"]) for r in out])


def lag_parts(items):
    """L{spark.audit.charts.lag_parts} from the C{"minute"} parts."""
    out = R.aggregate(of_kind(items, "minute"), ["segment", "key"], {
        "n": ("sum", "n"), "lag_sum": ("sum", "lag_sum"), "lag_max": ("max", "lag_max")})
    return Rows(LAG_PARTS_DDL, [dict(r, minute=r["key"]) for r in out])


def totals(items, by_segment=False):
    """The log's totals, as L{spark.audit.summary.totals_of_parts} names them, from the
    C{"qstat"} parts and the admin records; with C{by_segment}, C{{segment: totals}}."""
    from spark.audit.summary import totals_of_parts

    parts = [r for r in items if r["kind"] == "qstat" or (r["kind"] == "record" and r["magic"] == "admin")]
    groups = {}
    for r in parts:
        groups.setdefault(r["segment"] if by_segment else None, []).append(r)
    if not by_segment:
        groups.setdefault(None, [])

    def of(rows):
        q = [r for r in rows if r["kind"] == "qstat"]
        a = [r for r in rows if r["kind"] == "record"]

        def agg(fn, rs, col):
            vals = [r[col] for r in rs if r[col] is not None]
            return fn(vals) if vals else None

        return totals_of_parts({
            "messages": agg(sum, q, "n"), "admin_records": len(a),
            "msg_bytes": agg(sum, q, "sum_size"), "admin_bytes": agg(sum, a, "size"),
            "first_event_id": R.least(agg(min, q, "min_eid"), agg(min, a, "event_id")),
            "last_event_id": R.greatest(agg(max, q, "max_eid"), agg(max, a, "event_id")),
            "first_store_ts": R.least(agg(min, q, "min_ts"), agg(min, a, "store_ts")),
            "last_store_ts": R.greatest(agg(max, q, "max_ts"), agg(max, a, "store_ts")),
        })  # fmt: skip

    if by_segment:
        return {seg: dict(of(rows), segment=seg) for seg, rows in groups.items()}
    return of(groups[None])


# -- eventIds -----------------------------------------------------------------------------


def runs(items):
    """L{spark.audit.transforms.event_runs}: C{(start, end, copies)} of the C{"run"} items."""
    return [(r["event_id"], r["run_end"], r["seg_records"]) for r in of_kind(items, "run")]


def _with_prev_end(runs):
    # Sorted by (start, end); prev_end: the largest end of the runs before (None first).
    out, top = [], None
    for start, end, copies in sorted(runs, key=lambda r: (r[0], r[1])):
        out.append((start, end, copies, top))
        top = end if top is None else max(top, end)
    return out


def event_gaps(runs, floor):
    """L{spark.audit.transforms.event_id_gaps_from_runs}: the eventIds from C{floor} to
    the largest no run covers, as C{gap_start, gap_end, missing} rows."""
    kept = [r for r in runs if r[1] >= floor - 1] + [(floor - 1, floor - 1, 1)]
    gaps = [(prev + 1, start - 1) for start, _, _, prev in _with_prev_end(kept) if prev is not None and start > prev + 1]
    return Rows(GAPS_DDL, [{"gap_start": a, "gap_end": b, "missing": b - a + 1} for a, b in sorted(gaps)])


def duplicate_intervals(runs):
    """L{spark.audit.transforms.duplicate_intervals}: C{(lo, hi)} held more than once."""
    within = [(s, e) for s, e, c in runs if c > e - s + 1]
    across = [(s, min(e, prev)) for s, e, _, prev in _with_prev_end(runs) if prev is not None and s <= prev]
    return within + across


# -- consume queues -----------------------------------------------------------------------


def _blocks(rows):
    return {(k[0], k[1], k[2]): (r["n"], r["lo"], r["hi"]) for k, r in (
        ((r["topic"], r["queue_id"], r["key"]), r)
        for r in R.aggregate(rows, ["topic", "queue_id", "key"],
                             {"n": ("sum", "n"), "lo": ("sum", "sig_lo"), "hi": ("sum", "sig_hi")}))}


def differing_blocks(items, cq):
    """L{spark.audit.transforms.differing_blocks}: the C{(topic, queue_id, block)} whose
    expected entries (the C{"sig"} parts) and the consume queues' (C{cq}'s block rows)
    differ. Empty on a sound directory."""
    a = _blocks(of_kind(items, "sig"))
    b = _blocks([r for r in cq if r["n"] is not None])
    return sorted((k for k in set(a) | set(b) if a.get(k, (None,) * 3) != b.get(k, (None,) * 3)),
                  key=lambda k: R.null_first(dict(enumerate(k)), [0, 1, 2]))


def cq_problems(cq):
    """L{spark.audit.transforms.cq_problems} of the compact consume queues."""
    return Rows(CQ_PROBLEMS_DDL, [r for r in cq if r["n"] is None])


def queue_ends(cq):
    """L{spark.audit.transforms.queue_ends} of the compact consume queues."""
    out = R.aggregate([r for r in cq if r["n"] is not None], ["topic", "queue_id"],
                      {"max_offset": ("max", "queue_offset")})
    return Rows(ENDS_DDL, [dict(r, max_offset=r["max_offset"] + 1) for r in out])


# -- consumption --------------------------------------------------------------------------


def consumer_lag(positions, ends):
    """L{spark.audit.transforms.consumer_lag}: C{positions} (dicts of
    L{spark.audit.consumers.POSITIONS_DDL}) with their queue's length from C{ends}."""
    length = {(r["topic"], r["queue_id"]): r["max_offset"] for r in ends.rows}
    out = []
    for p in positions:
        end = length.get((p["topic"], p["queue_id"])) if None not in (p["topic"], p["queue_id"]) else None
        end = 0 if end is None else end
        ahead = None if p["committed"] is None or p["finished_ahead"] is None else end - p["committed"] - p["finished_ahead"]
        out.append(dict(p, max_offset=end, lag=R.greatest(0, ahead)))
    return Rows(LAG_DDL, out)


def retry_dlq(stats):
    """L{spark.audit.transforms.retry_dlq} from the C{queue_stats} rows."""
    out = []
    for r in R.aggregate(stats.rows, ["topic"], {"messages": ("sum", "messages"), "bytes": ("sum", "bytes")}):
        topic = r["topic"] or ""
        for kind, prefix in (("retry", RETRY_PREFIX), ("dlq", DLQ_PREFIX)):
            if r["topic"] is not None and topic.startswith(prefix):
                out.append(dict(r, kind=kind, consumer_group=topic[len(prefix):]))
                break
    return Rows(RETRY_DLQ_DDL, out)


def _and(a, b):
    # SQL's three-valued AND.
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def _lt(a, b):
    return None if a is None or b is None else a < b


def delays(items, pending, topics, as_of_ms, grace_ms):
    """L{spark.audit.transforms.delays}: the DELAY admin records of C{items} and the
    checkpoint's C{pending} delays (dicts of C{PENDING_DDL}) with the messages they
    published (the C{"fired"} parts and the messages kept one by one)."""
    logged = [r for r in records(items) if r["magic"] == "admin" and r["flag"] == OP_DELAY]
    fired = {}
    for r in records(items):
        if r["magic"] == "message" and r["delay_id"] is not None:
            fired[r["delay_id"]] = fired.get(r["delay_id"], 0) + 1
    for r in of_kind(items, "fired"):
        if r["delay_id"] is not None:
            fired[r["delay_id"]] = fired.get(r["delay_id"], 0) + (r["n"] or 0)
    ids = {r["event_id"] for r in logged}
    rows = [dict(r, applied=0) for r in logged]
    rows += [dict(p) for p in pending if p["event_id"] not in ids]
    alive = {t["topic"]: t["create_event_id"] for t in topics.rows if t["topic"] is not None}
    out = []
    for r in rows:
        done = R.greatest(fired.get(r["event_id"], 0) if r["event_id"] is not None else 0, r["applied"])
        created = alive.get(r["topic"]) if r["topic"] is not None else None
        topic_alive = created is not None and r["event_id"] is not None and created <= r["event_id"]
        waiting = _and(_lt(done, r["delay_count"]), topic_alive)
        late = None if r["trigger_ms"] is None else r["trigger_ms"] + grace_ms < as_of_ms
        out.append({"event_id": r["event_id"], "topic": r["topic"], "trigger_ms": r["trigger_ms"],
                    "delay_count": r["delay_count"], "fired": done, "pending": waiting,
                    "overdue": _and(waiting, late)})  # fmt: skip
    return Rows(DELAYS_DDL, out)


def expired_topics(topics, as_of_ms, grace_ms):
    """L{spark.audit.transforms.expired_topics} of the C{topics} rows."""
    return Rows(EXPIRED_DDL, [t for t in topics.rows if t["expire_at"] is not None and t["expire_at"] > 0
                              and t["expire_at"] + grace_ms < as_of_ms])
