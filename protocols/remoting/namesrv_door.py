"""Front door ``namesrv``: the nameserver embedded in ``twistd mqserver``.

Its route table is shared with the broker door of the same process (see
L{protocols.remoting.context}), which registers with it in-process.
"""

from protocols.remoting.context import context_for
from protocols.remoting.namesrv import NamesrvFactory, make_table


def make_factory(broker, config, reactor):
    """Return the nameserver factory of C{broker}'s process."""
    ctx = context_for(broker)
    if ctx.route_table is None:
        ctx.route_table = make_table(config, reactor)
    return NamesrvFactory(ctx.route_table, config["rocketmq.serverChannelMaxIdleTimeSeconds"], reactor)
