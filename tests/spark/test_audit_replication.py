"""The audit job compares a healthy master/slave pair written through every protocol
(smss, RocketMQ, NSQ) and finds no divergence."""

from tests.integration.test_replication_fields import write_pair
from tests.spark.test_audit_job import audit


def test_healthy_pair_has_no_divergence(spark, tmp_path):
    master, slave = write_pair(tmp_path)
    summary, _ = audit(spark, master, tmp_path / "out", "--compare", slave)
    cmp = summary["compare"]
    assert (cmp["missing"], cmp["extra"], cmp["different"], cmp["first_divergent_event_id"]) == (0, 0, 0, None)
