"""The console line protocol through the shared in-process node (StringTransport with
disconnection, a Clock, a real store): lines split at every byte, several in one read,
an over-long line after good ones, a SUB's un-acked window when the connection goes,
and the ack timeout on the clock."""

from protocols.console.factory import make_factory
from tests.support.inprocess import door_fixtures, result_of

node, held = door_fixtures(make_factory)


def declare(node, name, **attrs):
    return result_of(node.broker.queues.declare(name, attrs))


def messages(data):
    """(lines, [(queue, attempts, body)]) of console output C{data}."""
    lines, msgs = [], []
    while data:
        line, _, data = data.partition(b"\r\n")
        if line.startswith(b"MSG "):
            _, q, _eid, _receipt, attempts, n = line.split(b" ")
            msgs.append((q.decode(), int(attempts), data[:int(n)]))
            data = data[int(n) + 2:]
        else:
            lines.append(line)
    return lines, msgs


def test_lines_fed_one_byte_at_a_time_with_lf_or_crlf(node):
    declare(node, "q")
    c = node.connect(node.factory)
    c.send_bytewise(b"PUB q one\nPUB q two\r\nPEEK q 2\r\n")
    lines, msgs = messages(c.take())
    assert lines[:2] == [b"OK 2", b"OK 3"] and lines[2] == b"OK 2"
    assert [m[2] for m in msgs] == [b"one", b"two"]
    assert c.connected


def test_pipelined_lines_in_one_read_answer_in_order(node):
    declare(node, "q")
    c = node.connect(node.factory)
    c.send(b"PUB q a\r\nFROB\r\n\r\nINFO\r\nTOPICS\r\n")
    assert c.take() == (b"OK 2\r\nERR unknown command FROB (try HELP)\r\n"
                        b"ERR usage: INFO <topic>\r\nOK 1\r\nq queue\r\n")
    assert c.connected


def test_over_long_line_after_good_ones_answers_them_then_closes(tmp_path):
    from tests.support.inprocess import running

    def door(broker, config, reactor):
        f = make_factory(broker, config, reactor)
        f.max_line = 32
        return f

    with running(tmp_path / "data", door) as n:
        c = n.connect(n.factory)
        c.send(b"HELP\r\nSTATS\r\n" + b"x" * 40)
        lines = c.take().split(b"\r\n")
        assert lines[0].startswith(b"OK commands:") and lines[1].startswith(b"OK topics=")
        assert lines[2] == b"ERR line longer than 32 bytes"
        assert not c.connected


def test_sub_window_goes_back_when_the_connection_is_lost(node):
    declare(node, "q")
    node.broker.queues.publish("q", [b"a", b"b", b"c"])
    c = node.connect(node.factory)
    c.send(b"SUB q\r\n")
    node.clock.advance(0)
    lines, msgs = messages(c.take())
    assert lines == [b"OK subscribed q"] and [m[2] for m in msgs] == [b"a", b"b", b"c"]
    c.lose()
    d = node.connect(node.factory)
    d.send(b"FETCH q 5\r\n")
    lines, msgs = messages(d.take())
    assert lines == [b"OK 3"]
    assert [(m[2], m[1]) for m in msgs] == [(b"a", 2), (b"b", 2), (b"c", 2)]


def test_unacked_fetch_comes_back_after_the_ack_timeout(node):
    declare(node, "q", ack_timeout_ms=5000)
    node.broker.queues.publish("q", [b"a"])
    c = node.connect(node.factory)
    c.send(b"FETCH q\r\n")
    assert [m[2] for m in messages(c.take())[1]] == [b"a"]
    node.clock.advance(4.9)
    c.send(b"FETCH q\r\n")
    assert c.take() == b"OK 0\r\n"
    node.clock.advance(0.2)
    c.send(b"FETCH q\r\n")
    assert [(m[2], m[1]) for m in messages(c.take())[1]] == [(b"a", 2)]


def declared(held, name, **attrs):
    """Declare on the held node (the declaration's write waits for its fsync too)."""
    d = held.broker.queues.declare(name, attrs)
    held.runner.release()
    return result_of(d)


def test_replies_keep_the_command_order_while_a_pub_waits_for_its_fsync(held):
    declared(held, "q", persistent=True)
    c = held.connect(held.factory)
    c.send(b"PUB q a\r\nSTATS\r\nPUB nope x\r\nTOPICS\r\nQUIT\r\nHELP\r\n")
    assert c.take() == b"", "nothing may overtake the PUB's reply"
    assert c.connected, "QUIT waits for the replies before it"
    held.runner.release()
    lines = c.take().split(b"\r\n")
    assert lines[0] == b"OK 2"
    assert lines[1].startswith(b"OK topics=1 ")
    assert lines[2:] == [b"ERR unknown queue nope", b"OK 1", b"q queue", b"OK bye", b""]
    assert not c.connected


def test_pushed_messages_go_between_replies_never_before_a_pending_one(held):
    declared(held, "q")
    d = held.broker.queues.publish("q", [b"old"])
    held.runner.release()
    result_of(d)
    c = held.connect(held.factory)
    c.send(b"SUB q\r\nPUB q new\r\nTOPICS\r\n")
    held.clock.advance(0)  # the SUB's pump: "old" waits behind the PUB's reply
    assert c.take() == b"OK subscribed q\r\n"
    held.runner.release()
    held.clock.advance(0)  # the pump of the arrival
    lines, msgs = messages(c.take())
    assert lines == [b"OK 3", b"OK 1", b"q queue"]
    assert [m[2] for m in msgs] == [b"old", b"new"]


def test_over_long_line_after_a_pending_pub_closes_after_its_reply(held):
    declared(held, "q")
    c = held.connect(held.factory)
    c.send(b"PUB q a\r\n" + b"x" * (held.factory.max_line + 10))
    assert c.take() == b"" and c.connected
    held.runner.release()
    assert c.take() == b"OK 2\r\nERR line longer than %d bytes\r\n" % held.factory.max_line
    assert not c.connected


def test_a_client_pipelining_without_end_is_read_no_further_until_replies_drain(held):
    from protocols.console.protocol import MAX_PENDING

    declared(held, "q")
    c = held.connect(held.factory)
    c.send(b"PUB q m\r\n" * (MAX_PENDING + 1))
    assert c.take() == b""
    assert c.transport.producerState == "paused", "reading stops past MAX_PENDING"
    held.runner.release()
    assert c.take().count(b"\r\n") == MAX_PENDING + 1
    assert c.transport.producerState == "producing"


def test_a_client_that_does_not_read_is_not_read_and_is_answered_on_resume(node):
    c = node.connect(node.factory)
    c.protocol.pauseProducing()  # what the transport does when its write buffer is full
    assert c.transport.producerState == "paused", "no reading while it cannot write"
    c.send(b"STATS\r\nHELP\r\n")
    assert c.take() == b""
    c.protocol.resumeProducing()
    assert c.transport.producerState == "producing"
    lines = c.take().split(b"\r\n")
    assert lines[0].startswith(b"OK topics=") and lines[1].startswith(b"OK commands:")
    assert lines[2:] == [b""] and c.connected
