"""The broker settings mqadmin's updateBrokerConfig (UPDATE_BROKER_CONFIG, code 25)
changes while the broker runs: their RocketMQ 4.9.4 names, the ``rocketmq.*`` config key
each stands for, reading the request's Java Properties text, and ``brokerConfig.json`` in
the data directory, which keeps the changes over a restart (4.9.4 rewrites its
broker.properties)."""

import re

from mqserver.config import ConfigError, check_value

from protocols.remoting.config import KEYS

#: The file in the data directory holding the settings changed by updateBrokerConfig,
#: by their 4.9.4 names; applied over config.yaml when the broker door starts.
SETTINGS_FILE = "brokerConfig.json"

#: 4.9.4 name -> config key of the settings that take effect at once: topic and group
#: auto-creation, the delay levels of messages delayed from then on, the transaction
#: check's timeout and limit, the idle timeout of new connections. The broker's
#: identity, addresses, registration, listeners and start-up choices (such as
#: defaultTopicQueueNums, TBW102's queue count) are set in config.yaml only.
RUNTIME = {
    "autoCreateTopicEnable": "rocketmq.autoCreateTopicEnable",
    "autoCreateSubscriptionGroup": "rocketmq.autoCreateSubscriptionGroup",
    "messageDelayLevel": "rocketmq.messageDelayLevel",
    "transactionTimeOut": "rocketmq.transactionTimeoutMs",
    "transactionCheckMax": "rocketmq.transactionCheckMax",
    "serverChannelMaxIdleTimeSeconds": "rocketmq.serverChannelMaxIdleTimeSeconds",
}

_INT = re.compile(r"[+-]?[0-9]+")


class SettingsError(ValueError):
    """An updateBrokerConfig body or a setting's value the broker cannot take."""


def parse_properties(body):
    """Return the properties of a Java Properties text (bytes, UTF-8 as 4.9.4 reads it)
    as a dict of strings. Raises L{SettingsError} where Java's C{Properties.load} fails
    (a malformed C{\\uXXXX} escape)."""
    import javaproperties  # only this request needs it: an idle broker does not load it

    try:
        return javaproperties.loads(body.decode("utf-8", "replace"))
    except ValueError as e:
        raise SettingsError(str(e)) from None


def convert(properties):
    """Return C{{config key: value}} of the runtime settings among C{properties}
    (4.9.4 name -> text), each value checked as config.yaml's is, and the names left
    out (4.9.4 ignores names it does not have; the others are not changeable here).
    Raises L{SettingsError} naming the first setting whose value does not suit."""
    values, ignored = {}, []
    for name, text in sorted(properties.items()):
        key = RUNTIME.get(name)
        if key is None:
            ignored.append(name)
            continue
        typ = KEYS[key][0]
        value = text.strip()
        if typ is bool and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        elif typ is int and _INT.fullmatch(value):
            value = int(value)
        elif typ is str:
            value = text
        try:
            check_value(key, value, KEYS[key])
        except ConfigError as e:
            raise SettingsError(f"{name}: {e}") from None
        values[key] = value
    return values, ignored


def to_file(values):
    """The content of L{SETTINGS_FILE} for C{values} (config key -> value)."""
    names = {key: name for name, key in RUNTIME.items()}
    return {names[key]: value for key, value in sorted(values.items())}


def from_file(data):
    """Return C{{config key: value}} of L{SETTINGS_FILE}'s content C{data}.
    Raises L{SettingsError} when it is not what L{to_file} writes."""
    if not isinstance(data, dict):
        raise SettingsError("not a JSON object")
    values, ignored = convert({name: _text(v) for name, v in data.items()})
    if ignored:
        raise SettingsError(f"unknown settings {', '.join(ignored)}")
    return values


def _text(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
