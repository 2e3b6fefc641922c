"""Helpers for smss integration tests: connections, bounded waits, reading topics back.

Every wait here has a deadline; nothing sleeps to prove that something is fast.
"""

import itertools
import time

from protocols.smss.client import SmssClient
from protocols.smss.messages import AliveResponse, Batch, SubEnd
from tests.support.wait import wait_until  # noqa: F401 (re-exported: tests import it from here)

HOST = "127.0.0.1"

#: The server's CREATE error for bad names.
NAME_RULE = "topic name MUST be less than 128 char and NOT contains space/enter/tab"

_who_counter = itertools.count(1)


def connect(server, timeout=10.0):
    """Return a new SmssClient connected to C{server} (a ServerProcess)."""
    return SmssClient(getattr(server, "host", HOST), server.smss_port, timeout=timeout)


def unique_who(prefix="reader"):
    """Return a subscriber group name no other subscription in this run uses."""
    return f"{prefix}-{next(_who_counter)}".encode()


def now_ms():
    """Return the wall clock in ms (the server uses the same clock)."""
    return int(time.time() * 1000)


def next_data(sub, timeout):
    """Return the next Batch or SubEnd of C{sub}, skipping ALIVEs; TimeoutError after
    C{timeout} s."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no batch or SUBEND in time")
        event = sub.next_batch(remaining)
        if not isinstance(event, AliveResponse):
            return event


def read_topic(server, topic, after=0, count=None, until_alive=False, timeout=10.0,
               settle=0.2, batch=255, who=None):
    """Subscribe to C{topic} after eventId C{after} on a fresh connection and return
    the messages (PushedMessage) read, acking every batch.

    Stops when C{count} messages are in (then checks that nothing more arrives within
    C{settle} s), or, with C{until_alive}, at the first ALIVE (the server sends one only
    when the subscription has caught up; the server needs a short
    C{timeout.server.alive}), or otherwise after C{settle} s without a batch (or at an
    ALIVE, whichever comes first).
    Fails if C{timeout} s pass first. The server is asked to wait as long for each ack
    (not its default 3 s): a reader paused by a busy machine is not a lost message, and a
    batch that never arrives still fails the read at C{timeout}.
    """
    msgs = []
    deadline = time.monotonic() + timeout
    with connect(server) as c:
        sub = c.subscribe(topic, after, batch=batch, who=who or unique_who(),
                          ack_timeout_ms=timeout * 1000)
        while True:
            if count is not None and len(msgs) >= count:
                try:
                    extra = next_data(sub, settle)
                except TimeoutError:
                    return msgs
                raise AssertionError(f"more than {count} messages in {topic!r}: {extra!r}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(
                    f"gave up reading {topic!r} after {timeout}s with {len(msgs)} messages"
                )
            wait = remaining if (count is not None or until_alive) else min(settle, remaining)
            try:
                event = sub.next_batch(wait)
            except TimeoutError:
                if count is None and not until_alive:
                    return msgs
                raise
            if isinstance(event, AliveResponse):
                if count is None:
                    return msgs  # the server only sends ALIVE when there is nothing to send
                continue
            if isinstance(event, SubEnd):
                raise AssertionError(f"unexpected SUBEND while reading {topic!r}")
            assert isinstance(event, Batch)
            msgs.extend(event.messages)
            sub.ack()


def as_tuples(msgs):
    """Return (eventId, headers, body) of each PushedMessage."""
    return [(m.event_id, m.headers, m.body) for m in msgs]


def topic_event_id(client, topic):
    """Return the createEventId of C{topic} (TOPIC INFO)."""
    return client.topic_info(topic)["createEventId"]
