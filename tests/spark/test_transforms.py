"""The audit's DataFrame transforms on small frames built by hand."""

from spark.audit import checks as K
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
    topics = spark.createDataFrame([("t", 1, 4, 0, 0)], K.TOPICS_DDL)
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


def test_gaps_and_duplicates_from_runs_match_the_record_versions(spark):
    """Runs of eventIds per range (overlapping across ranges, one with an eventId held
    twice) give the same gaps and duplicates (L{spark.audit.checks}, on the driver) as
    the per-record transforms."""
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
    for floor in (1, 2, 3):  # the floor is never above the smallest eventId + 1
        assert [tuple(r.values()) for r in K.event_gaps(runs, floor).rows] == [
            tuple(r) for r in T.event_id_gaps(df, floor).collect()]
    intervals = spark.createDataFrame(K.duplicate_intervals(runs), "lo bigint, hi bigint")
    dups = T.event_id_duplicates_in(df, intervals)
    assertDataFrameEqual(dups, [tuple(r) for r in T.event_id_duplicates(df).collect()])
    assert sorted(r.event_id for r in dups.collect()) == [7, 12]
