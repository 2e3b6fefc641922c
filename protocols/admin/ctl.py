"""``mqctl``: the operator's command line over the broker's admin API (the ``admin``
front door, default http://127.0.0.1:9465; ``--url`` or ``MQCTL_URL`` to change it).

    mqctl topics | topic create NAME [--queues N] | topic delete NAME | topic info NAME
    mqctl consumers [--topic T] | lag [--topic T]
    mqctl rewind TOPIC@NAME (--time ISO8601 | --event N) [--kind channel|rocketmq|smss|msgout]
    mqctl peek TOPIC [-n N] | tail TOPIC [-n N] [--count N]
    mqctl stats
    mqctl cluster --group G [--etcd URL[,URL...]] | promote
    mqctl fault add --door DOOR [--command C] [--conn ID] [--address HOST[:PORT]]
                    [--every N] [--times N] [--seconds T] [--remark TEXT]
                    (--respond ERROR | --delay SECONDS | --drop | --close |
                     --split BYTES | --corrupt OFFSET)
    mqctl fault list | fault clear [ID] | fault run SCENARIO.yaml
    mqctl trace DOOR [--conn ID] [--command NAME] [--raw] [--count N]

Tables for people, ``--json`` for scripts. Exit status 0, 1 when the broker refused the
request, 2 when no broker answers. C{mqctl cluster} reads a replica group from etcd
(C{--etcd}, or C{MQCTL_ETCD}; default http://127.0.0.1:2379), not from a broker.
"""

import argparse
import datetime
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from mqserver.version import version

DEFAULT_URL = "http://127.0.0.1:9465"
DEFAULT_ETCD = "http://127.0.0.1:2379"


class NoBroker(Exception):
    """Nothing answers at the admin URL."""


class Refused(Exception):
    """The broker answered with an error.

    @ivar master_admin: the admin door (HOST:PORT) of the leader a replica group's
        follower named when it refused a write, else None."""

    def __init__(self, text, master_admin=None):
        super().__init__(text)
        self.master_admin = master_admin


class ScenarioFailed(Exception):
    """A scenario's step did not end as it should."""


class Api:
    """A blocking client of the admin API."""

    def __init__(self, url, timeout=10.0, token=""):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.headers = {"Content-Type": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"

    def call(self, method, path, body=None, **query):
        """Send one request and return its JSON answer. A write a replica group's
        follower refuses naming its leader's admin door is sent there once more (the
        refused one was not carried out), and later requests go there too."""
        try:
            return self._call(method, path, body, query)
        except Refused as e:
            if not e.master_admin:
                raise
            scheme = urllib.parse.urlsplit(self.url).scheme
            print(f"mqctl: {self.url} does not lead its group; sending the request to the"
                  f" leader at {e.master_admin}", file=sys.stderr)
            self.url = f"{scheme}://{e.master_admin}"
            return self._call(method, path, body, query)

    def _call(self, method, path, body, query):
        with self._open(method, path, body, self.timeout, query) as r:
            try:
                return json.loads(r.read())
            except (ConnectionError, TimeoutError) as e:
                raise NoBroker(f"the broker at {self.url} stopped answering ({e})") from None

    def stream(self, path, **query):
        """GET C{path}, a stream of JSON lines; yield each (no timeout: a stream may
        be quiet for long)."""
        with self._open("GET", path, None, None, query) as r:
            for line in r:
                if line.strip():
                    yield json.loads(line)

    def _open(self, method, path, body, timeout, query):
        q = {k: v for k, v in query.items() if v is not None}
        url = self.url + path + ("?" + urllib.parse.urlencode(q) if q else "")
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method, headers=self.headers)
        try:
            return urllib.request.urlopen(req, timeout=timeout)
        except urllib.error.HTTPError as e:
            if e.code == 401:
                raise Refused("unauthorized (HTTP 401): the admin door wants its token "
                              "(admin.token): pass --token or set MQCTL_TOKEN") from None
            try:
                answer = json.loads(e.read())
            except ValueError:
                answer = None
            if not isinstance(answer, dict):
                answer = {}
            raise Refused(f"{answer.get('error', e.reason)} (HTTP {e.code})",
                          answer.get("masterAdmin")) from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            reason = getattr(e, "reason", e)
            raise NoBroker(f"no broker answers at {self.url} ({reason}); is the admin door "
                           "listening (listen.admin)?") from None


