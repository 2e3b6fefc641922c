"""The compact form's tables, on the driver: from the partial aggregates the decode
tasks leave (L{spark.audit.columns.compact_batches}: a few rows per range and queue,
minute or block), collected once, the tables the per-record form computes in Spark
(L{spark.audit.transforms}) over every record; the checks over them both forms share
are L{spark.audit.checks}. C{tests/spark/test_compact.py} holds the two forms to the
same bytes.

Each function takes the collected rows (dicts of L{spark.audit.records.ITEM_DDL} or
C{CQ_COMPACT_DDL}) and returns a L{spark.audit.rows.Rows} of the per-record table's
schema, or plain values.

test-case-name: tests.spark.test_compact
"""

from spark.audit import rows as R
from spark.audit.rows import Rows

from spark.audit.checks import (
    CQ_PROBLEMS_DDL, ENDS_DDL, LAG_PARTS_DDL, PROBLEMS_DDL, QUEUE_STATS, QUEUE_STATS_DDL, SEGMENTS_DDL,
    THROUGHPUT_DDL,
)

OP_DELAY = 3  # the DELAY admin operation (spark.audit.transforms.OP_DELAY)


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


#: The C{queue_stats} columns from the C{"qstat"} parts (L{spark.audit.checks.QUEUE_STATS}).
_QUEUE_PARTS = {name: parts for name, _, parts in QUEUE_STATS}


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

    keys = ["segment"] if by_segment else []

    def by_key(rows, columns):
        return {tuple(r[k] for k in keys): r for r in R.aggregate(rows, keys, columns)}

    q = by_key(of_kind(items, "qstat"), {
        "messages": ("sum", "n"), "msg_bytes": ("sum", "sum_size"), "min_eid": ("min", "min_eid"),
        "max_eid": ("max", "max_eid"), "min_ts": ("min", "min_ts"), "max_ts": ("max", "max_ts")})
    a = by_key([r for r in records(items) if r["magic"] == "admin"], {
        "admin_records": ("count", "*"), "admin_bytes": ("sum", "size"), "min_eid": ("min", "event_id"),
        "max_eid": ("max", "event_id"), "min_ts": ("min", "store_ts"), "max_ts": ("max", "store_ts")})

    def of(key):
        x, y = q.get(key, {}), a.get(key, {})
        return totals_of_parts({
            "messages": x.get("messages"), "admin_records": y.get("admin_records", 0),
            "msg_bytes": x.get("msg_bytes"), "admin_bytes": y.get("admin_bytes"),
            "first_event_id": R.least(x.get("min_eid"), y.get("min_eid")),
            "last_event_id": R.greatest(x.get("max_eid"), y.get("max_eid")),
            "first_store_ts": R.least(x.get("min_ts"), y.get("min_ts")),
            "last_store_ts": R.greatest(x.get("max_ts"), y.get("max_ts")),
        })  # fmt: skip

    if by_segment:
        return {key[0]: dict(of(key), segment=key[0]) for key in set(q) | set(a)}
    return of(())


# -- eventIds -----------------------------------------------------------------------------


def runs(items):
    """L{spark.audit.transforms.event_runs}: C{(start, end, copies)} of the C{"run"} items."""
    return [(r["event_id"], r["run_end"], r["seg_records"]) for r in of_kind(items, "run")]


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
    return [k for k in set(a) | set(b) if a.get(k, (None,) * 3) != b.get(k, (None,) * 3)]


def cq_problems(cq):
    """L{spark.audit.transforms.cq_problems} of the compact consume queues."""
    return Rows(CQ_PROBLEMS_DDL, [r for r in cq if r["n"] is None])


def queue_ends(cq):
    """L{spark.audit.transforms.queue_ends} of the compact consume queues."""
    out = R.aggregate([r for r in cq if r["n"] is not None], ["topic", "queue_id"],
                      {"max_offset": ("max", "queue_offset")})
    return Rows(ENDS_DDL, [dict(r, max_offset=r["max_offset"] + 1) for r in out])


# -- delays -------------------------------------------------------------------------------


def delay_inputs(items):
    """What L{spark.audit.checks.delays} reads of the log, from C{items}: the DELAY admin
    records (dicts) and C{{delay eventId: messages it published}} (the C{"fired"} parts
    and the messages kept one by one)."""
    logged = [r for r in records(items) if r["magic"] == "admin" and r["flag"] == OP_DELAY]
    fired = {}
    for r in records(items):
        if r["magic"] == "message" and r["delay_id"] is not None:
            fired[r["delay_id"]] = fired.get(r["delay_id"], 0) + 1
    for r in of_kind(items, "fired"):
        if r["delay_id"] is not None:
            fired[r["delay_id"]] = fired.get(r["delay_id"], 0) + (r["n"] or 0)
    return logged, fired
