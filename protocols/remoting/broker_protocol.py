"""The broker wire protocol: one client connection (producer, consumer or admin tool).

Handlers map remoting requests onto the core broker, the consumer
offsets table and the door's L{ConsumerManager}; shared state lives on the factory
(L{protocols.remoting.broker_door.BrokerDoor}).
"""

import random
import struct
from functools import partial

from twisted.internet import defer

from mqserver.errors import ReplicasUnavailable, ReplicationError
from mqserver.message import Message, PutResult

from protocols.remoting import codes
from protocols.remoting import admin_stats
from protocols.remoting.admin_stats import StatsHandlers
from protocols.remoting.bodies import check_heartbeat, check_lock_body
from protocols.remoting.broker_admin import AdminHandlers, broker_error
from protocols.remoting.codec import encode_response, encode_send_answer
from protocols.remoting.props import MAX_PROPERTIES_LENGTH
from protocols.remoting.pull_handlers import PullHandlers
from protocols.remoting.sending import (
    NUMBERS as _NUMBERS, NO_HOST_FLAGS as _NO_HOST_FLAGS, SHORT_NAMES, build_messages, dlq_topic,
    host_bytes, normalize_properties, offset_msg_ids, property_value, retry_copy, retry_topic,
    send_header, header_int, with_real_queue,
)
from protocols.remoting.server import (
    BadRequest, RemotingProtocol, error, field, int_field, json_body, ok,
)
from protocols.remoting.tolerant_json import loads_object
from protocols.remoting.transactions import is_prepared
from protocols.remoting.topicview import (
    PERM_WRITE, RETRY_PREFIX, USUAL_NAMES as _USUAL_NAMES, usual_send_name, valid_name, write_queues,
)

#: What a send header's C{batch} says when it is a batch (L{sending.header_bool}).
_TRUE = ("true", "1")
#: The send header fields _usual_send reads, by their long names and by SEND_MESSAGE_V2's.
_LONG_READ = ("topic", "queueId", "sysFlag", "flag", "bornTimestamp", "reconsumeTimes",
              "properties", "batch")
_SHORT_READ = tuple({long: short for short, long in SHORT_NAMES.items()}[n] for n in _LONG_READ)
#: Every long name a short one stands for: a V2 header holding none is read by its short
#: names alone.
_LONG_NAMES = frozenset(SHORT_NAMES.values())

def sent(cmd, msg_ids, qid, queue_offset, code=codes.SUCCESS):
    """Return the frame of the SUCCESS answer to a send: what 4.9 writes, in our key order.
    C{code}: 4.9's other answers of a stored send (SLAVE_NOT_AVAILABLE,
    FLUSH_SLAVE_TIMEOUT), which carry the same fields."""
    return encode_response(cmd, code, {
        "MSG_REGION": "DefaultRegion", "TRACE_ON": "true", "msgId": msg_ids,
        "queueId": str(qid), "queueOffset": str(queue_offset)})


