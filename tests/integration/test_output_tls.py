"""A connection that starts TLS in the middle writes only through the TLS layer, on
both reactor paths: nsqd connections upgraded with IDENTIFY C{tls_v1} (their transport
stays a plain TCP connection, which the direct send of the spinning reactor's path
must leave alone) publish pipelined messages and get every one delivered, byte for byte."""

import pytest

from protocols.nsq.codec import FrameReader, decode_message, encode_command
from protocols.nsq.wire import FRAME_TYPE_MESSAGE
from tests.integration.test_nsq_security import upgraded
from tests.support.nsq import nsq_listen
from tests.support.server import ServerProcess
from tests.support.tls import Certs

BODIES = [b"tls-%03d-" % i + bytes(range(256)) * (i % 7) for i in range(120)]


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return Certs(tmp_path_factory.mktemp("outcerts"))


@pytest.fixture(params=["spinning", "standard"])
def srv(request, tmp_path, certs):
    s = ServerProcess(tmp_path / "data", listen=nsq_listen(),
                      config={"server": {"reactor": request.param},
                              "nsq": {"tlsCert": certs.cert, "tlsKey": certs.key}}).start()
    try:
        yield s
    finally:
        s.stop()
        s.close()


def _frames(sock, reader, count):
    got = []
    while len(got) < count:
        data = sock.recv(65536)
        assert data, "the broker closed the connection"
        got += reader.feed(data)
    return got


def test_upgraded_connections_publish_and_consume_over_tls(srv, certs):
    port = srv.ports["NsqdFactory"]
    pub, _ = upgraded(port, certs)
    sub, _ = upgraded(port, certs)
    try:
        # pipelined: one write of every PUB, the answers gathered into few sends
        pub.sendall(b"".join(encode_command("PUB", "tls_out", body=b) for b in BODIES))
        assert _frames(pub, FrameReader(), len(BODIES)) == [(0, b"OK")] * len(BODIES)
        sub.sendall(encode_command("SUB", "tls_out", "ch") + encode_command("RDY", 200))
        reader = FrameReader()
        frames = _frames(sub, reader, 1)
        assert frames[0] == (0, b"OK")
        frames = frames[1:] + _frames(sub, reader, len(BODIES) - len(frames) + 1)
        messages = [decode_message(d) for t, d in frames if t == FRAME_TYPE_MESSAGE]
        assert [m.body for m in messages] == BODIES
        sub.sendall(b"".join(encode_command("FIN", m.msg_id) for m in messages))
    finally:
        pub.close()
        sub.close()
