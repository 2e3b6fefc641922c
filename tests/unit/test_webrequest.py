"""The bounded request of every HTTP door (mqserver/webrequest.py), in process: a real
twisted.web channel over StringTransport."""

from io import BytesIO

from twisted.internet.testing import StringTransport
from twisted.web import resource

from mqserver import webrequest


class Echo(resource.Resource):
    isLeaf = True

    def render(self, request):
        self.content = request.content
        return b"got %d" % len(request.content.read())


class Tiny(webrequest.Site):
    max_body = 10


def connect():
    root = Echo()
    site = Tiny(root)
    t = StringTransport()
    ch = site.buildProtocol(None)
    ch.makeConnection(t)
    return root, t, ch


def test_a_content_length_over_the_limit_is_refused_from_the_head():
    root, t, ch = connect()
    ch.dataReceived(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n")
    out = t.value()
    assert out.startswith(b"HTTP/1.1 413 Request Entity Too Large\r\n")
    assert out.endswith(b'{"error": "request body larger than 10 bytes"}\n')
    assert t.disconnecting
    ch.dataReceived(b"x" * 11)  # what still comes is dropped, and never processed
    assert not hasattr(root, "content") and t.value() == out


def test_a_chunked_body_is_refused_when_it_passes_the_limit():
    root, t, ch = connect()
    ch.dataReceived(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    ch.dataReceived(b"a\r\n0123456789\r\n")
    assert t.value() == b""
    ch.dataReceived(b"1\r\nx\r\n0\r\n\r\n")
    assert t.value().startswith(b"HTTP/1.1 413 ") and t.disconnecting
    assert not hasattr(root, "content")


def test_bodies_within_the_limit_are_kept_in_memory():
    root, t, ch = connect()
    ch.dataReceived(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                    b"a\r\n0123456789\r\n0\r\n\r\n")
    assert t.value().startswith(b"HTTP/1.1 200 ") and t.value().endswith(b"got 10")
    assert isinstance(root.content, BytesIO)


def test_a_refusal_with_expect_100_continue_sends_no_continue():
    root, t, ch = connect()
    ch.dataReceived(b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 99\r\n\r\n")
    assert t.value().startswith(b"HTTP/1.1 413 ") and b"100 Continue" not in t.value()


def test_sites_offer_http_1_1_only():
    assert Tiny(Echo()).acceptableProtocols() == [b"http/1.1"]
