"""Front door ``namesrv``: the nameserver embedded in ``twistd mqserver``.

Its route table is shared with the broker door of the same process (see
L{protocols.remoting.context}), which registers with it in-process.
"""

from protocols.remoting.context import context_for
from protocols.remoting.namesrv import NamesrvFactory, NamesrvProtocol, make_table
from protocols.remoting.server import check_fault


def make_factory(broker, config, reactor):
    """Return the nameserver factory of C{broker}'s process."""
    ctx = context_for(broker)
    if ctx.route_table is None:
        ctx.route_table = make_table(config, reactor)
    factory = NamesrvFactory(ctx.route_table, config["rocketmq.serverChannelMaxIdleTimeSeconds"], reactor)
    factory.tap = broker.wiretap
    broker.wiretap.faults.door(NamesrvProtocol.door_name, check_fault)
    return factory
