"""An in-memory etcd with the calls of L{mqserver.cluster.etcd.EtcdClient}, on a clock,
for tests of the replica group's timing on C{MemoryReactorClock}: a lease lapses when the
clock passes its TTL after its last renewal, the keys attached to it go, and watches see
the changes.

tests/integration/test_memory_etcd.py runs the same contract against a real etcd and
this one, so the two cannot drift apart on what the group relies on.

L{set_reachable}(False) cuts every member off, a L{Line} one member: calls fail with
L{EtcdUnavailable} after the client's timeout (as a call to an etcd that does not answer
does) and the watches' deliveries wait, while etcd itself goes on (its leases lapse on
time).
"""

import base64

from twisted.internet import defer, task

from mqserver.cluster.etcd import (
    EtcdError,
    EtcdUnavailable,
    Event,
    KeyValue,
    LeaseNotFound,
    TxnResult,
    prefix_end,
)


class _Watch:
    def __init__(self, etcd, key, end, callback):
        self.etcd = etcd
        self.key, self.end = key, end
        self.callback = callback
        self.connected = True

    def covers(self, key):
        if self.end is None:
            return key == self.key
        return self.key.encode("utf-8") <= key.encode("utf-8") < self.end

    def stop(self):
        self.connected = False
        self.etcd._watches.remove(self)


