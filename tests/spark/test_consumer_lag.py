"""Every consumer's lag, read from where a real broker keeps it: RocketMQ groups
(consumerOffset.json), NSQ channels and msgout queues and subscriptions (the checkpoint's
channels), msgout push subscriptions; in summary.json, the Parquet table and the report."""

import json
import os

import pytest

from spark.audit import job
from tests.spark import datadirs as dd

COLUMNS = ["kind", "source", "topic", "consumer", "queue_id", "committed", "finished_ahead",
           "delivered_unfinished", "max_offset", "lag", "push_url"]  # fmt: skip


@pytest.fixture(scope="module")
def audited(spark, consumers_dir, tmp_path_factory):
    """The audit of the consumers directory: C{(summary.json, output directory)}."""
    out = tmp_path_factory.mktemp("lag") / "out"
    args = job.parse_args([consumers_dir, "--out", str(out), "--quiet", "--tables", "consumer_lag"])
    _, code = job.run(spark, args)
    assert code == 0
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f), out


def lag_rows(summary):
    """The lag rows by C{(kind, topic, consumer)}."""
    rows = summary["consumption"]["lag"]
    for r in rows:
        assert set(r) == set(COLUMNS), r
    return {(r["kind"], r["topic"], r["consumer"]): r for r in rows}


def figures(row):
    return row["committed"], row["finished_ahead"], row["delivered_unfinished"], row["lag"]


@pytest.mark.parametrize("key", sorted(dd.CONSUMERS))
def test_each_consumer_kind_has_its_lag(audited, key):
    """Each kind of consumer appears once, with the position its protocol left: the
    committed offset, what was finished above it, what was handed out and not finished,
    and the messages not finished of the queue's ten."""
    rows = lag_rows(audited[0])
    assert key in rows, sorted(rows)
    assert figures(rows[key]) == dd.CONSUMERS[key]
    assert (rows[key]["queue_id"], rows[key]["max_offset"]) == (0, 10)


def test_only_the_consumers_the_broker_keeps(audited):
    """No other consumer is listed (smss subscribers name their position in each SUB: the
    broker keeps none on disk), and only the push subscription has a URL."""
    rows = lag_rows(audited[0])
    assert sorted(rows) == sorted(dd.CONSUMERS)
    assert {k: r["push_url"] for k, r in rows.items() if r["push_url"]} == {
        ("msgout subscription", "mt", "push"): dd.PUSH_URL
    }
    sources = {k[0]: rows[k]["source"] for k in rows}
    assert sources["rocketmq group"] == "consumerOffset.json"
    assert sources["nsq channel"] == sources["msgout queue"] == "metadata.json state.channels"


def test_lag_in_parquet_and_report(spark, audited):
    """The Parquet table has the summary's rows in the same schema; the report lists
    every kind."""
    summary, out = audited
    assert [n for n in os.listdir(out / "tables") if not n.startswith(".")] == ["consumer_lag"]  # as asked
    table = spark.read.parquet(str(out / "tables" / "consumer_lag"))
    assert table.columns == COLUMNS
    got = sorted(tuple(r) for r in table.collect())
    want = sorted(tuple(r[c] for c in COLUMNS) for r in summary["consumption"]["lag"])
    assert got == want
    page = (out / "report.html").read_text()
    for kind, topic, consumer in dd.CONSUMERS:
        assert kind in page and consumer in page
