"""The console line protocol: telnet-style debugging and msgout's long connection.

Every reply starts with C{OK} or C{ERR <reason>}. A message is
C{MSG <queue> <id> <receipt> <attempts> <bytes>} followed by its body and CRLF (the byte
count tells where the body ends; C{-} stands for no receipt). Lines end with LF or CRLF.

Replies carry no tag, so they go out in the order of the commands even when one waits
(a PUB to a persistent queue is answered after its fsync): what is written while a reply
is pending waits behind it. Pushed messages (SUB, TAIL) go out between replies, never
inside one.

What this connection holds un-acked (FETCH and SUB) goes back to its queue at once when
the connection drops; receipts can be acked from any connection (or over HTTP).
"""

import shlex
from collections import deque

from twisted.internet.interfaces import IPushProducer
from twisted.logger import Logger
from twisted.protocols.basic import LineReceiver
from zope.interface import implementer

from mqserver.broker.queue_consumer import cursor_deliveries
from mqserver.errors import BrokerError, TopicNotFound
from mqserver.interfaces import IWatcher
from mqserver.runtime.output import Output, no_delay
from mqserver.security import LineTokenGate
from mqserver.message import Message

HELP = ("commands: HELP | STATS | TOPICS | INFO <t> | PUB <t> <text> | PEEK <t> [n] | "
        "TAIL <t> | FETCH <q> [n] [FROM earliest|latest|<id>] [ID <sub_id>] | "
        "SUB <q>... [FROM latest|earliest|<id>] [ID <sub_id>] | ACK <receipt>... | "
        "NACK <receipt>... | QUIT")


#: Replies waiting for a write (and what waits behind them) past which the connection
#: stops reading until they drain: a client pipelining without reading is bounded.
MAX_PENDING = 512


class CommandError(Exception):
    """A bad command or argument: answered with C{ERR <text>}."""


def _start(word):
    if word in ("latest", "earliest"):
        return word
    if word.isdigit():
        return int(word)
    raise CommandError("FROM takes latest, earliest or a message id")


def _count(word, hi):
    if not word.isdigit() or not 1 <= int(word) <= hi:
        raise CommandError(f"count must be 1..{hi}")
    return int(word)


def _options(args, allowed):
    """Split trailing C{FROM x} / C{ID x} options off C{args}; returns (rest, options)."""
    rest, opts = [], {}
    i = 0
    while i < len(args):
        key = args[i].upper()
        if key in allowed and i + 1 < len(args):
            opts[key] = args[i + 1]
            i += 2
        elif key in allowed:
            raise CommandError(f"{key} needs a value")
        else:
            rest.append(args[i])
            i += 1
    return rest, opts


@implementer(IWatcher)
class _Follower:
    """Follows a topic from a cursor (TAIL, and SUB of a topic-mode queue without an id),
    writing each message; reads a bounded chunk per turn while the transport keeps up."""

    CHUNK = 100

    def __init__(self, proto, name, cursor):
        self.proto = proto
        self.name = name
        self.cursor = cursor
        self._call = None
        proto.broker.watch(name, self)
        proto.broker.track_cursor(cursor)
        self.kick()

    def kick(self):
        if self._call is None and self.cursor is not None:
            self._call = self.proto.reactor.callLater(0, self._run)

    def _run(self):
        self._call = None
        if self.proto.paused or self.proto.answers or self.cursor is None:
            return  # kicked again when the transport or the pending replies let it
        ds = cursor_deliveries(self.name, self.cursor, self.CHUNK)
        for d in ds:
            self.proto.send_message(d)
        if len(ds) == self.CHUNK:
            self.kick()

    def data_available(self, topic, queue_id):
        self.kick()

    def topic_deleted(self, topic):
        self.proto.sendLine(b"ERR queue " + topic.encode() + b" was deleted")
        self.stop()

    def stop(self):
        if self.cursor is None:
            return
        self.proto.broker.unwatch(self.name, self)
        self.proto.broker.close_cursor(self.cursor)
        self.cursor = None
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None


