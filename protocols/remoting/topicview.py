"""How core topics look to RocketMQ: TopicConfig views, name rules, system topics.

A core L{Topic} has C{queues} (RocketMQ's queue count), C{perm} and C{attrs}; the
RocketMQ-only settings (read/write queue numbers when they differ, topicFilterType,
topicSysFlag, order) live in C{attrs["rocketmq"]}.
"""

import re

TBW102 = "TBW102"
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
PERM_INHERIT = 1
PERM_WRITE = 2
PERM_READ = 4
_NAME = re.compile(r"^[%|a-zA-Z0-9_-]+$")
MAX_NAME = 127
MAX_GROUP = 255


def valid_group(name):
    """Return True when C{name} passes the RocketMQ clients' group name rule (the
    characters of a topic, at most 255): its retry topic becomes a directory name."""
    return bool(name) and len(name) <= MAX_GROUP and bool(_NAME.match(name))


def valid_name(name):
    """Return True when C{name} passes RocketMQ's topic name rule (TopicValidator)."""
    return bool(name) and len(name) <= MAX_NAME and bool(_NAME.match(name))


#: Names of existing topics that passed L{usual_send_name} (at most L{_USUAL_MAX}).
USUAL_NAMES = set()
_USUAL_MAX = 4096


def usual_send_name(name):
    """Return True when C{name}, an existing topic's, passes L{valid_name} and names no
    retry topic (whose sends are checked against the retry limit), and remember it in
    L{USUAL_NAMES}."""
    if not valid_name(name) or name.startswith(RETRY_PREFIX):
        return False
    if len(USUAL_NAMES) >= _USUAL_MAX:
        USUAL_NAMES.clear()
    USUAL_NAMES.add(name)
    return True


def rocket_attrs(topic):
    """Return the RocketMQ settings stored with C{topic}."""
    return (topic.attrs or {}).get("rocketmq", {})


def topic_config(topic):
    """Return the RocketMQ TopicConfig dict of a core topic."""
    ra = rocket_attrs(topic)
    return {
        "topicName": topic.name,
        "readQueueNums": int(ra.get("readQueueNums", topic.queues)),
        "writeQueueNums": int(ra.get("writeQueueNums", topic.queues)),
        "perm": topic.perm,
        "topicFilterType": ra.get("topicFilterType", "SINGLE_TAG"),
        "topicSysFlag": int(ra.get("topicSysFlag", 0)),
        "order": bool(ra.get("order", False)),
    }


def write_queues(topic):
    return int(rocket_attrs(topic).get("writeQueueNums", topic.queues))


def read_queues(topic):
    return int(rocket_attrs(topic).get("readQueueNums", topic.queues))


def make_attrs(base, read, write, filter_type="SINGLE_TAG", sys_flag=0, order=False):
    """Return C{base} attrs with the RocketMQ settings replaced."""
    attrs = dict(base or {})
    attrs["rocketmq"] = {
        "readQueueNums": read, "writeQueueNums": write, "topicFilterType": filter_type,
        "topicSysFlag": sys_flag, "order": order,
    }
    return attrs
