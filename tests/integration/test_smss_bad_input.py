"""Malformed and hostile smss input against the real broker.

Each test keeps a witness connection B open: B publishes before and after the bad input,
and the test then reads B's topic back whole. So after every case the broker is still
up, still answers on an unrelated connection, and has lost or garbled nothing.
The broker runs with store.maxPubPayload 1024 so oversized requests are cheap to send.
"""

import socket
import struct
import time

import pytest

from protocols.smss import client_codec as cc
from protocols.smss.client import SmssError
from protocols.smss.messages import AliveResponse, Batch, ErrResponse, OkResponse
from protocols.smss.payload import encode_payload
from tests.support.server import ServerProcess
from tests.support.smss import NAME_RULE, as_tuples, connect, next_data, read_topic, wait_until

MAX_PUB = 1024
TOO_SMALL = "invalid request, payload size must be more than 8"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """One broker for the whole module, with a small PUB payload limit."""
    s = ServerProcess(
        tmp_path_factory.mktemp("smss-bad-input") / "broker",
        config={"store": {"maxPubPayload": MAX_PUB}, "timeout": {"server": {"alive": 300}}},
    )
    try:
        s.start()
        yield s
        assert s.stop() is not None
    finally:
        s.close()


class Witness:
    """Connection B and its topic: publishes around the bad input, then checks it all."""

    def __init__(self, server, name):
        self.server = server
        self.topic = name
        self.conn = connect(server)
        self.conn.create(name)
        self.sent = []

    def publish(self, tag):
        msgs = [([(b"tag", tag.encode())], f"{tag}-{i}".encode() * (i + 1)) for i in range(3)]
        self.conn.publish(self.topic, msgs)
        self.sent += [(h, b) for h, b in msgs]

    def verify(self):
        assert self.server.proc.poll() is None, "the broker died"
        got = read_topic(self.server, self.topic, count=len(self.sent))
        assert [(m.headers, m.body) for m in got] == self.sent
        ids = [m.event_id for m in got]
        assert ids == sorted(set(ids))
        log = self.server.current_log()
        assert "Traceback" not in log and "Unhandled" not in log, log


@pytest.fixture
def witness(broker, request):
    """Publish on B before the test body; after it, publish again and read it all back."""
    w = Witness(broker, "witness-" + request.node.name.replace("[", "-").replace("]", ""))
    try:
        w.publish("before")
        yield w
        w.publish("after")
        w.verify()
    finally:
        w.conn.close()


@pytest.fixture
def target(broker):
    """A topic that bad requests aim at, and a client A to send them."""
    with connect(broker) as a:
        name = f"target-{time.monotonic_ns()}"
        a.create(name)
        yield a, name