class BrokerProtocol(PullHandlers, AdminHandlers, StatsHandlers, RemotingProtocol):
    """One client connection to the broker door."""

    handlers = {
        codes.SEND_MESSAGE: "send", codes.SEND_MESSAGE_V2: "send", codes.SEND_BATCH_MESSAGE: "send",
        codes.PULL_MESSAGE: "pull",
        codes.QUERY_MESSAGE: "query_message", codes.VIEW_MESSAGE_BY_ID: "view_message",
        codes.HEART_BEAT: "heartbeat", codes.UNREGISTER_CLIENT: "unregister_client",
        codes.GET_CONSUMER_LIST_BY_GROUP: "consumer_list",
        codes.QUERY_CONSUMER_OFFSET: "query_offset", codes.UPDATE_CONSUMER_OFFSET: "update_offset",
        codes.GET_MAX_OFFSET: "max_offset", codes.GET_MIN_OFFSET: "min_offset",
        codes.SEARCH_OFFSET_BY_TIMESTAMP: "search_offset",
        codes.GET_EARLIEST_MSG_STORETIME: "earliest_time",
        codes.CONSUMER_SEND_MSG_BACK: "send_back",
        codes.LOCK_BATCH_MQ: "lock", codes.UNLOCK_BATCH_MQ: "unlock",
        codes.UPDATE_AND_CREATE_TOPIC: "create_topic", codes.DELETE_TOPIC_IN_BROKER: "delete_topic",
        codes.GET_ALL_TOPIC_CONFIG: "all_topic_config",
        codes.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: "create_group",
        codes.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: "all_groups",
        codes.DELETE_SUBSCRIPTIONGROUP: "delete_group",
        codes.UPDATE_BROKER_CONFIG: "update_broker_config",
        **admin_stats.HANDLERS,
        codes.END_TRANSACTION: "end_transaction",
    }

    door_name = "broker"

    def __init__(self, door):
        super().__init__()
        self.door = door
        self.broker = door.broker
        self.messages = door.broker.messages
        self.tap = door.broker.wiretap
        # While a send waits for its topic to be created, the sends behind it on this
        # connection wait too: (command, Deferred of its answer), in arrival order.
        self._held = None

    def connectionMade(self):
        self.born_host = host_bytes(self.transport.getPeer())
        if self.door.acl is not None:
            # RocketMQ plain ACL: every request is checked first
            self.admit = partial(self.door.acl.refusal, ip=getattr(self.transport.getPeer(), "host", ""))

    def connectionLost(self, reason):
        super().connectionLost(reason)
        self.door.polls.drop(self)  # nobody to answer: its parked pulls are forgotten
        self.door.connection_lost(self)

    # -- sending -------------------------------------------------------------------

    def send(self, cmd):
        if self._held is not None:
            # stored in the order they came, as the 4.9.4 broker's one send thread does
            d = defer.Deferred()
            self._held.append((cmd, d))
            return d
        # most sends are the usual one (_usual_send), answered at once
        code = cmd.code
        ext = cmd.ext_fields
        if code == codes.SEND_MESSAGE:  # the C++ client's
            answer = self._usual_send(cmd, ext, _LONG_READ)
        elif code == codes.SEND_MESSAGE_V2:  # the Java and Go clients', short field names
            if "b" in ext and _LONG_NAMES.isdisjoint(ext):
                # read by their short names: what send_header's renaming would give, as
                # no long name is there to clash with one
                answer = self._usual_send(cmd, ext, _SHORT_READ)
            else:
                answer = self._usual_send(cmd, send_header(cmd), _LONG_READ)
        else:
            answer = None
        return self._any_send(cmd) if answer is None else answer

    def _usual_send(self, cmd, ext, names):
        """Store and answer the usual send in short, or return None (L{_any_send} then serves
        it, and also says what is wrong): one message, not a batch, to a writable topic
        that exists, never expires and is no retry topic, on a queue in range, neither
        delayed nor a half message, within the size limits, on a master, the write done
        at once (flush levels 0 and 1). The answer is what L{_any_send} gives it.
        C{names}: the header's names of the fields read (L{_LONG_READ} or
        L{_SHORT_READ})."""
        TOPIC, QUEUE_ID, SYS_FLAG, FLAG, BORN, RECONSUME, PROPERTIES, BATCH = names
        topic = ext.get(TOPIC)
        t = self.broker.registry.topics.get(topic)
        if (t is None or t.state or t.expire_at or not t.perm & PERM_WRITE
                or topic not in _USUAL_NAMES and not usual_send_name(topic)):
            return None
        try:
            qid = int(ext[QUEUE_ID])
            sys_flag, flag, born_ts, reconsume = numbers = (
                int(ext.get(SYS_FLAG) or 0), int(ext.get(FLAG) or 0),
                int(ext.get(BORN) or 0), int(ext.get(RECONSUME) or 0))
            _NUMBERS.pack(*numbers)
        except (KeyError, ValueError, struct.error):
            return None
        props = ext.get(PROPERTIES)
        batch = ext.get(BATCH)
        body = cmd.body
        if (not 0 <= qid < t.queues or qid >= write_queues(t)
                or batch is not None and batch.lower() in _TRUE
                or len(body) > self.messages.max_message_size):
            return None
        if props:
            if "DELAY\x01" in props or "TRAN_MSG" in props:
                return None
            props = normalize_properties(props)
            if len(props) > MAX_PROPERTIES_LENGTH:
                return None
        else:
            props = b""
        msg = Message(body, props, flag, sys_flag & _NO_HOST_FLAGS, reconsume, born_ts,
                      self.born_host)
        try:
            r = self.broker.publish_now(topic, [msg], qid)
        except Exception:
            return defer.fail().addErrback(broker_error, cmd, topic)
        if type(r) is not PutResult:
            return r.addCallbacks(self._published, self._send_failed, callbackArgs=(cmd,),
                                  errbackArgs=(cmd, topic, self._published))
        msg_id = (self.messages.store_host + r.log_offsets[0].to_bytes(8, "big")).hex().upper()
        if cmd.serialize_type != codes.SERIALIZE_JSON:
            return sent(cmd, msg_id, qid, r.queue_offsets[0])
        return encode_send_answer(cmd, msg_id, qid, r.queue_offsets[0])

    def _any_send(self, cmd):
        ext = send_header(cmd)
        if cmd.code == codes.SEND_BATCH_MESSAGE:
            ext = dict(ext, batch="true")
        topic = ext.get("topic") or ""
        if not valid_name(topic):
            return error(cmd, codes.MESSAGE_ILLEGAL, f"the topic[{topic}] is conflict with system reserved words or illegal")
        msgs = build_messages(ext, cmd.body, self.born_host, self.messages.max_message_size)
        for m in msgs:
            if len(m.body) > self.messages.max_message_size:
                return error(cmd, codes.MESSAGE_ILLEGAL, f"the message body size over max value, MAX: {self.messages.max_message_size}")
            if len(m.properties) > MAX_PROPERTIES_LENGTH:
                return error(cmd, codes.MESSAGE_ILLEGAL, f"the message properties length too long {len(m.properties)}")
        t = self.broker.topic(topic)
        if t is None:
            d = self.door.auto_create(topic, ext.get("defaultTopic"), header_int(ext, "defaultTopicQueueNums", 4))
            if d is None:
                return error(cmd, codes.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
            return self._hold(d, lambda t: self._send_to(cmd, ext, t, msgs), cmd, topic)
        return self._send_to(cmd, ext, t, msgs)

    def _hold(self, d, then, cmd, topic):
        """Return the answer of C{then(result of d)}, holding this connection's later sends
        until it has written (not until its write is durable)."""
        self._held = []

        def go(result):
            try:
                return then(result)
            finally:
                self._release()

        def failed(f):
            self._release()
            return f

        return d.addCallbacks(go, failed).addErrback(broker_error, cmd, topic)

    def _release(self):
        held, self._held = self._held, None
        while held:
            cmd, d = held.pop(0)
            r = self.send(cmd)
            if isinstance(r, defer.Deferred):
                r.chainDeferred(d)
            else:
                d.callback(r)
            if self._held is not None:  # that one waits again: the rest behind it
                self._held.extend(held)
                return

    def _send_to(self, cmd, ext, t, msgs):
        if not t.perm & PERM_WRITE:
            return error(cmd, codes.NO_PERMISSION, f"the topic[{t.name}] sending message is forbidden")
        qid = header_int(ext, "queueId", -1)
        nq = write_queues(t)
        if qid >= nq:
            return error(cmd, codes.SYSTEM_ERROR, f"request queueId[{qid}] is illegal, topic write queue num {nq}")
        if qid < 0:
            if nq == 0:  # the 4.9 broker's random pick divides by zero here: SYSTEM_ERROR
                return error(cmd, codes.SYSTEM_ERROR, f"the topic[{t.name}] has no write queue")
            qid = random.randrange(nq)
        topic = t.name
        if topic.startswith(RETRY_PREFIX) and len(msgs) == 1:
            group = topic[len(RETRY_PREFIX):]
            max_times = header_int(ext, "maxReconsumeTimes", 0) or self.door.retry_max_times(group)
            if msgs[0].reconsume_times >= max_times:
                return self._hold(self.door.ensure_topic(dlq_topic(group), 1),
                                  lambda t2: self._publish(cmd, t2.name, 0, msgs), cmd, topic)
        if len(msgs) == 1:
            if is_prepared(msgs[0]):
                return self._prepare(cmd, topic, qid, msgs[0])
            level = property_value(msgs[0].properties, b"DELAY")
            if level is not None and level.isdigit() and int(level) > 0:
                return self._delay(cmd, topic, qid, msgs, int(level))
        return self._publish(cmd, topic, qid, msgs)

    def _publish(self, cmd, topic, qid, msgs):
        # At flush levels 0 and 1 the write is done when publish_now returns: answer at
        # once, without a Deferred (docs/architecture.md, "Answers in request order").
        try:
            r = self.broker.publish_now(topic, msgs, qid)
        except Exception:
            return defer.fail().addErrback(broker_error, cmd, topic)
        if isinstance(r, defer.Deferred):
            return r.addCallbacks(self._published, self._send_failed, callbackArgs=(cmd,),
                                  errbackArgs=(cmd, topic, self._published))
        return self._published(r, cmd)

    def _published(self, r, cmd, code=codes.SUCCESS):
        return sent(cmd, offset_msg_ids(self.messages.store_host, r.log_offsets), r.queue_id,
                    r.queue_offsets[0], code)

    @staticmethod
    def _send_failed(f, cmd, topic, answer):
        """The answer to a failed send: one stored here that too few slaves confirmed
        gets 4.9's SLAVE_NOT_AVAILABLE or FLUSH_SLAVE_TIMEOUT with its fields
        (C{answer(result, cmd, code)} makes them); any other error L{broker_error}'s."""
        e = f.value
        if isinstance(e, ReplicationError) and e.put_result is not None:
            code = (codes.SLAVE_NOT_AVAILABLE if isinstance(e, ReplicasUnavailable)
                    else codes.FLUSH_SLAVE_TIMEOUT)
            return answer(e.put_result, cmd, code)
        return broker_error(f, cmd, topic)

    def _delay(self, cmd, topic, qid, msgs, level):
        # 4.9 parks it on SCHEDULE_TOPIC_XXXX with REAL_TOPIC and REAL_QID; the delivered
        # copy keeps them (and DELAY) and goes to that queue.
        msgs[0].properties = with_real_queue(msgs[0].properties, topic, qid)
        delay_ms = self.door.delay_ms(level)
        start = self.messages.end
        d = self.broker.delay(topic, delay_ms, msgs)

        def done(_, cmd=cmd, code=codes.SUCCESS):
            return sent(cmd, offset_msg_ids(self.messages.store_host, [start]), qid, 0, code)

        return d.addCallbacks(done, self._send_failed, errbackArgs=(cmd, topic, done))

    def _prepare(self, cmd, topic, qid, msg):
        d = self.door.transactions.prepare(topic, qid, msg)

        def done(r, cmd=cmd, code=codes.SUCCESS):
            return sent(cmd, offset_msg_ids(self.messages.store_host, r.log_offsets), qid,
                        r.queue_offsets[0], code)

        return d.addCallbacks(done, self._send_failed, errbackArgs=(cmd, topic, done))

    def end_transaction(self, cmd):
        return self.door.transactions.end(self, cmd)

    def send_back(self, cmd):
        group = field(cmd, "group", "")
        offset = int_field(cmd, "offset")
        delay_level = int_field(cmd, "delayLevel", 0)
        cfg = self.door.group_config(group)
        if cfg is None:
            return error(cmd, codes.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group [{group}] not exist")
        view = self.door.record_at(offset)
        if view is None:
            return error(cmd, codes.SYSTEM_ERROR, f"look message by offset failed, {offset}")
        max_times = cfg.get("retryMaxTimes", 16)
        if cmd.version >= codes.VERSION_V3_4_9 and field(cmd, "maxReconsumeTimes"):
            max_times = int_field(cmd, "maxReconsumeTimes")
        msg = retry_copy(view, offset_msg_ids(self.messages.store_host, [offset]))
        if view.reconsume_times >= max_times or delay_level < 0:
            d = self.door.ensure_topic(dlq_topic(group), 1)
            d.addCallback(lambda t: self.broker.publish(t.name, [msg], 0))
        else:
            level = delay_level if delay_level > 0 else 3 + view.reconsume_times
            d = self.door.ensure_topic(retry_topic(group), 1)
            msg.properties = with_real_queue(msg.properties, retry_topic(group), 0)
            d.addCallback(lambda t: self.broker.delay(t.name, self.door.delay_ms(level), [msg]))
        return d.addCallbacks(lambda _: ok(cmd), broker_error, errbackArgs=(cmd, group))

    # -- queries -------------------------------------------------------------------

    def view_message(self, cmd):
        offset = int_field(cmd, "offset")
        data = self.door.raw_record_at(offset)
        if data is None:
            return error(cmd, codes.SYSTEM_ERROR, f"can not find message by the offset, {offset}")
        return ok(cmd, body=data)

    def query_message(self, cmd):
        topic = field(cmd, "topic", "")
        key = field(cmd, "key", "")
        max_num = int_field(cmd, "maxNum", 32)
        begin = int_field(cmd, "beginTimestamp", 0)
        end = int_field(cmd, "endTimestamp", 2**63 - 1)
        body, last_ts, last_off = self.door.query_by_key(topic, key, max_num, begin, end)
        if not body:
            return error(cmd, codes.QUERY_NOT_FOUND, "can not find message, maybe time range not correct")
        return ok(cmd, {"indexLastUpdateTimestamp": last_ts, "indexLastUpdatePhyoffset": last_off}, body=body)

    # -- clients -------------------------------------------------------------------

    def heartbeat(self, cmd):
        # what mqadmin's consumerConnection/producerConnection show of this client
        self.client_language, self.client_version = cmd.language, cmd.version
        try:
            data = loads_object(cmd.body) if cmd.body else {}
            check_heartbeat(data)
        except ValueError as e:
            return error(cmd, codes.SYSTEM_ERROR, f"bad heartbeat body: {e}")
        return self.door.heartbeat(self, data).addCallback(lambda _: ok(cmd))

    def unregister_client(self, cmd):
        self.door.unregister_client(
            field(cmd, "clientID", ""), field(cmd, "producerGroup", ""), field(cmd, "consumerGroup", ""))
        return ok(cmd)

    def consumer_list(self, cmd):
        group = field(cmd, "consumerGroup", "")
        ids = self.door.consumers.client_ids(group)
        if not ids:
            return error(cmd, codes.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return ok(cmd, body=json_body({"consumerIdList": ids}))

    # -- offsets -------------------------------------------------------------------

    def _queue(self, cmd):
        return self.messages.find_queue(field(cmd, "topic", ""), int_field(cmd, "queueId"))

    def query_offset(self, cmd):
        topic, group, qid = field(cmd, "topic", ""), field(cmd, "consumerGroup", ""), int_field(cmd, "queueId")
        off = self.broker.offsets.query(topic, group, qid)
        if off is not None:
            return ok(cmd, {"offset": off})
        q = self.messages.find_queue(topic, qid)
        if q is None or q.min_offset <= 0:
            # a young queue: a new group starts at its beginning (RocketMQ 4.9's rule)
            return ok(cmd, {"offset": 0})
        return error(cmd, codes.QUERY_NOT_FOUND, "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")

    def update_offset(self, cmd):
        off = int_field(cmd, "commitOffset")
        if off >= 0:
            self.broker.offsets.commit(field(cmd, "topic", ""), field(cmd, "consumerGroup", ""),
                                       int_field(cmd, "queueId"), off)
        return ok(cmd)

    def max_offset(self, cmd):
        q = self._queue(cmd)
        return ok(cmd, {"offset": q.max_offset if q else 0})

    def min_offset(self, cmd):
        q = self._queue(cmd)
        return ok(cmd, {"offset": q.min_offset if q else 0})

    def _store_ts(self, q, i):
        return self.messages.store_ts_at(q.entry(i)[0])

    def search_offset(self, cmd):
        q = self._queue(cmd)
        ts = int_field(cmd, "timestamp")
        if q is None or q.max_offset <= q.min_offset:
            return ok(cmd, {"offset": q.max_offset if q else 0})
        lo, hi = max(q.min_offset, self._first_live(q)), q.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            if self._store_ts(q, mid) < ts:
                lo = mid + 1
            else:
                hi = mid
        return ok(cmd, {"offset": lo})

    def _first_live(self, q):
        lo = q.min_offset
        while lo < q.max_offset and q.entry(lo)[0] < self.messages.min_offset:
            lo += 1
        return lo

    def earliest_time(self, cmd):
        q = self._queue(cmd)
        if q is None or q.max_offset <= q.min_offset:
            return ok(cmd, {"timestamp": 0})
        first = self._first_live(q)
        if first >= q.max_offset:
            return ok(cmd, {"timestamp": 0})
        return ok(cmd, {"timestamp": self._store_ts(q, first)})

    # -- orderly consumers ---------------------------------------------------------

    def _lock_body(self, cmd):
        try:
            data = loads_object(cmd.body)
            check_lock_body(data)
        except ValueError as e:
            raise BadRequest(codes.SYSTEM_ERROR, f"bad lock body: {e}") from None
        mqs = [mq for mq in data.get("mqSet") or [] if mq.get("brokerName") in (None, self.door.broker_name)]
        return data.get("consumerGroup", ""), data.get("clientId", ""), mqs

    def lock(self, cmd):
        group, client, mqs = self._lock_body(cmd)
        granted = set(self.door.consumers.lock(group, client, [(m["topic"], int(m["queueId"])) for m in mqs]))
        ok_set = [m for m in mqs if (m["topic"], int(m["queueId"])) in granted]
        return ok(cmd, body=json_body({"lockOKMQSet": ok_set}))

    def unlock(self, cmd):
        group, client, mqs = self._lock_body(cmd)
        self.door.consumers.unlock(group, client, [(m["topic"], int(m["queueId"])) for m in mqs])
        return ok(cmd)