class MemoryEtcd:
    """See the module docstring. One object serves as every member's client."""

    def __init__(self, clock, timeout=1.0):
        self.clock = clock
        self.timeout = timeout
        self.reachable = True
        self.revision = 1
        self._kv = {}  # key -> KeyValue
        self._leases = {}  # id -> the DelayedCall that drops it
        self._ttl = {}  # id -> TTL in seconds
        self._next_lease = 1000
        self._watches = []
        self._pending = []  # (watch, events, revision) held while unreachable

    # -- plumbing --

    def _answer(self, f, *args):
        if not self.reachable:
            def fail():
                raise EtcdUnavailable("etcd did not answer (in memory)")
            return task.deferLater(self.clock, self.timeout, fail)
        try:
            return defer.succeed(f(*args))
        except EtcdError:
            return defer.fail()

    def _renew(self, lease, ttl):
        timer = self._leases.get(lease)
        if timer is not None and timer.active():
            timer.cancel()
        self._leases[lease] = self.clock.callLater(ttl, self._drop_lease, lease)
        self._ttl[lease] = ttl

    def _drop_lease(self, lease):
        timer = self._leases.pop(lease)
        if timer.active():
            timer.cancel()
        for key in [k for k, kv in self._kv.items() if kv.lease == lease]:
            self._delete_key(key)

    def _notify(self, event):
        for w in list(self._watches):
            if w.covers(event.kv.key):
                if self.reachable:
                    w.callback([event], self.revision)
                else:
                    self._pending.append((w, [event], self.revision))

    def set_reachable(self, reachable):
        """Make etcd reachable or not; deliveries held back go out when it is again."""
        self.reachable = reachable
        if reachable:
            pending, self._pending = self._pending, []
            for w, events, revision in pending:
                if w.connected:
                    w.callback(events, revision)

    def _put_key(self, key, value, lease):
        if lease and lease not in self._leases:
            raise LeaseNotFound("etcdserver: requested lease not found")
        self.revision += 1
        old = self._kv.get(key)
        value = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        kv = KeyValue(key, value, old.create_revision if old else self.revision,
                      self.revision, (old.version if old else 0) + 1, lease)
        self._kv[key] = kv
        self._notify(Event("PUT", kv))

    def _delete_key(self, key):
        if key not in self._kv:
            return 0
        del self._kv[key]
        self.revision += 1
        self._notify(Event("DELETE", KeyValue(key, mod_revision=self.revision)))
        return 1

    def _keys(self, key, prefix):
        if not prefix:
            return [key] if key in self._kv else []
        start, end = key.encode("utf-8"), prefix_end(key)
        return sorted(k for k in self._kv if start <= k.encode("utf-8") < end)

    # -- the client's calls --

    def range(self, key, prefix=False):
        return self._answer(lambda: ([self._kv[k] for k in self._keys(key, prefix)],
                                     self.revision))

    def get(self, key):
        return self._answer(lambda: self._kv.get(key))

    def put(self, key, value, lease=0):
        def put():
            self._put_key(key, value, lease)
            return self.revision
        return self._answer(put)

    def delete(self, key, prefix=False):
        return self._answer(lambda: sum(self._delete_key(k) for k in self._keys(key, prefix)))

    def txn(self, compares, success=(), failure=()):
        def run():
            ok = all(self._holds(c) for c in compares)
            responses = []
            for op in (success if ok else failure):
                responses.append(self._op(op))
            return TxnResult(ok, self.revision, responses)
        return self._answer(run)

    def _holds(self, c):
        key = base64.b64decode(c["key"]).decode("utf-8")
        kv = self._kv.get(key)
        target = {"CREATE": "create_revision", "MOD": "mod_revision", "VERSION": "version",
                  "VALUE": "value", "LEASE": "lease"}[c["target"]]
        have = getattr(kv, target) if kv is not None else (b"" if target == "value" else 0)
        want = (base64.b64decode(c[target]) if target == "value" else int(c[target]))
        return {"EQUAL": have == want, "NOT_EQUAL": have != want,
                "GREATER": have > want, "LESS": have < want}[c["result"]]

    def _op(self, op):
        (kind, body), = op.items()
        key = base64.b64decode(body["key"]).decode("utf-8")
        prefix = "range_end" in body
        if kind == "request_put":
            self._put_key(key, base64.b64decode(body.get("value", "")), int(body.get("lease", 0)))
            return None
        if kind == "request_delete_range":
            return sum(self._delete_key(k) for k in self._keys(key, prefix))
        return [self._kv[k] for k in self._keys(key, prefix)]

    def lease_grant(self, ttl):
        def grant():
            self._next_lease += 1
            self._renew(self._next_lease, ttl)
            return self._next_lease, ttl
        return self._answer(grant)

    def lease_keepalive(self, lease):
        def keepalive():
            if lease not in self._leases:
                raise LeaseNotFound(f"lease {lease} expired or was revoked")
            self._renew(lease, self._ttl[lease])
            return self._ttl[lease]
        return self._answer(keepalive)

    def lease_revoke(self, lease):
        def revoke():
            if lease in self._leases:
                self._drop_lease(lease)
        return self._answer(revoke)

    def watch(self, key, callback, prefix=False, start_revision=None):
        w = _Watch(self, key, prefix_end(key) if prefix else None, callback)
        self._watches.append(w)
        return w


class Line:
    """One member's way to a L{MemoryEtcd}, which the test can cut on its own: while
    C{cut}, its calls fail after the timeout and its watches' deliveries wait."""

    def __init__(self, etcd):
        self.etcd = etcd
        self.cut = False
        self._held = []

    def __getattr__(self, name):
        call = getattr(self.etcd, name)
        if name not in ("range", "get", "put", "delete", "txn", "lease_grant",
                        "lease_keepalive", "lease_revoke"):
            raise AttributeError(name)

        def through(*args, **kw):
            if self.cut:
                def fail():
                    raise EtcdUnavailable("etcd did not answer (line cut)")
                return task.deferLater(self.etcd.clock, self.etcd.timeout, fail)
            return call(*args, **kw)
        return through

    def watch(self, key, callback, prefix=False, start_revision=None):
        def deliver(events, revision):
            if self.cut:
                self._held.append((events, revision))
            else:
                callback(events, revision)
        self._deliver = callback
        return self.etcd.watch(key, deliver, prefix, start_revision)

    def mend(self):
        """Join the line again; held deliveries go out."""
        self.cut = False
        held, self._held = self._held, []
        for events, revision in held:
            self._deliver(events, revision)