def table(rows, columns):
    """Return C{rows} (dicts) as a text table of C{columns} ((title, key or function))."""
    cells = [[title for title, _ in columns]]
    for r in rows:
        cells.append([str(f(r) if callable(f) else r.get(f, "")) for _, f in columns])
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)


def _ts(ms):
    if not ms:
        return "-"
    return datetime.datetime.fromtimestamp(ms / 1000).isoformat(sep=" ", timespec="milliseconds")


def parse_time(text):
    """Return ms since the epoch of an ISO 8601 time (local time when it has no zone)."""
    try:
        dt = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise SystemExit(f"mqctl: --time wants an ISO 8601 time, not {text!r}") from None
    return int(dt.timestamp() * 1000)


CONSUMER_COLUMNS = [("TOPIC", "topic"), ("KIND", "kind"), ("NAME", "name"), ("LAG", "lag"),
                    ("IN FLIGHT", "in_flight"), ("OUT", "out_msgs"), ("REQUEUES", "requeues"),
                    ("CLIENTS", lambda r: len(r.get("clients", [])))]


def cmd_topics(api, args):
    rows = api.call("GET", "/topics")
    return rows, table(rows, [("TOPIC", "name"), ("QUEUES", "queues"), ("MESSAGES", "messages"),
                              ("IN", "in_msgs"), ("IN BYTES", "in_bytes"),
                              ("CONSUMERS", "consumers")])


def cmd_topic(api, args):
    name = urllib.parse.quote(args.name, safe="")
    if args.action == "create":
        r = api.call("POST", "/topics", {"name": args.name, "queues": args.queues})
        return r, f"created {r['name']} ({r['queues']} queue{'s' if r['queues'] != 1 else ''})"
    if args.action == "delete":
        r = api.call("DELETE", f"/topics/{name}")
        return r, f"deleted {args.name}"
    r = api.call("GET", f"/topics/{name}")
    lines = [f"topic      {r['topic']}", f"queues     {r['queues_count']}",
             f"created    {_ts(r['create_ts'])} (eventId {r['create_event_id']})",
             f"expires    {_ts(r['expire_at'])}",
             f"in         {r['in_msgs']} messages, {r['in_bytes']} bytes since the start", ""]
    qrows = [dict(v, queue=q) for q, v in r["queues"].items()]
    lines.append(table(qrows, [("QUEUE", "queue"), ("MIN OFFSET", "min_offset"),
                               ("MAX OFFSET", "max_offset"), ("IN", "in_msgs"),
                               ("IN BYTES", "in_bytes")]))
    if r["consumers"]:
        lines += ["", table(r["consumers"], CONSUMER_COLUMNS)]
    return r, "\n".join(lines)


def cmd_consumers(api, args):
    rows = api.call("GET", "/consumers", topic=args.topic)
    return rows, table(rows, CONSUMER_COLUMNS)


def cmd_lag(api, args):
    rows = sorted(api.call("GET", "/consumers", topic=args.topic), key=lambda r: -r["lag"])
    return rows, table(rows, [("LAG", "lag"), ("TOPIC", "topic"), ("KIND", "kind"),
                              ("NAME", "name"), ("IN FLIGHT", "in_flight")])


def cmd_rewind(api, args):
    topic, sep, name = args.consumer.partition("@")
    if args.topic:
        topic, name = args.topic, args.consumer
    elif not sep:
        raise SystemExit("mqctl: name the consumer as TOPIC@NAME (or give --topic)")
    body = {"topic": topic, "name": name, "kind": args.kind}
    if args.time is not None:
        body["time_ms"] = parse_time(args.time)
    else:
        body["event_id"] = args.event
    r = api.call("POST", "/consumers/rewind", body)
    pos = ", ".join(f"queue {q} at {o}" for q, o in r["positions"].items())
    return r, f"rewound {r['kind']} {r['name']} on {r['topic']}: {pos}; lag now {r['lag']}"


def _body(m):
    if "body_base64" in m:
        return "base64:" + m["body_base64"]
    return m.get("body", "")


PEEK_COLUMNS = [("EVENTID", "event_id"), ("QUEUE", "queue"), ("OFFSET", "offset"),
                ("STORED", lambda m: _ts(m["store_ts"])), ("BODY", _body),
                ("PROPERTIES", lambda m: json.dumps(m["properties"]) if m.get("properties")
                 else "")]


def _message_lines(msgs):
    out = []
    for m in msgs:
        props = " " + json.dumps(m["properties"]) if m.get("properties") else ""
        out.append(f"{m['event_id']:>10}  q{m['queue']}:{m['offset']}  {_ts(m['store_ts'])}  "
                   f"{_body(m)}{props}")
    return out


