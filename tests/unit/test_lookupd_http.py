"""The embedded nsqlookupd's HTTP API in process (twisted.web's DummyRequest over the
broker's NSQ node and its registry): POST /channel/delete answered as nsqlookupd 1.3.0's
doDeleteChannel answers it, for the broker's own channels and a remote nsqd's."""

import json

import pytest
from twisted.web.test.requesthelper import DummyRequest

from protocols.nsq.lookupd_http import LookupdHttpResource
from protocols.nsq.node import get_node
from tests.support.inprocess import door_fixtures, result_of

node, _ = door_fixtures()

REMOTE = {"broadcast_address": "10.0.0.2", "tcp_port": 5150, "http_port": 5151,
          "hostname": "other", "remote_address": "10.0.0.2:40000", "version": "1.3.0"}


def call(resource, method, path, **args):
    """Render one request; return (status, decoded JSON body or None)."""
    r = DummyRequest([p for p in path.split(b"/") if p])
    r.method, r.path = method, path
    r.args = {k.encode(): [v.encode()] for k, v in args.items()}
    body = resource.render(r)
    return r.responseCode or 200, json.loads(body) if body else None


@pytest.fixture
def lookupd(node):
    """The embedded lookupd's HTTP resource; the broker has topic t with channel c."""
    nsq = get_node(node.broker, node.config, node.clock)
    nsq.tcp_port, nsq.http_port = 4150, 4151  # what the nsqd doors set once listening
    result_of(nsq.ensure_topic("t"))
    node.broker.channels.create_channel("t", "c")
    return LookupdHttpResource(nsq.lookupd)


def channels(resource, topic="t"):
    status, body = call(resource, b"GET", b"/channels", topic=topic)
    assert status == 200
    return body["channels"]


def test_deleting_the_brokers_own_channel_drops_its_registration(node, lookupd):
    """nsqadmin deletes a channel at the lookupd first: 200 and the registration goes
    (from /channels and /lookup), until the broker adds the channel again, as an nsqd
    registers a channel it creates."""
    assert channels(lookupd) == ["c"]
    assert call(lookupd, b"POST", b"/channel/delete", topic="t", channel="c") == (200, None)
    assert channels(lookupd) == []
    assert call(lookupd, b"GET", b"/lookup", topic="t")[1]["channels"] == []
    # the registration is gone: a second delete finds none, as nsqlookupd's does
    assert call(lookupd, b"POST", b"/channel/delete", topic="t", channel="c") == (
        404, {"message": "CHANNEL_NOT_FOUND"})
    # then nsqadmin deletes it at the nsqd, and a consumer makes it anew
    assert node.broker.channels.delete_channel("t", "c")
    node.broker.channels.create_channel("t", "c")
    assert channels(lookupd) == ["c"]


def test_deleting_a_remote_producers_channel(node, lookupd):
    """A channel a remote nsqd registered over TCP is dropped the same way."""
    registry = lookupd.registry
    registry.identify("peer", REMOTE)
    registry.register("peer", "r", "rc")
    assert channels(lookupd, "r") == ["rc"]
    assert call(lookupd, b"POST", b"/channel/delete", topic="r", channel="rc") == (200, None)
    assert channels(lookupd, "r") == []


@pytest.mark.parametrize("args", [{"topic": "t", "channel": "nope"}, {"topic": "nope", "channel": "c"}],
                         ids=["missing-channel", "missing-topic"])
def test_a_channel_without_registration_is_not_found(lookupd, args):
    """No such channel registration, whether its topic exists or not: 404
    CHANNEL_NOT_FOUND (nsqlookupd looks the (topic, channel) registration up alone)."""
    assert call(lookupd, b"POST", b"/channel/delete", **args) == (404, {"message": "CHANNEL_NOT_FOUND"})
    assert channels(lookupd) == ["c"]


@pytest.mark.parametrize("args, message", [
    ({"channel": "c"}, "MISSING_ARG_TOPIC"),
    ({"topic": "", "channel": "c"}, "INVALID_ARG_TOPIC"),
    ({"topic": "bad!", "channel": "c"}, "INVALID_ARG_TOPIC"),
    ({"topic": "t"}, "MISSING_ARG_CHANNEL"),
    ({"topic": "t", "channel": ""}, "INVALID_ARG_CHANNEL"),
], ids=["no-topic", "empty-topic", "bad-topic", "no-channel", "empty-channel"])
def test_bad_arguments(lookupd, args, message):
    """The arguments are checked in nsqlookupd's order; an empty value is present and
    invalid, not missing."""
    assert call(lookupd, b"POST", b"/channel/delete", **args) == (400, {"message": message})
    assert channels(lookupd) == ["c"]
