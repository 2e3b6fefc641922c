"""Admin requests of the broker door (as RocketMQ 4.9.4's AdminBrokerProcessor): topics,
subscription groups and the broker's runtime settings (the statistics requests are in
L{protocols.remoting.admin_stats}); and the mapping of core errors to remoting codes."""

from mqserver.broker.topics import MAX_QUEUES
from mqserver.errors import (
    DiskFullError, InvalidRequest, InvalidTopicName, NotMaster, StoreError, TopicExists, TopicNotFound,
)

from protocols.remoting import broker_settings, codes
from protocols.remoting.bodies import check_group_config
from protocols.remoting.server import BadRequest, bool_field, error, field, int_field, json_body, ok
from protocols.remoting.tolerant_json import loads_object
from protocols.remoting.topicview import make_attrs, valid_group, valid_name


def broker_error(f, cmd, topic=None):
    """Map a core error to a remoting error response."""
    e = f.value
    if isinstance(e, BadRequest):
        return error(cmd, e.code, str(e))
    if isinstance(e, TopicNotFound):
        return error(cmd, codes.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
    if isinstance(e, NotMaster):
        return error(cmd, codes.SERVICE_NOT_AVAILABLE, str(e))
    if isinstance(e, (InvalidRequest, InvalidTopicName, TopicExists)):
        return error(cmd, codes.SYSTEM_ERROR, str(e))
    if isinstance(e, DiskFullError):
        # The 4.9 broker's answer when its disk is full (PutMessageStatus
        # SERVICE_NOT_AVAILABLE); clients retry another broker.
        return error(cmd, codes.SERVICE_NOT_AVAILABLE,
                     f"service not available now, the broker's disk is full: {e}")
    if isinstance(e, StoreError):
        return error(cmd, codes.SYSTEM_ERROR, f"store error: {e}")
    f.raiseException()


class AdminHandlers:
    """Admin handlers mixed into L{protocols.remoting.broker_protocol.BrokerProtocol}."""

    def create_topic(self, cmd):
        topic = field(cmd, "topic", "")
        if not valid_name(topic):
            return error(cmd, codes.SYSTEM_ERROR, f"topic[{topic}] is illegal")
        read = int_field(cmd, "readQueueNums", 16)
        write = int_field(cmd, "writeQueueNums", 16)
        if not (0 <= read <= MAX_QUEUES and 0 <= write <= MAX_QUEUES):
            # the topic's queues are max(read, write) (at most MAX_QUEUES, the broker
            # checks) and routes tell clients both counts
            return error(cmd, codes.SYSTEM_ERROR,
                         f"readQueueNums and writeQueueNums must be 0..{MAX_QUEUES}")
        perm = int_field(cmd, "perm", 6)
        t = self.broker.topic(topic)
        attrs = make_attrs(t.attrs if t else None, read, write, field(cmd, "topicFilterType", "SINGLE_TAG"),
                           int_field(cmd, "topicSysFlag", 0), bool_field(cmd, "order"))
        d = self.broker.update_topic(topic, queues=max(read, write), perm=perm, attrs=attrs)
        d.addCallback(lambda _: self.door.topics_changed())
        return d.addCallbacks(lambda _: ok(cmd), broker_error, errbackArgs=(cmd, topic))

    def delete_topic(self, cmd):
        topic = field(cmd, "topic", "")
        if self.broker.registry.get(topic) is None:
            # 4.9.4 answers success for a topic it does not have: mqadmin deleteSubGroup
            # deletes the group's %RETRY% and %DLQ% topics whether they exist or not.
            return ok(cmd)
        d = self.broker.delete_topic(topic)
        d.addCallback(lambda _: self.door.topics_changed())
        return d.addCallbacks(lambda _: ok(cmd), broker_error, errbackArgs=(cmd, topic))

    def all_topic_config(self, cmd):
        return ok(cmd, body=json_body(self.door.topic_config_wrapper()))

    def create_group(self, cmd):
        try:
            cfg = loads_object(cmd.body)
        except ValueError:
            return error(cmd, codes.SYSTEM_ERROR, "subscription group body is not JSON")
        if not cfg.get("groupName"):
            return error(cmd, codes.SYSTEM_ERROR, "groupName is required")
        if not isinstance(cfg["groupName"], str) or not valid_group(cfg["groupName"]):
            return error(cmd, codes.SYSTEM_ERROR, f"group[{cfg['groupName']}] is illegal")
        try:
            check_group_config(cfg)
        except ValueError as e:
            return error(cmd, codes.SYSTEM_ERROR, f"bad subscription group: {e}")
        return self.door.set_group_config(cfg).addCallbacks(lambda _: ok(cmd), broker_error, errbackArgs=(cmd,))

    def all_groups(self, cmd):
        return ok(cmd, body=json_body(self.door.group_config_wrapper()))

    def delete_group(self, cmd):
        group = field(cmd, "groupName", "")
        self.door.delete_group_config(group)
        if bool_field(cmd, "removeOffset"):
            self.broker.offsets.drop_group(group)
        return ok(cmd)

    def update_broker_config(self, cmd):
        """UPDATE_BROKER_CONFIG (mqadmin updateBrokerConfig): the body is Java Properties
        text; the runtime settings it names (L{broker_settings.RUNTIME}) change and are
        kept over a restart, other names are ignored as 4.9.4 ignores names it does not
        have. SUCCESS, as 4.9.4 answers; SYSTEM_ERROR with 4.9.4's remark for a body
        Properties cannot read, and for a value the setting cannot take (4.9.4 would
        answer SUCCESS and keep the old value) or a settings file that cannot be written,
        nothing changed then."""
        if not cmd.body:
            return ok(cmd)
        try:
            properties = broker_settings.parse_properties(cmd.body)
        except broker_settings.SettingsError:
            return error(cmd, codes.SYSTEM_ERROR, "string2Properties error")
        try:
            values, ignored = broker_settings.convert(properties)
        except broker_settings.SettingsError as e:
            return error(cmd, codes.SYSTEM_ERROR, f"updateBrokerConfig refused: {e}")
        self.log.info("updateBrokerConfig from {peer}: {values}; ignored: {ignored}",
                      peer=self.peer_str(), values=broker_settings.to_file(values),
                      ignored=", ".join(ignored) or "none")
        if not values:
            return ok(cmd)
        d = self.door.update_settings(values)
        return d.addCallbacks(lambda _: ok(cmd), lambda f: error(
            cmd, codes.SYSTEM_ERROR, f"updateBrokerConfig: writing {broker_settings.SETTINGS_FILE} failed: "
                                     f"{f.getErrorMessage()}"))
