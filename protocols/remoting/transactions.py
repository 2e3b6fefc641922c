"""RocketMQ 4.x transactional messages, as the 4.9 broker keeps them.

A SEND with ``TRAN_MSG=true`` stores a *half message*: the message with ``REAL_TOPIC``
and ``REAL_QID`` added, transaction bits cleared, on ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0,
where no consumer of the real topic sees it. END_TRANSACTION (37) commits it (a copy goes
to the real topic and queue with the COMMIT bits) or rolls it back; either way an *op
record* (tag ``d``, body = the half's queue offset) goes to
``RMQ_SYS_TRANS_OP_HALF_TOPIC``. A half with no decision after
``rocketmq.transactionTimeoutMs`` is checked back: a renewed copy with
``TRANSACTION_CHECK_TIMES`` + 1 goes to the half topic and CHECK_TRANSACTION_STATE (39)
names that copy to one producer connection of the half's group. After
``rocketmq.transactionCheckMax`` checks the half is moved to
``TRANS_CHECK_MAX_TIME_TOPIC`` with a log line.

Everything is in the log, so the pending halves are derived from it: a store dispatch
listener sees each half, copy, op and discard record as it is written, replicated or
replayed, and the checkpoint keeps the pending table. Copies name their first half in
``TRAN_PREPARED_QUEUE_OFFSET`` (4.9's own property), so a decision about any copy ends
the whole transaction: a message is committed at most once.
"""

import random

from twisted.internet import defer
from twisted.logger import Logger

from mqserver import message as fmt
from mqserver.message import Message

from protocols.remoting import codes
from protocols.remoting.sending import offset_msg_ids
from protocols.remoting.server import bool_field, error, field, int_field, ok

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_MAX_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
_TX_TOPICS = frozenset((HALF_TOPIC, OP_TOPIC, CHECK_MAX_TOPIC))
REMOVE_TAG = b"d"

P_TRAN_MSG = b"TRAN_MSG"
P_PGROUP = b"PGROUP"
P_REAL_TOPIC = b"REAL_TOPIC"
P_REAL_QID = b"REAL_QID"
P_CHECK_TIMES = b"TRANSACTION_CHECK_TIMES"
P_ROOT = b"TRAN_PREPARED_QUEUE_OFFSET"
P_IMMUNITY = b"CHECK_IMMUNITY_TIME_IN_SECONDS"
_TX_BITS = codes.MSG_TRANSACTION_ROLLBACK_TYPE  # 0xC: both transaction bits
_HOST_V6 = codes.MSG_BORNHOST_V6_FLAG | codes.MSG_STOREHOST_V6_FLAG
STATE_NAME = "rocketmq.transactions"


def is_prepared(msg):
    """Return True when C{msg} (a send's L{Message}) is a transaction's half message:
    ``TRAN_MSG`` is true, unless it is a pre-4.6.1 client's retry (reconsumed and
    delayed), as the 4.9 broker decides."""
    props = msg.properties
    if P_TRAN_MSG not in props:
        return False
    pairs = dict(fmt.decode_properties(props))
    if pairs.get(P_TRAN_MSG, b"").lower() != b"true":
        return False
    return not (msg.reconsume_times > 0 and (pairs.get(b"DELAY") or b"0") not in (b"0", b""))


def _replace(pairs, name, value):
    return [(k, v) for k, v in pairs if k != name] + [(name, value)]


class PendingHalf:
    """A half message without a decision yet.

    @ivar root: queue offset of the first half (the transaction's key).
    @ivar qoffset: queue offset of its newest copy; C{log_offset} its commit-log offset.
    @ivar store_ts: when that copy was stored; C{wait_ms} how long it waits for a check.
    @ivar checks: how many times it was checked back.
    """

    __slots__ = ("root", "qoffset", "log_offset", "store_ts", "wait_ms", "checks")

    def __init__(self, root, qoffset, log_offset, store_ts, wait_ms, checks):
        self.root, self.qoffset, self.log_offset = root, qoffset, log_offset
        self.store_ts, self.wait_ms, self.checks = store_ts, wait_ms, checks

    def row(self):
        return [self.root, self.qoffset, self.log_offset, self.store_ts, self.wait_ms, self.checks]


