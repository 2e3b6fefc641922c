"""Every consumer position the broker keeps on disk, as rows of one schema (driver side).

Where the broker keeps them:

- C{consumerOffset.json}: RocketMQ groups, C{{"offsetTable": {"topic@group": {"0": 12}}}},
  the next queue offset the group consumes.
- the checkpoint's C{state.channels.channels}: every durable channel (NSQ channels,
  msgout's shared queue channel C{msgout:queue} and its topic-mode subscriptions
  C{msgout:sub:<sub_id>}), each with a C{floor} per queue (the lowest offset not yet
  finished) and C{done} ranges above it (offsets finished out of order).
- the checkpoint's C{state.ext.msgout.subscriptions}: msgout push subscriptions (queue,
  sub_id, URL); a push subscription consumes through the queue's shared channel (queue
  mode) or its C{sub_id}'s (topic mode).

smss subscribers name their start eventId in each SUB; the broker keeps no position of
theirs on disk, so there is none to read.

Each row: C{kind, source, topic, consumer, queue_id, committed, finished_ahead,
delivered_unfinished, push_url}, where C{committed} is the offset below which everything
is finished, C{finished_ahead} the offsets finished above it, and
C{delivered_unfinished} the unfinished offsets below the highest finished one: messages
handed out and neither finished nor given up when the checkpoint was written (in flight,
deferred or requeued; the broker delivers them again after a restart). The job adds each
queue's length and the lag (L{spark.audit.checks.consumer_lag}).

test-case-name: tests.spark.test_consumer_lag
"""

#: The schema of the rows (a Spark DDL string).
POSITIONS_DDL = (
    "kind string, source string, topic string, consumer string, queue_id int, committed bigint,"
    " finished_ahead bigint, delivered_unfinished bigint, push_url string"
)

ROCKETMQ = "rocketmq group"
NSQ = "nsq channel"
MSGOUT_QUEUE = "msgout queue"
MSGOUT_SUB = "msgout subscription"

OFFSETS_SOURCE = "consumerOffset.json"
CHANNELS_SOURCE = "metadata.json state.channels"
PUSH_SOURCE = "metadata.json state.ext.msgout"

#: msgout's channel names (L{mqserver.broker.queues}): the shared channel of a
#: queue-mode queue, and the prefix of a topic-mode subscription's.
QUEUE_CHANNEL = "msgout:queue"
SUB_PREFIX = "msgout:sub:"


def rocketmq_rows(table):
    """Rows of RocketMQ's C{offsetTable} (C{{"topic@group": {"qid": offset}}})."""
    rows = []
    for key, queues in (table or {}).items():
        topic, _, group = str(key).rpartition("@")
        if not topic or not isinstance(queues, dict):
            continue
        for qid, off in queues.items():
            try:
                rows.append((ROCKETMQ, OFFSETS_SOURCE, topic, group, int(qid), int(off), 0, 0, None))
            except (TypeError, ValueError):
                continue
    return rows


def channel_kind(name):
    """Return C{(kind, consumer)} of a channel named C{name}."""
    if name == QUEUE_CHANNEL:
        return MSGOUT_QUEUE, "(queue)"
    if name.startswith(SUB_PREFIX):
        return MSGOUT_SUB, name[len(SUB_PREFIX):]
    return NSQ, name


def _done_counts(ranges, floor):
    """Return C{(finished above floor, unfinished below the highest finished)} of the
    C{[start, end)} ranges of a channel's done set."""
    done, top = 0, floor
    for r in ranges or ():
        start, end = max(int(r[0]), floor), int(r[1])
        if end > start:
            done += end - start
            top = max(top, end)
    return done, top - floor - done


def channel_rows(channels, push):
    """Rows of the checkpoint's durable channels (C{state.channels.channels}); C{push}:
    C{{(topic, channel name): url}} of the push subscriptions consuming through them."""
    rows, seen = [], set()
    for ch in channels or ():
        try:
            topic, name = ch["topic"], ch["name"]
            floors = {int(q): int(f) for q, f in (ch.get("floor") or {}).items()}
            done = {int(q): r for q, r in (ch.get("done") or {}).items()}
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
        kind, consumer = channel_kind(name)
        url = push.get((topic, name))
        seen.add((topic, name))
        for qid, floor in sorted(floors.items()):
            ahead, unfinished = _done_counts(done.get(qid), floor)
            rows.append((kind, CHANNELS_SOURCE, topic, consumer, qid, floor, ahead, unfinished, url))
    # A push subscription whose channel the checkpoint does not hold yet: listed, from
    # the queue's start.
    for (topic, name), url in sorted(push.items()):
        if (topic, name) not in seen:
            kind, consumer = channel_kind(name)
            rows.append((kind, PUSH_SOURCE, topic, consumer, 0, 0, 0, 0, url))
    return rows


def push_channels(subscriptions, topics):
    """Return C{{(topic, channel name): url}} of msgout's push C{subscriptions}; C{topics}
    (the checkpoint's C{state.topics}) tell a queue-mode queue (the shared channel) from a
    topic-mode one (the C{sub_id}'s channel)."""
    mode = {}
    for t in topics or ():
        attrs = t.get("attrs") if isinstance(t, dict) else None
        own = attrs.get("msgout") if isinstance(attrs, dict) else None
        mode[t.get("name") if isinstance(t, dict) else None] = (own or {}).get("mode", "queue")
    out = {}
    for s in subscriptions or ():
        try:
            queue, sub_id, url = s["queue"], s["sub_id"], s.get("url")
        except (KeyError, TypeError):
            continue
        name = SUB_PREFIX + str(sub_id) if mode.get(queue, "queue") == "topic" else QUEUE_CHANNEL
        out[(queue, name)] = url
    return out


def position_rows(offset_table, meta):
    """Every consumer position of a directory: RocketMQ's C{offset_table} (the parsed
    C{consumerOffset.json}'s C{offsetTable}) and the checkpoint C{meta}'s channels and
    push subscriptions, as L{POSITIONS_DDL} tuples."""
    state = (meta or {}).get("state") or {}
    chans = state.get("channels") or {}
    subs = ((state.get("ext") or {}).get("msgout") or {}).get("subscriptions")
    push = push_channels(subs, state.get("topics"))
    return rocketmq_rows(offset_table) + channel_rows(chans.get("channels"), push)
