"""The console protocol (protocols/console) over StringTransport, a fake clock and a
real store."""

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from protocols.console.factory import ConsoleFactory
from tests.unit.test_msgout_queues import declare, open_broker, pub


class Conn:
    def __init__(self, factory, clock):
        self.clock = clock
        self.t = StringTransport()
        self.p = factory.buildProtocol(None)
        self.p.makeConnection(self.t)

    def send(self, line):
        self.p.dataReceived(line + b"\r\n")
        self.clock.advance(0)
        return self.out()

    def out(self):
        data = self.t.value()
        self.t.clear()
        return data

    def messages(self, data):
        """Parse MSG frames (and other lines) out of C{data}."""
        lines, msgs = [], []
        while data:
            line, _, data = data.partition(b"\r\n")
            if line.startswith(b"MSG "):
                _, q, eid, receipt, attempts, n = line.split(b" ")
                body, data = data[:int(n)], data[int(n) + 2:]
                msgs.append((q.decode(), int(eid), receipt.decode(), int(attempts), body))
            else:
                lines.append(line)
        return lines, msgs


def setup(tmp_path, **kw):
    clock = Clock()
    store, broker = open_broker(tmp_path, clock)
    return clock, store, broker, ConsoleFactory(broker, clock, **kw)


def test_help_unknown_and_bad_arguments_keep_the_connection(tmp_path):
    clock, store, broker, f = setup(tmp_path)
    c = Conn(f, clock)
    assert c.send(b"HELP").startswith(b"OK commands:")
    assert c.send(b"FROB x").startswith(b"ERR unknown command FROB")
    assert c.send(b"INFO").startswith(b"ERR usage")
    assert c.send(b"INFO nope") == b"ERR unknown queue nope\r\n"
    assert c.send(b"PEEK nope 0").startswith(b"ERR")
    assert c.send(b"PUB nope hi") == b"ERR unknown queue nope\r\n"
    assert c.send(b"ACK 1.2.3").startswith(b"ERR 1 of 1 not in flight")
    assert c.send(b"SUB q FROM").startswith(b"ERR")
    assert c.send(b"stats").startswith(b"OK topics=0")
    assert not c.t.disconnecting
    assert c.send(b"QUIT") == b"OK bye\r\n"
    assert c.t.disconnecting
    store.close()


def test_line_length_is_enforced(tmp_path):
    clock, store, broker, f = setup(tmp_path, max_line=64)
    c = Conn(f, clock)
    c.p.dataReceived(b"PUB q " + b"x" * 100)
    assert c.out().startswith(b"ERR line longer than 64 bytes")
    assert c.t.disconnecting
    store.close()


def test_pub_peek_topics_info_and_binary_bodies(tmp_path):
    clock, store, broker, f = setup(tmp_path)
    declare(broker, "q")
    c = Conn(f, clock)
    out = c.send(b"PUB q hello world")
    assert out.startswith(b"OK ")
    pub(broker, "q", b"two\r\nlines")
    lines, msgs = c.messages(c.send(b"PEEK q 5"))
    assert lines == [b"OK 2"]
    assert [(m[2], m[4]) for m in msgs] == [("-", b"hello world"), ("-", b"two\r\nlines")]
    assert c.send(b"TOPICS") == b"OK 1\r\nq queue\r\n"
    assert b"messages=2" in c.send(b"INFO q")
    store.close()


def test_fetch_ack_from_another_connection_and_drop_fails_back(tmp_path):
    clock, store, broker, f = setup(tmp_path)
    declare(broker, "q")
    pub(broker, "q", b"a", b"b", b"c")
    c1, c2 = Conn(f, clock), Conn(f, clock)
    lines, msgs = c1.messages(c1.send(b"FETCH q 2"))
    assert lines == [b"OK 2"] and [m[4] for m in msgs] == [b"a", b"b"]
    assert c2.send(b"ACK " + msgs[0][2].encode()) == b"OK 1\r\n"  # another connection
    c1.p.connectionLost(None)  # b goes back at once
    lines, again = c2.messages(c2.send(b"FETCH q 5"))
    assert [(m[4], m[3]) for m in again] == [(b"b", 2), (b"c", 1)]
    store.close()


def test_sub_pushes_until_drained_then_as_they_arrive(tmp_path):
    clock, store, broker, f = setup(tmp_path, window=2)
    declare(broker, "q1")
    declare(broker, "q2")
    pub(broker, "q1", b"a", b"b", b"c")
    c = Conn(f, clock)
    lines, msgs = c.messages(c.send(b"SUB q1 q2"))
    assert lines == [b"OK subscribed q1 q2"]
    assert [m[4] for m in msgs] == [b"a", b"b"]  # window 2
    lines, more = c.messages(c.send(b"ACK " + " ".join(m[2] for m in msgs).encode()))
    assert lines == [b"OK 2"]
    pub(broker, "q2", b"z")
    clock.advance(0)
    _, more2 = c.messages(c.out())
    assert sorted((m[0], m[4]) for m in more + more2) == [("q1", b"c"), ("q2", b"z")]
    store.close()


def test_tail_follows_until_any_input(tmp_path):
    clock, store, broker, f = setup(tmp_path)
    declare(broker, "t", mode="topic")
    pub(broker, "t", b"old")
    c = Conn(f, clock)
    assert c.send(b"TAIL t").startswith(b"OK tailing t")
    pub(broker, "t", b"new")
    clock.advance(0)
    _, msgs = c.messages(c.out())
    assert [m[4] for m in msgs] == [b"new"]
    assert c.send(b"") == b"OK tail ended\r\n"
    pub(broker, "t", b"after")
    clock.advance(0)
    assert c.out() == b""
    store.close()


def test_topic_mode_sub_with_ids_and_from(tmp_path):
    clock, store, broker, f = setup(tmp_path)
    declare(broker, "t", mode="topic")
    pub(broker, "t", b"x", b"y")
    a, b = Conn(f, clock), Conn(f, clock)
    _, ma = a.messages(a.send(b"SUB t ID one FROM earliest"))
    _, mb = b.messages(b.send(b"SUB t ID two FROM latest"))
    assert [m[4] for m in ma] == [b"x", b"y"] and mb == []
    first = ma[1][1]
    c = Conn(f, clock)
    _, mc = c.messages(c.send(b"SUB t FROM %d" % first))  # no id: follows from there
    assert [(m[4], m[2]) for m in mc] == [(b"y", "-")]
    store.close()
