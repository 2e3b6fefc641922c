"""The replication status every front door can show (smss TOPIC INFO $replication, nsqd
/stats): role, applied eventId, and on a slave the lag."""


def replication_status(broker, slaves=None):
    """Return the status as a JSON-ready dict. C{slaves}: connected slaves, if known."""
    out = _role_status(broker, slaves)
    group = getattr(broker, "group", None)
    if group is not None:
        out["group"] = group.status()
    return out


def _role_status(broker, slaves):
    applier = broker.state_of("replica")
    if applier is not None and not broker.is_master:
        return applier.status()
    if not broker.is_master:  # a replica group's member that neither leads nor follows yet
        return {"role": "none", "appliedEventId": broker.store.next_event_id - 1}
    out = {"role": "master", "appliedEventId": broker.store.next_event_id - 1}
    if slaves is not None:
        out["slaves"] = slaves
    gate = broker.sync_gate
    if gate is not None:
        out["sync"] = {
            "replicas": gate.replicas,
            "timeoutMs": int(gate.timeout * 1000),
            "committedEventId": gate.committed_event_id,
            "confirming": sorted(gate.confirmed(f) for f in gate.followers()),
            "available": gate.available(),
            "timeouts": gate.timeouts,
            "unavailable": gate.unavailable,
        }
    return out
