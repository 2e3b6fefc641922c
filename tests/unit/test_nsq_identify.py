"""IDENTIFY negotiation as nsqd v1.3.0 does it."""
import json

import pytest

from protocols.nsq.errors import NsqError
from protocols.nsq.identify import ClientSettings, ServerSettings, negotiate

OBSERVED_REPLY = (
    b'{"max_rdy_count":2500,"version":"1.3.0","max_msg_timeout":900000,"msg_timeout":60000,'
    b'"tls_v1":false,"deflate":false,"deflate_level":6,"max_deflate_level":6,"snappy":false,'
    b'"sample_rate":0,"auth_required":false,"output_buffer_size":16384,'
    b'"output_buffer_timeout":250}')


def nego(server=ServerSettings(), **fields):
    """Negotiate a JSON body built from keyword fields."""
    return negotiate(json.dumps(fields).encode(), server)


def fails(text, server=ServerSettings(), **fields):
    """Assert negotiation fails fatally with exactly ``text``."""
    with pytest.raises(NsqError) as info:
        nego(server, **fields)
    assert info.value.data == text and info.value.fatal


def test_default_reply_is_byte_identical_to_observed():
    """The spec's §12 (a) IDENTIFY yields nsqd's observed 264-byte JSON reply."""
    body = (b'{"client_id":"c","feature_negotiation":true,"heartbeat_interval":30000}')
    result = negotiate(body)
    assert result.reply() == OBSERVED_REPLY and len(OBSERVED_REPLY) == 264
    assert result.client.client_id == "c" and result.client.heartbeat_interval_ms == 30000


def test_without_feature_negotiation_reply_is_ok_and_no_upgrade():
    """No feature_negotiation -> plain OK, no upgrades even if requested, no conflict error."""
    result = nego(snappy=True, deflate=True, tls_v1=True)
    assert result.reply() == b"OK" and result.response is None
    assert not (result.snappy or result.deflate or result.tls_v1)
    assert negotiate(b"{}").reply() == b"OK"


@pytest.mark.parametrize("field,value,text", [
    ("heartbeat_interval", 500, b"E_BAD_BODY IDENTIFY heartbeat interval (500) is invalid"),
    ("heartbeat_interval", 60001, b"E_BAD_BODY IDENTIFY heartbeat interval (60001) is invalid"),
    ("heartbeat_interval", -2, b"E_BAD_BODY IDENTIFY heartbeat interval (-2) is invalid"),
    ("output_buffer_size", 63, b"E_BAD_BODY IDENTIFY output buffer size (63) is invalid"),
    ("output_buffer_size", 65537, b"E_BAD_BODY IDENTIFY output buffer size (65537) is invalid"),
    ("output_buffer_timeout", 24,
     b"E_BAD_BODY IDENTIFY output buffer timeout (24) is invalid"),
    ("output_buffer_timeout", 30001,
     b"E_BAD_BODY IDENTIFY output buffer timeout (30001) is invalid"),
    ("sample_rate", 100, b"E_BAD_BODY IDENTIFY sample rate (100) is invalid"),
    ("sample_rate", -1, b"E_BAD_BODY IDENTIFY sample rate (-1) is invalid"),
    ("msg_timeout", 999, b"E_BAD_BODY IDENTIFY msg timeout (999) is invalid"),
    ("msg_timeout", 900001, b"E_BAD_BODY IDENTIFY msg timeout (900001) is invalid"),
    ("msg_timeout", -1, b"E_BAD_BODY IDENTIFY msg timeout (-1) is invalid"),
])
def test_out_of_range_values(field, value, text):
    """Each out-of-range setting is fatal E_BAD_BODY naming the prose setting and value."""
    fails(text, **{field: value})


@pytest.mark.parametrize("field,value,attr,expected", [
    ("heartbeat_interval", 1000, "heartbeat_interval_ms", 1000),
    ("heartbeat_interval", 60000, "heartbeat_interval_ms", 60000),
    ("heartbeat_interval", -1, "heartbeat_interval_ms", 0),
    ("output_buffer_size", 64, "output_buffer_size", 64),
    ("output_buffer_size", 65536, "output_buffer_size", 65536),
    ("output_buffer_timeout", 25, "output_buffer_timeout_ms", 25),
    ("output_buffer_timeout", 30000, "output_buffer_timeout_ms", 30000),
    ("output_buffer_timeout", -1, "output_buffer_timeout_ms", 0),
    ("sample_rate", 99, "sample_rate", 99),
    ("msg_timeout", 1000, "msg_timeout_ms", 1000),
    ("msg_timeout", 900000, "msg_timeout_ms", 900000),
])
def test_boundary_values_accepted(field, value, attr, expected):
    """Range bounds are inclusive and -1 disables where nsqd allows it."""
    assert getattr(nego(**{field: value}).client, attr) == expected


def test_unbuffered_output_forces_timeout_zero():
    """output_buffer_size -1 means size 1 and no timed flush, whatever timeout was asked."""
    result = nego(feature_negotiation=True, output_buffer_size=-1, output_buffer_timeout=100)
    assert result.response["output_buffer_size"] == 1
    assert result.response["output_buffer_timeout"] == 0


