"""An etcd v3 client on Twisted, through etcd's JSON gateway (the C{/v3/...} endpoints
every etcd 3.4+ serves on its client URL) with treq: no threads, no gRPC.

Keys are text (UTF-8), values bytes; both travel base64 as the gateway wants, and the
gateway's 64-bit integers (revisions, lease ids) travel as decimal strings. Calls return
Deferreds. Each call goes to the endpoint that last answered; an endpoint that cannot be
reached (connection refused, timed out) gives way to the next one. A call that fails
after etcd may have seen it (a txn or put whose reply was lost) is not repeated: it
fails with L{EtcdUnavailable}, and the caller decides.

A watch (L{EtcdClient.watch}) is one streaming HTTP response of newline-separated JSON
objects; it reconnects by itself, resuming from the revision after the last one it
delivered, so no event is lost or repeated across reconnections (unless etcd compacted
them away meanwhile: then it resumes at the oldest revision etcd still holds).
"""

import base64
import json

import treq
from twisted.internet import defer, error, protocol
from twisted.logger import Logger
from twisted.web.client import (
    Agent,
    HTTPConnectionPool,
    RequestTransmissionFailed,
    ResponseFailed,
    ResponseNeverReceived,
)

from mqserver.config import etcd_endpoints as parse_endpoints

#: The largest gateway answer (one unary reply, or one watch message) we read, in bytes.
MAX_REPLY = 16 << 20

# Failures that mean "this endpoint could not be reached": the request never got there.
_UNREACHED = (error.ConnectError, error.ConnectingCancelledError, error.DNSLookupError)
# Failures after which etcd may or may not have executed the request.
_LOST = (defer.TimeoutError, defer.CancelledError, ResponseFailed, ResponseNeverReceived,
         RequestTransmissionFailed, error.ConnectionLost, error.ConnectionDone)


class EtcdError(Exception):
    """etcd answered with an error (the gateway's message and gRPC code)."""

    def __init__(self, message, code=None, status=None):
        super().__init__(message)
        self.code = code
        self.status = status


class EtcdUnavailable(EtcdError):
    """No endpoint answered (each one refused, timed out or dropped the request)."""


class LeaseNotFound(EtcdError):
    """The lease has expired or was revoked."""


def _b64(data):
    if isinstance(data, str):
        data = data.encode("utf-8")
    return base64.b64encode(data).decode("ascii")


def _unb64(text):
    return base64.b64decode(text or "")


def prefix_end(prefix):
    """The C{range_end} that makes a range or watch cover every key starting with
    C{prefix} (etcd's rule: the prefix with its last byte below 0xff incremented)."""
    data = prefix.encode("utf-8") if isinstance(prefix, str) else bytes(prefix)
    for i in range(len(data) - 1, -1, -1):
        if data[i] < 0xFF:
            return data[:i] + bytes([data[i] + 1])
    return b"\0"  # every key


class KeyValue:
    """One key as etcd holds it.

    @ivar key: the key (text). @ivar value: its value (bytes).
    @ivar create_revision, mod_revision, version: etcd's revisions of it.
    @ivar lease: the id of the lease it is attached to (0: none).
    """

    __slots__ = ("key", "value", "create_revision", "mod_revision", "version", "lease")

    def __init__(self, key, value=b"", create_revision=0, mod_revision=0, version=0, lease=0):
        self.key = key
        self.value = value
        self.create_revision = create_revision
        self.mod_revision = mod_revision
        self.version = version
        self.lease = lease

    @classmethod
    def from_json(cls, kv):
        return cls(_unb64(kv.get("key")).decode("utf-8", "replace"), _unb64(kv.get("value")),
                   int(kv.get("create_revision", 0)), int(kv.get("mod_revision", 0)),
                   int(kv.get("version", 0)), int(kv.get("lease", 0)))

    def __repr__(self):
        return (f"KeyValue({self.key!r}, {self.value!r}, create={self.create_revision}, "
                f"mod={self.mod_revision}, lease={self.lease})")


class Event:
    """One change a watch saw: C{type} is C{"PUT"} or C{"DELETE"}; C{kv} the key after
    it (for a DELETE, the key and the revision of the deletion)."""

    __slots__ = ("type", "kv")

    def __init__(self, type, kv):
        self.type = type
        self.kv = kv

    def __repr__(self):
        return f"Event({self.type}, {self.kv!r})"


# -- transactions ---------------------------------------------------------------------

_TARGETS = {"version": "VERSION", "create_revision": "CREATE", "mod_revision": "MOD",
            "value": "VALUE", "lease": "LEASE"}
_RESULTS = {"==": "EQUAL", "!=": "NOT_EQUAL", ">": "GREATER", "<": "LESS"}


