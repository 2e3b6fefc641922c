"""twistd plugins of mqserver. Each object only names a module, loaded lazily, so this
file stays cheap for twistd's plugin scan."""

from twisted.application.service import ServiceMaker

from mqserver.frontdoor import FrontDoor

mqserver = ServiceMaker(
    "mqserver",
    "mqserver.tap",
    "A message broker speaking smss, RocketMQ remoting and NSQ over one commit log",
    "mqserver",
)

smss = FrontDoor(
    "smss",
    "protocols.smss.factory",
    "tcp:12301:interface=127.0.0.1",
    order=10,
    follower="protocols.smss.follower",
)
namesrv = FrontDoor("namesrv", "protocols.remoting.namesrv_door", "tcp:9876:interface=127.0.0.1", order=20)
rocketmq_broker = FrontDoor("broker", "protocols.remoting.broker_door", "tcp:10911:interface=127.0.0.1", order=21)

mqnamesrv = ServiceMaker(
    "mqnamesrv",
    "protocols.remoting.namesrv_tap",
    "A standalone RocketMQ nameserver for mqserver brokers",
    "mqnamesrv",
)
