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
    config="protocols.smss.config",
)
namesrv = FrontDoor("namesrv", "protocols.remoting.namesrv_door", "tcp:9876:interface=127.0.0.1",
                    order=20, config="protocols.remoting.config")
rocketmq_broker = FrontDoor("broker", "protocols.remoting.broker_door",
                            "tcp:10911:interface=127.0.0.1", order=21,
                            config="protocols.remoting.config")

mqnamesrv = ServiceMaker(
    "mqnamesrv",
    "protocols.remoting.namesrv_tap",
    "A standalone RocketMQ nameserver for mqserver brokers",
    "mqnamesrv",
)

mqlookupd = ServiceMaker(
    "mqlookupd",
    "protocols.nsq.lookupd_tap",
    "A standalone nsqlookupd (TCP V1 and HTTP) for NSQ clients and mqserver nodes",
    "mqlookupd",
)

_NSQ_KEYS = "protocols.nsq.config"
nsqd_tcp = FrontDoor("nsqd_tcp", "protocols.nsq.factory", "tcp:4150:interface=127.0.0.1",
                     order=30, config=_NSQ_KEYS)
nsqd_http = FrontDoor("nsqd_http", "protocols.nsq.http_door", "tcp:4151:interface=127.0.0.1",
                      order=31, config=_NSQ_KEYS)
lookupd_tcp = FrontDoor("lookupd_tcp", "protocols.nsq.lookupd", "tcp:4160:interface=127.0.0.1",
                        order=32, config=_NSQ_KEYS)
lookupd_http = FrontDoor("lookupd_http", "protocols.nsq.lookupd_http_door",
                         "tcp:4161:interface=127.0.0.1", order=33, config=_NSQ_KEYS)

msgout = FrontDoor("msgout", "protocols.msgout.door", "tcp:8280:interface=127.0.0.1",
                   order=40, config="protocols.msgout.config")
console = FrontDoor("console", "protocols.console.factory", "tcp:12300:interface=127.0.0.1",
                    order=41, config="protocols.console.config")
# built at their first connection: twisted.web and prometheus_client are about 12 MB
# resident an idle broker does not use (mqserver.frontdoor.FirstUseFactory; the NSQ
# HTTP and msgout doors' own door modules do the same for their sites)
metrics = FrontDoor("metrics", "protocols.metrics.door", "tcp:9464:interface=127.0.0.1",
                    order=90, config="protocols.metrics.config", first_use="MetricsSite")
# the admin door's own module builds its site at the first connection
# (protocols/admin/front.py), and says at start-up whether fault rules are allowed
admin = FrontDoor("admin", "protocols.admin.front", "tcp:9465:interface=127.0.0.1",
                  order=91, config="protocols.admin.config")