def compare(key, target, op, operand):
    """One comparison of a txn: C{compare("/k", "create_revision", "==", 0)}.

    @param target: C{version}, C{create_revision}, C{mod_revision}, C{value} or C{lease}.
    @param op: C{==}, C{!=}, C{>} or C{<}.
    @param operand: an int, or bytes/text for C{value}.
    """
    if target not in _TARGETS or op not in _RESULTS:
        raise ValueError(f"cannot compare {target!r} with {op!r}")
    return {"key": _b64(key), "target": _TARGETS[target], "result": _RESULTS[op],
            target: _b64(operand) if target == "value" else str(int(operand))}


def op_put(key, value, lease=0):
    """A put inside a txn."""
    return {"request_put": _put_body(key, value, lease)}


def op_delete(key, prefix=False):
    """A delete inside a txn."""
    return {"request_delete_range": range_body(key, prefix)}


def op_get(key, prefix=False):
    """A range inside a txn."""
    return {"request_range": range_body(key, prefix)}


def _put_body(key, value, lease):
    body = {"key": _b64(key), "value": _b64(value)}
    if lease:
        body["lease"] = str(lease)
    return body


def range_body(key, prefix):
    body = {"key": _b64(key)}
    if prefix:
        body["range_end"] = _b64(prefix_end(key))
    return body


class TxnResult:
    """What a txn did: C{succeeded} (the comparisons held), C{revision} (etcd's revision
    after it), C{responses} (one per operation run: a list of L{KeyValue} for a range, the
    count deleted for a delete, None for a put)."""

    def __init__(self, succeeded, revision, responses):
        self.succeeded = succeeded
        self.revision = revision
        self.responses = responses


def _txn_response(item):
    if "response_range" in item:
        return [KeyValue.from_json(kv) for kv in item["response_range"].get("kvs", ())]
    if "response_delete_range" in item:
        return int(item["response_delete_range"].get("deleted", 0))
    return None


def _revision(reply):
    return int(reply.get("header", {}).get("revision", 0))


# -- the client -----------------------------------------------------------------------


