"""Which configurations load Twisted's TLS stack (mqserver.runtime.tlsstack): every
way a broker can use TLS names itself, and a configuration using none names nothing."""

import sys

import pytest

from mqserver.config import build_config
from mqserver.frontdoor import front_doors
from mqserver.runtime import tlsstack

DOORS = front_doors()
PLAIN = "tcp:0:interface=127.0.0.1"


def config(listen=None, **data):
    """A config with every door off but those of C{listen} (default: smss on TCP)."""
    listen = dict({name: "off" for name in DOORS}, **(listen or {"smss": PLAIN}))
    return build_config(dict(data, listen=listen), None, DOORS)


@pytest.mark.parametrize("listen", [
    {"smss": PLAIN},
    {"smss": PLAIN, "nsqd_tcp": "tcp6:0:interface=\\:\\:1", "broker": "unix:/tmp/x.sock",
     "namesrv": PLAIN, "nsqd_http": PLAIN, "lookupd_tcp": PLAIN, "lookupd_http": PLAIN,
     "console": PLAIN, "metrics": PLAIN, "admin": PLAIN},
])
def test_plain_doors_need_no_tls(listen):
    assert tlsstack.uses(config(listen), DOORS) == []


@pytest.mark.parametrize("listen, data, reason", [
    ({"smss": "ssl:0:privateKey=k.pem:certKey=c.pem"}, {}, "door smss listens on ssl:"),
    ({"smss": PLAIN, "msgout": PLAIN}, {}, "door msgout (pushes to https:// URLs)"),
    ({"smss": PLAIN}, {"role": "slave", "master": "127.0.0.1:1", "masterTls": True}, "masterTls"),
    ({"smss": PLAIN}, {"role": "slave", "master": "tls:127.0.0.1:1"}, "master tls:"),
    ({"smss": PLAIN}, {"cluster": {"etcd": "https://127.0.0.1:2379", "group": "g", "name": "a"},
                       "replication": {"syncReplicas": 1}}, "cluster.etcd https://"),
    ({"nsqd_tcp": PLAIN}, {"nsq": {"tlsCert": "c.pem", "tlsKey": "k.pem"}}, "nsq.tlsCert"),
    ({"nsqd_tcp": PLAIN}, {"nsq": {"authHttpAddresses": ["HTTPS://auth.example/auth"]}},
     "nsq.authHttpAddresses https://"),
])
def test_each_use_of_tls_is_named(listen, data, reason):
    assert tlsstack.uses(config(listen, **data), DOORS) == [reason]


def test_plain_auth_and_etcd_urls_need_no_tls():
    c = config({"nsqd_tcp": PLAIN}, nsq={"authHttpAddresses": ["127.0.0.1:4181", "http://a/auth"]},
               cluster={"etcd": "http://127.0.0.1:2379", "group": "g", "name": "a"},
               replication={"syncReplicas": 1})
    assert tlsstack.uses(c, DOORS) == []


def test_choices_that_keep_the_stack_leave_the_process_alone():
    """C{always}, a use of TLS, or a process whose TCP module is loaded already (this
    one: the test runner's reactor) keep the stack; none of them changes sys.modules."""
    assert "twisted.internet.tcp" in sys.modules
    before = sys.modules.get("OpenSSL")
    always = tlsstack.choose(config(server={"tlsStack": "always"}), DOORS)
    used = tlsstack.choose(config({"smss": PLAIN, "msgout": PLAIN}), DOORS)
    late = tlsstack.choose(config(), DOORS)
    assert (always.loaded, used.loaded, late.loaded) == (True, True, True)
    assert "always" in always.why and "msgout" in used.why and "before" in late.why
    assert sys.modules.get("OpenSSL") is before is not None
