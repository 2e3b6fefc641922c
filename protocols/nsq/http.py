"""The nsqd HTTP API (``listen.nsqd_http``): /ping, /info, /pub, /mpub, /stats, topic and
channel admin, /config. Parameters come from the query string; errors are
``{"message": CODE}`` with nsqd's status codes; every reply but /ping carries
``X-NSQ-Content-Type: nsq; version=1.0``.
"""


from twisted.internet import defer
from twisted.web import resource, server

from mqserver import webfaults, webrequest
from mqserver.errors import BrokerError, InvalidTopicName
from mqserver.message import Message
from mqserver.version import version as mqserver_version

from protocols.nsq.codec import NS_PER_MS as _NS, is_valid_name, is_valid_topic
from protocols.nsq.faults import HTTP_DOOR
from protocols.nsq.httputil import (
    HttpError, NsqSite, arg as _arg, error_body, fault_error, handler_for, result_body,
)
from protocols.nsq.stats import stats_json, stats_text
from protocols.nsq.version import VERSION
from protocols.nsq.wire import U32


def _bool_arg(request, name, default):
    v = _arg(request, name)
    if v is None:
        return default
    return v not in ("false", "0")


def _int_arg(request, name):
    v = _arg(request, name)
    if v is None:
        return None
    try:
        n = int(v)
    except ValueError:
        raise HttpError(400, f"INVALID_ARG_{name.upper()}") from None
    if n < 0:
        raise HttpError(400, f"INVALID_ARG_{name.upper()}")
    return n


def _topic(request, code="INVALID_TOPIC"):
    t = _arg(request, "topic")
    if not t:
        raise HttpError(400, "MISSING_ARG_TOPIC")
    if not is_valid_topic(t):
        raise HttpError(400, code)
    return t


def _topic_channel(request):
    t = _topic(request, "INVALID_ARG_TOPIC")
    c = _arg(request, "channel")
    if not c:
        raise HttpError(400, "MISSING_ARG_CHANNEL")
    if not is_valid_name(c):
        raise HttpError(400, "INVALID_ARG_CHANNEL")
    return t, c