def cmd_peek(api, args):
    msgs = api.call("GET", f"/topics/{urllib.parse.quote(args.topic, safe='')}/messages", n=args.n)
    if not msgs:
        return msgs, "(no messages)"
    return msgs, table(msgs, PEEK_COLUMNS)


def cmd_tail(api, args, out=sys.stdout):
    path = f"/topics/{urllib.parse.quote(args.topic, safe='')}/messages"
    last = api.call("GET", path, n=args.n)
    seen = 0
    after = 0
    while True:
        for m in last:
            print(json.dumps(m) if args.json else _message_lines([m])[0], file=out, flush=True)
            after = max(after, m["event_id"])
            seen += 1
            if args.count and seen >= args.count:
                return None, None
        if not last and after == 0:
            after = api.call("GET", "/stats")["next_event_id"] - 1
        time.sleep(args.interval)
        last = api.call("GET", path, n=1000, after=after)


def cmd_stats(api, args):
    s = api.call("GET", "/stats")
    r = s["rates"]
    lines = [f"in   {s['in_msgs']} messages, {s['in_bytes']} bytes since the start; "
             f"{r['put_10s']}/s (10 s), {r['put_60s']}/s (1 min), {r['put_600s']}/s (10 min)",
             f"out  {s['out_msgs']} messages, {s['out_bytes']} bytes; "
             f"{r['get_10s']}/s (10 s), {r['get_60s']}/s (1 min), {r['get_600s']}/s (10 min)", ""]
    doors = [{"door": d, "n": len(a), "addrs": " ".join(a)} for d, a in s["connections"].items()]
    lines.append(table(doors, [("DOOR", "door"), ("CONNECTIONS", "n"), ("CLIENTS", "addrs")]))
    if s.get("replicas"):
        lines += ["", table(s["replicas"], [("SLAVE", "slave"), ("SENT EVENTID", "sent_event_id"),
                                            ("LAG (EVENTIDS)", "lag_events")])]
    rep = s.get("replication") or {}
    if rep.get("role") == "slave":
        state = "connected" if rep.get("connected") else "NOT connected"
        lines += ["", f"slave of {rep.get('master') or '?'} ({state}): applied eventId "
                      f"{rep['appliedEventId']}, lag {rep.get('lagMs', 0)} ms, "
                      f"{rep.get('records', 0)} records applied since the start"]
    return s, "\n".join(lines)


