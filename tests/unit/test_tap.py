"""The twistd plugin, its options, the service tree it builds, and config validation."""

import pytest
from twisted.application.service import IServiceMaker
from twisted.plugin import getPlugins

from mqserver.config import ConfigError, build_config
from mqserver.frontdoor import front_doors
from mqserver.tap import Options, makeService


def test_plugin_is_found():
    """twistd finds a service maker called mqserver."""
    import twisted.plugins

    names = [p.tapname for p in getPlugins(IServiceMaker, twisted.plugins)]
    assert "mqserver" in names


def test_front_doors_are_plugins():
    """The smss front door is found through the plugin system, with its default port."""
    doors = front_doors()
    assert doors["smss"].default_endpoint == "tcp:12301:interface=127.0.0.1"


def test_defaults_and_service_tree(tmp_path):
    """With no config, data goes to ./data and smss listens on 127.0.0.1:12301."""
    o = Options()
    o.parseOptions([])
    cfg = o["settings"]
    assert cfg["store.path"] == "data"
    assert cfg.listen["smss"] == "tcp:12301:interface=127.0.0.1"
    o2 = Options()
    o2.parseOptions(["--data", str(tmp_path), "--listen", "smss=tcp:0"])
    root = makeService(o2)
    assert [s.name for s in root] == [
        "storage", "roles", "listen-smss", "listen-namesrv",
        "rocketmq-broker", "rocketmq-tick", "rocketmq-register", "rocketmq-expire-clients",
        "rocketmq-check-transactions",
        "listen-broker", "listen-nsqd_tcp", "listen-nsqd_http", "listen-lookupd_tcp",
        "listen-lookupd_http", "msgout-pushes", "listen-msgout", "listen-console", "listen-metrics",
        "listen-admin",
    ]
    assert cfg.listen["msgout"] == "tcp:8280:interface=127.0.0.1"
    assert cfg.listen["console"] == "tcp:12300:interface=127.0.0.1"
    # the store's loops are children of the storage service (stopped before it closes)
    assert [s.name for s in root.getServiceNamed("storage")] == ["checkpoint", "offsets", "retention"]
    assert cfg.listen["namesrv"] == "tcp:9876:interface=127.0.0.1"
    assert cfg.listen["broker"] == "tcp:10911:interface=127.0.0.1"


def test_listen_off(tmp_path):
    """A front door set to off gets no listener."""
    o = Options()
    off = [a for door in front_doors() for a in ("--listen", f"{door}=off")]
    o.parseOptions(["--data", str(tmp_path), *off])
    assert [s.name for s in makeService(o)] == ["storage", "roles"]


def refused(capsys, args):
    """What C{Options().parseOptions(args)} writes before it ends the process."""
    with pytest.raises(SystemExit) as exit_info:
        Options().parseOptions(args)
    assert exit_info.value.code == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    return err


def test_bad_options_end_the_process_with_one_line(tmp_path, capsys):
    """Unknown front doors, malformed --listen, unknown options and bad config files
    end the process with one line on stderr (not twistd's usage text)."""
    assert refused(capsys, ["--listen", "nope=tcp:1"]) == (
        "mqserver cannot start: unknown front door 'nope' in --listen\n")
    assert "--listen wants NAME=ENDPOINT" in refused(capsys, ["--listen", "smss"])
    assert "--bogus" in refused(capsys, ["--bogus"])
    cfg = tmp_path / "c.yaml"
    cfg.write_text("store:\n  flushLevl: 2\n")
    assert "store.flushLevl" in refused(capsys, ["--config", str(cfg)])
    cfg.write_text("store: [\n  x: : :\n")
    assert refused(capsys, ["--config", str(cfg)]).endswith(
        "is not valid YAML: expected the node content, but found ':' at line 2, column 6\n")


