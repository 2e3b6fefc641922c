"""nsqd's /stats in JSON and text, built from the core statistics
(L{mqserver.broker.stats}), the broker's channels and NSQ clients."""

import time

from mqserver.broker.stats import payload_bytes
from mqserver.replication.status import replication_status

from protocols.nsq.version import VERSION

_E2E = {"count": 0, "percentiles": None}
_MEMORY = {"heap_objects": 0, "heap_idle_bytes": 0, "heap_in_use_bytes": 0,
           "heap_released_bytes": 0, "gc_pause_usec_100": 0, "gc_pause_usec_99": 0,
           "gc_pause_usec_95": 0, "next_gc_bytes": 0, "gc_total_runs": 0}


def client_stats(c):
    """ClientStats of one V2 connection."""
    s = c.settings
    host = c.remote_address.rsplit(":", 1)[0]
    out = {
        "client_id": s.client_id or host, "hostname": s.hostname or host, "version": "V2",
        "remote_address": c.remote_address, "state": c.state, "ready_count": c.rdy,
        "in_flight_count": c.in_flight, "message_count": c.message_count,
        "finish_count": c.finish_count, "requeue_count": c.requeue_count,
        "connect_ts": c.connect_ts, "sample_rate": c.sample_rate, "deflate": c.deflate,
        "snappy": c.snappy, "user_agent": s.user_agent, "tls": False, "tls_cipher_suite": "",
        "tls_version": "", "tls_negotiated_protocol": "",
        "tls_negotiated_protocol_is_mutual": False,
    }
    if c.pub_counts and c.channel is None:
        out["message_count"] = sum(c.pub_counts.values())  # a producer counts what it published
    if c.pub_counts:
        out["pub_counts"] = [{"topic": t, "count": n} for t, n in sorted(c.pub_counts.items())]
    return out


def topic_stats(node, name, channel=None, include_clients=True):
    """TopicStats of C{name}."""
    chans = node.broker.channels
    consumers = {}
    for c in node.clients:
        if c.channel is not None:
            consumers.setdefault(id(c.channel), []).append(c)
    channels = []
    for cname, ch in sorted(chans.of(name).items()):
        if channel is not None and cname != channel:
            continue
        cl = consumers.get(id(ch), [])
        channels.append({
            "channel_name": cname, "depth": ch.depth(), "backend_depth": 0,
            "in_flight_count": len(ch.in_flight), "deferred_count": len(ch.deferred),
            "message_count": ch.message_count, "requeue_count": ch.requeue_count,
            "timeout_count": ch.timeout_count, "client_count": len(cl),
            "clients": [client_stats(c) for c in cl] if include_clients else None,
            "paused": ch.paused, "e2e_processing_latency": dict(_E2E),
        })
    depth = 0
    if not chans.of(name):
        t = node.broker.topic(name)
        hold = chans.holds.get(name, {})
        if t is not None:
            for q in range(t.queues):
                qu = node.broker.messages.queue(name, q)
                depth += qu.max_offset - max(hold.get(q, 0), qu.min_offset)
    # messages and bytes published since the start, as nsqd counts them (bodies; a
    # RocketMQ message's properties count too)
    msgs, nbytes = node.broker.stats.topic_in(name)
    return {"topic_name": name, "channels": channels, "depth": depth, "backend_depth": 0,
            "message_count": msgs, "message_bytes": payload_bytes(name, msgs, nbytes),
            "paused": name in chans.paused_topics, "e2e_processing_latency": dict(_E2E)}


def stats_json(node, topic=None, channel=None, include_clients=True, include_mem=True):
    """The /stats?format=json object."""
    names = node.topic_names()
    if topic is not None:
        topics = [topic_stats(node, topic, channel, include_clients)] if topic in names else None
    else:
        topics = [topic_stats(node, n, channel, include_clients) for n in names]
    producers = [client_stats(c) for c in node.clients if c.pub_counts] if include_clients else []
    out = {"version": VERSION, "health": "OK", "start_time": node.start_time, "topics": topics,
           # mqserver's own addition: role, applied eventId and, on a slave, the lag.
           "replication": replication_status(node.broker)}
    if include_mem:
        out["memory"] = dict(_MEMORY)
    out["producers"] = producers or None
    return out


def _ago(ts):
    return f"{max(0, int(time.time()) - ts)}s"


def stats_text(node, topic=None, channel=None, include_clients=True, include_mem=True):
    """The plain-text /stats."""
    data = stats_json(node, topic, channel, include_clients, include_mem)
    start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(node.start_time))
    lines = [f"nsqd v{VERSION} (mqserver)", f"start_time {start}",
             f"uptime {time.time() - node.start_time:.3f}s", "", "Health: OK", ""]
    if include_mem:
        lines += ["Memory:"] + [f"   {k:<25}{v}" for k, v in data["memory"].items()] + [""]
    topics = data["topics"] or []
    if not topics:
        lines.append("Topics: None")
    else:
        lines.append("Topics:")
    for t in topics:
        p = "*P " if t["paused"] else "   "
        lines.append(f"{p}[{t['topic_name']:<15}] depth: {t['depth']:<5} be-depth: 0     "
                     f"msgs: {t['message_count']:<8} e2e%: ")
        for c in t["channels"]:
            p = "*P " if c["paused"] else "   "
            lines.append(
                f"   {p}[{c['channel_name']:<25}] depth: {c['depth']:<5} be-depth: 0     "
                f"inflt: {c['in_flight_count']:<4} def: {c['deferred_count']:<4} "
                f"re-q: {c['requeue_count']:<5} timeout: {c['timeout_count']:<5} "
                f"msgs: {c['message_count']:<8} e2e%: ")
            for cl in c["clients"] or []:
                lines.append(
                    f"        [V2 {cl['hostname']} {cl['user_agent']}] state: {cl['state']} "
                    f"inflt: {cl['in_flight_count']:<4} rdy: {cl['ready_count']:<4} "
                    f"fin: {cl['finish_count']:<8} re-q: {cl['requeue_count']:<8} "
                    f"msgs: {cl['message_count']:<8} connected: {_ago(cl['connect_ts'])}")
    lines.append("")
    producers = data["producers"] or []
    lines.append("Producers:" if producers else "Producers: None")
    for pr in producers:
        counts = " ".join(f"{x['topic']}={x['count']}" for x in pr.get("pub_counts", []))
        lines.append(f"   [V2 {pr['remote_address']:<20}] msgs: {pr['message_count']:<8} "
                     f"topics: {counts} connected: {_ago(pr['connect_ts'])}")
    return ("\n".join(lines) + "\n").encode()
