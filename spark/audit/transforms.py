"""The audit's pure DataFrame -> DataFrame functions (no I/O; the tests cover each).

Inputs are the DataFrames the job reads: I{items} (commit-log records, problems and
segments, see L{spark.audit.records}), I{cq} (consume-queue entries), and small frames
built from the checkpoint and the offset files (I{topics}, I{pending}, I{offsets}).

test-case-name: tests.spark.test_transforms
"""

from pyspark.sql import functions as F
from pyspark.sql import Window

from spark.audit.checks import QUEUE_STATS
from spark.audit.checks import TOPICS_DDL  # noqa: F401  (the topics frame's schema, named here too)
from spark.audit.consumers import POSITIONS_DDL

RECORD_COLUMNS = [
    "segment", "offset", "size", "magic", "event_id", "topic", "queue_id", "queue_offset",
    "flag", "sys_flag", "born_ts", "store_ts", "body_len", "crc_ok", "tag_hash",
    "reconsume_times", "delay_id", "delay_level", "trigger_ms", "delay_count", "expire_at",
    "digest",
]  # fmt: skip

#: Admin operations (see L{mqserver.store.format}); repeated here as plain ints so this
#: module does not need the format module on the driver's import path twice.
OP_CREATE, OP_DELETE, OP_DELAY, OP_UPDATE = 1, 2, 3, 4

#: Schemas of the small frames the job builds from JSON files.
PENDING_DDL = "event_id bigint, trigger_ms bigint, topic string, delay_count int, applied int"
OFFSETS_DDL = POSITIONS_DDL


def records(items):
    """Return the message and admin records of C{items}."""
    return items.where(F.col("kind") == "record").select(*RECORD_COLUMNS)


def messages(recs):
    """Return only the message records."""
    return recs.where(F.col("magic") == "message")


def segments(items):
    """Return one row per segment file: start, length, records, end, sealing, the
    CRC-32 of its records' bytes, and its first and last eventId."""
    ids = items.where(F.col("kind") == "run").groupBy("segment").agg(
        F.min("event_id").alias("first_event_id"), F.max("run_end").alias("last_event_id")
    )
    rows = items.where(F.col("kind") == "segment").select(
        F.col("segment"),
        F.col("size").alias("file_length"),
        F.col("seg_records").alias("records"),
        F.col("seg_end").alias("records_end"),
        F.col("seg_sealed").alias("sealed"),
        F.col("seg_declared_size").alias("declared_segment_size"),
        F.col("sig_lo").alias("crc32"),
    )
    return rows.join(ids, "segment", "left")


def problems(items):
    """Return every unreadable or damaged record: decoding problems (C{corrupt},
    C{torn}: a damaged byte range, C{offset} and C{bytes}, with the eventIds of the
    sound records before and after it, C{event_before} and C{event_after}, when the
    range that found it holds them) and records whose body CRC does not match
    (C{crc})."""
    decoded = items.where(F.col("kind") == "problem").select(
        "segment", "offset", F.col("size").alias("bytes"), "problem", "detail",
        F.lit(None).cast("bigint").alias("event_id"), F.lit(None).cast("string").alias("topic"),
        F.col("min_eid").alias("event_before"), F.col("max_eid").alias("event_after"),
    )  # fmt: skip
    none = F.lit(None).cast("bigint")
    crc = items.where((F.col("kind") == "record") & ~F.col("crc_ok")).select(
        "segment", "offset", F.col("size").alias("bytes"), F.lit("crc").alias("problem"),
        F.lit("body CRC mismatch").alias("detail"), "event_id", "topic",
        none.alias("event_before"), none.alias("event_after"),
    )  # fmt: skip
    return decoded.unionByName(crc)


def queue_stats_columns(source, named=False):
    """The aggregate columns of L{QUEUE_STATS} from C{source}: C{"records"} or
    C{"parts"}; with C{named}, the parts' function over each column's own name (to
    merge per-segment queue_stats)."""
    out = []
    for name, from_recs, from_parts in QUEUE_STATS:
        fn, col = from_recs if source == "records" else from_parts
        out.append(getattr(F, fn)(name if named else col).alias(name))
    return out


