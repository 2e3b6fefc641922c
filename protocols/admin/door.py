"""The ``admin`` front door: the broker's admin API, HTTP/JSON (twisted.web), on loopback
by default. One root resource (L{AdminResource}) serves every route, so another
resource can wrap it (authentication) as a whole.

Routes (answers are JSON; errors are C{{"error": text}} with a 4xx/5xx status):

  - C{GET /info}: the broker's version, process id and role.
  - C{GET /stats}: every statistic (L{mqserver.broker.stats.Statistics.snapshot}), the
    broker's version and its replication status (on a slave: its master, whether it is
    connected, the eventId applied, the lag).
  - C{GET /topics}: the topics with their counts; C{POST /topics} C{{"name", "queues"}}
    creates one; C{GET /topics/NAME} its details and consumers; C{DELETE /topics/NAME}.
  - C{GET /topics/NAME/messages?n=N} the last N messages; C{&after=EVENTID} the next N
    after an eventId (what C{mqctl tail} polls).
  - C{GET /consumers[?topic=T]}: every consumer (lag, in flight, out, requeues).
  - C{POST /consumers/rewind} C{{"topic", "name", "kind"?, "time_ms" | "event_id"}}.
  - C{GET /trace?door=D[&conn=N][&command=C][&raw=1]}: the wire trace of front door D, a
    long-lived answer of JSON lines, one per frame (L{mqserver.trace}); it ends when
    the client goes.
  - C{GET /faults}: the fault rules in force; C{POST /faults} a rule
    (L{mqserver.faults.FaultRules.add}) adds one; C{DELETE /faults} clears them all,
    C{DELETE /faults/ID} one. Only with C{admin.faults: true}; else 403.
"""

import json
import os

from twisted.internet import defer
from twisted.internet.interfaces import IPushProducer
from twisted.logger import Logger
from twisted.web import resource, server
from zope.interface import implementer

from mqserver.errors import BrokerError, NotMaster, TopicExists, TopicNotFound
from mqserver import webrequest
from mqserver.replication.status import replication_status
from mqserver.security import BearerTokenResource
from mqserver.version import version

from protocols.admin import messages

_KINDS = ("channel", "rocketmq", "smss", "msgout")

#: the largest request body (JSON) the admin API takes
MAX_BODY = 1 << 20
#: this door's name under C{listen:} (what a replica group's members publish it as)
ADMIN_DOOR = "admin"


class ApiError(Exception):
    """An answer with an error status."""

    def __init__(self, status, text):
        super().__init__(text)
        self.status = status


def _json_body(request):
    try:
        data = json.loads(request.content.read() or b"{}")
    except (ValueError, RecursionError):  # RecursionError: nested too deep
        raise ApiError(400, "the body is not JSON") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object")
    return data


def _int_arg(request, name, default=None):
    v = request.args.get(name.encode())
    if not v:
        return default
    try:
        return int(v[0])
    except ValueError:
        raise ApiError(400, f"{name} must be an integer") from None


