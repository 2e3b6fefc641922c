"""The nsqd TCP front door (``listen.nsqd_tcp``): C{make_factory} for the plugin."""

from protocols.nsq.node import get_node
from protocols.nsq.protocol import NsqdFactory


def make_factory(broker, config, reactor):
    """Return the nsqd V2 TCP factory of C{broker}'s shared L{NsqNode}."""
    return NsqdFactory(get_node(broker, config, reactor))