def read_group(endpoints, group, timeout=5.0):
    """The L{mqserver.cluster.group.GroupView} of C{group}, read from the first of the
    etcd C{endpoints} that answers. Raises L{NoBroker} when none does."""
    from mqserver.cluster.etcd import KeyValue, range_body
    from mqserver.cluster.group import GroupView, group_prefix
    from mqserver.config import etcd_endpoints

    body = json.dumps(range_body(group_prefix(group), prefix=True)).encode()
    failures = []
    for url in etcd_endpoints(endpoints):
        req = urllib.request.Request(url + "/v3/kv/range", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                reply = json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise Refused(f"etcd at {url} answered HTTP {e.code}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError) as e:
            failures.append(f"{url}: {getattr(e, 'reason', e)}")
            continue
        kvs = [KeyValue.from_json(kv) for kv in reply.get("kvs", ())]
        return GroupView(group, kvs, int(reply.get("header", {}).get("revision", 0)))
    raise NoBroker("no etcd answers (" + "; ".join(failures or ["no endpoint given"]) + ")")


def cmd_cluster(api, args):
    view = read_group(args.etcd, args.group)
    rows = view.rows()
    data = {"group": args.group, "epoch": view.epoch,
            "leader": (view.leader or {}).get("name"), "members": rows}
    lines = [f"group {args.group}: leader {data['leader'] or '(none)'}, epoch {view.epoch}"]
    if rows:
        lines += ["", table(rows, [
            ("NAME", "name"), ("ROLE", "role"), ("EPOCH", "epoch"), ("EVENTID", "eventId"),
            ("LAG", lambda r: "-" if r["lag"] is None else r["lag"]),
            ("ADDRESSES", lambda r: " ".join(f"{k}={v}" for k, v in sorted(
                r["addresses"].items())) if isinstance(r["addresses"], dict)
             else r["addresses"])])]
    else:
        lines.append("no member has published itself")
    return data, "\n".join(lines)


def cmd_promote(api, args):
    r = api.call("POST", "/promote")
    term = "" if r.get("term") is None else f", term {r['term']}"
    return r, f"promoted: this broker is the master{term}"


FAULT_ACTIONS = ("respond", "delay", "drop", "close", "split", "corrupt")


def fault_spec(args):
    """Return the admin API's rule (a dict) of C{mqctl fault add}'s arguments."""
    spec = {"door": args.door}
    for key in ("command", "conn", "address", "every", "times", "seconds", "remark"):
        v = getattr(args, key)
        if v is not None:
            spec[key] = v
    for action in FAULT_ACTIONS:
        v = getattr(args, action)
        if v is not None and v is not False:
            spec[action] = v
    return spec


def _left(rule):
    parts = []
    if rule["times_left"] is not None:
        parts.append(f"{rule['times_left']} use{'s' if rule['times_left'] != 1 else ''}")
    if rule["seconds_left"] is not None:
        parts.append(f"{rule['seconds_left']} s")
    return ", ".join(parts) or "-"


FAULT_COLUMNS = [("ID", "id"), ("DOOR", "door"), ("COMMAND", lambda r: r["command"] or "*"),
                 ("CONN", lambda r: r["conn"] or "*"), ("ADDRESS", lambda r: r["address"] or "*"),
                 ("ACTION", "action"),
                 ("VALUE", lambda r: "" if r["value"] is None else r["value"]),
                 ("EVERY", "every"), ("LEFT", _left), ("APPLIED", "applied")]


def cmd_fault(api, args):
    if args.action == "run":
        return cmd_fault_run(api, args)
    if args.action == "add":
        r = api.call("POST", "/faults", fault_spec(args))
        return r, f"rule {r['id']} added: {r['action']} on {r['door']} ({_left(r)} left)"
    if args.action == "clear":
        if args.id is not None:
            r = api.call("DELETE", f"/faults/{args.id}")
            return r, f"rule {args.id} cleared"
        r = api.call("DELETE", "/faults")
        return r, f"{r['cleared']} rule{'s' if r['cleared'] != 1 else ''} cleared"
    rows = api.call("GET", "/faults")
    return rows, table(rows, FAULT_COLUMNS) if rows else "(no fault rule)"


def duration(value, what):
    """Return the seconds of C{value}: a number, or text such as C{5s}, C{500ms},
    C{2m}."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    text = str(value).strip()
    for suffix, scale in (("ms", 0.001), ("s", 1.0), ("m", 60.0)):
        if text.endswith(suffix):
            try:
                seconds = float(text[:-len(suffix)]) * scale
            except ValueError:
                break
            if seconds >= 0:
                return seconds
            break
    raise SystemExit(f"mqctl: {what} wants a duration such as 5s, 500ms or 2m, not {value!r}")


def load_scenario(path):
    """Return the steps of the scenario file C{path}: a YAML list of steps, each with
    C{rules} (the admin API's rules) and either C{after} (a duration: the step's rules
    are cleared then) or C{until: used} (the step ends when its rules have ended, within
    C{timeout}, 60s by default)."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            steps = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        raise SystemExit(f"mqctl: cannot read the scenario {path}: {e}") from None
    if not isinstance(steps, list) or not steps:
        raise SystemExit(f"mqctl: {path}: a scenario is a YAML list of steps")
    out = []
    for i, step in enumerate(steps, 1):
        where = f"{path}: step {i}"
        if not isinstance(step, dict) or not isinstance(step.get("rules"), list) \
                or not step["rules"] or not all(isinstance(r, dict) for r in step["rules"]):
            raise SystemExit(f"mqctl: {where}: give its rules, a list of rules")
        unknown = set(step) - {"name", "rules", "after", "until", "timeout"}
        if unknown:
            raise SystemExit(f"mqctl: {where}: unknown key(s) {', '.join(sorted(unknown))}")
        if ("after" in step) == ("until" in step) or step.get("until", "used") != "used":
            raise SystemExit(f"mqctl: {where}: give after: DURATION or until: used")
        out.append({"name": step.get("name") or f"step {i}", "rules": step["rules"],
                    "after": duration(step["after"], "after") if "after" in step else None,
                    "timeout": duration(step.get("timeout", 60), "timeout")})
    return out


def cmd_fault_run(api, args, out=sys.stdout, sleep=time.sleep, clock=time.monotonic):
    """Run a scenario's steps in order; every rule it added is cleared at its end, also
    when it fails or is interrupted."""
    steps = load_scenario(args.scenario)
    live = []
    try:
        for step in steps:
            ids = []
            for spec in step["rules"]:
                ids.append(api.call("POST", "/faults", spec)["id"])
                live.append(ids[-1])
            wait = (f"for {step['after']:g} s" if step["after"] is not None
                    else f"until they are used up (at most {step['timeout']:g} s)")
            print(f"{step['name']}: rule{'s' if len(ids) > 1 else ''} "
                  f"{', '.join(map(str, ids))} {wait}", file=out, flush=True)
            deadline = clock() + (step["after"] if step["after"] is not None else step["timeout"])
            while True:
                rules = {r["id"]: r for r in api.call("GET", "/faults")}
                left = [i for i in ids if i in rules]
                if (step["after"] is None and not left) or clock() >= deadline:
                    break
                sleep(min(args.interval, max(0.0, deadline - clock())))
            for i in ids:
                state = (f"applied {rules[i]['applied']} times" if i in rules else "used up")
                print(f"  rule {i}: {state}", file=out, flush=True)
            if step["after"] is None and left:
                raise ScenarioFailed(f"{step['name']}: rule(s) {', '.join(map(str, left))} "
                              f"not used up in {step['timeout']:g} s")
            for i in left:
                api.call("DELETE", f"/faults/{i}")
            live = [i for i in live if i not in ids]
        print("scenario done", file=out, flush=True)
    finally:
        for i in live:
            try:
                api.call("DELETE", f"/faults/{i}")
            except Refused:
                pass  # ended meanwhile
    return None, None


def _fault_parser(sub):
    f = sub.add_parser("fault", help="fault rules (needs admin.faults: true on the broker)")
    fsub = f.add_subparsers(dest="action", required=True)
    add = fsub.add_parser("add", help="add a rule")
    add.add_argument("--door", required=True,
                     help="front door: broker, namesrv, nsqd_tcp, nsqd_http, lookupd_http, smss, "
                          "msgout")
    add.add_argument("--command", help="RocketMQ request code or name, NSQ verb, smss "
                                        "command, HTTP route; default: any")
    add.add_argument("--conn", type=int, help="only this connection id")
    add.add_argument("--address", help="only connections from HOST or HOST:PORT")
    add.add_argument("--every", type=int, help="act on every Nth matching request")
    add.add_argument("--times", type=int, help="end after N uses")
    add.add_argument("--seconds", type=float, help="end after T seconds")
    add.add_argument("--remark", help="the error's text (respond)")
    act = add.add_mutually_exclusive_group(required=True)
    act.add_argument("--respond", metavar="ERROR",
                     help="answer with this error (RocketMQ code, NSQ E_* code, smss "
                          "text, HTTP status)")
    act.add_argument("--delay", type=float, metavar="SECONDS", help="hold the answer back")
    act.add_argument("--drop", action="store_true", help="answer nothing")
    act.add_argument("--close", action="store_true", help="close the connection")
    act.add_argument("--split", type=int, metavar="BYTES",
                     help="write the answer BYTES at a time, 50 ms apart")
    act.add_argument("--corrupt", type=int, metavar="OFFSET",
                     help="invert the answer's byte at OFFSET (negative: from the end)")
    fsub.add_parser("list", help="the rules in force")
    clear = fsub.add_parser("clear", help="remove one rule, or all")
    clear.add_argument("id", nargs="?", type=int)
    run = fsub.add_parser("run", help="apply a scenario's steps of rules in order")
    run.add_argument("scenario", help="a YAML file (contrib/scenarios/ has examples)")
    run.add_argument("--interval", type=float, default=0.2, help="seconds between checks")
    f.set_defaults(fn=cmd_fault)


def trace_line(e, raw=False):
    """Return the text line of one wire trace event."""
    if "dropped" in e:
        return f"... {e['dropped']} frames dropped (mqctl did not keep up)"
    when = datetime.datetime.fromtimestamp(e["time"]).strftime("%H:%M:%S.%f")[:-3]
    arrow = {"in": ">", "out": "<", "fault": "!"}.get(e["dir"], e["dir"])
    size = "" if e["size"] is None else f" {e['size']} B"
    fields = " ".join(f"{k}={json.dumps(v) if isinstance(v, (dict, list)) else v}"
                      for k, v in e["fields"].items() if v not in (None, "", {}))
    line = f"{when} {e['door']}#{e['conn']} {e['peer']} {arrow} {e['command']}{size} {fields}"
    if raw and e.get("raw"):
        line += f" raw={e['raw']}"
    return line


def cmd_trace(api, args, out=sys.stdout):
    lines = api.stream("/trace", door=args.door, conn=args.conn, command=args.command,
                       raw=1 if args.raw else None)
    seen = 0
    for e in lines:
        if "tracing" in e:
            continue
        print(json.dumps(e) if args.json else trace_line(e, args.raw), file=out, flush=True)
        seen += 1
        if args.count and seen >= args.count:
            break
    return None, None


def build_parser():
    p = argparse.ArgumentParser(prog="mqctl", description="Operate a running mqserver broker.")
    p.add_argument("--url", default=os.environ.get("MQCTL_URL", DEFAULT_URL),
                   help=f"admin API address (default {DEFAULT_URL}, or MQCTL_URL)")
    p.add_argument("--token", default=os.environ.get("MQCTL_TOKEN", ""),
                   help="the admin door's bearer token (admin.token), or MQCTL_TOKEN")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--version", action="version", version=f"mqctl (mqserver) {version()}")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("topics", help="list topics").set_defaults(fn=cmd_topics)
    t = sub.add_parser("topic", help="create, delete or describe a topic")
    t.add_argument("action", choices=("create", "delete", "info"))
    t.add_argument("name")
    t.add_argument("--queues", type=int, default=1)
    t.set_defaults(fn=cmd_topic)
    for name, fn, what in (("consumers", cmd_consumers, "list consumers"),
                           ("lag", cmd_lag, "consumers by lag")):
        c = sub.add_parser(name, help=what)
        c.add_argument("--topic")
        c.set_defaults(fn=fn)
    r = sub.add_parser("rewind", help="move a consumer to a time or an eventId")
    r.add_argument("consumer", help="TOPIC@NAME (a RocketMQ group, NSQ channel, smss who, ...)")
    r.add_argument("--topic", help="the topic, when CONSUMER is only the name")
    r.add_argument("--kind", choices=("channel", "rocketmq", "smss", "msgout"))
    when = r.add_mutually_exclusive_group(required=True)
    when.add_argument("--time", help="ISO 8601: the first message stored at or after it")
    when.add_argument("--event", type=int, help="eventId: the first message at or after it")
    r.set_defaults(fn=cmd_rewind)
    k = sub.add_parser("peek", help="the last messages of a topic")
    k.add_argument("topic")
    k.add_argument("-n", type=int, default=10)
    k.set_defaults(fn=cmd_peek)
    tl = sub.add_parser("tail", help="follow a topic's new messages")
    tl.add_argument("topic")
    tl.add_argument("-n", type=int, default=10, help="start with the last N")
    tl.add_argument("--count", type=int, default=0, help="stop after N messages")
    tl.add_argument("--interval", type=float, default=0.5, help="seconds between polls")
    tl.set_defaults(fn=cmd_tail)
    sub.add_parser("stats", help="broker totals, rates and connections").set_defaults(fn=cmd_stats)
    c = sub.add_parser("cluster", help="a replica group's members, roles, epochs and lag, "
                                       "from etcd")
    c.add_argument("--etcd", default=os.environ.get("MQCTL_ETCD", DEFAULT_ETCD),
                   help=f"etcd client URLs, comma-separated (default {DEFAULT_ETCD}, or "
                        "MQCTL_ETCD)")
    c.add_argument("--group", required=True, help="the group's name (cluster.group)")
    c.set_defaults(fn=cmd_cluster)
    sub.add_parser("promote", help="make a follower stop following and become the master"
                   ).set_defaults(fn=cmd_promote)
    tr = sub.add_parser("trace", help="every frame a front door reads and writes, live")
    tr.add_argument("door", help="front door: broker, namesrv, nsqd_tcp, smss, ...")
    tr.add_argument("--conn", type=int, help="only this connection id")
    tr.add_argument("--command", help="only this command (code, name, verb, route)")
    tr.add_argument("--raw", action="store_true", help="add each frame's bytes in hex")
    tr.add_argument("--count", type=int, default=0, help="stop after N frames")
    tr.set_defaults(fn=cmd_trace)
    _fault_parser(sub)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    api = Api(args.url, token=args.token)
    try:
        data, text = args.fn(api, args)
    except NoBroker as e:
        print(f"mqctl: {e}", file=sys.stderr)
        return 2
    except Refused as e:
        print(f"mqctl: the broker refused: {e}", file=sys.stderr)
        return 1
    except ScenarioFailed as e:
        print(f"mqctl: the scenario failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    if text is not None:
        print(json.dumps(data, indent=2) if args.json else text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
