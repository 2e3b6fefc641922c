"""Bounded waits on something a test can observe (a reply, a stats figure, a log line,
a file), shared by every integration test.

Tests wait for the condition they depend on, never for a fixed time standing for "by
now it has happened": under load a fixed time is too short, and otherwise too long.
"""

import time


def wait_until(predicate, timeout, what="condition", interval=0.02):
    """Poll C{predicate} until it returns something true and return that.

    @param timeout: seconds to keep trying before failing.
    @param what: what is waited for, named in the failure message.
    @raise AssertionError: after C{timeout} s, naming C{what}.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"gave up after {timeout}s waiting for {what}")
        time.sleep(interval)


def deferred_wait(predicate, timeout=10.0, what="condition", interval=0.02):
    """L{wait_until} for tests running on the reactor (pytest-twisted): return a Deferred
    that fires once C{predicate()} is true, polling without blocking the reactor, or
    fails with AssertionError after C{timeout} s, naming C{what}."""
    from twisted.internet import defer, reactor, task

    @defer.inlineCallbacks
    def loop():
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() >= deadline:
                raise AssertionError(f"gave up after {timeout}s waiting for {what}")
            yield task.deferLater(reactor, interval, lambda: None)

    return loop()