def queue_stats(recs, by=()):
    """Per (topic, queue id): messages, bytes, body bytes, first/last store time and
    eventId, the queue offsets seen, RocketMQ delay-level messages, and the average
    messages per minute between the first and the last store time. C{by}: more
    grouping columns first (C{("segment",)} for the parts of an incremental audit)."""
    out = messages(recs).groupBy(*by, "topic", "queue_id").agg(*queue_stats_columns("records"))
    return with_per_minute(out)


def with_per_minute(stats):
    """Add C{per_minute}: messages per minute between the first and last store time."""
    minutes = F.greatest(F.lit(1.0), (F.col("last_store_ts") - F.col("first_store_ts")) / 60000.0)
    return stats.withColumn("per_minute", F.round(F.col("messages") / minutes, 3))


def throughput(recs, by=()):
    """Messages and bytes per (topic, minute of store time); C{minute} is epoch ms.
    C{by}: more grouping columns first, as for L{queue_stats}."""
    return (
        messages(recs)
        .withColumn("minute", F.col("store_ts") - F.col("store_ts") % 60000)
        .groupBy(*by, "topic", "minute")
        .agg(F.count("*").alias("messages"), F.sum("size").alias("bytes"))
    )


def event_id_gaps(recs, floor):
    """Return the ranges of missing eventIds between C{floor} and the largest one seen:
    C{gap_start, gap_end, missing}. C{floor} is 1 when the log still starts at offset 0
    (every eventId from 1 on must be there); pass the smallest eventId seen when
    retention removed the oldest segments."""
    spark = recs.sparkSession
    ids = recs.select("event_id").distinct()
    ids = ids.unionByName(spark.range(floor - 1, floor).withColumnRenamed("id", "event_id"))
    ids = ids.distinct()
    top = ids.agg(F.max("event_id").alias("top"))
    after = ids.select((F.col("event_id") + 1).alias("gap_start"))
    starts = after.join(ids, after.gap_start == ids.event_id, "left_anti").crossJoin(top)
    starts = starts.where(F.col("gap_start") <= F.col("top")).select("gap_start")
    before = ids.select((F.col("event_id") - 1).alias("gap_end"))
    ends = before.join(ids, before.gap_end == ids.event_id, "left_anti")
    ends = ends.where(F.col("gap_end") >= F.lit(floor))
    w1 = Window.orderBy("gap_start")
    w2 = Window.orderBy("gap_end")
    s = starts.withColumn("n", F.row_number().over(w1))
    e = ends.withColumn("n", F.row_number().over(w2))
    return (
        s.join(e, "n")
        .select("gap_start", "gap_end", (F.col("gap_end") - F.col("gap_start") + 1).alias("missing"))
        .orderBy("gap_start")
    )


def event_runs(items):
    """Return the runs of consecutive eventIds the decoder found per range: C{start,
    end, copies} (see L{spark.audit.columns.run_batch})."""
    return items.where(F.col("kind") == "run").select(
        F.col("event_id").alias("start"), F.col("run_end").alias("end"), F.col("seg_records").alias("copies")
    )


def event_id_duplicates_in(recs, intervals, any_interval=None):
    """L{event_id_duplicates} over only the records whose eventId lies in one of
    C{intervals} (C{lo, hi}: L{spark.audit.checks.duplicate_intervals}); nothing is
    scanned when there are none (C{any_interval}: whether there are any, when the caller
    knows already)."""
    if any_interval is None:
        any_interval = bool(intervals.take(1))
    if not any_interval:
        return recs.sparkSession.createDataFrame([], "event_id bigint, copies bigint, offsets array<bigint>")
    cand = recs.join(
        F.broadcast(intervals), (F.col("event_id") >= F.col("lo")) & (F.col("event_id") <= F.col("hi")), "left_semi"
    )
    return event_id_duplicates(cand)


