"""The audit's checks over small tables (L{spark.audit.checks}): plain Python on the
driver, for both forms of the job, on rows built by hand."""

from spark.audit import checks as K
from spark.audit.rows import Rows, ddl_names


def topics(*rows):
    return Rows(K.TOPICS_DDL, [dict(zip(ddl_names(K.TOPICS_DDL), r)) for r in rows])


def test_gaps_from_runs_with_the_floor_and_overlaps():
    runs = [(3, 5, 3), (7, 9, 3), (8, 12, 5), (20, 20, 1)]
    assert [tuple(r.values()) for r in K.event_gaps(runs, 1).rows] == [(1, 2, 2), (6, 6, 1), (13, 19, 7)]
    assert [tuple(r.values()) for r in K.event_gaps(runs, 3).rows] == [(6, 6, 1), (13, 19, 7)]
    assert K.event_gaps([], 1).rows == []


def test_intervals_held_twice_within_and_across_runs():
    # (10, 12) holds 4 records for 3 eventIds; (8, 11) overlaps (5, 9) on 8-9.
    assert sorted(K.duplicate_intervals([(10, 12, 4), (5, 9, 5), (8, 11, 4)])) == [(8, 9), (10, 11), (10, 12)]
    assert K.duplicate_intervals([(1, 5, 5), (6, 9, 4)]) == []


def test_lag_is_the_queue_length_less_what_was_finished():
    """Lag is queue length minus committed offset and the offsets finished above it; a
    queue with no entries has length 0; a position with no committed offset lags 0."""
    cols = ddl_names(K.LAG_DDL)
    pos = [dict(kind="k", source="f", topic="t", consumer="g", queue_id=q, committed=c, finished_ahead=a,
                delivered_unfinished=1, push_url=None) for q, c, a in ((0, 3, 2), (1, 0, 0), (0, None, 0))]
    ends = Rows(K.ENDS_DDL, [{"topic": "t", "queue_id": 0, "max_offset": 10}])
    got = K.consumer_lag(pos, ends)
    assert got.columns == cols
    assert [(r["queue_id"], r["max_offset"], r["lag"]) for r in got.rows] == [(0, 10, 5), (1, 0, 0), (0, 10, 0)]


def test_retry_and_dead_letter_volumes_per_topic():
    stats = Rows(K.QUEUE_STATS_DDL, [
        {"topic": "%RETRY%g1", "queue_id": 0, "messages": 2, "bytes": 20},
        {"topic": "%RETRY%g1", "queue_id": 1, "messages": 1, "bytes": 10},
        {"topic": "%DLQ%g2", "queue_id": 0, "messages": 4, "bytes": 40},
        {"topic": "orders", "queue_id": 0, "messages": 9, "bytes": 90},
    ])  # fmt: skip
    got = sorted(tuple(r.values()) for r in K.retry_dlq(stats).rows)
    assert got == [("dlq", "g2", "%DLQ%g2", 4, 40), ("retry", "g1", "%RETRY%g1", 3, 30)]


def test_delays_fired_pending_overdue_and_gone():
    """A delay without all its messages is overdue after its trigger time plus grace,
    unless its topic is gone or was created after it; the checkpoint's pending delays
    count with the messages it says they published."""
    logged = [dict(event_id=10, topic="t", trigger_ms=1000, delay_count=2),
              dict(event_id=11, topic="gone", trigger_ms=1000, delay_count=1)]
    pending = [dict(event_id=10, trigger_ms=1000, topic="t", delay_count=2, applied=0),  # logged: not twice
               dict(event_id=3, trigger_ms=500, topic="t", delay_count=4, applied=4)]
    t = topics(("t", 1, 1, 5000, 0))
    got = {r["event_id"]: (r["fired"], r["pending"], r["overdue"])
           for r in K.delays(logged, {10: 1}, pending, t, as_of_ms=7000, grace_ms=5000).rows}
    assert got == {10: (1, True, True), 11: (0, False, False), 3: (4, False, False)}
    later = K.delays(logged, {10: 1}, [], topics(("t", 1, 12, 0, 0)), 7000, 5000).rows
    assert [r["pending"] for r in later] == [False, False]  # t was created again after the delay
    assert not [r for r in K.delays(logged, {10: 1}, [], t, 5999, 5000).rows if r["overdue"]]
    assert K.delays(logged, {10: 2}, [], t, 7000, 5000).rows[0]["pending"] is False


def test_expired_topics_still_registered():
    t = topics(("t", 1, 1, 5000, 0), ("forever", 1, 2, 0, 0))
    assert [r["topic"] for r in K.expired_topics(t, 10_001, 5000).rows] == ["t"]
    assert K.expired_topics(t, 10_000, 5000).rows == []
