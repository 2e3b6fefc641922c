"""Answers written in request order by a connection whose requests finish out of order.

smss and nsqd answer every request in the order it came, yet a publish answers only
when its write is durable: each connection keeps a queue of answers, bytes that are
ready and L{PendingAnswer}s for the ones a Deferred will give. The Deferred's callback
fills its place (L{PendingAnswer.settle}) and the connection writes what is ready from
the head of the queue: public Deferred API, without reading the Deferred's result.
"""


class PendingAnswer:
    """The place of a Deferred's answer in a connection's queue of answers.

    @ivar deferred: the Deferred that gives the answer.
    @ivar ready: whether it has fired (L{settle} was called).
    @ivar value: what it fired with, once ready.
    """

    __slots__ = ("deferred", "ready", "value")

    def __init__(self, deferred):
        self.deferred = deferred
        self.ready = False
        self.value = None

    def settle(self, value):
        """Record C{value} as the answer; return it (a callback passes it on)."""
        self.ready = True
        self.value = value
        return value
