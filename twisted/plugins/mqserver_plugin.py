"""twistd plugins of mqserver: each line only names a tap module, loaded lazily."""

from twisted.application.service import ServiceMaker

mqserver = ServiceMaker(
    "mqserver",
    "mqserver.tap",
    "A message broker speaking smss, RocketMQ remoting and NSQ over one commit log",
    "mqserver",
)
