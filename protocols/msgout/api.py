"""The msgout HTTP/JSON API: routes, their handlers, and JSON in and out.

Every reply is JSON; errors are C{{"error": TEXT}} with a fitting status. Bodies of
messages travel as UTF-8 C{body} or, when not valid UTF-8, base64 C{body_b64}.
"""

import base64
import binascii
import json
from urllib.parse import unquote, urlsplit

from twisted.internet import defer
from twisted.logger import Logger

from mqserver.broker.queues import UnknownReceipt
from mqserver.errors import (BrokerError, InvalidRequest, InvalidTopicName, NotMaster,
                             StoreError, TopicExists, TopicNotFound)
from mqserver import message as fmt
from mqserver.message import Message

_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_string = json.encoder.encode_basestring  # as _JSON escapes a str


class ApiError(Exception):
    """A request refused with C{status} and C{message}."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


#: core errors -> HTTP status
_STATUS = ((TopicNotFound, 404), (TopicExists, 409), (InvalidTopicName, 400),
           (InvalidRequest, 400), (UnknownReceipt, 400), (NotMaster, 503),
           (StoreError, 503), (BrokerError, 400))


def status_of(exc):
    """Return (status, text) for an exception a handler raised."""
    if isinstance(exc, ApiError):
        return exc.status, exc.message
    if isinstance(exc, defer.CancelledError):  # the client left; nobody reads this
        return 499, "cancelled"
    for cls, status in _STATUS:
        if isinstance(exc, cls):
            return status, str(exc) or cls.__name__
    return 500, "internal error"


def split_path(path):
    """Return the decoded segments of a request path (bytes), or None if undecodable."""
    try:
        text = path.split(b"?", 1)[0].decode("ascii")
        return [unquote(p, errors="strict") for p in text.strip("/").split("/")]
    except (UnicodeDecodeError, ValueError):
        return None


def delivery_json(d):
    """One delivered message as JSON text: C{{"id", "receipt", "attempts", "ts", "body"
    or "body_b64", "headers"}}. Built from pieces rather than a dict per message (the
    fetch and push hot path); the string escaping is json's own."""
    try:
        body = '"body":' + _string(d.body.decode("utf-8"))
    except UnicodeDecodeError:
        body = '"body_b64":"' + base64.b64encode(d.body).decode("ascii") + '"'
    receipt = '"' + d.receipt + '"' if d.receipt else "null"  # digits and dots only
    headers = _JSON(d.headers()) if d.props else "{}"
    return (f'{{"id":{d.id},"receipt":{receipt},"attempts":{d.attempts},"ts":{d.ts_ms},'
            f'{body},"headers":{headers}}}')


class Messages:
    """A reply or push body holding deliveries: C{extra} fields, then C{"messages"}."""

    __slots__ = ("deliveries", "extra")

    def __init__(self, deliveries, **extra):
        self.deliveries = deliveries
        self.extra = extra

    def receipts(self):
        return [d.receipt for d in self.deliveries if d.receipt]

    def json(self):
        head = "".join(f"{_JSON(k)}:{_JSON(v)}," for k, v in self.extra.items())
        return ("{" + head + '"messages":[' + ",".join(map(delivery_json, self.deliveries))
                + "]}").encode("utf-8")


