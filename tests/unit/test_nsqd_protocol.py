"""NsqdProtocol in process (StringTransport, a Clock, a real store): partial frames,
pipelining, errors mid-stream, connection loss with work in flight, heartbeats and
message timeouts. Expected bytes are those of nsq-protocol.md §2.3."""

import json
import struct

import pytest

from protocols.nsq.factory import make_factory
from protocols.nsq.frames import FrameReader, decode_message
from tests.support.inprocess import NOW, door_fixtures, running

MAGIC = b"  V2"
# nsq-protocol.md §2.3
OK = bytes.fromhex("00000006000000004f4b")
CLOSE_WAIT = bytes.fromhex("0000000e00000000434c4f53455f57414954")
HEARTBEAT = bytes.fromhex("0000000f000000005f6865617274626561745f")


def pub(topic, body):
    return b"PUB %s\n" % topic + struct.pack(">I", len(body)) + body


def error_frame(text):
    return struct.pack(">ii", len(text) + 4, 1) + text


def frames(data):
    return FrameReader().feed(data)


def messages(data):
    out = []
    for kind, payload in frames(data):
        assert kind == 2, (kind, payload)
        out.append(decode_message(payload))
    return out


node, held = door_fixtures(make_factory)


def connect(node):
    c = node.connect(node.factory)
    c.send(MAGIC)
    return c


def consumer(node, rdy=10, channel=b"ch", msg_timeout_ms=None):
    c = connect(node)
    if msg_timeout_ms is not None:
        body = b'{"msg_timeout":%d}' % msg_timeout_ms
        c.send(b"IDENTIFY\n" + struct.pack(">I", len(body)) + body)
        assert c.take() == OK, "no feature negotiation: a plain OK"
    c.send(b"SUB t %s\nRDY %d\n" % (channel, rdy))
    assert c.take() == OK
    # the channel pumps on the next turn; frames wait for the output buffer timeout
    # (250 ms) while the consumer has RDY to spare
    node.clock.advance(0)
    node.clock.advance(0.25)
    return c


def test_pub_fed_one_byte_at_a_time(node):
    c = node.connect(node.factory)
    c.send_bytewise(MAGIC + pub(b"t", b"hello") + b"NOP\n")
    assert c.take() == OK
    assert c.connected
    assert node.store.queue("t", 0).max_offset == 1


def test_pipelined_commands_answer_in_order(node):
    c = connect(node)
    mpub = b"MPUB t\n" + struct.pack(">II", 14, 2) + struct.pack(">I", 1) + b"a" \
        + struct.pack(">I", 1) + b"b"
    c.send(pub(b"t", b"1") + b"NOP\n" + mpub + pub(b"t", b"2"))
    assert c.take() == OK * 3
    assert node.store.queue("t", 0).max_offset == 4


def test_non_fatal_error_mid_stream_keeps_the_connection(node):
    c = consumer(node)
    c.send(b"FIN 00000000000000ff\n" + pub(b"t", b"x"))
    assert frames(c.take()) == [
        (1, b"E_FIN_FAILED FIN 00000000000000ff failed ID not in flight"),
        (0, b"OK"),
    ]
    assert c.connected
    node.clock.advance(0)
    node.clock.advance(0.25)
    assert [m.body for m in messages(c.take())] == [b"x"]


def test_fatal_error_after_good_commands_answers_them_then_closes(node):
    c = connect(node)
    c.send(pub(b"t", b"1") + b"BOGUS\n" + pub(b"t", b"2"))
    assert c.take() == OK + error_frame(b"E_INVALID invalid command BOGUS")
    assert not c.connected
    assert node.store.queue("t", 0).max_offset == 1, "nothing after the fatal error runs"


def test_bad_magic_is_fatal(node):
    c = node.connect(node.factory)
    c.send_bytewise(b"  V3")
    assert c.take() == error_frame(b"E_BAD_PROTOCOL")
    assert not c.connected


def test_replies_wait_for_the_fsync_of_the_pub_ahead(held):
    c = connect(held)
    c.send(pub(held_topic := b"t", b"1"))  # creates the topic, then publishes
    held.runner.release()
    assert c.take() == OK
    c.send(pub(held_topic, b"2") + b"BOGUS\n")
    assert c.take() == b"", "the fatal error waits for the PUB ahead of it"
    assert c.connected
    held.runner.release()
    assert c.take() == OK + error_frame(b"E_INVALID invalid command BOGUS")
    assert not c.connected


def test_connection_lost_with_a_pub_waiting_for_fsync(held):
    c = connect(held)
    c.send(pub(b"t", b"1"))
    held.runner.release()
    c.take()
    c.send(pub(b"t", b"2"))
    c.lose()
    held.runner.release()
    assert c.take() == b""
    r = consumer(held)
    assert [m.body for m in messages(r.take())] == [b"1", b"2"], "the write was kept"


