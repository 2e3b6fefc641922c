"""RocketMQ's views of the core statistics (L{mqserver.broker.stats}): consumer groups as
core consumers, BrokerStatsData (VIEW_BROKER_STATS_DATA, 315) and the runtime info
(GET_BROKER_RUNTIME_INFO, 28) that C{mqadmin clusterList} prints.

Nothing is counted here: messages in are counted by the store, messages out by the
group's core L{mqserver.broker.stats.OffsetConsumer} when a pull answers with messages."""

import shutil
import time

from mqserver.broker.stats import WINDOWS

TOPIC_PUT_NUMS = "TOPIC_PUT_NUMS"
TOPIC_PUT_SIZE = "TOPIC_PUT_SIZE"
GROUP_GET_NUMS = "GROUP_GET_NUMS"
GROUP_GET_SIZE = "GROUP_GET_SIZE"
#: stats name -> (kind of key, messages (0) or bytes (1))
_NAMES = {TOPIC_PUT_NUMS: ("put", 0), TOPIC_PUT_SIZE: ("put", 1),
          GROUP_GET_NUMS: ("get", 0), GROUP_GET_SIZE: ("get", 1)}
_MINUTE, _HOUR, _DAY = 60, 3600, 86400


def group_consumer(broker, group, topic, on_rewind=None):
    """Return the core consumer of (group, topic) (L{OffsetConsumer}), with C{on_rewind}
    telling the group's clients when an operator moves it."""
    c = broker.stats.group(group, topic)
    if c.on_rewind is None:
        c.on_rewind = on_rewind
    return c


def stats_data(stats, name, key):
    """Return the BrokerStatsData dict of (stats name, key), or None when unknown.

    Keys follow RocketMQ: a topic, or C{topic@group}."""
    spec = _NAMES.get(name)
    if spec is None:
        return None
    kind, index = spec
    counts = stats.counts()
    if (kind, key) not in counts:
        return None
    out = {}
    for field, seconds in (("statsMinute", _MINUTE), ("statsHour", _HOUR), ("statsDay", _DAY)):
        total, _ = stats.window((kind, key), index, seconds, counts)
        out[field] = {"avgpt": 0.0, "sum": total, "tps": total / seconds if seconds else 0.0}
    return out


def _tps(stats, kind, counts):
    return " ".join(f"{stats.window((kind, None), 0, w, counts)[1]:.1f}" for w in WINDOWS)


def runtime_info(stats, store, version, version_desc):
    """Return the KVTable of GET_BROKER_RUNTIME_INFO with every field clusterList reads
    (C{store}: the broker's L{mqserver.interfaces.IStoreStats})."""
    counts = stats.counts()
    put_m, put_b = counts[("put", None)]
    get_m, _ = counts[("get", None)]
    yesterday, today = stats.history.day_marks
    ratio = _disk_ratio(store.path)
    earliest = store.earliest_store_ts()
    boot = stats.start_ms
    return {
        "brokerVersionDesc": version_desc, "brokerVersion": str(version),
        "bootTimestamp": str(boot),
        "runtime": _runtime(int(time.time() * 1000) - boot),
        "putMessageTimesTotal": str(max(put_m, 1)),
        "putMessageSizeTotal": str(put_b), "putMessageFailedTimes": "0",
        "putMessageAverageSize": str(put_b / max(put_m, 1)),
        "putTps": _tps(stats, "put", counts),
        "getTransferedTps": _tps(stats, "get", counts),
        "getFoundTps": _tps(stats, "get", counts), "getMissTps": "0.0 0.0 0.0",
        "getTotalTps": _tps(stats, "get", counts),
        "msgPutTotalYesterdayMorning": str(yesterday.get(("put", None), (0, 0))[0]),
        "msgPutTotalTodayMorning": str(today.get(("put", None), (0, 0))[0]),
        "msgPutTotalTodayNow": str(put_m),
        "msgGetTotalYesterdayMorning": str(yesterday.get(("get", None), (0, 0))[0]),
        "msgGetTotalTodayMorning": str(today.get(("get", None), (0, 0))[0]),
        "msgGetTotalTodayNow": str(get_m),
        "sendThreadPoolQueueSize": "0", "sendThreadPoolQueueCapacity": "10000",
        "pullThreadPoolQueueSize": "0", "pullThreadPoolQueueCapacity": "100000",
        "queryThreadPoolQueueSize": "0", "queryThreadPoolQueueCapacity": "20000",
        "sendThreadPoolQueueHeadWaitTimeMills": "0", "pullThreadPoolQueueHeadWaitTimeMills": "0",
        "queryThreadPoolQueueHeadWaitTimeMills": "0", "pageCacheLockTimeMills": "0",
        "dispatchBehindBytes": "0", "earliestMessageTimeStamp": str(earliest),
        "startAcceptSendRequestTimeStamp": "0",
        "commitLogDiskRatio": str(ratio), "consumeQueueDiskRatio": str(ratio),
        "commitLogMinOffset": str(store.min_offset),
        "commitLogMaxOffset": str(store.end),
        "putLatency99": "0.00", "putLatency999": "0.00",
    }


def _runtime(ms):
    s = ms // 1000
    return f"[ {s // 86400} days, {s // 3600 % 24} hours, {s // 60 % 60} minutes, {s % 60} seconds ]"


def _disk_ratio(path):
    try:
        u = shutil.disk_usage(path)
    except OSError:
        return -1
    return round(u.used / u.total, 4) if u.total else -1