class AdminResource(resource.Resource):
    """Every route of the admin API."""

    isLeaf = True
    log = Logger()

    def __init__(self, broker, max_peek=1000, master="", faults=False):
        super().__init__()
        self.broker = broker
        self.stats = broker.stats
        self.max_peek = max_peek
        self.master = master
        self.faults = faults

    def render(self, request):
        parts = [p.decode("utf-8", "replace") for p in request.postpath if p]
        try:
            result = self._route(request, request.method, parts)
        except ApiError as e:
            return self._error(request, e.status, str(e))
        if result is server.NOT_DONE_YET:  # a stream: it writes and finishes itself
            return result
        if isinstance(result, defer.Deferred):
            gone = webrequest.departure(request)
            result.addCallbacks(lambda r: self._finish(request, 200, r, gone),
                                lambda f: self._failed(request, f, gone))
            return server.NOT_DONE_YET
        return self._answer(request, 200, result)

    def _route(self, request, method, parts):
        routes = {
            ("GET", ("info",)): self.info,
            ("GET", ("stats",)): self.stats_answer,
            ("GET", ("topics",)): self.topics,
            ("POST", ("topics",)): lambda: self.create_topic(_json_body(request)),
            ("GET", ("consumers",)): lambda: self.consumers(request),
            ("POST", ("consumers", "rewind")): lambda: self.rewind(_json_body(request)),
            ("POST", ("promote",)): self.promote,
            ("GET", ("trace",)): lambda: self.trace(request),
            ("GET", ("faults",)): lambda: self._fault_rules().list(),
            ("POST", ("faults",)): lambda: self.add_fault(_json_body(request)),
            ("DELETE", ("faults",)): lambda: {"cleared": self._fault_rules().clear()},
        }
        verb = method.decode()
        key = tuple(parts)
        if (verb, key) in routes:
            return routes[(verb, key)]()
        if len(parts) >= 2 and parts[0] == "topics":
            if len(parts) == 2 and verb == "GET":
                return self.topic(parts[1])
            if len(parts) == 2 and verb == "DELETE":
                return self.delete_topic(parts[1])
            if len(parts) == 3 and parts[2] == "messages" and verb == "GET":
                return self.messages(request, parts[1])
        if len(parts) == 2 and parts[0] == "faults" and verb == "DELETE":
            return self.clear_fault(parts[1])
        if any(k[1] == key for k in routes):
            raise ApiError(405, f"{verb} not allowed on /{'/'.join(parts)}")
        raise ApiError(404, f"no such route: /{'/'.join(parts)}")

    def promote(self):
        """A follower stops following and becomes the master (docs/replication.md)."""
        roles = self.broker.roles
        if roles is None:
            raise ApiError(409, "this broker cannot change its role")
        if self.broker.is_master:
            raise ApiError(409, "this broker is the master already")
        return roles.promote().addCallback(lambda term: {"role": "master", "term": term})

    # -- answers -------------------------------------------------------------------------

    def _answer(self, request, status, obj):
        request.setResponseCode(status)
        request.setHeader(b"Content-Type", b"application/json")
        return json.dumps(obj).encode() + b"\n"

    def _error(self, request, status, text):
        return self._answer(request, status, {"error": text})

    def _finish(self, request, status, obj, gone):
        if not gone:  # else the client left before the answer was ready
            request.write(self._answer(request, status, obj))
            request.finish()

    def _failed(self, request, f, gone):
        if f.check(ApiError):
            status, text = f.value.status, str(f.value)
        elif f.check(TopicNotFound):
            status, text = 404, f"topic {f.value} not found"
        elif f.check(TopicExists):
            status, text = 409, f"topic {f.value} exists"
        elif f.check(NotMaster):
            self._finish(request, 400, self._not_master(f.value), gone)
            return
        elif f.check(BrokerError):
            status, text = 400, str(f.value) or type(f.value).__name__
        else:
            self.log.failure("admin request failed", f)
            status, text = 500, "internal error"
        self._finish(request, status, {"error": text}, gone)

    def _not_master(self, error):
        # A write a follower refuses: the master's smss address, and in a replica group
        # the leader's admin door, where mqctl sends the request again.
        body = {"error": str(error)}
        if error.master:
            body["master"] = error.master
        group = self.broker.group
        admin = group.leader_address(ADMIN_DOOR) if group is not None else None
        if admin:
            body["masterAdmin"] = admin
        return body

    # -- topics --------------------------------------------------------------------------

    def _topic(self, name):
        t = self.broker.topic(name)
        if t is None:
            raise ApiError(404, f"topic {name} not found")
        return t

    def stats_answer(self):
        replication = replication_status(self.broker)
        if replication["role"] == "slave":
            # the master followed now (a replica group's leader, or after a promotion
            # elsewhere), not only the one configured
            replication["master"] = self.broker.master_address or self.master
        return dict(self.stats.snapshot(), version=version(), replication=replication)

    def info(self):
        return {"version": version(), "pid": os.getpid(),
                "role": "master" if self.broker.is_master else "slave"}

    def topics(self):
        out = []
        for t in self.broker.topics():
            msgs, nbytes = self.stats.topic_in(t.name)
            depth = sum(q.max_offset - q.min_offset for (n, _), q in self.broker.messages.open_queues()
                        if n == t.name)
            out.append({"name": t.name, "queues": t.queues, "state": t.state,
                        "messages": depth, "in_msgs": msgs, "in_bytes": nbytes,
                        "consumers": len(self.stats.all_consumers(t.name))})
        return out

    def topic(self, name):
        t = self._topic(name)
        info = self.stats.topic_stats(name)
        info.update({"queues_count": t.queues, "create_ts": t.create_ts,
                     "expire_at": t.expire_at, "state": t.state,
                     "create_event_id": t.create_event_id})
        return info

    def create_topic(self, body):
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise ApiError(400, "name is required")
        queues = body.get("queues", 1)
        if not isinstance(queues, int):
            raise ApiError(400, "queues must be an integer")
        d = self.broker.create_topic(name, queues=queues)
        return d.addCallback(lambda t: {"name": t.name, "queues": t.queues})

    def delete_topic(self, name):
        self._topic(name)
        return self.broker.delete_topic(name).addCallback(lambda _: {"deleted": name})

    def messages(self, request, name):
        t = self._topic(name)
        n = _int_arg(request, "n", 10)
        if not 1 <= n <= self.max_peek:
            raise ApiError(400, f"n must be 1..{self.max_peek}")
        after = _int_arg(request, "after")
        log = self.broker.messages
        if after is None:
            return messages.peek(log, name, range(t.queues), n)
        return messages.after(log, name, range(t.queues), after, n)

    # -- consumers -----------------------------------------------------------------------

    def consumers(self, request):
        topic = request.args.get(b"topic", [b""])[0].decode("utf-8", "replace") or None
        return [self.stats.consumer_stats(c) for c in self.stats.all_consumers(topic)]

    def rewind(self, body):
        topic, name, kind = body.get("topic"), body.get("name"), body.get("kind")
        if not isinstance(topic, str) or not isinstance(name, str):
            raise ApiError(400, "topic and name are required")
        ts, eid = body.get("time_ms"), body.get("event_id")
        if (ts is None) == (eid is None) or not isinstance(ts if ts is not None else eid, int):
            raise ApiError(400, "give one of time_ms and event_id, as an integer")
        if kind and kind not in _KINDS:
            raise ApiError(400, f"kind must be one of {', '.join(_KINDS)}")
        self._topic(topic)
        kinds = [kind] if kind else _KINDS
        found = [c for c in (self.stats.find(k, name, topic) for k in kinds) if c is not None]
        if not found:
            raise ApiError(404, f"no consumer {name} on {topic}")
        if len(found) > 1:
            raise ApiError(409, f"{name} on {topic} is several consumers "
                                f"({', '.join(c.kind for c in found)}): give its kind")
        c = found[0]
        try:
            positions = self.stats.rewind(c, event_id=eid, ts_ms=ts)
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        out = self.stats.consumer_stats(c)
        out["positions"] = {str(q): o for q, o in sorted(positions.items())}
        return out


    # -- the wire trace ---------------------------------------------------------------------

    def trace(self, request):
        tap = self.broker.wiretap
        door = request.args.get(b"door", [b""])[0].decode("utf-8", "replace")
        if door not in tap.faults.doors():
            raise ApiError(400, f"door must be one of {', '.join(tap.faults.doors())}")
        command = request.args.get(b"command", [b""])[0].decode("utf-8", "replace") or None
        raw = request.args.get(b"raw", [b""])[0] in (b"1", b"true")
        stream = TraceStream(request)
        request.setHeader(b"Content-Type", b"application/x-ndjson")
        request.write(json.dumps({"tracing": door}).encode() + b"\n")
        stream.subscription = tap.trace.subscribe(
            stream.deliver, door, _int_arg(request, "conn"), command, raw)
        request.registerProducer(stream, True)
        request.notifyFinish().addBoth(lambda _: stream.stopProducing())
        return server.NOT_DONE_YET

    # -- fault rules -----------------------------------------------------------------------

    def _fault_rules(self):
        if not self.faults:
            raise ApiError(403, "fault rules are off: set admin.faults: true in the broker's "
                                "config to allow them")
        return self.broker.wiretap.faults

    def add_fault(self, body):
        try:
            rule = self._fault_rules().add(body)
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        return rule.to_dict(self.broker.wiretap.clock.seconds())

    def clear_fault(self, rule_id):
        rules = self._fault_rules()
        if not rule_id.isdigit():
            raise ApiError(400, "a fault rule's id is a number")
        if not rules.clear(int(rule_id)):
            raise ApiError(404, f"no fault rule {rule_id}")
        return {"cleared": 1}