def test_delivery_frame_fin_and_rdy(node):
    connect(node).send(pub(b"t", b"hello") + pub(b"t", b"again"))
    c = consumer(node, rdy=1)
    out = c.take()
    assert out[:8] == struct.pack(">ii", 4 + 26 + 5, 2)
    (m,) = messages(out)
    assert (m.body, m.attempts, m.timestamp) == (b"hello", 1, int(NOW * 1e9))
    node.clock.advance(1)
    assert c.take() == b"", "RDY 1 holds the second message back"
    c.send(b"FIN " + m.msg_id + b"\n")
    node.clock.advance(0)
    assert [x.body for x in messages(c.take())] == [b"again"]


def test_in_flight_messages_of_a_lost_consumer_go_to_another_after_msg_timeout(node):
    connect(node).send(pub(b"t", b"1") + pub(b"t", b"2"))
    a = consumer(node, msg_timeout_ms=2000)
    assert [m.body for m in messages(a.take())] == [b"1", b"2"]
    b = consumer(node)
    a.lose()
    node.clock.advance(0)
    assert b.take() == b"", "in flight until they time out, as nsqd"
    node.clock.advance(1.5)
    assert b.take() == b""
    node.clock.advance(0.6)
    node.clock.advance(0.25)
    got = messages(b.take())
    assert sorted((m.body, m.attempts) for m in got) == [(b"1", 2), (b"2", 2)]


def test_touch_extends_the_timeout_and_req_redelivers_at_once(node):
    connect(node).send(pub(b"t", b"1"))
    c = consumer(node, rdy=1, msg_timeout_ms=5000)
    (m,) = messages(c.take())
    node.clock.advance(4)
    c.send(b"TOUCH " + m.msg_id + b"\n")
    node.clock.advance(4)
    assert c.take() == b"", "TOUCH restarted the 5 s timeout"
    node.clock.advance(1.5)
    (again,) = messages(c.take())
    assert (again.msg_id, again.body, again.attempts) == (m.msg_id, b"1", 2), "timed out"
    c.send(b"REQ " + m.msg_id + b" 0\n")
    node.clock.advance(0)
    (third,) = messages(c.take())
    assert (third.body, third.attempts) == (b"1", 3)


def test_heartbeat_then_close_after_two_silent_intervals(node):
    c = connect(node)
    node.clock.advance(29.9)
    assert c.take() == b""
    node.clock.advance(0.1)
    assert c.take() == HEARTBEAT
    c.send(b"NOP\n")  # any bytes reset the read deadline
    node.clock.advance(30)
    assert c.take() == HEARTBEAT
    assert c.connected
    node.clock.advance(30)
    assert not c.connected, "nothing received for 2 intervals"


def test_cls_answers_close_wait_and_keeps_the_socket(node):
    connect(node).send(pub(b"t", b"1"))
    c = consumer(node)
    (m,) = messages(c.take())
    c.send(b"CLS\n")
    assert c.take() == CLOSE_WAIT
    c.send(b"FIN " + m.msg_id + b"\n" + b"RDY 5\n")
    node.clock.advance(0)
    assert c.take() == b""
    assert c.connected


def test_frames_wait_for_the_output_buffer_timeout_while_rdy_has_room(node):
    c = consumer(node, rdy=10)
    connect(node).send(pub(b"t", b"1"))
    node.clock.advance(0)
    node.clock.advance(0.24)
    assert c.take() == b""
    node.clock.advance(0.01)
    assert [m.body for m in messages(c.take())] == [b"1"]


@pytest.mark.parametrize("codec", ["snappy", "deflate"])
def test_compressed_pipelined_commands_fed_one_byte_at_a_time(node, codec):
    """After the upgrade (the client waits for IDENTIFY's reply, as clients do), a
    compressed stream of several commands, split at every byte, answers in order through
    the compressor: snappy's observed upgrade bytes (§5.1), then OK per PUB."""
    from protocols.nsq import compress

    if codec == "snappy":
        enc, dec = compress.SnappyCompressor(), compress.SnappyDecompressor()
        upgrade = bytes.fromhex("ff060000734e61507059" "010e0000" "26982bcf") + OK
    else:
        enc, dec = compress.DeflateCompressor(6), compress.DeflateDecompressor()
        upgrade = None  # deflate's bytes depend on the zlib build; they inflate to OK
    body = b'{"feature_negotiation":true,"%s":true}' % codec.encode()
    c = node.connect(node.factory)
    c.send(MAGIC + b"IDENTIFY\n" + struct.pack(">I", len(body)) + body)
    out = c.take()
    (size,) = struct.unpack_from(">I", out)
    ((kind, reply),) = frames(out[:4 + size])
    assert kind == 0 and json.loads(reply)[codec] is True
    if upgrade is not None:
        assert out[4 + size:] == upgrade
    assert dec.decompress(out[4 + size:]) == OK
    c.send_bytewise(enc.compress(pub(b"t", b"1") + b"NOP\n" + pub(b"t", b"2")))
    assert dec.decompress(c.take()) == OK + OK
    assert node.store.queue("t", 0).max_offset == 2


