"""The audit's DataFrame transforms on small frames built by hand."""

from spark.audit import transforms as T


def assertDataFrameEqual(df, expected, checkRowOrder=False):
    """Compare C{df}'s rows with C{expected} tuples (pyspark.testing's version needs
    pandas in 3.5, which the project does not otherwise use)."""
    got = [tuple(r) for r in df.collect()]
    expected = [tuple(e) for e in expected]
    if not checkRowOrder:
        got, expected = sorted(got, key=repr), sorted(expected, key=repr)
    assert got == expected

REC_DDL = (
    "offset bigint, size int, magic string, event_id bigint, topic string, queue_id int,"
    " queue_offset bigint, flag int, store_ts bigint, tag_hash bigint, delay_id bigint,"
    " trigger_ms bigint, delay_count int, digest bigint"
)


def recs(spark, rows):
    """Records from C{(event_id, topic, queue_offset, offset)} message tuples or full dicts."""
    out = []
    for r in rows:
        if isinstance(r, tuple):
            eid, topic, qoff, off = r
            r = dict(offset=off, size=100, magic="message", event_id=eid, topic=topic, queue_id=0,
                     queue_offset=qoff, flag=0, store_ts=60_000 * eid, tag_hash=0, digest=eid)  # fmt: skip
        out.append(r)
    cols = [c.split()[0] for c in REC_DDL.split(", ")]
    return spark.createDataFrame([tuple(r.get(c) for c in cols) for r in out], REC_DDL)


def test_event_id_gaps_ranges_and_floor(spark):
    """Gaps come out as ranges; with floor 1 a missing start counts too."""
    df = recs(spark, [(e, "t", e, e * 100) for e in (3, 4, 7, 8, 9, 12)])
    assertDataFrameEqual(
        T.event_id_gaps(df, 1),
        [(1, 2, 2), (5, 6, 2), (10, 11, 2)],
        checkRowOrder=True,
    )
    assertDataFrameEqual(T.event_id_gaps(df, 3), [(5, 6, 2), (10, 11, 2)], checkRowOrder=True)


def test_event_id_duplicates(spark):
    """Only eventIds held twice or more, with their offsets."""
    df = recs(spark, [(1, "t", 0, 0), (2, "t", 1, 100), (2, "t", 2, 200)])
    assertDataFrameEqual(T.event_id_duplicates(df), [(2, 2, [100, 200])])


def test_cq_mismatches(spark):
    """Missing, extra (only into the retained log) and wrong entries; records of an
    older incarnation of the topic are not expected in its queue."""
    df = recs(spark, [(5, "t", 0, 1000), (6, "t", 1, 1100), (7, "t", 2, 1200), (2, "t", 9, 900)])
    topics = spark.createDataFrame([("t", 1, 4, 0, 0)], T.TOPICS_DDL)
    cq = spark.createDataFrame(
        [("t", 0, 0, 1000, 100, 0, None), ("t", 0, 1, 1150, 100, 0, None),
         ("t", 0, 3, 1300, 100, 0, None), ("t", 0, 4, 10, 100, 0, None)],
        "topic string, queue_id int, queue_offset bigint, log_offset bigint, size int, tag_hash bigint,"
        " problem string",
    )  # fmt: skip
    got = T.cq_mismatches(df, cq, topics, log_min_offset=500).select("queue_offset", "status")
    assertDataFrameEqual(got, [(1, "wrong"), (2, "missing"), (3, "extra")])


def test_compare_records(spark):
    """Missing on the other side, extra there, different content; below the floor
    nothing counts."""
    a = recs(spark, [(e, "t", e, e) for e in (1, 2, 3, 4)])
    b = recs(spark, [(1, "t", 1, 1), (2, "t", 2, 2), (4, "t", 4, 4), (5, "t", 5, 5)])
    b = b.withColumn("digest", b.digest + (b.event_id == 2).cast("bigint"))
    got = T.compare_records(a, b, 1).select("event_id", "status")
    assertDataFrameEqual(got, [(2, "different"), (3, "missing"), (5, "extra")])
    assert T.compare_records(a, b, 5).select("event_id", "status").collect() == [(5, "extra")]


def test_lag_delays_and_expiry(spark):
    """Lag is queue length minus committed offset and the offsets finished above it; a
    delay without all its messages is overdue after its trigger time plus grace, unless
    its topic is gone; an expired topic still registered is listed."""
    offsets = spark.createDataFrame(
        [("k", "f", "t", "g", 0, 3, 2, 1, None), ("k", "f", "t", "g", 1, 0, 0, 0, None)], T.OFFSETS_DDL
    )
    ends = spark.createDataFrame([("t", 0, 10)], "topic string, queue_id int, max_offset bigint")
    assertDataFrameEqual(
        T.consumer_lag(offsets, ends).select("queue_id", "max_offset", "lag"), [(0, 10, 5), (1, 0, 0)]
    )
    delay = dict(offset=0, size=100, magic="admin", event_id=10, topic="t", queue_id=-1, queue_offset=-1,
                 flag=T.OP_DELAY, store_ts=0, tag_hash=0, trigger_ms=1000, delay_count=2, digest=0)  # fmt: skip
    gone = dict(delay, event_id=11, topic="gone")
    fired = dict(delay, magic="message", event_id=12, flag=0, delay_id=10, trigger_ms=None, delay_count=None)
    df = recs(spark, [delay, gone, fired])
    topics = spark.createDataFrame([("t", 1, 1, 5000, 0)], T.TOPICS_DDL)
    pending = spark.createDataFrame([], T.PENDING_DDL)
    got = T.delays(df, pending, topics, as_of_ms=7000, grace_ms=5000)
    assertDataFrameEqual(
        got.select("event_id", "fired", "pending", "overdue"), [(10, 1, True, True), (11, 0, False, False)]
    )
    assert T.delays(df, pending, topics, 5999, 5000).where("overdue").count() == 0
    assert [r.topic for r in T.expired_topics(topics, 10_001, 5000).collect()] == ["t"]
    assert T.expired_topics(topics, 10_000, 5000).count() == 0


def test_gaps_and_duplicates_from_runs_match_the_record_versions(spark):
    """Runs of eventIds per range (overlapping across ranges, one with an eventId held
    twice) give the same gaps and duplicates as the per-record transforms."""
    ranges = [[3, 4, 5, 7], [7, 8, 9, 12, 12], [2, 14, 15], [20]]
    offset = iter(range(0, 10_000, 100))
    df = recs(spark, [(e, "t", 0, next(offset)) for r in ranges for e in r])
    runs = []
    for r in ranges:
        ids = sorted(r)
        start = prev = ids[0]
        count = 1
        for e in ids[1:]:
            if e == prev:
                count += 1
                continue
            if e != prev + 1:
                runs.append((start, prev, count))
                start, count = e, 0
            prev = e
            count += 1
        runs.append((start, prev, count))
    runs = spark.createDataFrame(runs, "start bigint, end bigint, copies int")
    for floor in (1, 2, 3):  # the floor is never above the smallest eventId + 1
        assert T.event_id_gaps_from_runs(runs, floor).collect() == T.event_id_gaps(df, floor).collect()
    dups = T.event_id_duplicates_in(df, T.duplicate_intervals(runs))
    assertDataFrameEqual(dups, [tuple(r) for r in T.event_id_duplicates(df).collect()])
    assert sorted(r.event_id for r in dups.collect()) == [7, 12]
