"""Reading a topic's messages for the admin API (peek and tail), as JSON-ready dicts.

Records are read through the broker's L{mqserver.interfaces.IMessageLog} (C{log} below):
the last C{n} of every queue merged by eventId (peek), or the next C{n} after an eventId
(tail)."""

import base64

from mqserver import message as fmt


def message_dict(view):
    """Return one stored message as a dict (the body as text when it is UTF-8)."""
    body = bytes(view.body)
    out = {"event_id": view.event_id, "queue": view.queue_id, "offset": view.queue_offset,
           "store_ts": view.store_ts, "size": len(body)}
    try:
        out["body"] = body.decode("utf-8")
    except UnicodeDecodeError:
        out["body_base64"] = base64.b64encode(body).decode()
    props = [(k.decode("utf-8", "replace"), v.decode("utf-8", "replace"))
             for k, v in fmt.decode_properties(view.properties)] if view.properties else []
    if props:
        out["properties"] = dict(props)
    return out


def _views(log, entries):
    buf, locs = log.read_records(entries)
    return [fmt.RecordView(buf, pos) for pos, _ in locs]


def peek(log, topic, queue_ids, n):
    """Return the last C{n} messages of C{topic}, oldest first."""
    views = []
    for qid in queue_ids:
        q = log.find_queue(topic, qid)
        if q is None:
            continue
        start = max(q.min_offset, q.max_offset - n)
        while start < q.max_offset:
            entries = log.read_entries(topic, qid, start, q.max_offset - start)
            if not entries:
                break
            views += _views(log, entries)
            start += len(entries) // fmt.CQ_ENTRY_SIZE
    views.sort(key=lambda v: v.event_id)
    return [message_dict(v) for v in views[-n:]]


def after(log, topic, queue_ids, event_id, n):
    """Return up to C{n} messages of C{topic} whose eventId is above C{event_id}, in
    eventId order."""
    cursor = log.cursor_at(topic, queue_ids, event_id + 1)
    buf, locs = cursor.read_span(n)
    return [message_dict(fmt.RecordView(buf, pos)) for pos, _ in locs]
