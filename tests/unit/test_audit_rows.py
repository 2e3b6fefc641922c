"""The audit's small tables on the driver (L{spark.audit.rows}): the questions the
summary asks of them answer as Spark SQL does (nulls first, aggregates skip nulls, a
comparison with a null is not true), and Spark's rounding of doubles."""

from spark.audit import rows as R

DDL = "topic string, queue_id int, n bigint, flag boolean"


def table():
    return R.Rows(DDL, [
        {"topic": "b", "queue_id": 1, "n": 5, "flag": True},
        {"topic": None, "queue_id": 0, "n": None, "flag": None},
        {"topic": "a", "queue_id": 2, "n": 7, "flag": False},
        {"topic": "a", "queue_id": 1, "n": 1},
    ])  # fmt: skip


def test_rows_take_the_schema_columns_and_fill_the_missing_with_null():
    t = table()
    assert t.columns == ["topic", "queue_id", "n", "flag"]
    assert t.rows[3] == {"topic": "a", "queue_id": 1, "n": 1, "flag": None}
    assert R.count(t) == len(t) == 4


def test_dicts_order_nulls_first_then_by_the_other_columns():
    got = R.dicts(table(), ["topic"])
    assert [(r["topic"], r["queue_id"]) for r in got] == [(None, 0), ("a", 1), ("a", 2), ("b", 1)]
    assert [r["n"] for r in R.dicts(table(), ["n"], limit=2)] == [None, 1]
    assert R.dicts(table()) == table().rows  # unordered: as held


def test_counts_totals_and_values_skip_nothing_but_nulls():
    t = table()
    assert R.counts(t, "topic") == {"a": 2, "b": 1, None: 1}
    assert R.total(t, "n") == 13
    assert R.total(R.Rows(DDL, [{"n": None}]), "n") is None
    assert R.values(t, "topic") == {"a", "b", None}


def test_where_never_matches_a_null():
    t = table()
    assert [r["n"] for r in R.where(t, "flag", "==", True).rows] == [5]
    assert [r["n"] for r in R.where(t, "topic", "!=", "a").rows] == [5]
    assert [r["topic"] for r in R.where(t, "n", "set").rows] == ["b", "a", "a"]


def test_aggregate_as_sql_groups():
    rows = table().rows + [{"topic": "a", "queue_id": 9, "n": None, "flag": None}]
    got = {r["topic"]: r for r in R.aggregate(rows, ["topic"], {
        "sum": ("sum", "n"), "lo": ("min", "n"), "hi": ("max", "queue_id"),
        "rows": ("count", "*"), "known": ("count", "n")})}  # fmt: skip
    assert got["a"] == {"topic": "a", "sum": 8, "lo": 1, "hi": 9, "rows": 3, "known": 2}
    assert got[None] == {"topic": None, "sum": None, "lo": None, "hi": 0, "rows": 1, "known": 0}


def test_spark_round_is_half_up_on_the_printed_decimal():
    assert R.spark_round(2.0005, 3) == 2.001  # Python's round gives 2.0 (binary 2.000499...)
    assert R.spark_round(0.0625, 3) == 0.063
    assert R.spark_round(-1.0005, 3) == -1.001
    assert R.spark_round(1 / 3, 3) == 0.333
    assert R.spark_round(None, 3) is None


def test_least_and_greatest_skip_nulls():
    assert R.least(None, 3, 2) == 2 and R.greatest(None, 3, 2) == 3
    assert R.least(None, None) is None and R.greatest() is None