def test_a_publish_the_store_refuses_at_once_is_answered_in_its_turn(tmp_path):
    # nsqd takes bigger messages than the store here, so the store refuses the second
    # PUB while it is called (no Deferred to wait on): its error still comes after the
    # OK of the PUB ahead of it, and it is fatal as nsqd's E_PUB_FAILED is
    big = {"nsq.maxMsgSize": 8 << 20, "nsq.maxBodySize": 16 << 20}
    with running(tmp_path / "data", make_factory, config=big) as n:
        c = connect(n)
        c.send(pub(b"t", b"1"))  # creates the topic
        assert c.take() == OK
        c.send(pub(b"t", b"2") + pub(b"t", b"x" * (5 << 20)))
        assert c.take() == OK + error_frame(
            b"E_PUB_FAILED PUB failed message of 5242880 bytes is over the limit")
        assert not c.connected
        r = consumer(n)
        assert [m.body for m in messages(r.take())] == [b"1", b"2"]


def test_a_pub_pipelined_behind_a_waiting_sub_is_answered_after_it(held):
    # SUB to a new topic waits for the topic's creation; a PUB to another, existing
    # topic pipelined behind it is answered after it
    c = connect(held)
    c.send(pub(b"t", b"1"))
    held.runner.release()
    assert c.take() == OK
    c.send(b"SUB new ch\n" + pub(b"t", b"2"))
    assert c.take() == b""
    held.runner.release()
    assert c.take() == OK + OK


def test_nothing_after_a_fatal_publish_error_in_the_same_read_is_run(tmp_path):
    # nsqd stops at a fatal error: the PUB behind the refused one is neither stored
    # nor answered (it was stored, and its OK written after the error frame)
    big = {"nsq.maxMsgSize": 8 << 20, "nsq.maxBodySize": 16 << 20}
    with running(tmp_path / "data", make_factory, config=big) as n:
        c = connect(n)
        c.send(pub(b"t", b"1"))
        assert c.take() == OK
        c.send(pub(b"t", b"x" * (5 << 20)) + pub(b"t", b"2"))
        assert c.take() == error_frame(
            b"E_PUB_FAILED PUB failed message of 5242880 bytes is over the limit")
        assert not c.connected
        r = consumer(n)
        assert [m.body for m in messages(r.take())] == [b"1"]


def test_fins_cut_mid_line_across_reads_stay_on_the_batched_path(node):
    """A reader's FINs arrive in reads cut anywhere, often inside a line. The read that
    ends the cut line has it finished on its own; the FINs after it in that read are
    finished in one batch, not one decoder command each (the bench_reader profile)."""
    connect(node).send(b"".join(pub(b"t", b"%d" % i) for i in range(30)))
    c = consumer(node, rdy=30)
    ids = [m.msg_id for m in messages(c.take())]
    assert len(ids) == 30
    channel = node.broker.channels.get("t", "ch")
    singles = []
    finish = channel.finish
    channel.finish = lambda eid, owner: singles.append(eid) or finish(eid, owner)
    stream = b"".join(b"FIN " + i + b"\n" for i in ids)
    cuts = [0, 30, 200, 333, len(stream)]  # inside the 2nd, 10th and 16th lines
    for a, b in zip(cuts, cuts[1:]):
        c.send(stream[a:b])
    node.clock.advance(0)
    assert c.take() == b""  # no E_FIN_FAILED
    assert not channel.in_flight
    assert len(singles) == 3, "only the lines cut between reads go one by one"


def test_a_pub_in_one_read_does_not_pass_the_security_gate(node):
    # the one-PUB-per-read shortcut calls the PUB handler straight, but only on a
    # connection without the gate: with TLS required it is refused before the upgrade
    node.factory.node.tls_required = True  # (the config would also want a certificate)
    c = connect(node)
    c.send(pub(b"t", b"1"))
    assert c.take() == error_frame(b"E_INVALID cannot PUB in current state (TLS required)")
    assert not c.connected


def test_a_pub_in_one_read_creates_its_topic_and_is_stored(node):
    c = connect(node)
    c.send(pub(b"new", b"1"))
    assert c.take() == OK  # created first, as nsqd does
    c.send(pub(b"new", b"2"))
    assert c.take() == OK
    r = connect(node)
    r.send(b"SUB new ch\nRDY 10\n")
    assert r.take() == OK
    node.clock.advance(0)
    node.clock.advance(0.25)
    assert [m.body for m in messages(r.take())] == [b"1", b"2"]


def test_a_pub_is_answered_before_the_store_tells_its_listeners(node):
    """The usual PUB's OK is written as soon as its message is, before the store's
    bookkeeping (the queue's entry, the listeners that push it to consumers): the
    producer's round trip does not wait for them. The message is stored all the same."""
    c = connect(node)
    c.send(pub(b"t", b"one"))  # creates the topic
    assert c.take() == OK
    written = []
    node.store.add_arrival_listener(lambda topic, qid: written.append(c.transport.value()))
    c.send(pub(b"t", b"two"))
    assert written == [OK]
    assert c.take() == OK
    assert node.store.queue("t", 0).max_offset == 2
