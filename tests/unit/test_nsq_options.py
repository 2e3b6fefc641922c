"""nsqd's client-overridable options as config keys: the start-up checks (the broker's
use of them: tests/integration/test_nsq_options.py)."""

import pytest

from mqserver.config import ConfigError, build_config
from protocols.nsq.identify import ServerSettings


def test_defaults_are_nsqds():
    """Unset, the keys give nsqd 1.3's defaults: the settings IDENTIFY had before."""
    cfg = build_config({})
    d = ServerSettings()
    assert (cfg["nsq.maxMsgTimeout"], cfg["nsq.maxHeartbeatInterval"],
            cfg["nsq.maxOutputBufferSize"], cfg["nsq.outputBufferTimeout"],
            cfg["nsq.minOutputBufferTimeout"], cfg["nsq.maxOutputBufferTimeout"],
            cfg["nsq.deflate"], cfg["nsq.maxDeflateLevel"], cfg["nsq.snappy"]) == (
        d.max_msg_timeout_ms, d.max_heartbeat_interval_ms, d.max_output_buffer_size,
        d.output_buffer_timeout_ms, d.min_output_buffer_timeout_ms,
        d.max_output_buffer_timeout_ms, d.deflate_enabled, d.max_deflate_level,
        d.snappy_enabled)
    assert cfg["nsq.maxReqTimeout"] == 3600000
    assert cfg["nsq.maxChannelConsumers"] == 0  # no limit


@pytest.mark.parametrize("values, message", [
    ({"maxDeflateLevel": 10}, "'nsq.maxDeflateLevel' must be 1..9"),
    ({"maxDeflateLevel": 0}, "'nsq.maxDeflateLevel' must be 1..9"),
    ({"minOutputBufferTimeout": 600, "maxOutputBufferTimeout": 500},
     "'nsq.minOutputBufferTimeout' (600) is above 'nsq.maxOutputBufferTimeout' (500)"),
    ({"outputBufferTimeout": 20},
     "'nsq.outputBufferTimeout' (20) is outside 'nsq.minOutputBufferTimeout'..'nsq.maxOutputBufferTimeout' (25..30000)"),
    ({"msgTimeout": 60000, "maxMsgTimeout": 30000},
     "'nsq.msgTimeout' (60000) is above 'nsq.maxMsgTimeout' (30000)"),
    ({"maxOutputBufferSize": 63}, "'nsq.maxOutputBufferSize' must be 64.."),
    ({"maxHeartbeatInterval": 999}, "'nsq.maxHeartbeatInterval' must be >= 1000"),
    ({"maxChannelConsumers": -1}, "'nsq.maxChannelConsumers' must be >= 0"),
])
def test_bad_options_refused_at_start(values, message):
    with pytest.raises(ConfigError) as e:
        build_config({"nsq": values})
    assert message in str(e.value)
