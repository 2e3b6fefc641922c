"""SmssServerProtocol in process (StringTransport, a Clock, a real store): partial frames,
pipelining, errors mid-stream, connection loss with work in flight, the subscription's
timers. Expected bytes are the worked examples of smss-protocol.md §15."""

import struct


from protocols.smss import client_codec as cc
from protocols.smss import wire
from protocols.smss.factory import SmssFactory, make_factory
from protocols.smss.messages import Batch, ErrResponse, OkResponse
from protocols.smss.payload import encode_message
from protocols.smss.protocol import NAME_RULE
from tests.support.inprocess import FillingTransport, door_fixtures

# smss-protocol.md §15
CREATE_ORDER = bytes.fromhex("02050000000000000000000000000000000000006f72646572"
                             "0000000000000000")
PUB_ORDER_HELLO = bytes.fromhex("01050" "00d00000000000000000000000000000000"
                                "6f72646572" "050000000000000068656c6c6f")
OK = bytes.fromhex("c8000000000000000000")
ALIVE_REQ = bytes([0x11]) + bytes(19)
ALIVE = bytes.fromhex("c9000000000000000000")
SUBEND = bytes.fromhex("ff000000000000000000")
TOPIC_NOT_EXIST = bytes.fromhex("90010f00000000000000") + b"topic not exist"


def record(body):
    """One §5 message record without headers."""
    return struct.pack("<II", len(body), 0) + body


def err(text):
    return struct.pack("<HH6x", 400, len(text)) + text


node, held = door_fixtures()


def smss(node, **kw):
    if kw:
        return node.add_factory(SmssFactory(node.broker, node.clock, **kw))
    return node.door(make_factory)


def events(data, expect=cc.Expect.SIMPLE):
    return cc.ResponseDecoder(expect).feed(data)


def test_spec_create_and_pub_fed_one_byte_at_a_time(node):
    c = node.connect(smss(node))
    c.send_bytewise(CREATE_ORDER)
    assert c.take() == OK
    c.send_bytewise(PUB_ORDER_HELLO)
    assert c.take() == OK
    assert c.connected
    assert node.store.queue("order", 0).max_offset == 1


def _stored(store, topic):
    """(body, properties, sys_flag) of every message stored in C{topic}, in order."""
    from mqserver.store import format as fmt

    entries = store.read_entries(topic, 0, 0, 1000)
    buf, locs = store.read_records(entries)
    out = []
    for pos, _ in locs:
        v = fmt.RecordView(buf, pos)
        out.append((bytes(v.body), bytes(v.properties), v.sys_flag))
    return out


PAYLOADS = [
    record(b"hello"),  # one message without headers: what the SDKs send
    encode_message([(b"k", b"v")], b"b"),  # a message with a header
    record(b"one") + record(b"two"),  # two records
    record(b"x" * 300),
]


def test_one_read_pubs_store_what_decoded_pubs_store(node):
    """Each PUB sent in one read (feed's fast decode of one PUB) stores the same
    messages and gets the same answers as the same PUB fed a byte at a time (the
    decoder's general path)."""
    fast = node.connect(smss(node))
    slow = node.connect(smss(node))
    fast.send(cc.encode_create(b"fast"))
    slow.send(cc.encode_create(b"slow"))
    assert fast.take() == OK and slow.take() == OK
    for payload in PAYLOADS:
        fast.send(cc.encode_pub(b"fast", payload))
        slow.send_bytewise(cc.encode_pub(b"slow", payload))
        assert fast.take() == slow.take() == OK
    for bad in (cc.encode_pub(b"nope", record(b"x")), cc.encode_pub(b"fast", b"\x05" * 9)):
        fast.send(bad)
        slow.send_bytewise(bad)
        assert fast.take() == slow.take() != OK
    assert fast.connected and slow.connected
    assert _stored(node.store, "fast") == _stored(node.store, "slow")
    assert [m[0] for m in _stored(node.store, "fast")][:1] == [b"hello"]


def test_names_of_128_bytes_are_the_longest_create_accepts(node):
    """CREATE takes a 128-byte name (the reference server's check is "> 128") and PUBs
    reach it; 129 bytes get the name rule's ERR, on CREATE and on PUB alike."""
    c = node.connect(smss(node))
    name = b"n" * 128
    c.send(cc.encode_create(name) + cc.encode_pub(name, record(b"long")))
    assert c.take() == OK + OK
    assert [m[0] for m in _stored(node.store, name.decode())] == [b"long"]
    too_long = b"n" * 129
    c.send(cc.encode_create(too_long) + cc.encode_pub(too_long, record(b"x")))
    assert c.take() == err(NAME_RULE.encode()) + TOPIC_NOT_EXIST
    assert c.connected
    assert node.broker.topic(too_long.decode()) is None


