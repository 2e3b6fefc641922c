"""The audit's small tables: their schemas, and the checks both forms run over them on
the driver (eventId gaps and the intervals held twice from the runs of eventIds, the
consumers' lag, retry and dead-letter volumes, delays, expired topics). Their inputs are
a few rows per range, queue, consumer or delay, in either form: the compact form's come
from its parts (L{spark.audit.compact}), the per-record form's from Spark aggregates
collected (L{spark.audit.job}). Plain Python with Spark SQL's rules
(L{spark.audit.rows}).

test-case-name: tests.unit.test_audit_checks
"""

from spark.audit import rows as R
from spark.audit.rows import Rows

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

#: The columns of the C{queue_stats} table: (name, how it is computed from the records,
#: L{spark.audit.transforms.queue_stats}; how from partial aggregates: the compact form's
#: C{"qstat"} rows, L{spark.audit.compact.queue_stats}, or per-segment queue_stats
#: themselves when the partial column is the name). Aggregates as (function, column).
QUEUE_STATS = (
    ("messages", ("count", "*"), ("sum", "n")),
    ("bytes", ("sum", "size"), ("sum", "sum_size")),
    ("body_bytes", ("sum", "body_len"), ("sum", "sum_body")),
    ("first_store_ts", ("min", "store_ts"), ("min", "min_ts")),
    ("last_store_ts", ("max", "store_ts"), ("max", "max_ts")),
    ("first_event_id", ("min", "event_id"), ("min", "min_eid")),
    ("last_event_id", ("max", "event_id"), ("max", "max_eid")),
    ("min_queue_offset", ("min", "queue_offset"), ("min", "min_qo")),
    ("max_queue_offset", ("max", "queue_offset"), ("max", "max_qo")),
    ("delay_level_messages", ("count", "delay_level"), ("sum", "n_level")),
    ("delayed_fired", ("count", "delay_id"), ("sum", "n_delay")),
)


# -- eventIds -----------------------------------------------------------------------------


def _with_prev_end(runs):
    # Sorted by (start, end); prev_end: the largest end of the runs before (None first).
    out, top = [], None
    for start, end, copies in sorted(runs, key=lambda r: (r[0], r[1])):
        out.append((start, end, copies, top))
        top = end if top is None else max(top, end)
    return out


def event_gaps(runs, floor):
    """The ranges of missing eventIds, from the runs of eventIds C{(start, end, copies)}
    (L{spark.audit.columns.run_batch}: a few per range): between C{floor} and the
    largest eventId, where no run covers one; C{gap_start, gap_end, missing} rows.
    C{floor} is 1 when the log still starts at offset 0 (every eventId from 1 on must be
    there), else the smallest eventId seen (retention removed the oldest segments)."""
    kept = [r for r in runs if r[1] >= floor - 1] + [(floor - 1, floor - 1, 1)]
    gaps = [(prev + 1, start - 1) for start, _, _, prev in _with_prev_end(kept)
            if prev is not None and start > prev + 1]  # fmt: skip
    return Rows(GAPS_DDL, [{"gap_start": a, "gap_end": b, "missing": b - a + 1} for a, b in sorted(gaps)])


def duplicate_intervals(runs):
    """The eventId intervals C{(lo, hi)} held more than once, from the runs: runs with more
    records than eventIds, and the overlaps of runs of different ranges."""
    within = [(s, e) for s, e, c in runs if c > e - s + 1]
    across = [(s, min(e, prev)) for s, e, _, prev in _with_prev_end(runs) if prev is not None and s <= prev]
    return within + across




# -- consumption --------------------------------------------------------------------------


def consumer_lag(positions, ends):
    """Lag per consumer and queue: C{positions} (dicts of
    L{spark.audit.consumers.POSITIONS_DDL}) with their queue's length from C{ends}
    (L{ENDS_DDL} rows; 0 for a queue with no entries): the messages of the queue not
    finished, its length minus the committed offset and the offsets finished above it."""
    length = {(r["topic"], r["queue_id"]): r["max_offset"] for r in ends.rows}
    out = []
    for p in positions:
        end = length.get((p["topic"], p["queue_id"])) if None not in (p["topic"], p["queue_id"]) else None
        end = 0 if end is None else end
        ahead = None
        if p["committed"] is not None and p["finished_ahead"] is not None:
            ahead = end - p["committed"] - p["finished_ahead"]
        out.append(dict(p, max_offset=end, lag=R.greatest(0, ahead)))
    return Rows(LAG_DDL, out)


def retry_dlq(stats):
    """Messages and bytes of RocketMQ retry (C{%RETRY%group}) and dead-letter
    (C{%DLQ%group}) topics, per topic, from the C{queue_stats} rows: C{kind,
    consumer_group, topic, messages, bytes}."""
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


def delays(logged, fired, pending, topics, as_of_ms, grace_ms):
    """Delays and whether they fired: C{event_id, topic, trigger_ms, delay_count, fired,
    pending, overdue}.

    A delay is a DELAY admin record (C{logged}: dicts with C{event_id, topic,
    trigger_ms, delay_count}); its messages, once published, carry C{MQ_DELAY_ID=<its
    eventId>} (C{fired}: C{{delay eventId: messages}}). Delays named only by the
    checkpoint (C{pending}, dicts of C{PENDING_DDL}: their record was removed by
    retention) count too, with the messages the checkpoint says they published. A delay
    whose topic is gone (not in C{topics}, or created again after it) is not pending:
    the broker drops it. It is overdue when messages are still missing C{grace_ms} after
    its trigger time, as of C{as_of_ms}."""
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
    """Topics whose lifetime ended (C{expire_at} + C{grace_ms} before C{as_of_ms}) but
    which are still in the registry (the C{topics} rows): the broker has not reclaimed
    them."""
    return Rows(EXPIRED_DDL, [t for t in topics.rows if t["expire_at"] is not None and t["expire_at"] > 0
                              and t["expire_at"] + grace_ms < as_of_ms])
