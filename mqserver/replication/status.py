"""The replication status every front door can show (smss TOPIC INFO $replication, nsqd
/stats): role, applied eventId, and on a slave the lag."""


def replication_status(broker, slaves=None):
    """Return the status as a JSON-ready dict. C{slaves}: connected slaves, if known."""
    applier = broker.state_of("replica")
    if applier is not None:
        return applier.status()
    out = {"role": "master", "appliedEventId": broker.store.next_event_id - 1}
    if slaves is not None:
        out["slaves"] = slaves
    return out