def test_checks_run_in_nsqd_order():
    """Heartbeat is checked before output buffer timeout, size, sample rate, msg timeout."""
    fails(b"E_BAD_BODY IDENTIFY heartbeat interval (1) is invalid",
          heartbeat_interval=1, output_buffer_size=1, sample_rate=500, msg_timeout=1)
    fails(b"E_BAD_BODY IDENTIFY output buffer timeout (1) is invalid",
          output_buffer_size=1, output_buffer_timeout=1)
    fails(b"E_BAD_BODY IDENTIFY sample rate (500) is invalid", sample_rate=500, msg_timeout=1)


def test_zero_keeps_current_values():
    """0 keeps the connection's current value (a repeated IDENTIFY), except sample_rate."""
    current = ClientSettings(heartbeat_interval_ms=5000, output_buffer_size=100,
                             output_buffer_timeout_ms=50, sample_rate=10, msg_timeout_ms=2000)
    result = negotiate(b'{"feature_negotiation":true}', ServerSettings(), current)
    assert result.client.heartbeat_interval_ms == 5000
    assert result.response["output_buffer_size"] == 100
    assert result.response["output_buffer_timeout"] == 50
    assert result.response["msg_timeout"] == 2000
    assert result.response["sample_rate"] == 0  # nsqd stores sample_rate unconditionally


def test_both_compressions_is_identify_failed():
    """Granting both snappy and deflate is fatal E_IDENTIFY_FAILED."""
    fails(b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression",
          feature_negotiation=True, snappy=True, deflate=True)


def test_both_compressions_allowed_when_one_is_disabled_on_server():
    """Only granted features conflict: with deflate off on the server snappy wins."""
    result = nego(ServerSettings(deflate_enabled=False), feature_negotiation=True,
                  snappy=True, deflate=True)
    assert result.snappy and not result.deflate and result.response["deflate"] is False


@pytest.mark.parametrize("asked,deflate,expected", [
    (None, True, 6), (0, True, 6), (-3, True, 6), (1, True, 1), (5, True, 5), (9, True, 6),
    (3, False, 6),  # the client's level is only taken when deflate is granted
])
def test_deflate_level(asked, deflate, expected):
    """deflate_level: default 6, non-positive -> 6, capped at max_deflate_level."""
    fields = {"feature_negotiation": True, "deflate": deflate}
    if asked is not None:
        fields["deflate_level"] = asked
    result = nego(**fields)
    assert result.deflate_level == expected == result.response["deflate_level"]
    assert result.deflate is deflate


def test_deflate_level_cap_follows_server():
    """A server allowing level 9 grants 9 and reports max_deflate_level 9."""
    result = nego(ServerSettings(max_deflate_level=9), feature_negotiation=True,
                  deflate=True, deflate_level=9)
    assert result.deflate_level == 9 and result.response["max_deflate_level"] == 9


def test_features_granted_only_if_enabled():
    """tls_v1/snappy are true only when asked for and available on the server."""
    asked = dict(feature_negotiation=True, tls_v1=True, snappy=True)
    default = nego(**asked)
    assert default.snappy and not default.tls_v1  # no certificate by default
    result = nego(ServerSettings(tls_available=True, snappy_enabled=False), **asked)
    assert result.tls_v1 and not result.snappy
    assert result.response["tls_v1"] is True and result.response["snappy"] is False


def test_reply_reflects_server_and_client_settings():
    """The reply carries server limits plus this connection's effective values."""
    server = ServerSettings(max_rdy_count=100, version="9.9.9", auth_required=True)
    result = nego(server, feature_negotiation=True, msg_timeout=5000, sample_rate=20,
                  output_buffer_size=1024, output_buffer_timeout=100)
    assert result.response == {
        "max_rdy_count": 100, "version": "9.9.9", "max_msg_timeout": 900000,
        "msg_timeout": 5000, "tls_v1": False, "deflate": False, "deflate_level": 6,
        "max_deflate_level": 6, "snappy": False, "sample_rate": 20, "auth_required": True,
        "output_buffer_size": 1024, "output_buffer_timeout": 100}


@pytest.mark.parametrize("body", [
    b"", b"not json", b"[]", b'"x"', b"1", b'{"heartbeat_interval":"1000"}',
    b'{"heartbeat_interval":1000.0}', b'{"heartbeat_interval":1e3}', b'{"snappy":1}',
    b'{"client_id":5}', b'{"sample_rate":2147483648}', b'{"msg_timeout":NaN}',
    b'{"heartbeat_interval":9223372036854775808}', b'{"a":1',
])
def test_undecodable_bodies(body):
    """Bodies Go's JSON decoder rejects give `IDENTIFY failed to decode JSON body`."""
    with pytest.raises(NsqError) as info:
        negotiate(body)
    assert info.value.data == b"E_BAD_BODY IDENTIFY failed to decode JSON body"


def test_go_json_leniency():
    """Like Go: null is a no-op, keys match case-insensitively, unknown keys are ignored."""
    assert negotiate(b"null").reply() == b"OK"
    result = negotiate(b'{"Feature_Negotiation":true,"HEARTBEAT_INTERVAL":2000,'
                       b'"short_id":"x","long_id":"y","client_id":null,"extra":{"a":[1]}}')
    assert result.feature_negotiation and result.client.heartbeat_interval_ms == 2000
    assert result.client.client_id == ""


def test_identity_fields_recorded():
    """client_id, hostname and user_agent are taken from the body."""
    c = nego(client_id="a", hostname="h.local", user_agent="pynsq/0.9.1").client
    assert (c.client_id, c.hostname, c.user_agent) == ("a", "h.local", "pynsq/0.9.1")