def test_pipelined_requests_answered_in_order_in_one_read(node):
    c = node.connect(smss(node))
    c.send(CREATE_ORDER + PUB_ORDER_HELLO + cc.encode_pub(b"nope", record(b"x"))
           + ALIVE_REQ + PUB_ORDER_HELLO)
    assert c.take() == OK + OK + TOPIC_NOT_EXIST + ALIVE + OK
    assert c.connected


def test_unknown_command_is_answered_and_the_connection_stays(node):
    c = node.connect(smss(node))
    c.send(bytes([0x2a]) + bytes(19) + ALIVE_REQ)
    assert c.take() == err(b"don't support action") + ALIVE
    assert c.connected


def test_bad_frame_after_good_ones_answers_them_then_err_and_closes(node):
    c = node.connect(smss(node))
    bad = struct.pack("<BHI12xB", 1, 2000, 9, 0)  # topic length over the 1024 limit
    c.send(CREATE_ORDER + PUB_ORDER_HELLO + bad + ALIVE_REQ)
    assert c.take() == OK + OK + err(b"topic length 2000 over limit 1024")
    assert not c.connected
    assert node.store.queue("order", 0).max_offset == 1


def test_payload_too_small_is_skipped_and_the_stream_stays_in_sync(node):
    c = node.connect(smss(node))
    small = struct.pack("<BHI12xB", 1, 5, 8, 0) + b"order" + bytes(8)
    c.send_bytewise(CREATE_ORDER + small + ALIVE_REQ)
    assert c.take() == OK + err(b"invalid request, payload size must be more than 8") + ALIVE
    assert c.connected


def test_pipelined_answers_wait_for_the_fsync_of_the_pub_ahead(held):
    c = held.connect(smss(held))
    c.send(CREATE_ORDER)
    held.runner.release()
    assert c.take() == OK
    c.send(PUB_ORDER_HELLO + ALIVE_REQ)
    assert c.take() == b"", "ALIVE must not overtake the PUB waiting for its fsync"
    held.runner.release()
    assert c.take() == OK + ALIVE


def test_connection_lost_with_a_pub_waiting_for_fsync(held):
    c = held.connect(smss(held))
    c.send(CREATE_ORDER)
    held.runner.release()
    c.take()
    c.send(PUB_ORDER_HELLO)
    c.lose()
    held.runner.release()
    assert c.take() == b"", "nothing is written to a closed connection"
    # The write was not taken back: a new connection can read the message.
    c2 = held.connect(smss(held))
    c2.send(cc.encode_sub(b"order", 0, batch=5, who=b"g"))
    (batch,) = events(c2.take(), cc.Expect.SUB)
    assert [m.body for m in batch.messages] == [b"hello"]


def subscribe(node, factory, who=b"g1", batch=1, ack_timeout_ns=None, event_id=0):
    c = node.connect(factory)
    c.send(cc.encode_sub(b"order", event_id, batch=batch, ack_timeout_ns=ack_timeout_ns,
                         who=who))
    return c


def publish(node, factory, *bodies):
    p = node.connect(factory)
    for body in bodies:
        p.send(cc.encode_pub(b"order", record(body)))
    assert events(p.take()) == [OkResponse(None)] * len(bodies)
    p.lose()


def order_with(node, *bodies, **settings):
    """The smss factory (with C{settings}), with topic "order" holding C{bodies}."""
    f = smss(node, **settings)
    admin = node.connect(f)
    admin.send(CREATE_ORDER)
    admin.lose()  # an open request connection would keep its idle timer armed
    if bodies:
        publish(node, f, *bodies)
    return f


def test_batch_bytes_and_acks_one_at_a_time(node):
    f = order_with(node, b"hello", b"b2")
    c = subscribe(node, f, batch=1)
    out = c.take()
    assert out[:10] == bytes.fromhex("c8000100" "2d000000" "0000"), "count 1, body 45 (§15)"
    assert out[10 + 32:] == record(b"hello")
    ts, eid = struct.unpack_from("<qq", out, 10)
    assert (ts, eid) == (int(node.clock.seconds() * 1000), 2), "eventId 1 is the CREATE"
    c.send(cc.encode_ack(0)[:1])
    assert c.take() == b""
    c.send(cc.encode_ack(0)[1:])
    (batch,) = events(c.take(), cc.Expect.SUB)
    assert [m.body for m in batch.messages] == [b"b2"]


