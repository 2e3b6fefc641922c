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
