"""Push to a URL: each push subscription is a channel consumer whose deliveries are
POSTed as JSON batches (treq, persistent connections) until the queue is drained, then
as messages arrive.

Up to L{PARALLEL} batches are in flight per subscription (one message for an ordered
queue). A 2xx answer acks the batch; anything else (status, refused connection, timeout)
fails it back to the channel, in order, and delivery pauses for an exponential backoff.
So delivery is at least once, and an ordered queue (one message in flight) keeps its
order.
"""

from twisted.internet import defer
from twisted.logger import Logger

from protocols.msgout.api import Messages

_HEADERS = {b"Content-Type": [b"application/json; charset=utf-8"]}
FIRST_BACKOFF = 0.1
#: Batches a subscription of an unordered queue may have in flight at once.
PARALLEL = 4


def _treq():
    """treq, imported by the first push: it imports C{twisted.web.client}, which imports
    C{twisted.internet.endpoints} and with it the TLS stack (about 13 MB resident) that
    a msgout door without push subscriptions never uses."""
    import treq

    return treq


class PushRunner:
    """Pushes one L{PushSubscription}."""

    log = Logger()

    def __init__(self, manager, sub):
        self.manager = manager
        self.sub = sub
        self.consumer = None
        self._posts = set()
        self._retry = None
        self._failed_in_row = 0
        self.stopped = False

    def start(self):
        q = self.manager.queues
        self.consumer = q.consumer(self.sub.queue, self, self._window(), self.sub.sub_id,
                                   on_closed=self.channel_closed)

    def _window(self):
        return self.sub.batch * PARALLEL

    def __call__(self, consumer, deliveries):
        """The consumer's sink: POST the deliveries in batches."""
        batch = self.sub.batch
        for i in range(0, len(deliveries), batch):
            self._post(deliveries[i:i + batch])

    def _post(self, deliveries):
        s = self.sub
        body = Messages(deliveries, queue=s.queue, sub_id=s.sub_id).json()
        receipts = [d.receipt for d in deliveries if d.receipt]
        m = self.manager
        d = _treq().post(s.url, data=body, headers=_HEADERS, pool=m.connection_pool(),
                         timeout=m.timeout, reactor=m.reactor)
        self._posts.add(d)
        d.addBoth(self._forget, d)
        d.addCallback(self._answered)
        d.addCallbacks(lambda _: self._done(len(deliveries), receipts),
                       lambda f: self._failed(f, receipts))

    def _forget(self, result, d):
        self._posts.discard(d)
        return result

    @staticmethod
    def _answered(resp):
        d = _treq().content(resp)  # read it whole so the connection goes back to the pool
        if 200 <= resp.code < 300:
            return d
        return d.addCallback(lambda _: defer.fail(RuntimeError(f"HTTP {resp.code}")))

    def _done(self, n, receipts):
        if self.stopped:
            return
        self.manager.queues.ack(receipts)  # frees window slots: the channel pumps more
        self.sub.delivered += n
        if self._retry is None:
            self._failed_in_row = 0

    def _failed(self, f, receipts):
        if self.stopped or f.check(defer.CancelledError):
            return
        s = self.sub
        s.failures += 1
        s.last_error = f.getErrorMessage() or f.type.__name__
        s.last_error_ms = self.manager.queues.broker.now_ms()
        self.consumer.window = 0  # nothing more until the backoff ends
        self.manager.queues.nack(receipts)
        if self._retry is None:
            wait = min(self.manager.max_backoff, FIRST_BACKOFF * (2 ** self._failed_in_row))
            self._failed_in_row += 1
            self._retry = self.manager.reactor.callLater(wait, self._resume)

    def _resume(self):
        self._retry = None
        c = self.consumer
        if c is not None and not self.stopped:
            c.window = self._window()
            c.channel.schedule_pump()

    def channel_closed(self, consumer):
        """The queue (or the subscription's channel) is gone."""
        self.stop()
        self.manager.queues.subscriptions.pop((self.sub.queue, self.sub.sub_id), None)

    def stop(self):
        self.stopped = True
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None
        if self.consumer is not None:
            self.consumer.close(fail_back=True)
        for d in list(self._posts):
            d.cancel()
        self.sub.runner = None


class PushManager:
    """Runs every push subscription of a L{QueueService} while the msgout door is up.

    @ivar pool: the treq connection pool (persistent connections), made by the first
        push (L{connection_pool}), or C{None}.
    """

    log = Logger()

    def __init__(self, queues, reactor, timeout=10.0, max_backoff=30.0):
        self.queues = queues
        self.reactor = reactor
        self.timeout = timeout
        self.max_backoff = max_backoff
        self.pool = None

    def start(self):
        """Start the stored subscriptions and every one made from now on."""
        self.queues.push_runner = self.run
        for s in list(self.queues.subscriptions.values()):
            self.run(s)

    def connection_pool(self):
        """The pool the pushes share, made at the first call (see L{_treq})."""
        if self.pool is None:
            from twisted.web.client import HTTPConnectionPool

            self.pool = HTTPConnectionPool(self.reactor, persistent=True)
            self.pool.maxPersistentPerHost = 4
            self.pool.retryAutomatically = False
        return self.pool

    def run(self, sub):
        """Start pushing C{sub}."""
        if sub.runner is not None:
            return
        if self.queues.broker.topic(sub.queue) is None:
            self.queues.subscriptions.pop((sub.queue, sub.sub_id), None)
            return
        r = PushRunner(self, sub)
        sub.runner = r
        try:
            r.start()
        except Exception:
            sub.runner = None
            self.log.failure("push subscription {q}/{s} did not start", q=sub.queue,
                             s=sub.sub_id)

    def stop(self):
        """Stop every runner (what they hold goes back) and close the pool."""
        if self.queues.push_runner == self.run:
            self.queues.push_runner = None
        for s in list(self.queues.subscriptions.values()):
            if s.runner is not None:
                s.runner.stop()
        if self.pool is not None:
            pool, self.pool = self.pool, None  # a restart makes a new one, as before
            return pool.closeCachedConnections()


def push_manager(broker, config, reactor):
    """The L{PushManager} of C{broker}'s msgout door, as C{config} sets it."""
    return PushManager(broker.queues, reactor,
                       timeout=config["msgout.pushTimeoutMs"] / 1000.0,
                       max_backoff=config["msgout.pushMaxBackoffMs"] / 1000.0)