def test_ack_timeout_closes_and_frees_the_name_and_the_batch(node):
    f = order_with(node, b"hello")
    c = subscribe(node, f, ack_timeout_ns=2_000_000_000)
    assert isinstance(events(c.take(), cc.Expect.SUB)[0], Batch)
    node.clock.advance(1.9)
    assert c.connected
    node.clock.advance(0.2)
    assert not c.connected
    # the claim went with the connection: the same group can subscribe again, and the
    # un-acked message is sent again from where it resumes
    c2 = subscribe(node, f)
    (batch,) = events(c2.take(), cc.Expect.SUB)
    assert [m.body for m in batch.messages] == [b"hello"]


def test_connection_lost_with_an_unacked_batch_releases_the_claim(node):
    f = order_with(node, b"hello")
    c = subscribe(node, f)
    assert c.take()
    taken = subscribe(node, f)
    assert events(taken.take()) == [ErrResponse("g1 regiester exist")]
    taken.lose()  # an open request connection keeps its idle timer
    c.lose()
    assert node.pending_calls() == [], "the subscription's timers went with it"
    c2 = subscribe(node, f)
    (batch,) = events(c2.take(), cc.Expect.SUB)
    assert [m.body for m in batch.messages] == [b"hello"]


def test_alive_on_an_idle_stream_only_when_no_batch_waits(node):
    f = order_with(node, alive_interval=5.0)
    c = subscribe(node, f)
    assert c.take() == b""
    node.clock.advance(4.9)
    assert c.take() == b""
    node.clock.advance(0.1)
    assert c.take() == ALIVE
    node.clock.advance(5)
    assert c.take() == ALIVE
    publish(node, f, b"hello")
    node.clock.advance(0)  # arrivals are read on the next turn
    assert isinstance(events(c.take(), cc.Expect.SUB)[0], Batch)
    node.clock.advance(2.9)  # ack timeout is 3 s: still waiting, and no ALIVE meanwhile
    assert c.take() == b""
    c.send(cc.encode_ack(0))
    node.clock.advance(5)
    assert c.take() == ALIVE


def test_topic_deleted_while_subscribed_ends_the_stream_then_requests_work(node):
    f = order_with(node)
    c = subscribe(node, f)
    d = node.connect(f)
    d.send(cc.encode_delete(b"order"))
    assert d.take() == OK
    assert c.take() == SUBEND
    c.send(ALIVE_REQ)
    assert c.take() == ALIVE
    assert c.connected


def test_ack_and_end_returns_to_requests_with_pipelined_request(node):
    f = order_with(node, b"hello")
    c = subscribe(node, f)
    assert c.take()
    c.send(cc.encode_ack(1) + ALIVE_REQ)
    assert c.take() == ALIVE
    assert c.connected


def test_replica_stream_blocks_alive_and_loss(node):
    """REPLICA (fed bytewise) streams the log as §8.2 blocks, the PUB block laid out as
    §15's example; an idle feed gets ALIVE; the loss of the slave ends the feed."""
    f = order_with(node, b"hello")
    r = node.connect(f)
    r.send_bytewise(cc.encode_replica(0))
    out = r.take()
    (create, pub) = events(out, cc.Expect.REPLICA)
    assert out.endswith(OK + struct.pack("<I", 59) + pub.raw), "B = 59, as in §15"
    ms = b"%d" % (node.clock.seconds() * 1000)
    line = ms + b"\t1\t2\t" + ms + b"\torder\t14\n"
    assert create.raw.startswith(b"(\x00\x00\x00" + ms + b"\t2\t1\t")
    assert pub.raw == struct.pack("<I", 41) + line + record(b"hello") + b"\n"
    assert f.replica_feeds == 1
    node.clock.advance(30)
    assert r.take() == ALIVE
    publisher = node.connect(f)
    publisher.send(cc.encode_pub(b"order", record(b"live")))
    node.clock.advance(0)
    (live,) = events(r.take(), cc.Expect.REPLICA)
    assert live.raw.endswith(record(b"live") + b"\n")
    publisher.lose()  # an open request connection keeps its idle timer
    r.lose()
    assert f.replica_feeds == 0
    assert node.pending_calls() == []