@implementer(IPushProducer)
class ConsoleProtocol(LineReceiver):
    """One console connection."""

    delimiter = b"\n"
    log = Logger()

    def __init__(self, factory):
        self.factory = factory
        self.broker = factory.broker
        self.queues = factory.broker.queues
        self.reactor = factory.reactor
        self.MAX_LENGTH = factory.max_line
        self.gate = LineTokenGate(getattr(factory, "token", ""))
        self.consumers = {}  # (queue, sub_id or None, "sub"|"fetch") -> QueueConsumer
        self.followers = []
        self.tail = None
        self.paused = False
        self.output = Output(self)
        #: output waiting behind a reply not ready yet, in order: bytes, or a list that
        #: holds the reply once it is ready (empty until then)
        self.answers = deque()
        self.closing = False  # QUIT or an over-long line: closes after the replies
        #: why the transport is not read: "output" (its write buffer is full),
        #: "pending" (MAX_PENDING replies wait), "closing"
        self._holds = set()
        self.commands = {
            b"HELP": self.do_help, b"STATS": self.do_stats, b"TOPICS": self.do_topics,
            b"INFO": self.do_info, b"PUB": self.do_pub, b"PEEK": self.do_peek,
            b"TAIL": self.do_tail, b"FETCH": self.do_fetch, b"SUB": self.do_sub,
            b"ACK": self.do_ack, b"NACK": self.do_nack, b"QUIT": self.do_quit,
        }

    # -- connection ----------------------------------------------------------------------

    def connectionMade(self):
        no_delay(self.transport)
        self.factory.connections.add(self)
        self.transport.registerProducer(self, True)

    def connectionLost(self, reason):
        self.factory.connections.discard(self)
        self.answers.clear()  # nobody to write them to
        self._stop_following()
        for c in self.consumers.values():
            c.close(fail_back=True)
        self.consumers.clear()

    def pauseProducing(self):
        # The client does not read: run no more commands (LineReceiver parses no lines
        # while paused) and read no more, so nothing piles up on either side.
        self.paused = True
        self._hold("output")
        for c in self.consumers.values():
            c.window_saved, c.window = c.window, 0

    def resumeProducing(self):
        self.paused = False
        self._release("output")
        for c in self.consumers.values():
            if hasattr(c, "window_saved"):
                c.window = c.window_saved
                del c.window_saved
            c.channel.schedule_pump()
        self._kick_followers()
        self.dataReceived(b"")  # the lines that came while paused

    def _hold(self, why):
        """Stop reading the connection for reason C{why}."""
        if not self._holds:
            self.transport.pauseProducing()
        self._holds.add(why)

    def _release(self, why):
        """Read again once no reason holds it."""
        if why in self._holds:
            self._holds.discard(why)
            if not self._holds:
                self.transport.resumeProducing()

    def _kick_followers(self):
        for f in self.followers + ([self.tail] if self.tail else []):
            f.kick()

    def stopProducing(self):
        pass

    def lineLengthExceeded(self, line):
        if not self.closing:
            self.sendLine(b"ERR line longer than %d bytes" % self.MAX_LENGTH)
            self._close_when_answered()

    def _close_when_answered(self):
        """Close once every reply before this point is written; read nothing more."""
        self.closing = True
        if self.answers:
            self._hold("closing")
        else:
            self.transport.loseConnection()

    # -- dispatch (the one place every command goes through) ------------------------------

    def lineReceived(self, line):
        if self.closing:
            return
        if line.endswith(b"\r"):
            line = line[:-1]
        if self.tail is not None:  # any input ends a TAIL
            self.tail.stop()
            self.tail = None
            self.sendLine(b"OK tail ended")
            return
        if not line.strip():
            return
        if not self.gate.passed:  # console.token: AUTH <token> first, else closed
            reply, keep = self.gate.check(line)
            self.sendLine(reply)
            if not keep:
                self.transport.loseConnection()
            return
        cmd, _, rest = line.strip().partition(b" ")
        self.dispatch(cmd.upper(), rest)

    def dispatch(self, cmd, rest):
        """Run command C{cmd} (upper-case bytes) on the rest of its line."""
        fn = self.commands.get(cmd)
        if fn is None:
            self.sendLine(b"ERR unknown command " + cmd[:64] + b" (try HELP)")
            return
        try:
            fn(rest)
        except CommandError as e:
            self._err(str(e))
        except BrokerError as e:
            self.sendLine(self._error_line(e))

    def write(self, data):
        """Send C{data} now, or behind the replies still pending."""
        if self.answers:
            self.answers.append(data)
        else:
            self.output.write(data)

    def sendLine(self, line):
        self.write(line + b"\r\n")

    def _later(self, d):
        """Hold the reply's place for Deferred C{d}, which fires with its line."""
        slot = []
        self.answers.append(slot)
        if len(self.answers) > MAX_PENDING:
            self._hold("pending")

        def ready(line):
            slot.append(line + b"\r\n")
            self._flush()

        d.addErrback(self._failed).addCallback(ready)

    def _flush(self):
        """Write the pending output up to the first reply not ready yet."""
        answers, out = self.answers, []
        while answers:
            head = answers[0]
            if type(head) is list:
                if not head:
                    break
                head = head[0]
            out.append(head)
            answers.popleft()
        if out:
            self.output.write_sequence(out)
        if len(answers) <= MAX_PENDING // 2:
            self._release("pending")
        if answers:
            return
        if self.closing:
            self.transport.loseConnection()
        else:
            self._kick_followers()

    @staticmethod
    def _error_line(e):
        if isinstance(e, TopicNotFound):
            text = "unknown queue " + str(e)
        else:
            text = str(e) or type(e).__name__
        return b"ERR " + text.replace("\n", " ").encode("utf-8", "replace")

    def _err(self, text):
        self.sendLine(b"ERR " + text.replace("\n", " ").encode("utf-8", "replace"))

    def _ok(self, text=""):
        self.sendLine(b"OK " + text.encode("utf-8", "replace") if text else b"OK")

    def _failed(self, f):
        """The ERR line of a failed Deferred command."""
        if f.check(BrokerError):
            return self._error_line(f.value)
        self.log.failure("console command failed", f)
        return b"ERR internal error"

    @staticmethod
    def _args(rest):
        try:
            return shlex.split(rest.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise CommandError("arguments are not valid UTF-8 or have an open quote") from None

    def send_message(self, d):
        """Write one message: the MSG line, then the body and CRLF."""
        head = "MSG %s %d %s %d %d\r\n" % (d.queue, d.id, d.receipt or "-", d.attempts,
                                           len(d.body))
        if self.answers:  # one entry: nothing can land inside the frame
            self.answers.append(b"".join((head.encode("utf-8"), d.body, b"\r\n")))
        else:
            self.output.write_sequence((head.encode("utf-8"), d.body, b"\r\n"))

    # -- commands ------------------------------------------------------------------------

    def do_help(self, rest):
        self._ok(HELP)

    def do_stats(self, rest):
        b = self.broker
        topics = [t for t in b.topics() if b.topic(t.name) is not None]
        chans = [ch for by in b.channels.channels.values() for ch in by.values()]
        self._ok(" ".join(f"{k}={v}" for k, v in (
            ("topics", len(topics)), ("channels", len(chans)),
            ("in_flight", sum(len(ch.in_flight) for ch in chans)),
            ("depth", sum(ch.depth() for ch in chans)),
            ("push_subscriptions", len(self.queues.subscriptions)),
            ("connections", len(self.factory.connections)),
            ("next_id", b.messages.next_event_id))))

    def do_topics(self, rest):
        names = [t.name for t in self.broker.topics() if self.broker.topic(t.name)]
        self._ok(str(len(names)))
        for n in names:
            a = self.queues.attrs(n)
            self.sendLine(f"{n} {a['mode']}".encode("utf-8"))

    def do_info(self, rest):
        args = self._args(rest)
        if len(args) != 1:
            raise CommandError("usage: INFO <topic>")
        info = self.queues.info(args[0])
        self._ok(" ".join(f"{k}={v}" for k, v in info.items()
                          if not isinstance(v, (dict, list))))
        for sub, st in info.get("subs", {}).items():
            self.sendLine(("sub %s %s" % (sub, " ".join(f"{k}={v}" for k, v in st.items())))
                          .encode("utf-8"))

    def do_pub(self, rest):
        name, _, text = rest.partition(b" ")
        if not name or not text:
            raise CommandError("usage: PUB <topic> <text>")
        d = self.queues.publish(name.decode("utf-8", "replace"),
                                [Message(text, born_ts=self.broker.now_ms())])
        self._later(d.addCallback(lambda ids: b"OK %d" % ids[0]))

    def do_peek(self, rest):
        args = self._args(rest)
        if not 1 <= len(args) <= 2:
            raise CommandError("usage: PEEK <topic> [n]")
        n = _count(args[1], self.factory.peek_max) if len(args) == 2 else 1
        ds, _ = self.queues.read_from(args[0], "earliest", n)
        self._ok(str(len(ds)))
        for d in ds:
            self.send_message(d)

    def do_tail(self, rest):
        args = self._args(rest)
        if len(args) != 1:
            raise CommandError("usage: TAIL <topic>")
        _, cur = self.queues.read_from(args[0], "latest", 0)
        self._ok("tailing " + args[0] + " (send any line to stop)")
        self.tail = _Follower(self, args[0], cur)

    def _consumer(self, name, sub_id, kind, start, window):
        key = (name, sub_id, kind)
        c = self.consumers.get(key)
        if c is None or not c.open:
            c = self.queues.consumer(name, self._delivered, window, sub_id, start,
                                     on_closed=self._queue_gone)
            self.consumers[key] = c
        return c

    def _delivered(self, consumer, deliveries):
        for d in deliveries:
            self.send_message(d)

    def _queue_gone(self, consumer):
        for key, c in list(self.consumers.items()):
            if c is consumer:
                del self.consumers[key]
                if key[2] == "sub":
                    self.sendLine(b"ERR queue " + key[0].encode("utf-8") + b" was deleted")

    def do_fetch(self, rest):
        args, opts = _options(self._args(rest), ("FROM", "ID"))
        if not 1 <= len(args) <= 2:
            raise CommandError("usage: FETCH <q> [n] [FROM ...] [ID <sub_id>]")
        name = args[0]
        n = _count(args[1], self.factory.peek_max * 10) if len(args) == 2 else 1
        start = _start(opts["FROM"]) if "FROM" in opts else "earliest"
        sub_id = opts.get("ID")
        if self.queues.attrs(name)["mode"] == "topic" and sub_id is None:
            ds, _ = self.queues.read_from(name, start, n)
            self._ok(str(len(ds)))
            for d in ds:
                self.send_message(d)
            return
        got = []
        c = self._consumer(name, sub_id, "fetch", start, 0)
        c.sink = lambda c, ds: got.extend(ds)
        c.window = c.in_flight + n
        c.channel.pump()
        c.window = 0
        self._ok(str(len(got)))
        for d in got:
            self.send_message(d)

    def do_sub(self, rest):
        names, opts = _options(self._args(rest), ("FROM", "ID"))
        if not names:
            raise CommandError("usage: SUB <q>... [FROM latest|earliest|<id>] [ID <sub_id>]")
        sub_id = opts.get("ID")
        modes = {n: self.queues.attrs(n)["mode"] for n in names}  # all exist, or none
        if "FROM" in opts and sub_id is None and "queue" in modes.values():
            raise CommandError("FROM applies to topic-mode queues")
        for n in names:
            if modes[n] == "topic" and sub_id is None:
                start = _start(opts["FROM"]) if "FROM" in opts else "latest"
                _, cur = self.queues.read_from(n, start, 0)
                self.followers.append(_Follower(self, n, cur))
            else:
                start = _start(opts["FROM"]) if "FROM" in opts else "earliest"
                c = self._consumer(n, sub_id if modes[n] == "topic" else None, "sub", start,
                                   self.factory.window)
                c.channel.schedule_pump()
        self._ok("subscribed " + " ".join(names))

    def _receipts(self, rest, fn, verb):
        rs = rest.decode("utf-8", "replace").split()
        if not rs:
            raise CommandError(f"usage: {verb} <receipt>...")
        errors = fn(rs)
        if errors:
            self._err(f"{len(errors)} of {len(rs)} not in flight: " + " ".join(errors))
        else:
            self._ok(str(len(rs)))

    def do_ack(self, rest):
        self._receipts(rest, self.queues.ack, "ACK")

    def do_nack(self, rest):
        self._receipts(rest, self.queues.nack, "NACK")

    def do_quit(self, rest):
        self._ok("bye")
        self._close_when_answered()

    def _stop_following(self):
        for f in self.followers:
            f.stop()
        self.followers = []
        if self.tail is not None:
            self.tail.stop()
            self.tail = None