def event_id_duplicates(recs):
    """Return eventIds held by more than one record: C{event_id, copies, offsets}."""
    return (
        recs.groupBy("event_id")
        .agg(F.count("*").alias("copies"), F.sort_array(F.collect_list("offset")).alias("offsets"))
        .where(F.col("copies") > 1)
    )


def topics_from_log(recs):
    """Derive the live topics from admin records, for a directory without a checkpoint:
    a topic is live when its last create/update comes after its last delete; topics with
    messages but no admin record left (retention) are live since eventId 0."""
    admin = recs.where(F.col("magic") == "admin")
    last_delete = (
        admin.where(F.col("flag") == OP_DELETE).groupBy("topic").agg(F.max("event_id").alias("deleted"))
    )
    creates = admin.where(F.col("flag").isin(OP_CREATE, OP_UPDATE)).join(last_delete, "topic", "left")
    creates = creates.where(F.col("deleted").isNull() | (F.col("event_id") > F.col("deleted")))
    live = creates.groupBy("topic").agg(
        F.min("event_id").alias("create_event_id"),
        F.max_by("expire_at", "event_id").alias("expire_at"),
        F.min("store_ts").alias("create_ts"),
    )
    orphans = (
        messages(recs).select("topic").distinct()
        .join(admin.select("topic").distinct(), "topic", "left_anti")
        .select("topic", F.lit(0).cast("bigint").alias("create_event_id"),
                F.lit(0).cast("bigint").alias("expire_at"), F.lit(0).cast("bigint").alias("create_ts"))
    )  # fmt: skip
    return live.unionByName(orphans).withColumn("queues", F.lit(None).cast("int"))


def expected_entries(recs, topics):
    """Return the consume-queue entry each message record of a live topic implies:
    C{topic, queue_id, queue_offset, e_offset, e_size, e_tag, event_id}. Records written
    before the topic's current incarnation (deleted and created again) are left out."""
    live = topics.select("topic", "create_event_id")
    return (
        messages(recs)
        .join(live, "topic")
        .where(F.col("event_id") >= F.col("create_event_id"))
        .select(
            "topic", "queue_id", "queue_offset", F.col("offset").alias("e_offset"),
            F.col("size").alias("e_size"), F.col("tag_hash").alias("e_tag"), "event_id",
        )
    )  # fmt: skip


def cq_mismatches(recs, cq, topics, log_min_offset):
    """Compare consume queues with the commit log.

    Returns rows C{topic, queue_id, queue_offset, status, e_offset, e_size, e_tag,
    log_offset, size, tag_hash, event_id} where C{status} is C{missing} (a record with
    no entry), C{extra} (an entry with no record, pointing into the retained log) or
    C{wrong} (the entry points at another offset or size, or holds another tag hash).
    Entries pointing below C{log_min_offset} point at segments retention removed."""
    exp = expected_entries(recs, topics)
    act = cq.where(F.col("problem").isNull()).drop("problem")
    keys = ["topic", "queue_id", "queue_offset"]
    # Join entry by entry only in the blocks of a queue whose signatures differ: on a
    # sound directory that is none, and the big full outer join never runs.
    blocks = F.broadcast(differing_blocks(exp, act))
    block_keys = ["topic", "queue_id", "block"]
    exp = exp.withColumn("block", _block()).join(blocks, block_keys, "left_semi").drop("block")
    act = act.withColumn("block", _block()).join(blocks, block_keys, "left_semi").drop("block")
    joined = exp.join(act, keys, "full_outer")
    status = (
        F.when(F.col("log_offset").isNull(), F.lit("missing"))
        .when(F.col("e_offset").isNull(), F.lit("extra"))
        .when(
            (F.col("e_offset") != F.col("log_offset"))
            | (F.col("e_size") != F.col("size"))
            | (F.col("e_tag") != F.col("tag_hash")),
            F.lit("wrong"),
        )
    )
    out = joined.withColumn("status", status).where(F.col("status").isNotNull())
    out = out.where(~((F.col("status") == "extra") & (F.col("log_offset") < F.lit(log_min_offset))))
    return out.select(*keys, "status", "e_offset", "e_size", "e_tag", "log_offset", "size", "tag_hash", "event_id")