def test_followers_at_one_place_share_a_reads_frames(node):
    """Feeds reading from the same place in the same turn send the same frames, made
    once: the first to read makes them, the others send its bytes. A reference slave
    (no confirmations: no epoch records) gets frames of its own, a feed starting in a
    later turn reads for itself, and a lone feed keeps nothing."""
    f = order_with(node, b"hello")
    a, b, ref, c = (node.connect(f) for _ in range(4))
    a.send(cc.encode_replica(0, wire.CONFIRM_TRACE))
    first = a.take()
    assert f.shared_frames.reused == 0 and f.shared_frames.get((0, True)) is None, "alone"
    b.send(cc.encode_replica(0, wire.CONFIRM_TRACE))
    ref.send(cc.encode_replica(0))
    c.send(cc.encode_replica(0, wire.CONFIRM_TRACE))
    assert b.take() == c.take() == first
    assert f.shared_frames.reused == 1, "c sent what b read"
    assert [e.raw for e in events(ref.take(), cc.Expect.REPLICA)] == [
        e.raw for e in events(first, cc.Expect.REPLICA) if e.raw], "the same records"
    publisher = node.connect(f)
    publisher.send(cc.encode_pub(b"order", record(b"one")) + cc.encode_pub(b"order", record(b"two")))
    node.clock.advance(0)  # the feeds' turn: a reads for b and c, ref for itself
    (one, two) = events(a.take(), cc.Expect.REPLICA)
    assert two.raw.endswith(record(b"two") + b"\n")
    more = OK + struct.pack("<I", len(one.raw)) + one.raw + OK + struct.pack(
        "<I", len(two.raw)) + two.raw
    assert b.take() == c.take() == more
    assert [e.raw for e in events(ref.take(), cc.Expect.REPLICA)] == [one.raw, two.raw]
    assert f.shared_frames.reused == 3
    node.clock.advance(0)  # a later turn: nothing of the earlier reads is kept
    d = node.connect(f)
    d.send(cc.encode_replica(0, wire.CONFIRM_TRACE))
    assert d.take() == first + more
    assert f.shared_frames.reused == 3
    for conn in (a, b, ref, c, d, publisher):
        conn.lose()
    assert f.shared_frames.feeds == 0
    assert node.pending_calls() == []


def test_acks_sent_ahead_cost_one_batch_beyond_a_full_buffer(node):
    """A subscriber that acks without reading (acks pipelined after its SUB in one read)
    gets no more batches once the transport's buffer is full: what it costs is bounded by
    the buffer and one batch, not by the topic. The batch its first ack asked for goes
    when the buffer drains, and acking each batch then reads the rest: nothing is lost or
    sent twice."""
    bodies = [b"%04d" % i + bytes(1000) for i in range(50)]
    f = order_with(node, *bodies)
    c = node.connect(f, transport=FillingTransport)
    c.protocol.dataReceived(cc.encode_sub(b"order", 0, batch=5, who=b"g") + cc.encode_ack(0) * 20)
    first = events(c.transport.value(), cc.Expect.SUB)
    assert len(first) == 1, "one batch fills the buffer; the 20 acks ahead send no more"
    got = [m.body for m in first[0].messages]
    c.transport.drain()
    while True:
        out = c.transport.drain()  # the batch the first ack asked for, once drained
        if not out:
            break
        (batch,) = events(out, cc.Expect.SUB)
        got += [m.body for m in batch.messages]
        c.protocol.dataReceived(cc.encode_ack(0))
    assert got == bodies
    assert c.connected


def test_a_subscriber_that_acks_but_never_reads_is_closed_after_the_ack_timeout(node):
    """Acks sent ahead while the buffer stays full: the batch they asked for waits as long
    as an ack would (3 s by default), then the connection is closed and the claim freed,
    as an ack timeout does (the same group can subscribe again)."""
    f = order_with(node, *[b"%04d" % i + bytes(1000) for i in range(20)])
    c = node.connect(f, transport=FillingTransport)
    c.protocol.dataReceived(cc.encode_sub(b"order", 0, batch=5, who=b"g") + cc.encode_ack(0) * 3)
    node.clock.advance(2.9)
    assert c.connected
    node.clock.advance(0.2)
    assert not c.connected
    c2 = subscribe(node, f, batch=5)
    (batch,) = events(c2.take(), cc.Expect.SUB)
    assert batch.messages[0].body.startswith(b"0000"), "from where this SUB asked (eventId 0)"


def test_a_pub_is_answered_before_the_store_tells_its_listeners(node):
    """The usual PUB's OK is written as soon as its message is, before the store's
    bookkeeping (the queue's entry, the listeners that push it to subscribers): the
    client's round trip does not wait for them. The message is stored all the same."""
    c = node.connect(smss(node))
    c.send(CREATE_ORDER + PUB_ORDER_HELLO)
    assert c.take() == OK + OK
    written = []
    node.store.add_arrival_listener(lambda topic, qid: written.append(c.transport.value()))
    c.send(PUB_ORDER_HELLO)
    assert written == [OK]
    assert c.take() == OK
    assert node.store.queue("order", 0).max_offset == 2
    assert _stored(node.store, "order")[1][0] == b"hello"
