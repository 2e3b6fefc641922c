"""The auth server's reply as nsqd reads and applies it (internal/auth)."""

import json

import pytest

from protocols.nsq.auth import AuthReplyError, auth_url, parse_reply


def state(*grants, ttl=60):
    return parse_reply(json.dumps({"ttl": ttl, "identity": "i", "authorizations": list(grants)}), 1000.0)


def test_permissions_and_regexes_match_as_nsqd_does():
    s = state({"topic": "orders", "channels": ["^c"], "permissions": ["subscribe"]},
              {"topic": "^logs$", "channels": [".*"], "permissions": ["publish"]})
    assert s.allows("new_orders_eu", "c1")  # Go's MatchString: a match anywhere
    assert not s.allows("new_orders_eu", "x")
    assert not s.allows("orders")  # no publish grant on it
    assert s.allows("logs") and not s.allows("logs2")
    assert s.expires == 1060.0 and not s.expired(1060.0) and s.expired(1060.5)


def test_publish_needs_a_channel_regex_matching_the_empty_channel():
    """nsqd checks the (empty) channel of a publish against the grant's channels too."""
    assert not state({"topic": ".*", "channels": ["^c$"], "permissions": ["publish"]}).allows("t")
    assert not state({"topic": ".*", "channels": [], "permissions": ["publish"]}).allows("t")


@pytest.mark.parametrize("reply", [
    b"not json", b"[]", b'{"ttl": 0}', b'{"ttl": -5}', b'{"ttl": "60"}',
    b'{"ttl": 60, "authorizations": [{"topic": "(", "channels": [], "permissions": []}]}',
    b'{"ttl": 60, "authorizations": [{"topic": "t", "channels": ["["], "permissions": []}]}',
    b'{"ttl": 60, "authorizations": [{"topic": "t", "channels": [], "permissions": ["admin"]}]}',
])
def test_unusable_replies_are_refused(reply):
    with pytest.raises(AuthReplyError):
        parse_reply(reply, 0.0)


def test_auth_url():
    assert auth_url("127.0.0.1:4181", "10.0.0.1", True, "s&x") == (
        "http://127.0.0.1:4181/auth?remote_ip=10.0.0.1&tls=true&secret=s%26x&common_name=")
    assert auth_url("https://a.example/v1/auth", "ip", False, "s").startswith(
        "https://a.example/v1/auth?remote_ip=ip&tls=false")