@implementer(IPushProducer)
class TraceStream:
    """The wire trace written to one C{GET /trace} client, a JSON line a frame. While
    the client does not keep up (the transport's buffer is full) frames are counted,
    not buffered, and a line C{{"dropped": N}} says so when it catches up.

    @ivar subscription: the L{mqserver.trace.Subscription} feeding it.
    """

    def __init__(self, request):
        self.request = request
        self.subscription = None
        self.paused = False
        self.dropped = 0

    def deliver(self, event):
        if self.paused:
            self.dropped += 1
            return
        if self.dropped:
            self.request.write(json.dumps({"dropped": self.dropped}).encode() + b"\n")
            self.dropped = 0
        self.request.write(json.dumps(event).encode() + b"\n")

    def pauseProducing(self):
        self.paused = True

    def resumeProducing(self):
        self.paused = False

    def stopProducing(self):
        if self.subscription is not None:
            self.subscription.cancel()


class AdminSite(webrequest.Site):
    """The admin door's factory (quiet access log; JSON bodies of at most 1 MiB)."""

    max_body = MAX_BODY


def make_factory(broker, config, reactor):
    """Return the admin API site of C{broker}."""
    root = AdminResource(broker, config["admin.maxPeek"], master=config["master"],
                         faults=config["admin.faults"])
    token = config["admin.token"]
    site = AdminSite(BearerTokenResource(root, token) if token else root)
    site.displayTracebacks = False
    return site