class NsqdHttpResource(resource.Resource):
    """Every nsqd HTTP endpoint."""

    isLeaf = True

    def __init__(self, node):
        super().__init__()
        self.node = node
        self.broker = node.broker
        self.tap = node.broker.wiretap
        self.routes = {
            b"/ping": (b"GET", self.ping), b"/info": (b"GET", self.info),
            b"/pub": (b"POST", self.pub), b"/mpub": (b"POST", self.mpub),
            b"/stats": (b"GET", self.stats),
            b"/topic/create": (b"POST", self.topic_create),
            b"/topic/delete": (b"POST", self.topic_delete),
            b"/topic/empty": (b"POST", self.topic_empty),
            b"/topic/pause": (b"POST", lambda r: self.topic_pause(r, True)),
            b"/topic/unpause": (b"POST", lambda r: self.topic_pause(r, False)),
            b"/channel/create": (b"POST", self.channel_create),
            b"/channel/delete": (b"POST", self.channel_delete),
            b"/channel/empty": (b"POST", self.channel_empty),
            b"/channel/pause": (b"POST", lambda r: self.channel_pause(r, True)),
            b"/channel/unpause": (b"POST", lambda r: self.channel_pause(r, False)),
            b"/channel/rewind": (b"POST", self.channel_rewind),
        }

    def render(self, request):
        if self.tap.active:
            return webfaults.serve(self.tap, HTTP_DOOR, request, self._render, fault_error)
        return self._render(request)

    def _render(self, request):
        if self.node.tls_required and not request.isSecure():
            return self._tls_required(request)
        path = request.path.rstrip(b"/") or b"/"
        if path.startswith(b"/config/"):
            verb = request.method if request.method in (b"GET", b"PUT") else b"GET"
            route = (verb, self.config)
        else:
            route = self.routes.get(path)
        try:
            result = handler_for(route, request)(request)
        except HttpError as e:
            return error_body(request, e)
        if isinstance(result, defer.Deferred):
            gone = webrequest.departure(request)
            result.addCallbacks(lambda r: self._finish(request, r, gone),
                                lambda f: self._finish(request, self._failure(f), gone))
            return server.NOT_DONE_YET
        return result_body(request, result, path == b"/ping")

    def _failure(self, f):
        if f.check(HttpError):
            return f.value
        if f.check(InvalidTopicName):  # NSQ-valid but refused by the broker (leading ".")
            return HttpError(400, "INVALID_TOPIC")
        if not f.check(BrokerError):
            self.node.log.failure("nsqd HTTP request failed", f)
        return HttpError(500, "INTERNAL_ERROR")

    def _tls_required(self, request):
        # nsqd --tls-required: its plain HTTP port answers every request so and names
        # the HTTPS port (here: this door when it listens on ssl:, else none, 0).
        port = self.node.http_port if self.node.http_tls else 0
        request.setResponseCode(403)
        request.setHeader(b"X-NSQ-Content-Type", b"nsq; version=1.0")
        request.setHeader(b"Content-Type", b"application/json; charset=utf-8")
        return b'{"message": "TLS_REQUIRED", "https_port": %d}' % port

    def _finish(self, request, result, gone):
        if gone:
            return  # the client left before the answer was ready
        if isinstance(result, HttpError):
            request.write(error_body(request, result))
        else:
            request.write(result_body(request, result, False))
        request.finish()

    # -- endpoints -----------------------------------------------------------------------

    def ping(self, request):
        return b"OK"

    def info(self, request):
        n = self.node
        # version: the nsqd release clients expect; mqserver_version: this broker's
        return {"version": VERSION, "mqserver_version": mqserver_version(),
                "broadcast_address": n.broadcast_address,
                "hostname": n.hostname, "http_port": n.http_port, "tcp_port": n.tcp_port,
                "start_time": n.start_time,
                "max_heartbeat_interval": n.server.max_heartbeat_interval_ms * _NS,
                "max_output_buffer_size": n.server.max_output_buffer_size,
                "max_output_buffer_timeout": n.server.max_output_buffer_timeout_ms * _NS,
                "max_deflate_level": n.server.max_deflate_level}

    def _publish(self, topic, bodies, defer_ms=0):
        now = self.broker.now_ms()
        msgs = [Message(b, born_ts=now) for b in bodies]
        d = self.node.ensure_topic(topic)
        if not msgs:
            return d.addCallback(lambda _: b"OK")
        if defer_ms:
            d.addCallback(lambda _: self.broker.delay(topic, defer_ms, msgs))
        else:
            d.addCallback(lambda _: self.broker.publish(topic, msgs))
        return d.addCallback(lambda _: b"OK")

    def pub(self, request):
        body = request.content.read()
        if len(body) > self.node.max_msg_size:
            raise HttpError(413, "MSG_TOO_BIG")
        if not body:
            raise HttpError(400, "MSG_EMPTY")
        topic = _topic(request)
        defer_ms = 0
        raw = _arg(request, "defer")
        if raw is not None:
            try:
                defer_ms = int(raw)
            except ValueError:
                raise HttpError(400, "INVALID_DEFER") from None
            if not 0 <= defer_ms <= self.node.max_req_timeout_ms:
                raise HttpError(400, "INVALID_DEFER")
        return self._publish(topic, [body], defer_ms)

    def mpub(self, request):
        body = request.content.read()
        if len(body) > self.node.max_body_size:
            raise HttpError(413, "BODY_TOO_BIG")
        topic = _topic(request)
        binary = _arg(request, "binary")
        max_msg = self.node.max_msg_size
        if binary is not None and binary not in ("false", "0"):
            bodies = self._binary_bodies(body, max_msg)
        else:
            bodies = [line for line in body.split(b"\n") if line]
            if any(len(b) > max_msg for b in bodies):
                raise HttpError(413, "MSG_TOO_BIG")
        return self._publish(topic, bodies)

    @staticmethod
    def _binary_bodies(body, max_msg):
        if len(body) < 4:
            raise HttpError(413, "BAD_BODY")
        (count,) = U32.unpack_from(body, 0)
        if count <= 0 or count > (len(body) - 4) // 5 + 1:
            raise HttpError(413, "BAD_BODY")
        pos, out = 4, []
        for _ in range(count):
            if pos + 4 > len(body):
                raise HttpError(413, "BAD_MESSAGE")
            (n,) = U32.unpack_from(body, pos)
            pos += 4
            if n <= 0 or n > max_msg or pos + n > len(body):
                raise HttpError(413, "BAD_MESSAGE")
            out.append(body[pos:pos + n])
            pos += n
        return out

    def stats(self, request):
        topic = _arg(request, "topic")
        channel = _arg(request, "channel")
        clients = _bool_arg(request, "include_clients", True)
        mem = _bool_arg(request, "include_mem", True)
        if _arg(request, "format") == "json":
            return stats_json(self.node, topic, channel, clients, mem)
        return stats_text(self.node, topic, channel, clients, mem)

    def topic_create(self, request):
        return self.node.ensure_topic(_topic(request)).addCallback(lambda _: None)

    def _existing_topic(self, request):
        t = _topic(request)
        if self.broker.topic(t) is None:
            raise HttpError(404, "TOPIC_NOT_FOUND")
        return t

    def topic_delete(self, request):
        t = self._existing_topic(request)
        return self.broker.delete_topic(t).addCallback(lambda _: None)

    def topic_empty(self, request):
        self.broker.channels.empty_topic(self._existing_topic(request))

    def topic_pause(self, request, paused):
        self.broker.channels.set_topic_paused(self._existing_topic(request), paused)

    def _channel(self, request, create=False):
        t, c = _topic_channel(request)
        if self.broker.topic(t) is None:
            raise HttpError(404, "TOPIC_NOT_FOUND")
        ch = self.broker.channels.get(t, c)
        if ch is None and not create:
            raise HttpError(404, "CHANNEL_NOT_FOUND")
        return t, c, ch

    def channel_create(self, request):
        t, c, _ = self._channel(request, create=True)
        self.broker.channels.create_channel(t, c)

    def channel_delete(self, request):
        t, c, _ = self._channel(request)
        self.broker.channels.delete_channel(t, c)

    def channel_empty(self, request):
        self._channel(request)[2].empty()

    def channel_pause(self, request, paused):
        self.broker.channels.set_channel_paused(self._channel(request)[2], paused)

    def channel_rewind(self, request):
        """mqserver's addition: move a channel back (or forward) to the first message
        stored at or after C{timestamp_ms}, or to eventId C{event_id}; what is in flight is
        dropped and consumers go on from there. Answers where the channel now starts."""
        ch = self._channel(request)[2]
        ts, eid = _int_arg(request, "timestamp_ms"), _int_arg(request, "event_id")
        if (ts is None) == (eid is None):
            raise HttpError(400, "MISSING_ARG_TIMESTAMP_MS_OR_EVENT_ID")
        stats = self.broker.stats
        c = stats.find("channel", ch.name, ch.topic)
        positions = stats.rewind(c, event_id=eid, ts_ms=ts)
        return {"positions": {str(q): o for q, o in sorted(positions.items())},
                "depth": ch.depth()}

    def config(self, request):
        opt = request.path[len(b"/config/"):].decode("utf-8", "replace")
        n = self.node
        values = {
            "nsqlookupd_tcp_addresses": list(n.config["nsq.lookupdTcpAddresses"]),
            "msg_timeout": n.server.msg_timeout_ms * _NS,
            "max_msg_timeout": n.server.max_msg_timeout_ms * _NS,
            "max_rdy_count": n.server.max_rdy_count,
            "max_msg_size": n.max_msg_size, "max_body_size": n.max_body_size,
            "max_req_timeout": n.max_req_timeout_ms * _NS,
            "max_heartbeat_interval": n.server.max_heartbeat_interval_ms * _NS,
            "output_buffer_timeout": n.server.output_buffer_timeout_ms * _NS,
            "min_output_buffer_timeout": n.server.min_output_buffer_timeout_ms * _NS,
            "max_output_buffer_timeout": n.server.max_output_buffer_timeout_ms * _NS,
            "max_output_buffer_size": n.server.max_output_buffer_size,
            "deflate": n.server.deflate_enabled, "max_deflate_level": n.server.max_deflate_level,
            "snappy": n.server.snappy_enabled, "max_channel_consumers": n.max_channel_consumers,
            "broadcast_address": n.broadcast_address, "log_level": "info",
            "tcp_address": f"127.0.0.1:{n.tcp_port}", "http_address": f"127.0.0.1:{n.http_port}",
        }
        if opt not in values:
            raise HttpError(400, "INVALID_OPTION")
        if request.method == b"PUT":
            # only reading is supported; a write of the current value is accepted
            raise HttpError(400, "INVALID_OPTION")
        return values[opt]


class NsqdHttpSite(NsqSite):
    """The nsqd HTTP site; learns its port for /info and lookupd."""

    def __init__(self, node, idle_timeout=60.0):
        super().__init__(NsqdHttpResource(node), timeout=idle_timeout or None, reactor=node.reactor)
        self.node = node

    def body_limit(self, request, method, path):
        """As nsqd: /pub takes one message (nsq.maxMsgSize, else 413 MSG_TOO_BIG), every
        other route at most nsq.maxBodySize (413 BODY_TOO_BIG)."""
        if path is not None and path.rstrip(b"/") == b"/pub":
            return self.node.max_msg_size, "MSG_TOO_BIG"
        return self.node.max_body_size, "BODY_TOO_BIG"

    def listening(self, port):
        """The listener is bound (called by the broker's service tree)."""
        self.node.http_port = port.getHost().port