class EtcdClient:
    """A client of one etcd cluster.

    @ivar endpoints: client URLs, tried in turn.
    @ivar timeout: seconds one request to one endpoint may take.
    """

    log = Logger()

    def __init__(self, reactor, endpoints, timeout=2.0):
        self.reactor = reactor
        self.endpoints = parse_endpoints(endpoints)
        if not self.endpoints:
            raise ValueError("no etcd endpoint given")
        self.timeout = timeout
        self._current = 0
        self._pool = HTTPConnectionPool(reactor, persistent=True)
        self._pool.retryAutomatically = False
        self._http = treq.client.HTTPClient(Agent(reactor, pool=self._pool))

    def close(self):
        """Close the pooled connections; returns a Deferred."""
        return self._pool.closeCachedConnections()

    # -- unary calls --

    @defer.inlineCallbacks
    def call(self, path, body, idempotent=True):
        """POST C{body} (JSON) to the gateway's C{path} (e.g. C{/v3/kv/range}) and return
        the decoded answer, trying each endpoint in turn from the last good one.

        A request that may have reached etcd is sent again (to the next endpoint) only
        when C{idempotent}. Raises L{EtcdUnavailable} when no endpoint answered, and
        L{EtcdError} when etcd answered with an error.
        """
        failures = []
        for attempt in range(len(self.endpoints)):
            index = (self._current + attempt) % len(self.endpoints)
            url = self.endpoints[index] + path
            try:
                reply = yield self._post(url, body)
            except _UNREACHED as e:
                failures.append(f"{self.endpoints[index]}: {e.__class__.__name__}")
                continue
            except _LOST as e:
                failures.append(f"{self.endpoints[index]}: {_describe(e)}")
                self._current = (index + 1) % len(self.endpoints)
                if idempotent:
                    continue
                raise EtcdUnavailable("etcd did not answer (" + "; ".join(failures) + ")")
            self._current = index
            return reply
        self._current = (self._current + 1) % len(self.endpoints)
        raise EtcdUnavailable("no etcd endpoint answered (" + "; ".join(failures) + ")")

    def _post(self, url, body):
        d = defer.ensureDeferred(self._post_once(url, body))
        return d.addTimeout(self.timeout, self.reactor)

    async def _post_once(self, url, body):
        response = await self._http.post(url, data=json.dumps(body).encode("ascii"),
                                         headers={"Content-Type": ["application/json"]},
                                         unbuffered=True)
        data = await _read_limited(response, MAX_REPLY)
        try:
            reply = json.loads(data)
        except ValueError:
            raise EtcdError(f"etcd answered {response.code} with no JSON", status=response.code)
        if response.code != 200 or "error" in reply:
            message = reply.get("message") or reply.get("error") or f"HTTP {response.code}"
            cls = LeaseNotFound if "lease not found" in message else EtcdError
            raise cls(message, reply.get("code"), response.code)
        return reply

    # -- kv --

    @defer.inlineCallbacks
    def range(self, key, prefix=False):
        """Return C{(kvs, revision)}: the L{KeyValue}s of C{key} (or of every key
        starting with it when C{prefix}), sorted by key, and etcd's revision."""
        reply = yield self.call("/v3/kv/range", range_body(key, prefix))
        return [KeyValue.from_json(kv) for kv in reply.get("kvs", ())], _revision(reply)

    @defer.inlineCallbacks
    def get(self, key):
        """Return the L{KeyValue} of C{key}, or None."""
        kvs, _ = yield self.range(key)
        return kvs[0] if kvs else None

    @defer.inlineCallbacks
    def put(self, key, value, lease=0):
        """Set C{key} to C{value} (attached to C{lease} when given); returns the
        revision."""
        reply = yield self.call("/v3/kv/put", _put_body(key, value, lease))
        return _revision(reply)

    @defer.inlineCallbacks
    def delete(self, key, prefix=False):
        """Delete C{key} (or every key starting with it); returns how many went."""
        reply = yield self.call("/v3/kv/deleterange", range_body(key, prefix))
        return int(reply.get("deleted", 0))

    @defer.inlineCallbacks
    def txn(self, compares, success=(), failure=()):
        """Run a transaction: if every one of C{compares} (L{compare}) holds, the
        operations of C{success} (L{op_put}, L{op_delete}, L{op_get}), else those of
        C{failure}. Returns a L{TxnResult}. Never sent twice (see L{call})."""
        body = {"compare": list(compares), "success": list(success), "failure": list(failure)}
        reply = yield self.call("/v3/kv/txn", body, idempotent=False)
        return TxnResult(bool(reply.get("succeeded", False)), _revision(reply),
                         [_txn_response(r) for r in reply.get("responses", ())])

    # -- leases --

    @defer.inlineCallbacks
    def lease_grant(self, ttl):
        """Grant a lease of C{ttl} seconds (etcd rounds up to its minimum); returns
        C{(lease id, granted ttl)}."""
        reply = yield self.call("/v3/lease/grant", {"TTL": str(int(ttl))}, idempotent=False)
        return int(reply["ID"]), int(reply.get("TTL", ttl))

    @defer.inlineCallbacks
    def lease_keepalive(self, lease):
        """Renew C{lease} once; returns its TTL in seconds. Raises L{LeaseNotFound} when
        it expired or was revoked."""
        reply = yield self.call("/v3/lease/keepalive", {"ID": str(lease)})
        ttl = int(reply.get("result", {}).get("TTL", 0))
        if ttl <= 0:
            raise LeaseNotFound(f"lease {lease} expired or was revoked")
        return ttl

    @defer.inlineCallbacks
    def lease_revoke(self, lease):
        """Revoke C{lease}: every key attached to it is deleted. A lease already gone
        is no error."""
        try:
            yield self.call("/v3/lease/revoke", {"ID": str(lease)})
        except LeaseNotFound:
            pass

    # -- watches --

    def watch(self, key, callback, prefix=False, start_revision=None):
        """Watch C{key} (or every key starting with it): C{callback(events, revision)}
        is called with each batch of L{Event}s in revision order. Starts at
        C{start_revision} (None: the changes after now). Returns the L{Watch}, already
        started; call its C{stop()} to end it."""
        w = Watch(self, key, callback, prefix, start_revision)
        w.start()
        return w


def _describe(failure):
    if isinstance(failure, (ResponseFailed, ResponseNeverReceived, RequestTransmissionFailed)):
        reasons = getattr(failure, "reasons", None) or []
        inner = ", ".join(r.value.__class__.__name__ for r in reasons)
        return f"{failure.__class__.__name__}({inner})"
    return failure.__class__.__name__


class _TooLarge(Exception):
    pass


def _read_limited(response, limit):
    """The body of C{response}, failing once more than C{limit} bytes arrived (the
    connection is dropped then, before anything more is buffered)."""
    chunks, size = [], [0]

    def collect(data):
        size[0] += len(data)
        if size[0] > limit:
            raise _TooLarge()
        chunks.append(data)

    def done(_):
        return b"".join(chunks)

    def too_large(f):
        f.trap(_TooLarge)
        raise EtcdError(f"etcd answered more than {limit} bytes")

    return treq.collect(response, collect).addCallbacks(done, too_large)