@pytest.mark.parametrize(
    "data, message",
    [
        ({"store": {"flushLevel": 3}}, "store.flushLevel"),
        ({"store": {"maxLogSize": "big"}}, "store.maxLogSize"),
        ({"log": {"sample": 0}}, "log.sample"),
        ({"store": {"folderCount": 0}}, "store.folderCount"),
        ({"listen": {"smss": 5}}, "listen.smss"),
        ({"listen": {"kafka": "tcp:9092"}}, "listen.kafka"),
        ({"bogus": 1}, "bogus"),
        ({"store": {"noCache": "yes"}}, "store.noCache"),
        ({"server": {"spinMicros": -1}}, "server.spinMicros"),
        ({"server": {"spinMicros": 20_000}}, "server.spinMicros"),
    ],
)
def test_config_errors_name_the_key(data, message):
    """Each invalid setting is refused with an error naming its key."""
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        build_config(data)


def test_config_smss_keys_and_aliases():
    """smss's key names are read, the README's alias for the alive interval too, and port
    is a shorthand for the smss listener."""
    cfg = build_config({"port": 12399, "time": {"server": {"alive": 500}},
                        "store": {"flushLevel": 2, "maxLogSize": 65536}})
    assert cfg["timeout.server.alive"] == 500
    assert cfg["store.flushLevel"] == 2
    assert cfg.listen["smss"] == "tcp:12399:interface=127.0.0.1"
    assert build_config({"listen": {"smss": "off"}}).listen["smss"] is None
    assert build_config({})["server.spinMicros"] == 200
    assert build_config({"server": {"spinMicros": 0}})["server.spinMicros"] == 0


class _Door:
    """A stand-in front door plugin naming a config module."""

    def __init__(self, name, config=None, default_endpoint="tcp:0"):
        self.name = name
        self.config = config
        self.default_endpoint = default_endpoint


def test_front_doors_own_their_keys(monkeypatch):
    """A door's keys are known only when a door declaring them is installed: without the
    RocketMQ doors, rocketmq.* is an unknown key; with a door of our own, its keys, aliases
    and cross-key check apply."""
    import sys
    import types

    doors = {"smss": front_doors()["smss"]}
    with pytest.raises(ConfigError, match=r"unknown config key 'rocketmq\.brokerName'"):
        build_config({"rocketmq": {"brokerName": "b"}}, doors=doors)
    assert build_config({"store": {"folderCount": 3}}, doors=doors)["store.folderCount"] == 3

    mod = types.ModuleType("fake_door_config")
    mod.KEYS = {"fake.size": (int, 5, lambda v: v > 0, "> 0"), "fake.name": (str, "x", None, None)}
    mod.ALIASES = {"fake.bytes": "fake.size"}

    def validate(values):
        if values["fake.name"] == "bad" and values["fake.size"] > 1:
            raise ConfigError("config key 'fake.name' cannot be bad with fake.size > 1")

    mod.validate = validate
    monkeypatch.setitem(sys.modules, "fake_door_config", mod)
    doors = {"a": _Door("a", "fake_door_config"), "b": _Door("b", "fake_door_config")}
    cfg = build_config({"fake": {"bytes": 7}}, doors=doors)
    assert cfg["fake.size"] == 7 and cfg["fake.name"] == "x"
    assert cfg.listen == {"a": "tcp:0", "b": "tcp:0"}
    with pytest.raises(ConfigError, match=r"'fake\.size' must be > 0"):
        build_config({"fake": {"size": 0}}, doors=doors)
    with pytest.raises(ConfigError, match=r"'fake\.name' cannot be bad"):
        build_config({"fake": {"name": "bad"}}, doors=doors)
    with pytest.raises(ConfigError, match=r"unknown config key 'fake\.other'"):
        build_config({"fake": {"other": 1}}, doors=doors)


def test_a_key_declared_twice_is_refused(monkeypatch):
    """Two config modules declaring the same key is a plugin error, not a silent override."""
    import sys
    import types

    mod = types.ModuleType("fake_dup_config")
    mod.KEYS = {"store.path": (str, "elsewhere", None, None)}
    monkeypatch.setitem(sys.modules, "fake_dup_config", mod)
    with pytest.raises(ConfigError, match=r"'store\.path' is declared twice"):
        build_config({}, doors={"d": _Door("d", "fake_dup_config")})
