"""Checking the JSON request bodies the broker keeps (HEARTBEAT, subscription group
configs) before they reach the door: a field of the wrong type is a refused request
(SYSTEM_ERROR), never an exception deep in the broker."""

from protocols.remoting.topicview import valid_group

#: Subscription group fields the broker reads as numbers or booleans.
_GROUP_INTS = ("retryQueueNums", "retryMaxTimes", "brokerId", "whichBrokerWhenConsumeSlowly")
_GROUP_BOOLS = ("consumeEnable", "consumeFromMinEnable", "consumeBroadcastEnable",
                "notifyConsumerIdsChangedEnable")


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _list_of_dicts(value, what):
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ValueError(f"{what} is not a list of objects")
    return value


def check_heartbeat(data):
    """Raise ValueError unless C{data} (a dict) is shaped like HeartbeatData."""
    if not isinstance(data.get("clientID") or "", str):
        raise ValueError("clientID is not a string")
    for cd in _list_of_dicts(data.get("consumerDataSet"), "consumerDataSet"):
        if not isinstance(cd.get("groupName") or "", str):
            raise ValueError("groupName is not a string")
        for sd in _list_of_dicts(cd.get("subscriptionDataSet"), "subscriptionDataSet"):
            if not isinstance(sd.get("topic") or "", str) or not isinstance(sd.get("subString") or "*", str):
                raise ValueError("subscription topic or subString is not a string")
            version = sd.get("subVersion") or 0
            if not _is_int(version) and not (isinstance(version, str) and version.lstrip("-").isdigit()):
                raise ValueError("subVersion is not a number")
    for pd in _list_of_dicts(data.get("producerDataSet"), "producerDataSet"):
        if not isinstance(pd.get("groupName") or "", str):
            raise ValueError("groupName is not a string")


def check_lock_body(data):
    """Raise ValueError unless C{data} (a dict) is a LockBatchRequestBody: a group, a
    client id and an mqSet of {topic, brokerName, queueId} objects."""
    for key in ("consumerGroup", "clientId"):
        if not isinstance(data.get(key) or "", str):
            raise ValueError(f"{key} is not a string")
    for mq in _list_of_dicts(data.get("mqSet"), "mqSet"):
        queue = mq.get("queueId")
        if not isinstance(mq.get("topic"), str) or not (
                _is_int(queue) or isinstance(queue, str) and queue.isascii() and queue.isdigit()):
            raise ValueError("an mqSet entry has no topic or queueId")


def check_group_config(cfg):
    """Raise ValueError unless C{cfg} (a dict) is a usable SubscriptionGroupConfig."""
    name = cfg.get("groupName")
    if not isinstance(name, str) or not valid_group(name):
        raise ValueError("groupName is required and must be a valid name")
    for key in _GROUP_INTS:
        if key in cfg and not _is_int(cfg[key]):
            raise ValueError(f"{key} is not an integer")
    for key in _GROUP_BOOLS:
        if key in cfg and not isinstance(cfg[key], bool):
            raise ValueError(f"{key} is not a boolean")