class _LineStream(protocol.Protocol):
    """The body of a watch response: one JSON object per line, each passed to
    C{on_message}; C{finished} fires (with None) when the body ends, C{reason} then
    saying why."""

    def __init__(self, on_message, limit=MAX_REPLY):
        self.on_message = on_message
        self.limit = limit
        self.finished = defer.Deferred()
        self.reason = None
        self._buffer = b""

    def dataReceived(self, data):
        self._buffer += data
        while True:
            line, sep, rest = self._buffer.partition(b"\n")
            if not sep:
                break
            self._buffer = rest
            if line.strip():
                try:
                    message = json.loads(line)
                except ValueError:
                    self._buffer = b""
                    self.transport.stopProducing()
                    return
                self.on_message(message)
        if len(self._buffer) > self.limit:
            self._buffer = b""
            self.transport.stopProducing()

    def connectionLost(self, reason):
        self.reason = reason
        self.finished.callback(None)


class Watch:
    """A watch of one key or prefix that reconnects until stopped.

    @ivar next_revision: the revision it resumes from after a reconnection (None until
        etcd named one, when it was started "from now").
    @ivar connected: True while the stream is open and etcd confirmed the watch.
    @ivar reconnects: how many times the stream was opened again.
    """

    log = Logger()
    min_backoff = 0.1
    max_backoff = 2.0

    def __init__(self, client, key, callback, prefix=False, start_revision=None):
        self.client = client
        self.key = key
        self.callback = callback
        self.prefix = prefix
        self.next_revision = start_revision
        self.connected = False
        self.reconnects = 0
        self._stopped = False
        self._stream = None
        self._request = None
        self._retry = None
        self._backoff = self.min_backoff
        self._endpoint = client._current

    def start(self):
        self._stopped = False
        self._open()

    def stop(self):
        """End the watch: no callback after this."""
        self._stopped = True
        self.connected = False
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None
        if self._request is not None:
            self._request.cancel()
        if self._stream is not None and self._stream.transport is not None:
            self._stream.transport.stopProducing()

    def _open(self):
        body = {"create_request": range_body(self.key, self.prefix)}
        if self.next_revision is not None:
            body["create_request"]["start_revision"] = str(self.next_revision)
        url = self.client.endpoints[self._endpoint % len(self.client.endpoints)] + "/v3/watch"
        d = self.client._http.post(url, data=json.dumps(body).encode("ascii"),
                                   headers={"Content-Type": ["application/json"]},
                                   unbuffered=True)
        d.addTimeout(self.client.timeout, self.client.reactor)
        self._request = d
        d.addCallbacks(self._responded, self._failed)

    def _responded(self, response):
        self._request = None
        if self._stopped:
            response.deliverBody(protocol.Protocol())
            return
        if response.code != 200:
            self.log.warn("etcd watch answered HTTP {code}", code=response.code)
            response.deliverBody(protocol.Protocol())
            self._again()
            return
        stream = self._stream = _LineStream(self._message)
        response.deliverBody(stream)
        stream.finished.addCallback(self._ended)

    def _failed(self, f):
        self._request = None
        if not self._stopped:
            self._again()

    def _ended(self, _):
        self._stream = None
        self.connected = False
        if not self._stopped:
            self._again()

    def _again(self):
        """Reconnect after a backoff, to the next endpoint."""
        self.connected = False
        self._endpoint += 1
        self.reconnects += 1
        self._retry = self.client.reactor.callLater(self._backoff, self._reopen)
        self._backoff = min(self._backoff * 2, self.max_backoff)

    def _reopen(self):
        self._retry = None
        if not self._stopped:
            self._open()

    def _message(self, message):
        if self._stopped:
            return
        result = message.get("result")
        if result is None:  # a gateway error object
            self.log.warn("etcd watch error: {message}", message=message)
            if self._stream is not None:
                self._stream.transport.stopProducing()
            return
        revision = _revision(result)
        if result.get("created"):
            self.connected = True
            self._backoff = self.min_backoff
            if self.next_revision is None:
                self.next_revision = revision + 1
        compacted = int(result.get("compact_revision", 0))
        if compacted:
            # What we asked for is gone: resume at the oldest revision etcd holds.
            self.log.warn("etcd watch of {key}: revisions before {rev} were compacted",
                          key=self.key, rev=compacted)
            self.next_revision = compacted
            if self._stream is not None:
                self._stream.transport.stopProducing()
            return
        events = []
        for e in result.get("events", ()):
            kv = KeyValue.from_json(e.get("kv", {}))
            events.append(Event(e.get("type", "PUT"), kv))
        if events:
            self.next_revision = events[-1].kv.mod_revision + 1
            self.callback(events, revision)
        elif not result.get("created") and revision:
            # a progress notification: everything up to it was delivered
            self.next_revision = max(self.next_revision or 0, revision + 1)
