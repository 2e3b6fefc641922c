"""A prometheus_client collector that reads the broker's statistics when /metrics is
scraped: nothing is counted for Prometheus on the publish or delivery paths.

Metric names start with ``mqserver_``; counters since the broker started, gauges now."""

import os

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from mqserver.replication.status import replication_status
from mqserver.version import version


def _histogram(name, doc, latency):
    buckets = [(("+Inf" if b == float("inf") else repr(b)), n) for b, n in latency.cumulative()]
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=latency.sum)


def _disk_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


class BrokerCollector:
    """Collects every metric of one broker (see L{collect})."""

    def __init__(self, broker, per_consumer=True):
        self.broker = broker
        self.per_consumer = per_consumer

    def collect(self):
        build = GaugeMetricFamily("mqserver_build_info", "The broker's version (always 1)",
                                  labels=["version"])
        build.add_metric([version()], 1)
        yield build
        yield from self._topics()
        yield from self._consumers()
        yield from self._doors()
        yield from self._store()
        yield from self._replication()
        yield from self._faults()

    def _topics(self):
        msgs = CounterMetricFamily("mqserver_messages_in", "Messages stored since the start",
                                   labels=["topic", "queue"])
        nbytes = CounterMetricFamily("mqserver_bytes_in", "Record bytes stored since the start",
                                     labels=["topic", "queue"])
        for (topic, qid), q in self.broker.messages.open_queues():
            msgs.add_metric([topic, str(qid)], q.in_msgs)
            nbytes.add_metric([topic, str(qid)], q.in_bytes)
        yield msgs
        yield nbytes

    def _consumers(self):
        labels = ["kind", "topic", "consumer"]
        out_m = CounterMetricFamily("mqserver_consumer_messages_out",
                                    "Messages handed to consumers (redeliveries too)",
                                    labels=labels)
        out_b = CounterMetricFamily("mqserver_consumer_bytes_out",
                                    "Record bytes handed to consumers", labels=labels)
        req = CounterMetricFamily("mqserver_consumer_requeues",
                                  "Messages given back to be delivered again", labels=labels)
        lag = GaugeMetricFamily("mqserver_consumer_lag_messages",
                                "Messages stored that the consumer has not read yet", labels=labels)
        infl = GaugeMetricFamily("mqserver_consumer_in_flight_messages",
                                 "Messages handed out and not acknowledged yet", labels=labels)
        stats = self.broker.stats
        if self.per_consumer:
            for c in stats.all_consumers():
                key = [c.kind, c.topic, c.name]
                out_m.add_metric(key, c.out_msgs)
                out_b.add_metric(key, c.out_bytes)
                req.add_metric(key, c.requeues)
                lag.add_metric(key, stats.lag(c))
                infl.add_metric(key, c.in_flight)
        yield from (out_m, out_b, req, lag, infl)

    def _doors(self):
        g = GaugeMetricFamily("mqserver_connections", "Open connections per front door",
                              labels=["door"])
        for door, addrs in self.broker.stats.connections().items():
            g.add_metric([door], len(addrs))
        yield g

    def _store(self):
        store = self.broker.store_stats
        yield _histogram("mqserver_store_write_seconds",
                         "Time to append a write to the log (one write in 64 timed)",
                         store.write_latency)
        fsync_latency = store.fsync_latency
        if fsync_latency is not None:
            yield _histogram("mqserver_store_fsync_seconds", "Time of one commit-log fsync",
                             fsync_latency)
        yield GaugeMetricFamily("mqserver_store_segments", "Commit-log segment files",
                                value=store.segments)
        yield GaugeMetricFamily("mqserver_store_log_bytes", "Bytes the retained commit log spans",
                                value=store.end - store.min_offset)
        yield GaugeMetricFamily("mqserver_store_disk_bytes",
                                "Bytes of every file in the data directory",
                                value=_disk_bytes(store.path))
        yield GaugeMetricFamily("mqserver_store_next_event_id", "The eventId of the next record",
                                value=store.next_event_id)
        try:
            used = store.disk_used_ratio()
        except OSError:
            used = None  # the data directory's file system cannot be read: no sample
        if used is not None:
            yield GaugeMetricFamily("mqserver_store_disk_used_ratio",
                                    "Used share of the data directory's file system (as df)",
                                    value=used)
        yield GaugeMetricFamily("mqserver_store_disk_max_used_ratio",
                                "store.diskMaxUsedRatio: publishes are refused above it",
                                value=store.disk_max_used_ratio)
        yield CounterMetricFamily("mqserver_store_disk_errors",
                                  "Writes and fsyncs of the data directory that failed (a full"
                                  " or failing disk)", value=store.disk_errors)
        yield CounterMetricFamily("mqserver_store_disk_troubles",
                                  "Disk troubles started (failed writes, the usage ratio passed)",
                                  value=store.disk_full_events)
        yield CounterMetricFamily("mqserver_store_damaged_records",
                                  "Damaged records found and skipped",
                                  value=store.damaged_records)

    def _replication(self):
        s = replication_status(self.broker)
        yield GaugeMetricFamily("mqserver_replication_is_slave", "1 on a replication slave",
                                value=1 if s["role"] == "slave" else 0)
        yield GaugeMetricFamily("mqserver_replication_applied_event_id",
                                "The last eventId this broker holds", value=s["appliedEventId"])
        group = s.get("group")
        if group is not None:
            yield GaugeMetricFamily("mqserver_group_leader",
                                    "1 while this member leads its replica group",
                                    value=1 if group["role"] == "leader" else 0)
            yield GaugeMetricFamily("mqserver_group_epoch",
                                    "The epoch of the replica group's leader, as this member"
                                    " knows it (0: none known)", value=group["epoch"])
        slaves = GaugeMetricFamily("mqserver_replication_slave_lag_events",
                                   "eventIds a slave following this master is behind",
                                   labels=["slave"])
        for r in self.broker.stats.replicas():
            slaves.add_metric([r["slave"]], r["lag_events"])
        yield slaves
        if s["role"] == "slave":
            yield GaugeMetricFamily("mqserver_replication_lag_ms",
                                    "Master write time to slave apply time of the last record",
                                    value=s.get("lagMs", 0))
            yield GaugeMetricFamily("mqserver_replication_stalled",
                                    "1 while the slave is stalled: its master is ahead and"
                                    " its applied eventId has not moved",
                                    value=1 if s["stalled"] else 0)
            yield GaugeMetricFamily("mqserver_replication_seconds_since_progress",
                                    "Seconds since the slave's applied eventId last moved"
                                    " (or it connected to its master)",
                                    value=s["sinceProgressMs"] / 1000.0)
            if "lagEvents" in s:
                yield GaugeMetricFamily("mqserver_replication_lag_events",
                                        "eventIds the slave is behind its master",
                                        value=s["lagEvents"])

    def _faults(self):
        faults = self.broker.wiretap.faults
        yield GaugeMetricFamily("mqserver_fault_rules_active",
                                "Fault rules in force (admin.faults): 0 in production",
                                value=len(faults.rules()))
        applied = CounterMetricFamily("mqserver_fault_applied",
                                      "Requests a fault rule acted on, by door and action",
                                      labels=["door", "action"])
        for (door, action), n in sorted(faults.applied_total.items()):
            applied.add_metric([door, action], n)
        yield applied