def decode_message(m, max_size):
    """A JSON message (C{body} or C{body_b64}, optional C{headers}) as a L{Message}."""
    if not isinstance(m, dict):
        raise ApiError(400, "each message must be a JSON object")
    if "body_b64" in m:
        try:
            body = base64.b64decode(m["body_b64"], validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise ApiError(400, "body_b64 is not base64") from None
    elif isinstance(m.get("body"), str):
        body = m["body"].encode("utf-8", "surrogatepass")
    else:
        raise ApiError(400, "a message needs a string body or body_b64")
    if len(body) > max_size:
        raise ApiError(413, "message too large")
    headers = m.get("headers") or {}
    if not isinstance(headers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise ApiError(400, "headers must be an object of strings")
    pairs = [(k.encode(), v.encode()) for k, v in headers.items()]
    if pairs and not fmt.properties_safe(pairs):
        raise ApiError(400, "a header holds a control byte 0x01/0x02 or is empty")
    return Message(body, properties=fmt.encode_properties(pairs))


def _int(body, key, default, lo, hi):
    v = body.get(key, default)
    if type(v) is not int or not lo <= v <= hi:
        raise ApiError(400, f"{key} must be an integer {lo}..{hi}")
    return v


def _start(v):
    """A subscription start: "earliest", "latest" or a message id."""
    if v in ("earliest", "latest") or (type(v) is int and v >= 0):
        return v
    raise ApiError(400, 'from must be "earliest", "latest" or a message id')


class MsgoutApi:
    """The handlers of every route over one broker's L{QueueService}."""

    log = Logger()

    def __init__(self, broker, reactor, max_body=5 << 20, max_fetch=1000, max_wait_ms=60000):
        self.broker = broker
        self.queues = broker.queues
        self.reactor = reactor
        self.max_body = max_body
        self.max_fetch = max_fetch
        self.max_wait_ms = max_wait_ms
        self.max_message = broker.messages.max_message_size

    # -- routing -------------------------------------------------------------------------

    def route(self, method, parts):
        """Return (handler, path arguments) for C{method} and path C{parts}; raise
        L{ApiError} 404/405."""
        n = len(parts)
        if n < 2 or parts[0] != "v1":
            raise ApiError(404, "no such route")
        table = None
        args = ()
        if n == 2 and parts[1] in ("ack", "nack"):
            table = {b"POST": self.ack if parts[1] == "ack" else self.nack}
        elif parts[1] == "queues":
            if n == 2:
                table = {b"GET": self.list_queues}
            elif n == 3:
                table = {b"PUT": self.put_queue, b"GET": self.get_queue,
                         b"DELETE": self.delete_queue}
            elif n == 4 and parts[3] == "messages":
                table = {b"POST": self.post_messages}
            elif n == 4 and parts[3] == "fetch":
                table = {b"POST": self.fetch}
            elif n == 4 and parts[3] == "subscriptions":
                table = {b"POST": self.subscribe, b"GET": self.list_subscriptions}
            elif n == 5 and parts[3] == "subscriptions":
                table = {b"GET": self.get_subscription, b"DELETE": self.unsubscribe}
            args = tuple(parts[2:3]) + tuple(parts[4:5])
        if table is None:
            raise ApiError(404, "no such route")
        fn = table.get(method)
        if fn is None:
            raise ApiError(405, "method not allowed")
        return fn, args

    def precheck(self, method, parts):
        """Refuse what can be refused from the request line alone (unknown routes and
        queues), before the body is read. Raises L{ApiError}."""
        self.route(method, parts)
        if len(parts) >= 4 and self.broker.topic(parts[2]) is None:
            raise ApiError(404, f"no queue {parts[2]}")

    # -- queues --------------------------------------------------------------------------

    def list_queues(self, body):
        out = []
        for t in self.broker.topics():
            if self.broker.topic(t.name) is not None:
                out.append(dict(self.queues.attrs(t.name), name=t.name))
        return {"queues": out}

    def put_queue(self, body, name):
        return self.queues.declare(name, body if body is not None else {}).addCallback(
            lambda attrs: dict(attrs, name=name))

    def get_queue(self, body, name):
        return self.queues.info(name)

    def delete_queue(self, body, name):
        d = self.broker.delete_topic(name)
        return d.addCallback(lambda _: (self.queues.drop_queue(name), {"deleted": name})[1])

    # -- messages ------------------------------------------------------------------------

    def post_messages(self, body, name):
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            raise ApiError(400, 'the body must be {"messages": [...]}')
        msgs = [decode_message(m, self.max_message) for m in body["messages"]]
        if not msgs:
            raise ApiError(400, "no messages")
        now = self.broker.now_ms()
        for m in msgs:
            m.born_ts = now
        return self.queues.publish(name, msgs).addCallback(lambda ids: {"ids": ids})

    def fetch(self, body, name):
        body = body if body is not None else {}
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        n = _int(body, "max", 10, 1, self.max_fetch)
        wait = _int(body, "wait_ms", 0, 0, self.max_wait_ms) / 1000.0
        sub_id = body.get("sub_id")
        attrs = self.queues.attrs(name)
        if attrs["mode"] == "topic" and sub_id is None:
            if "from_id" not in body:
                raise ApiError(400, "a topic-mode queue needs sub_id or from_id")
            return self._read_from(name, _start(body["from_id"]), n, wait)
        start = _start(body.get("from", "earliest"))
        d = self.queues.fetch(name, n, wait, sub_id, start)
        return d.addCallback(Messages)

    def _read_from(self, name, start, n, wait):
        ds, cur = self.queues.read_from(name, start, n)
        if ds or wait <= 0:
            return self._read_result(ds, cur)
        d = self.queues.wait_data(name, wait)
        return d.addCallback(lambda _: self._read_result(
            *self.queues.read_from(name, start, n)))

    @staticmethod
    def _read_result(ds, cur):
        return Messages(ds, next_id=ds[-1].id + 1) if ds else Messages(ds)

    def _receipts(self, body):
        rs = body.get("receipts") if isinstance(body, dict) else None
        if not isinstance(rs, list) or not all(isinstance(r, str) for r in rs):
            raise ApiError(400, 'the body must be {"receipts": ["...", ...]}')
        return rs

    def ack(self, body):
        rs = self._receipts(body)
        errors = self.queues.ack(rs)
        return {"acked": len(rs) - len(errors), "errors": errors}

    def nack(self, body):
        rs = self._receipts(body)
        errors = self.queues.nack(rs)
        return {"nacked": len(rs) - len(errors), "errors": errors}

    # -- push subscriptions --------------------------------------------------------------

    def subscribe(self, body, name):
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        url = body.get("url")
        if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https") \
                or not urlsplit(url).hostname:
            raise ApiError(400, "url must be an http:// or https:// URL")
        sub_id = body.get("sub_id", "push")
        batch = _int(body, "batch", 100, 1, 10000)
        s = self.queues.subscribe(name, sub_id, url, batch, _start(body.get("from", "earliest")))
        return self.queues.subscription_info(s)

    def list_subscriptions(self, body, name):
        self.queues.attrs(name)
        return {"subscriptions": [self.queues.subscription_info(s)
                                  for (q, _), s in self.queues.subscriptions.items()
                                  if q == name]}

    def _subscription(self, name, sub_id):
        s = self.queues.subscriptions.get((name, sub_id))
        if s is None:
            raise ApiError(404, f"no subscription {sub_id} of {name}")
        return s

    def get_subscription(self, body, name, sub_id):
        return self.queues.subscription_info(self._subscription(name, sub_id))

    def unsubscribe(self, body, name, sub_id):
        self._subscription(name, sub_id)
        self.queues.unsubscribe(name, sub_id)
        return {"deleted": sub_id}

    # -- one request ---------------------------------------------------------------------

    def call(self, method, parts, raw):
        """Run the route's handler on the JSON C{raw} body. Returns a Deferred firing
        with (status, JSON-ready data)."""
        try:
            fn, args = self.route(method, parts)
            body = None
            if raw:
                try:
                    body = json.loads(raw)
                except (ValueError, RecursionError):  # RecursionError: nested too deep
                    raise ApiError(400, "the body is not valid JSON") from None
            result = fn(body, *args)
        except Exception as e:
            return defer.succeed(self._error(e))
        if isinstance(result, defer.Deferred):
            return result.addCallbacks(lambda r: (200, r), lambda f: self._error(f.value))
        return defer.succeed((200, result))

    def _error(self, exc):
        status, text = status_of(exc)
        if status == 500:
            self.log.error("msgout request failed: {e!r}", e=exc)
        if isinstance(exc, NotMaster) and exc.master is not None:
            return status, {"error": text, "master": exc.master}
        return status, {"error": text}


def dumps(obj):
    """JSON text of C{obj} (JSON-ready data or L{Messages}) as bytes."""
    if isinstance(obj, Messages):
        return obj.json()
    return _JSON(obj).encode("utf-8")
