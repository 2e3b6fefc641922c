"""The status the process exits with once its reactor has stopped.

twistd offers no way to end a running server with a status of its own, so the parts that
stop the broker for a reason a supervisor must see (a follower that has to cut its log
before it can follow) set it here, and C{python -m mqserver} exits with it."""

#: Stopped to be started again: the next start finishes what this one could not.
RESTART = 75  # EX_TEMPFAIL

_status = 0


def request(status):
    """Exit with C{status} (the highest asked for) once the reactor has stopped."""
    global _status
    _status = max(_status, status)


def status():
    """Return the status asked for (0 when nothing asked)."""
    return _status
