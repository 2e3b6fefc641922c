"""The admin front door as twistd starts it: the API's site (L{protocols.admin.door}:
twisted.web, several MB resident) is imported and built at the door's first connection
(L{mqserver.frontdoor.FirstUseFactory}); at start-up the log says whether fault rules
may be set through it (C{admin.faults})."""

from twisted.logger import Logger

from mqserver.frontdoor import FirstUseFactory
from mqserver.service import HookService

log = Logger(namespace="protocols.admin")


def warn_faults():
    """Say in the log that fault rules are allowed (never meant for production)."""
    log.warn("admin.faults is true: fault rules may be set through the admin API "
             "(for testing client libraries; docs/sdk-testing.md); "
             "mqserver_fault_rules_active in /metrics counts those in force")


def make_factory(broker, config, reactor):
    """The admin door's factory: its site is built at its first connection."""

    def build():
        from protocols.admin.door import make_factory as make_site

        return make_site(broker, config, reactor)

    services = []
    if config["admin.faults"]:
        services.append(HookService(warn_faults, lambda: None, "admin-faults"))
    return FirstUseFactory(build, "AdminSite", services)