class Transactions:
    """The broker door's transactions: half messages, END_TRANSACTION and the check loop.

    @ivar pending: root queue offset -> L{PendingHalf}.
    @ivar alias: queue offset of every copy of a pending half -> its root.
    """

    log = Logger()

    def __init__(self, door, config):
        self.door = door
        self.broker = door.broker
        self.messages = door.broker.messages
        self.timeout_ms = config["rocketmq.transactionTimeoutMs"]
        self.check_max = config["rocketmq.transactionCheckMax"]
        self.check_interval = config["rocketmq.transactionCheckIntervalMs"] / 1000.0
        self.pending = {}
        self.alias = {}
        # only its three topics' records (with properties or not: as it always did)
        self.messages.add_dispatch_listener(self._dispatch, topics=_TX_TOPICS)
        self.broker.register_state(STATE_NAME, self)

    # -- state (derived from the log, kept in the checkpoint) ------------------------

    def snapshot_state(self):
        return [h.row() for h in self.pending.values()]

    def restore_state(self, data):
        self.pending, self.alias = {}, {}
        for row in data or []:
            self._track(PendingHalf(*row))

    def _track(self, h):
        self.pending[h.root] = h
        self.alias[h.root] = h.root
        self.alias[h.qoffset] = h.root

    def _resolve(self, root):
        h = self.pending.pop(root, None)
        if h is not None:
            for q in [q for q, r in self.alias.items() if r == root]:
                del self.alias[q]
            self.broker.state_changed()

    def _dispatch(self, offset, topic, properties, store_ts):
        # Called for every message record of _TX_TOPICS written, replicated or replayed.
        view = self._read(offset, self.messages.end)
        if view is None:
            return
        props = dict(fmt.decode_properties(view.properties))
        if topic == HALF_TOPIC:
            root = _int(props.get(P_ROOT), view.queue_offset)
            checks = _int(props.get(P_CHECK_TIMES), 0)
            wait = self.timeout_ms
            if checks == 0 and props.get(P_IMMUNITY):
                wait = max(wait, _int(props[P_IMMUNITY], 0) * 1000)
            self._track(PendingHalf(root, view.queue_offset, offset, view.store_ts, wait, checks))
        elif topic == OP_TOPIC:
            if props.get(b"TAGS") == REMOVE_TAG:
                q = _int(bytes(view.body), -1)
                self._resolve(self.alias.get(q, q))
        else:
            root = props.get(P_ROOT)
            if root is not None:
                self._resolve(_int(root, -1))

    def _read(self, offset, end):
        """Return the message record at commit-log C{offset} below C{end}, or None."""
        data = self.messages.message_at(offset, end)
        return None if data is None else fmt.RecordView(data)

    # -- SEND with TRAN_MSG ----------------------------------------------------------

    def prepare(self, topic, qid, msg):
        """Store C{msg}, sent to (C{topic}, C{qid}), as a half message. Returns a Deferred
        firing with the L{PutResult} of the half record."""
        pairs = fmt.decode_properties(msg.properties)
        pairs = _replace(_replace(pairs, P_REAL_TOPIC, topic.encode("utf-8")), P_REAL_QID, str(qid).encode())
        half = Message(msg.body, fmt.encode_properties(pairs), msg.flag, msg.sys_flag & ~_TX_BITS,
                       msg.reconsume_times, msg.born_ts, msg.born_host)
        # the op topic too, so that a decision's two writes go out in one reactor turn
        d = self.door.ensure_topic(OP_TOPIC, 1)
        d.addCallback(lambda _: self.door.ensure_topic(HALF_TOPIC, 1))
        return d.addCallback(lambda _: self.broker.publish(HALF_TOPIC, [half], 0))

    # -- END_TRANSACTION -------------------------------------------------------------

    def end(self, protocol, cmd):
        """Answer END_TRANSACTION (37): commit or roll back a half message."""
        if not self.broker.is_master:
            return error(cmd, codes.SLAVE_NOT_AVAILABLE, None)
        kind = int_field(cmd, "commitOrRollback", 0)
        from_check = bool_field(cmd, "fromTransactionCheck")
        if kind not in (codes.MSG_TRANSACTION_COMMIT_TYPE, codes.MSG_TRANSACTION_ROLLBACK_TYPE):
            self.log.info("producer {peer} ended transaction {id} with state {kind} (pending){check}",
                          peer=protocol.peer_str(), id=field(cmd, "msgId", ""), kind=kind,
                          check=" after a check" if from_check else "")
            return None
        view = self.door.record_at(int_field(cmd, "commitLogOffset"))
        if view is None or view.topic != HALF_TOPIC:
            return error(cmd, codes.SYSTEM_ERROR, "Find prepared transaction message failed")
        props = dict(fmt.decode_properties(view.properties))
        if props.get(P_PGROUP, b"").decode("utf-8", "replace") != field(cmd, "producerGroup", ""):
            return error(cmd, codes.SYSTEM_ERROR, "The producer group wrong")
        if view.queue_offset != int_field(cmd, "tranStateTableOffset"):
            return error(cmd, codes.SYSTEM_ERROR, "The transaction state table offset wrong")
        root = self.alias.get(view.queue_offset)
        if root is None or root not in self.pending:
            return error(cmd, codes.SYSTEM_ERROR, "The transaction has already been committed or rolled back")
        if kind == codes.MSG_TRANSACTION_ROLLBACK_TYPE:
            self.log.info("transaction {id} of {group} rolled back{check}", id=field(cmd, "msgId", ""),
                          group=field(cmd, "producerGroup", ""), check=" after a check" if from_check else "")
            self._resolve(root)
            return self._op(view.queue_offset).addCallback(lambda _: ok(cmd))
        return self._commit(cmd, view, props, root)

    def _commit(self, cmd, view, props, root):
        real = props.get(P_REAL_TOPIC, b"").decode("utf-8", "replace")
        qid = _int(props.get(P_REAL_QID), -1)
        t = self.broker.topic(real)
        if t is None or not 0 <= qid < t.queues:
            return error(cmd, codes.SYSTEM_ERROR, f"the real topic {real} queue {qid} of the half message is gone")
        pairs = [(k, v) for k, v in fmt.decode_properties(view.properties) if k != P_ROOT]
        # 4.9 stores the committed message with the half's property string (REAL_TOPIC,
        # REAL_QID, TRAN_MSG and PGROUP included) and the COMMIT transaction bits.
        msg = Message(bytes(view.body), fmt.encode_properties(pairs), view.flag,
                      (view.sys_flag & ~(_TX_BITS | _HOST_V6)) | codes.MSG_TRANSACTION_COMMIT_TYPE,
                      view.reconsume_times, view.born_ts, bytes(view.born_host))
        self._resolve(root)
        # Both appends happen in this reactor turn: nothing can come between them.
        d1 = self.broker.publish(real, [msg], qid)
        d2 = self._op(view.queue_offset)
        d = defer.gatherResults([d1, d2], consumeErrors=True)
        d.addErrback(lambda f: f.value.subFailure if isinstance(f.value, defer.FirstError) else f)
        return d.addCallback(lambda _: ok(cmd))

    def _op(self, half_qoffset):
        op = Message(str(half_qoffset).encode(), fmt.encode_properties([(b"TAGS", REMOVE_TAG), (b"WAIT", b"false")]))
        return self._put(OP_TOPIC, op)

    def _put(self, topic, msg):
        if self.broker.topic(topic) is not None:
            return self.broker.publish(topic, [msg], 0)
        return self.door.ensure_topic(topic, 1).addCallback(lambda _: self.broker.publish(topic, [msg], 0))

    # -- the check loop --------------------------------------------------------------

    def check(self):
        """Check back every half message whose wait is over (the door's timer)."""
        if not self.broker.is_master or not self.pending:
            return
        now = self.broker.now_ms()
        for root in sorted(self.pending):
            h = self.pending.get(root)
            if h is None or now - h.store_ts < h.wait_ms:
                continue
            view = self.door.record_at(h.log_offset)
            if view is None or view.topic != HALF_TOPIC:
                self.log.warn("half message at {offset} is gone from the log: transaction dropped",
                              offset=h.log_offset)
                self._resolve(root)
                continue
            if h.checks >= self.check_max:
                self._discard(h, view)
            else:
                self._check_one(h, view)

    def _discard(self, h, view):
        pairs = _replace(fmt.decode_properties(view.properties), P_ROOT, str(h.root).encode())
        self.log.error(
            "half message {uniq} of {group} (queue offset {q}) has been checked {n} times, so discard it"
            " by moving it to system topic " + CHECK_MAX_TOPIC,
            uniq=_prop(pairs, b"UNIQ_KEY"), group=_prop(pairs, P_PGROUP), q=h.qoffset, n=h.checks)
        self._resolve(h.root)
        msg = Message(bytes(view.body), fmt.encode_properties(pairs), view.flag, view.sys_flag & ~_HOST_V6,
                      view.reconsume_times, view.born_ts, bytes(view.born_host))
        self._put(CHECK_MAX_TOPIC, msg).addErrback(lambda f: self.log.failure("discarding a half message failed", f))

    def _check_one(self, h, view):
        pairs = fmt.decode_properties(view.properties)
        pairs = _replace(_replace(pairs, P_CHECK_TIMES, str(h.checks + 1).encode()), P_ROOT, str(h.root).encode())
        copy = Message(bytes(view.body), fmt.encode_properties(pairs), view.flag, view.sys_flag & ~_HOST_V6,
                       view.reconsume_times, view.born_ts, bytes(view.born_host))
        # The copy is tracked (and h replaced) as it is appended; until then, do not
        # check this half again.
        h.store_ts = self.broker.now_ms()
        d = self.broker.publish(HALF_TOPIC, [copy], 0)
        d.addCallback(lambda r: self._send_check(r.log_offsets[0]))
        d.addErrback(lambda f: self.log.failure("renewing a half message failed", f))

    def _send_check(self, log_offset):
        data = self.door.raw_record_at(log_offset)
        if data is None:
            return
        view = fmt.RecordView(data)
        props = dict(fmt.decode_properties(view.properties))
        group = props.get(P_PGROUP, b"").decode("utf-8", "replace")
        conns = [c for c in (self.door.consumers.producers.get(group) or {}).values() if not c.closed]
        if not conns:
            self.log.warn("Check transaction failed, channel is null. groupId={group}", group=group)
            return
        uniq = props.get(b"UNIQ_KEY")
        ext = {"tranStateTableOffset": view.queue_offset, "commitLogOffset": log_offset,
               "offsetMsgId": offset_msg_ids(self.messages.store_host, [log_offset])}
        if uniq is not None:
            ext["msgId"] = ext["transactionId"] = uniq.decode("utf-8", "replace")
        body = as_real(data, view, props)
        random.choice(conns).send_oneway(codes.CHECK_TRANSACTION_STATE, ext, body)


def as_real(data, view, props):
    """Return the record C{data} re-encoded with its real topic and queue id, as 4.9
    sends a half message in CHECK_TRANSACTION_STATE's body."""
    topic = props.get(P_REAL_TOPIC, view.topic.encode("utf-8"))
    qid = _int(props.get(P_REAL_QID), view.queue_id)
    body_end = fmt.HEADER_SIZE + len(view.body)
    tail = bytes((len(topic),)) + topic + len(view.properties).to_bytes(2, "big") + view.properties
    out = bytearray(data[:body_end]) + tail
    out[0:4] = len(out).to_bytes(4, "big")
    out[fmt.OFF_QUEUE_ID:fmt.OFF_QUEUE_ID + 4] = qid.to_bytes(4, "big", signed=True)
    return bytes(out)


def _int(value, default):
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _prop(pairs, name):
    for k, v in pairs:
        if k == name:
            return v.decode("utf-8", "replace")
    return ""
