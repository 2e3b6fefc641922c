"""A broker process with fault rules allowed (admin.faults) for the fault and trace
tests."""

import contextlib

from tests.support.server import ServerProcess

LOOP = "tcp:0:interface=127.0.0.1"


@contextlib.contextmanager
def fault_broker(base, *doors):
    """A started broker in C{base}/broker with the admin door and C{doors} on ephemeral
    ports and C{admin.faults: true}; C{home} is C{base}/home (for the RocketMQ client).
    Stopped on leaving."""
    listen = dict({d: LOOP for d in doors}, admin=LOOP)
    s = ServerProcess(base / "broker", listen=listen, config={"admin": {"faults": True}}).start()
    s.home = base / "home"
    try:
        yield s
    finally:
        s.stop()
        s.close()
