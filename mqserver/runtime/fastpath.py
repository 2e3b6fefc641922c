"""The one checked adapter between mqserver's fast paths and Twisted's internals.

Two fast paths read attributes Twisted does not promise to keep:
L{mqserver.runtime.reactor.SpinningEPollReactor} (the epoll reactor's poller, selectables,
dispatch helpers and timed-call queues) and L{mqserver.runtime.output.send_now} (a TCP
connection's socket and write buffers; L{mqserver.runtime.output.TRANSPORT_ATTRIBUTES} lists
them next to the code that reads them). L{choose} checks, on real instances, that every
one of them is there before the broker uses either; if any is missing (a Twisted
release renamed it) it logs one warning and the broker runs on Twisted's standard epoll
reactor and plain C{transport.write}, which are slower but rely on public API only.
The operator can ask for the standard path too (C{server.reactor: standard}).

C{setup.cfg} admits the Twisted releases the tests run on (the oldest and the newest
of its range); the check is what keeps a release outside that range from breaking
start-up.
"""

import sys

from twisted.internet.main import installReactor
from twisted.logger import Logger

from mqserver.runtime import output
# send_now lists the transport internals it reads (TRANSPORT_ATTRIBUTES) next to the
# code reading them, and how to check them on a real connection
from mqserver.runtime.output import missing_transport_internals

log = Logger()

#: Attributes SpinningEPollReactor reads on itself (set by EPollReactor/ReactorBase).
REACTOR_ATTRIBUTES = (
    "_poller", "_selectables", "_doReadOrWrite", "_disconnectSelectable",
    "threadCallQueue", "_newTimedCalls", "_justStopped", "_cancellations",
    "_pendingTimedCalls",
)
#: Module-level names SpinningEPollReactor imports.
REACTOR_MODULE_NAMES = (("twisted.internet.posixbase", "_NO_FILEDESC"),)


class Choice:
    """What L{choose} decided.

    @ivar reactor: the reactor to install.
    @ivar spinning: whether it is a L{SpinningEPollReactor}.
    @ivar send_now: whether L{send_now} writes to sockets directly.
    @ivar missing: the Twisted internals found missing (empty when all are there).
    @ivar reason: why the standard path runs, or None.
    """

    def __init__(self, reactor, spinning, send_now, missing=(), reason=None):
        self.reactor = reactor
        self.spinning = spinning
        self.send_now = send_now
        self.missing = list(missing)
        self.reason = reason

    def describe(self):
        """One line for the start-up log."""
        if self.spinning and self.send_now:
            return "fast paths in use: SpinningEPollReactor and send_now"
        return f"standard Twisted paths in use (epoll reactor, transport.write): {self.reason}"


def missing_reactor_internals(reactor):
    """Return the names of L{REACTOR_ATTRIBUTES} and L{REACTOR_MODULE_NAMES} missing on
    C{reactor} and in Twisted's modules."""
    missing = [f"{type(reactor).__name__}.{n}" for n in REACTOR_ATTRIBUTES
               if not hasattr(reactor, n)]
    for module, name in REACTOR_MODULE_NAMES:
        __import__(module)
        if not hasattr(sys.modules[module], name):
            missing.append(f"{module}.{name}")
    return missing


def choose(spin, standard=False, probe=True):
    """Build the reactor twistd should install, and decide whether L{send_now} writes
    directly (L{mqserver.runtime.output.enable}). Returns a L{Choice}; logs one warning when
    a fast path's Twisted internals are missing.

    @param spin: seconds of busy polling for the spinning reactor.
    @param standard: run the standard paths whatever the check finds.
    @param probe: the spinning reactor's probes (C{server.spinProbe}).
    """
    from twisted.internet.epollreactor import EPollReactor

    if standard:
        output.enable(False)
        return Choice(EPollReactor(), False, False, reason="server.reactor is standard")
    try:
        from mqserver.runtime.reactor import SpinningEPollReactor

        fast = SpinningEPollReactor(spin, probe)
    except Exception as e:  # an import or constructor that no longer fits Twisted
        missing = [f"SpinningEPollReactor ({type(e).__name__}: {e})"]
    else:
        missing = missing_reactor_internals(fast)
    missing += missing_transport_internals()
    if not missing:
        output.enable(True)
        return Choice(fast, True, True)
    output.enable(False)
    log.warn(
        "this Twisted ({version}) lacks internals mqserver's fast paths read ({missing}); "
        "running on Twisted's standard epoll reactor and transport.write",
        version=_twisted_version(), missing=", ".join(missing))
    return Choice(EPollReactor(), False, False, missing,
                  reason="Twisted internals missing: " + ", ".join(missing))


def _twisted_version():
    import twisted

    return twisted.__version__


def service_reactor(spin, standard=False, probe=True):
    """Return the reactor a twistd service should use: the one already installed (for
    example by C{twistd --reactor}), else a newly installed L{SpinningEPollReactor} where
    epoll exists and Twisted's internals fit it (L{choose}; otherwise, or with
    C{standard}, Twisted's own epoll reactor), else Twisted's default.

    @param spin: seconds of busy polling for the spinning reactor.
    @param probe: the spinning reactor's probes (C{server.spinProbe}).
    """
    if "twisted.internet.reactor" not in sys.modules:
        try:
            choice = choose(spin, standard, probe)
        except ImportError:
            pass  # no epoll on this platform: Twisted picks its default below
        else:
            installReactor(choice.reactor)
            service_reactor.choice = choice
            return choice.reactor
    elif standard:
        output.enable(False)
    from twisted.internet import reactor

    return reactor


#: The last L{Choice} made by L{service_reactor}, or None.
service_reactor.choice = None