#: Consume-queue entries per signature block.
CQ_BLOCK = 4096


def _block():
    return F.floor(F.col("queue_offset") / CQ_BLOCK)


def _signatures(df, offset, size, tag):
    h = F.xxhash64("queue_offset", offset, size, tag)
    return df.groupBy("topic", "queue_id", _block().alias("block")).agg(
        F.count("*").alias("n"),
        F.sum(h.bitwiseAND(F.lit(0xFFFFFFFF))).alias("lo"),
        F.sum(F.shiftright(h, 32)).alias("hi"),
    )


def differing_blocks(exp, act):
    """Return the C{topic, queue_id, block} whose expected and actual entries differ
    (count, or a sum of 64-bit hashes of offset, size and tag hash, split in halves so
    the sums cannot overflow): one row per C{CQ_BLOCK} entries of a queue is compared,
    not one per entry."""
    a = _signatures(exp, "e_offset", "e_size", "e_tag")
    b = _signatures(act, "log_offset", "size", "tag_hash").select(
        "topic", "queue_id", "block", *[F.col(c).alias("o_" + c) for c in ("n", "lo", "hi")]
    )
    same = F.lit(True)
    for c in ("n", "lo", "hi"):
        same = same & F.col(c).eqNullSafe(F.col("o_" + c))
    return a.join(b, ["topic", "queue_id", "block"], "full_outer").where(~same).select("topic", "queue_id", "block")


def cq_problems(cq):
    """Return consume-queue files with a partial entry at their end."""
    return cq.where(F.col("problem").isNotNull())


def queue_ends(cq):
    """Return each queue's length (its max offset): C{topic, queue_id, max_offset}."""
    return (
        cq.where(F.col("problem").isNull())
        .groupBy("topic", "queue_id")
        .agg((F.max("queue_offset") + 1).alias("max_offset"))
    )


def logged_delays(recs):
    """The DELAY admin records of C{recs}: C{event_id, topic, trigger_ms, delay_count}
    (what L{spark.audit.checks.delays} reads of them)."""
    return recs.where((F.col("magic") == "admin") & (F.col("flag") == OP_DELAY)).select(
        "event_id", "topic", "trigger_ms", "delay_count"
    )


def fired_counts(recs):
    """Per delay, the messages of C{recs} it published (their C{MQ_DELAY_ID}):
    C{delay_id, n}."""
    return messages(recs).where(F.col("delay_id").isNotNull()).groupBy("delay_id").agg(F.count("*").alias("n"))


def compare_records(mine, other, floor):
    """Compare two directories' records by eventId, from C{floor} on.

    Returns C{event_id, status, offset, other_offset} with C{status} C{missing} (only
    here), C{extra} (only in the other directory) or C{different} (both hold it, with
    other content; physical offset and store host are not compared)."""
    a = mine.where(F.col("event_id") >= floor).select("event_id", "offset", "digest").dropDuplicates(["event_id"])
    b = other.where(F.col("event_id") >= floor).select(
        "event_id", F.col("offset").alias("other_offset"), F.col("digest").alias("other_digest")
    ).dropDuplicates(["event_id"])
    status = (
        F.when(F.col("other_digest").isNull(), F.lit("missing"))
        .when(F.col("digest").isNull(), F.lit("extra"))
        .when(F.col("digest") != F.col("other_digest"), F.lit("different"))
    )
    return (
        a.join(b, "event_id", "full_outer")
        .withColumn("status", status)
        .where(F.col("status").isNotNull())
        .select("event_id", "status", "offset", "other_offset")
    )
