"""Per-topic and per-group put/get counters (RocketMQ's BrokerStatsManager, reduced to
totals), served by VIEW_BROKER_STATS_DATA (315) and GET_BROKER_RUNTIME_INFO (28)."""

from collections import defaultdict

TOPIC_PUT_NUMS = "TOPIC_PUT_NUMS"
TOPIC_PUT_SIZE = "TOPIC_PUT_SIZE"
GROUP_GET_NUMS = "GROUP_GET_NUMS"
GROUP_GET_SIZE = "GROUP_GET_SIZE"


class Stats:
    """Counters since start. Keys follow RocketMQ: topic, or C{topic@group}."""

    def __init__(self):
        self.counters = {name: defaultdict(int) for name in (TOPIC_PUT_NUMS, TOPIC_PUT_SIZE, GROUP_GET_NUMS, GROUP_GET_SIZE)}

    def put(self, topic, count, size):
        self.counters[TOPIC_PUT_NUMS][topic] += count
        self.counters[TOPIC_PUT_SIZE][topic] += size

    def get(self, group, topic, count, size):
        key = f"{topic}@{group}"
        self.counters[GROUP_GET_NUMS][key] += count
        self.counters[GROUP_GET_SIZE][key] += size

    def view(self, name, key):
        """Return a BrokerStatsData dict for (stats name, key), or None when unknown."""
        table = self.counters.get(name)
        if table is None or key not in table:
            return None
        total = table[key]
        item = {"sum": total, "tps": 0.0, "avgpt": 0.0}
        return {"statsMinute": item, "statsHour": dict(item), "statsDay": dict(item)}

    def totals(self):
        return {
            "putMessageTimesTotal": sum(self.counters[TOPIC_PUT_NUMS].values()),
            "getMessageTimesTotal": sum(self.counters[GROUP_GET_NUMS].values()),
        }
