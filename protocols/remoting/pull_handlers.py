"""PULL_MESSAGE (11) handlers, mixed into L{protocols.remoting.broker_protocol.BrokerProtocol}:
the usual pull in short (L{PullHandlers._usual_pull}), every other through the general
path (L{PullHandlers._any_pull}), parked pulls finished (L{protocols.remoting.longpolls})
and the answers."""

from protocols.remoting import codes
from protocols.remoting.codec import encode_pull_answer, encode_response
from protocols.remoting.consumers import parse_subscription
from protocols.remoting.pulling import pull_once
from protocols.remoting.server import error, field, int_field
from protocols.remoting.topicview import PERM_READ, read_queues

#: Java's and Go's BROKER_SUSPEND_MAX_TIME_MILLIS, for a pull that names no suspend time.
SUSPEND_DEFAULT_MS = 20000
_SUBSCRIPTION, _COMMIT, _SUSPEND = (
    codes.PULL_FLAG_SUBSCRIPTION, codes.PULL_FLAG_COMMIT_OFFSET, codes.PULL_FLAG_SUSPEND)
#: What _usual_pull returns for a pull it leaves to _any_pull.
_GENERAL = object()
#: Tag expression -> the tag hashes it keeps (parse_subscription's), for the few
#: expressions a broker sees; emptied when it holds L{_TAG_CODES_MAX} of them.
_TAG_CODES = {}
_TAG_CODES_MAX = 256


def tag_codes_of(expr):
    """Return the tag hashes of subscription C{expr} (None: every message), kept in
    L{_TAG_CODES}."""
    codes_ = parse_subscription(expr)[1]
    if codes_ is not None:
        codes_ = frozenset(codes_)
    if len(_TAG_CODES) >= _TAG_CODES_MAX:
        _TAG_CODES.clear()
    _TAG_CODES[expr] = codes_
    return codes_


