"""The core's network-safety pieces: the allow-list, the bearer token resource and the
console's AUTH line gate."""

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.task import Clock
from twisted.logger import Logger
from twisted.web import resource, server

from mqserver.config import ConfigError, load_config
from mqserver.security import AllowList, BearerTokenResource, LineTokenGate, valid_networks


def v4(host):
    return IPv4Address("TCP", host, 1234)


def test_allow_list_matches_networks_and_addresses():
    a = AllowList(["10.0.0.0/8", "192.168.1.7", "::1/128"], Clock().seconds)
    assert a.allows(v4("10.1.2.3")) and a.allows(v4("192.168.1.7"))
    assert not a.allows(v4("192.168.1.8")) and not a.allows(v4("127.0.0.1"))
    assert a.allows(IPv6Address("TCP", "::1", 1)) and not a.allows(IPv6Address("TCP", "::2", 1))
    assert a.allows(IPv6Address("TCP", "::ffff:10.0.0.1", 1))  # IPv4 on a dual-stack socket
    assert a.allows(UNIXAddress(b"/tmp/sock"))  # local sockets have no address to check
    assert AllowList([], Clock().seconds).allows(v4("8.8.8.8"))  # empty: open


def test_refusals_are_logged_once_per_address_per_minute():
    clock = Clock()
    a = AllowList(["10.0.0.0/8"], clock.seconds)
    events = []
    a.log = Logger(observer=events.append)
    for _ in range(5):
        a.note_refused(v4("1.2.3.4"), "smss")
    a.note_refused(v4("5.6.7.8"), "smss")
    clock.advance(59)
    a.note_refused(v4("1.2.3.4"), "smss")
    assert [e["host"] for e in events] == ["1.2.3.4", "5.6.7.8"]
    clock.advance(1)
    a.note_refused(v4("1.2.3.4"), "nsqd_tcp")
    assert [(e["host"], e["door"]) for e in events][-1] == ("1.2.3.4", "nsqd_tcp")
    assert a.refused == 8


def test_config_key_is_checked():
    assert valid_networks(["10.0.0.0/8", "::1"]) and not valid_networks(["10.0.0.0/33"])
    assert load_config(None, {"security.allow": ["127.0.0.0/8"]})["security.allow"] == ["127.0.0.0/8"]
    with pytest.raises(ConfigError):
        load_config(None, {"security.allow": ["not-a-network"]})


def test_line_gate():
    assert LineTokenGate("").passed and LineTokenGate(None).passed
    g = LineTokenGate("s3cret")
    assert not g.passed
    assert g.check(b"LIST") == (LineTokenGate.REQUIRED, False)
    assert g.check(b"AUTH nope") == (LineTokenGate.WRONG, False) and not g.passed
    assert g.check(b"auth s3cret ") == (b"OK", True) and g.passed


class Leaf(resource.Resource):
    isLeaf = True

    def render(self, request):
        return b"path=" + request.path + b" postpath=" + b"/".join(request.postpath)


@pytest_twisted.inlineCallbacks
def test_bearer_token_resource_over_http():
    import treq

    root = resource.Resource()
    root.putChild(b"api", Leaf())
    sites = [BearerTokenResource(Leaf(), "s3cret"), BearerTokenResource(root, "s3cret"),
             BearerTokenResource(Leaf(), "")]
    ports = [reactor.listenTCP(0, server.Site(s), interface="127.0.0.1") for s in sites]
    try:
        leaf, tree, open_ = (f"http://127.0.0.1:{p.getHost().port}" for p in ports)
        good = {"Authorization": "Bearer s3cret"}
        for url in (leaf + "/pub?topic=t", tree + "/api/x"):
            r = yield treq.get(url)
            assert r.code == 401 and r.headers.getRawHeaders("WWW-Authenticate") == ['Bearer realm="mqserver"']
            yield r.content()
            r = yield treq.get(url, headers={"Authorization": "Bearer wrong"})
            assert r.code == 401
            yield r.content()
        r = yield treq.get(leaf + "/pub?topic=t", headers=good)
        assert (r.code, (yield r.content())) == (200, b"path=/pub postpath=pub")
        r = yield treq.get(tree + "/api/x", headers=good)
        assert (r.code, (yield r.content())) == (200, b"path=/api/x postpath=x")
        r = yield treq.get(leaf + "/", headers=good)
        assert r.code == 200
        yield r.content()
        r = yield treq.get(open_ + "/anything")
        assert r.code == 200
        yield r.content()
    finally:
        for p in ports:
            yield p.stopListening()
