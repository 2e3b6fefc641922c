"""Latency histograms of the store (write and fsync), kept as plain bucket counts so
recording one costs a bisect and two additions; /metrics turns them into Prometheus
histograms when it is scraped."""

import bisect

#: Upper bounds of the buckets, in seconds (the last bucket is +Inf).
BUCKETS = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
           0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Latency:
    """One latency histogram.

    @ivar counts: observations per bucket of L{BUCKETS} (one more for +Inf).
    @ivar sum: the sum of every observation, in seconds.
    """

    def __init__(self):
        self.counts = [0] * (len(BUCKETS) + 1)
        self.sum = 0.0

    def observe(self, seconds):
        """Record one observation."""
        self.counts[bisect.bisect_left(BUCKETS, seconds)] += 1
        self.sum += seconds

    def cumulative(self):
        """Return [(upper bound, observations at or below it), ...] ending with +Inf."""
        out, total = [], 0
        for bound, n in zip(BUCKETS + (float("inf"),), self.counts):
            total += n
            out.append((bound, total))
        return out