class PullHandlers:
    """The pull handlers of a broker connection (C{self.door}, C{self.broker},
    C{self.messages} are the connection's)."""

    def pull(self, cmd):
        # most pulls are the usual one (_usual_pull)
        answer = self._usual_pull(cmd, cmd.ext_fields)
        return self._any_pull(cmd) if answer is _GENERAL else answer

    def _usual_pull(self, cmd, ext):
        """Serve the usual pull in short, or return L{_GENERAL} (L{_any_pull} then serves
        it, and also says what is wrong), having done nothing: a readable topic that
        exists and never expires, a queue below its queue count, a known group, queueId
        and queueOffset there, the subscription in the request or the heartbeat's
        (current), and the numbers it uses decimal. The answer is what L{_any_pull} gives it."""
        topic = ext.get("topic")
        t = self.broker.registry.topics.get(topic)
        group = ext.get("consumerGroup")
        if (t is None or t.state or t.expire_at or not t.perm & PERM_READ
                or group not in self.door.consumers.group_configs):
            return _GENERAL
        try:
            qid, offset = int(ext["queueId"]), int(ext["queueOffset"])
            max_nums, sys_flag = int(ext.get("maxMsgNums") or 32), int(ext.get("sysFlag") or 0)
            if sys_flag & _SUBSCRIPTION:
                expr = ext.get("subscription", "*")
            else:
                sub = self.door.consumers.subscription(group, topic)
                version = ext.get("subVersion")
                if sub is None or sub[1] < (int(version) if version else 0):
                    return _GENERAL
                expr = sub[0]
            commit = ext.get("commitOffset") if sys_flag & _COMMIT else None
            commit = int(commit) if commit else -1
            suspend = ext.get("suspendTimeoutMillis") if sys_flag & _SUSPEND else None
            suspend = int(suspend) if suspend else SUSPEND_DEFAULT_MS
        except (KeyError, ValueError):
            return _GENERAL
        if not 0 <= qid < t.queues:
            return _GENERAL
        tag_codes = _TAG_CODES.get(expr, _GENERAL)
        if tag_codes is _GENERAL:
            tag_codes = tag_codes_of(expr)
        if commit >= 0 and self.broker.is_master:
            self.broker.offsets.commit(topic, group, qid, commit)
        if sys_flag & _SUSPEND:
            hold_ms = min(suspend, self.door.long_poll_max_ms)
            q = self.messages.find_queue(topic, qid)
            if hold_ms > 0 and q is not None and offset == q.max_offset:
                # a consumer keeping up, at the tail: what pull_once would find (nothing,
                # PULL_NOT_FOUND) without looking
                self.door.polls.park(self, cmd, (topic, qid, offset, max_nums, tag_codes, group), hold_ms)
                return None  # finish_pull answers it
        result = pull_once(self.messages, self.messages.store_host, topic, qid, offset, max_nums, tag_codes)
        if result.code == codes.PULL_NOT_FOUND and sys_flag & _SUSPEND and hold_ms > 0:
            self.door.polls.park(self, cmd, (topic, qid, offset, max_nums, tag_codes, group), hold_ms)
            return None
        return self._pull_response(cmd, result, group, topic, qid)

    def _any_pull(self, cmd):
        ext = cmd.ext_fields
        group = ext.get("consumerGroup", "")
        topic = ext.get("topic", "")
        try:
            # the usual request: four decimal numbers, converted at once
            qid, offset = int(ext["queueId"]), int(ext["queueOffset"])
            max_nums, sys_flag = int(ext.get("maxMsgNums") or 32), int(ext.get("sysFlag") or 0)
        except (KeyError, ValueError):
            # one is missing or bad: the field-by-field path names it
            qid, offset = int_field(cmd, "queueId"), int_field(cmd, "queueOffset")
            max_nums, sys_flag = int_field(cmd, "maxMsgNums", 32), int_field(cmd, "sysFlag", 0)
        t = self.broker.topic(topic)
        if t is None:
            return error(cmd, codes.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not t.perm & PERM_READ:
            return error(cmd, codes.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden")
        if not 0 <= qid < max(read_queues(t), t.queues):
            return error(cmd, codes.SYSTEM_ERROR, f"queueId[{qid}] is illegal, topic:[{topic}]")
        if self.door.group_config(group) is None:
            return error(cmd, codes.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group [{group}] does not exist")
        if sys_flag & codes.PULL_FLAG_SUBSCRIPTION:
            expr = field(cmd, "subscription", "*")
        else:
            # Java and Go push consumers leave the subscription to their heartbeat
            sub = self.door.consumers.subscription(group, topic)
            if sub is None:
                return error(cmd, codes.SUBSCRIPTION_NOT_EXIST,
                             f"the consumer's subscription not exist, group: {group} topic: {topic}")
            if sub[1] < int_field(cmd, "subVersion", 0):
                return error(cmd, codes.SUBSCRIPTION_NOT_LATEST, "the consumer's subscription not latest")
            expr = sub[0]
        _, tag_codes = parse_subscription(expr)
        if sys_flag & codes.PULL_FLAG_COMMIT_OFFSET:
            commit = int_field(cmd, "commitOffset", -1)
            if commit >= 0 and self.broker.is_master:
                self.broker.offsets.commit(topic, group, qid, commit)
        args = (topic, qid, offset, max_nums, tag_codes, group)
        result = pull_once(self.messages, self.messages.store_host, topic, qid, offset, max_nums, tag_codes)
        if result.code == codes.PULL_NOT_FOUND and sys_flag & codes.PULL_FLAG_SUSPEND:
            # held as long as the client asks (4.9), bounded by rocketmq.longPollMaxMs
            hold_ms = min(int_field(cmd, "suspendTimeoutMillis", SUSPEND_DEFAULT_MS), self.door.long_poll_max_ms)
            if hold_ms > 0:
                self.door.polls.park(self, cmd, args, hold_ms)
                return None  # finish_pull answers it
        return self._pull_response(cmd, result, group, topic, qid)

    def finish_pull(self, hold, final):
        """Re-run a parked pull; answer it and return True when it is done (C{final}: its
        time is up, answer whatever it finds)."""
        topic, qid, offset, max_nums, tag_codes, group = hold.args
        result = pull_once(self.messages, self.messages.store_host, topic, qid, offset, max_nums, tag_codes)
        if result.code == codes.PULL_NOT_FOUND and not final:
            return False
        self._reply(self._pull_response(hold.cmd, result, group, topic, qid), hold.cmd)
        return True

    def _pull_response(self, cmd, r, group, topic, qid):
        if r.count:
            self.door.group_consumer(group, topic).pulled_to(qid, r.next_offset, r.count, len(r.body))
        return encode_pull_answer(cmd, r.code, r.next_offset, r.min_offset, r.max_offset, r.body, r.remark)


def make_pull_response(cmd, r):
    """Return the answer frame to a pull with result C{r}: its code, remark and records,
    through the general encoder (the reference of L{encode_pull_answer}'s template)."""
    return encode_response(cmd, r.code, {
        "suggestWhichBrokerId": "0", "nextBeginOffset": str(r.next_offset),
        "minOffset": str(r.min_offset), "maxOffset": str(r.max_offset)}, r.body, r.remark)