def raw_socket(server):
    """A plain socket to the broker, for byte-level abuse."""
    s = socket.create_connection(("127.0.0.1", server.smss_port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def pub_header(topic, payload_len, trace=b"", code=1):
    """A PUB/DELAY header announcing C{payload_len} bytes, plus topic and trace."""
    return cc.encode_request(code, topic, trace, payload_len)


def assert_closed(client, timeout=5.0):
    """Wait until the broker closes C{client}'s connection; return the frames read first."""
    frames = []
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"connection not closed; frames {frames}"
        try:
            frames.append(client.read_response(timeout=remaining))
        except ConnectionError:  # not TimeoutError, which is an OSError too
            return frames


def test_unknown_command(broker, witness, target):
    """Unknown command codes get "don't support action" and the connection goes on."""
    a, name = target
    a.send_raw(cc.encode_request(7, name, b"trace") + cc.encode_request(200) + cc.encode_alive())
    assert a.read_response() == ErrResponse("don't support action")
    assert a.read_response() == ErrResponse("don't support action")
    assert isinstance(a.read_response(), AliveResponse)
    a.publish(name, [b"still fine"])


@pytest.mark.parametrize("cut", [1, 10, 19, 20, 23, 30])
def test_request_split_across_writes_still_decodes(broker, witness, target, cut):
    """A PUB whose bytes arrive in two writes, cut inside the header, topic or payload,
    decodes as one request."""
    a, name = target
    body = f"split-at-{cut}".encode()
    request = cc.encode_pub(name, encode_payload([([(b"h", b"v")], body)]))
    assert cut < len(request)
    a.send_raw(request[:cut])
    with pytest.raises(TimeoutError):
        a.read_response(timeout=0.2)  # nothing to answer yet
    a.send_raw(request[cut:])
    assert a.read_response() == OkResponse(None)
    got = read_topic(broker, name, count=1)
    assert as_tuples(got)[0][1:] == ([(b"h", b"v")], body)


def test_request_sent_one_byte_at_a_time(broker, witness, target):
    """CREATE, PUB and ALIVE sent one byte per write are all answered correctly."""
    a, name = target
    stream = (
        cc.encode_create(name + "-bytewise")
        + cc.encode_pub(name + "-bytewise", encode_payload([b"dribble"]), b"tr")
        + cc.encode_alive()
    )
    for i in range(len(stream)):
        a.send_raw(stream[i : i + 1])
    assert a.read_response() == OkResponse(None)
    assert a.read_response() == OkResponse(None)
    assert isinstance(a.read_response(), AliveResponse)
    assert [m.body for m in read_topic(broker, name + "-bytewise", count=1)] == [b"dribble"]


def test_oversized_pub_is_refused_and_discarded(broker, witness, target):
    """A PUB over store.maxPubPayload gets 'payload too large', its body is discarded,
    and a valid PUB on the same connection is accepted; exactly the limit is fine."""
    a, name = target
    big = encode_payload([b"B" * (2000 - 8)])
    assert len(big) == 2000
    a.send_raw(cc.encode_pub(name, big))
    assert a.read_response() == ErrResponse(f"payload too large: 2000 > {MAX_PUB}")
    # The same body sent in pieces, with a valid PUB glued to its end.
    req = cc.encode_pub(name, big) + cc.encode_pub(name, encode_payload([b"small"]))
    for i in range(0, len(req), 300):
        a.send_raw(req[i : i + 300])
    assert a.read_response() == ErrResponse(f"payload too large: 2000 > {MAX_PUB}")
    assert a.read_response() == OkResponse(None)
    limit = encode_payload([b"L" * (MAX_PUB - 8)])
    a.publish_raw(name, limit)
    # An oversized DELAY: its 8-byte delay field is discarded too.
    a.send_raw(cc.encode_delay(name, 5000, big) + cc.encode_alive())
    assert a.read_response() == ErrResponse(f"payload too large: 2000 > {MAX_PUB}")
    assert isinstance(a.read_response(), AliveResponse)
    got = read_topic(broker, name, count=2)
    assert [m.body for m in got] == [b"small", b"L" * (MAX_PUB - 8)]


def test_huge_announced_payload_is_refused_before_its_body(broker, witness, target):
    """A PUB announcing 4 GiB gets its ERR at once, without the body ever being sent."""
    a, name = target
    a.send_raw(pub_header(name, 0xFFFFFFFF))
    assert a.read_response(timeout=5) == ErrResponse(f"payload too large: {0xFFFFFFFF} > {MAX_PUB}")
    a.close()


def test_bad_topic_names_on_requests(broker, witness, target):
    """Empty and invalid topic names get smss's errors on every command, and the
    connection stays usable."""
    a, _ = target
    cases = [
        (a.publish, (b"", [b"x"]), "topic name is required"),
        (a.publish, (b"../x", [b"x"]), "topic not exist"),
        (a.publish, (b"a b", [b"x"]), "topic not exist"),
        (a.topic_info, (b"..",), "topic not exist"),
        (a.delete, (b"",), "topic name is required"),
        (a.delete, (b"a/b",), "topic not exist"),
        (a.delay, (b"", 2000, [b"x"]), "topic name is required"),
        (a.create, (b"", 0), "topic name is required"),
        (a.create, (b"..", 0), NAME_RULE),
        (a.create, (b"a/../b", 0), NAME_RULE),
        (a.create, (b"y" * 200, 0), NAME_RULE),
    ]
    for call, args, text in cases:
        with pytest.raises(SmssError) as info:
            call(*args)
        assert info.value.text == text, (call.__name__, args)
    for topic, text in ((b"", "topic name is required"), (b"a/b", "topic not exist")):
        sub = a.subscribe(topic, 0, who=b"bad-name")
        with pytest.raises(SmssError) as info:
            sub.next_batch(5)
        assert info.value.text == text
    a.send_raw(cc.encode_alive())
    assert isinstance(a.read_response(), AliveResponse)
    names = [t["name"] for t in a.list()]
    assert not any(n in ("", "..") or "/" in n or " " in n for n in names)
    assert not any(n.startswith(".") for n in names)


def test_lengths_over_decoder_limits_close_connection(broker, witness):
    """A topic length over the decoder's limit (also from garbage 0xff bytes), or a SUB
    who length over it, gets an ERR and the connection is closed; nothing else is
    affected."""
    for junk in (
        cc.encode_request(2, b"t" * 2000, body=b"\0" * 8),
        b"\xff" * 4096,
        cc.encode_sub(b"t", 0, 1, None, b"w" * 2000),
    ):
        with connect(broker) as a:
            try:
                a.send_raw(junk)
            except OSError:
                pass  # the broker may close before it has read everything
            frames = assert_closed(a)
            assert len(frames) == 1 and isinstance(frames[0], ErrResponse), frames
            assert "over limit" in frames[0].text


@pytest.mark.parametrize("size", [0, 1, 5, 8])
def test_pub_payload_of_8_bytes_or_less_keeps_connection_in_sync(broker, witness, target, size):
    """A PUB with P <= 8 gets its error, its P bytes are consumed, and the next request
    on the same connection (sent in the same write) is answered."""
    a, name = target
    junk = bytes([0x20 + i for i in range(size)])
    a.send_raw(
        pub_header(name, size) + junk
        + cc.encode_pub(name, encode_payload([b"next"]))
        + cc.encode_alive()
    )
    assert a.read_response() == ErrResponse(TOO_SMALL)
    assert a.read_response() == OkResponse(None)
    assert isinstance(a.read_response(), AliveResponse)
    assert [m.body for m in read_topic(broker, name, count=1)] == [b"next"]


@pytest.mark.parametrize(
    "payload",
    [
        struct.pack("<II", 100, 0) + b"only twelve!",  # S runs past the payload
        struct.pack("<II", 0, 0) + b"\0" * 4,  # S = 0
        encode_payload([b"ok"]) + b"\x05\x00\x00",  # 3 bytes left after a record
        encode_payload([b"ok"]) + struct.pack("<II", 1, 0),  # 8 left: not more than 8
        encode_payload([b"ok", b"fine"]) + struct.pack("<II", 50, 0) + b"x",  # last runs over
    ],
    ids=["size-past-end", "size-zero", "3-left", "8-left", "last-record-over"],
)
def test_invalid_pub_payload(broker, witness, target, payload):
    """A payload whose record walk breaks gets 'invalid pub payload', stores nothing,
    and the next request on the connection works."""
    a, name = target
    a.send_raw(cc.encode_pub(name, payload) + cc.encode_pub(name, encode_payload([b"good"])))
    assert a.read_response() == ErrResponse("invalid pub payload")
    assert a.read_response() == OkResponse(None)
    assert [m.body for m in read_topic(broker, name, count=1)] == [b"good"]


def test_invalid_delay_payload(broker, witness, target):
    """A DELAY whose payload breaks the record walk gets 'invalid delay request'."""
    a, name = target
    bad = struct.pack("<II", 100, 0) + b"short"
    a.send_raw(cc.encode_delay(name, 2000, bad) + cc.encode_alive())
    assert a.read_response() == ErrResponse("invalid delay request")
    assert isinstance(a.read_response(), AliveResponse)


@pytest.mark.parametrize(
    "part",
    ["10-bytes-of-header", "header-only", "half-topic", "half-payload", "half-sub", "half-delay"],
)
def test_client_disconnects_mid_request(broker, witness, target, part):
    """A client that hangs up in the middle of a request leaves nothing behind: the
    partial request is not stored, and the topic still takes writes."""
    _, name = target
    pub = cc.encode_pub(name, encode_payload([b"never stored" * 10]))
    sub = cc.encode_sub(name, 0, 1, None, b"half")
    delay = cc.encode_delay(name, 1000, encode_payload([b"never delayed"]))
    data = {
        "10-bytes-of-header": pub[:10],
        "header-only": pub[:20],
        "half-topic": pub[: 20 + len(name) // 2],
        "half-payload": pub[: len(pub) - 40],
        "half-sub": sub[: len(sub) - 3],
        "half-delay": delay[: len(delay) - 5],
    }[part]
    s = raw_socket(broker)
    s.sendall(data)
    s.close()
    with connect(broker) as a:
        a.publish(name, [b"after hangup"])
        if part == "half-sub":  # the who of the half SUB was never claimed
            sub2 = a.subscribe(name, 0, who=b"half")
            assert [m.body for m in next_data(sub2, 5).messages] == [b"after hangup"]
    if part == "half-delay":
        time.sleep(1.2)  # long enough for the DELAY of 1 s to have fired, had it been stored
    assert [m.body for m in read_topic(broker, name, count=1)] == [b"after hangup"]


def test_client_disconnects_before_reading_answers(broker, witness, target):
    """Pipelined requests from a client that closes before reading the answers are
    handled without harm (the PUBs may or may not be stored, but whole)."""
    a, name = target
    s = raw_socket(broker)
    s.sendall(
        b"".join(cc.encode_pub(name, encode_payload([f"gone-{i}".encode()])) for i in range(50))
        + cc.encode_list()
    )
    s.close()
    got = read_topic(broker, name, settle=0.5)
    assert [m.body for m in got] == [f"gone-{i}".encode() for i in range(len(got))]


def test_subscriber_disconnects_with_batch_pending(broker, witness, target):
    """A subscriber that hangs up while a batch waits for its ack frees its who."""
    a, name = target
    a.publish(name, [b"m1", b"m2"])
    with connect(broker) as sc:
        sub = sc.subscribe(name, 0, who=b"quitter", ack_timeout_ms=30_000)
        assert isinstance(next_data(sub, 5), Batch)

    def resubscribed():
        with connect(broker) as sc2:
            sub2 = sc2.subscribe(name, 0, who=b"quitter")
            try:
                ev = next_data(sub2, 5)
            except SmssError:
                return False
            return [m.body for m in ev.messages] == [b"m1"]

    wait_until(resubscribed, 5, "the who of a closed subscriber to be released")


def test_invalid_ack_closes_connection(broker, witness, target):
    """An ack other than 0 or 1 closes the subscriber's connection."""
    a, name = target
    a.publish(name, [b"m1", b"m2"])
    with connect(broker) as sc:
        sub = sc.subscribe(name, 0, who=b"bad-acker")
        assert isinstance(next_data(sub, 5), Batch)
        sc.send_raw(b"\x07\x00")
        assert assert_closed(sc) == []
    assert [m.body for m in read_topic(broker, name, count=2, who=b"bad-acker")] == [b"m1", b"m2"]


def test_extra_ack_is_ignored(broker, witness, target):
    """An ack sent when no batch is pending does not stall the subscription."""
    a, name = target
    a.publish(name, [b"m1"])
    with connect(broker) as sc:
        sub = sc.subscribe(name, 0, who=b"double-acker")
        assert isinstance(next_data(sub, 5), Batch)
        sub.ack()
        sc.send_raw(cc.encode_ack(0))  # one ack too many
        a.publish(name, [b"m2"])
        ev = next_data(sub, 5)
        assert [m.body for m in ev.messages] == [b"m2"]
