"""The smss door's frames as the wire trace shows them (L{mqserver.trace}): a request's
command and fields, and the status of what the door writes."""

from mqserver import message as fmt
from mqserver.trace import dataclass_fields

from protocols.smss import wire
from protocols.smss.faults import NAMES

_STATUS = {wire.STATUS_OK: "OK", wire.STATUS_ALIVE: "ALIVE", wire.STATUS_SUBEND: "SUBEND",
           wire.STATUS_ERR: "ERR"}


def request_names(ev):
    """Return the names of request C{ev}'s command (the first one shown)."""
    return NAMES.get(type(ev), (type(ev).__name__.upper(),))


def request_fields(ev):
    """Return the trace's fields of request C{ev} (payloads as their sizes)."""
    return dataclass_fields(ev, text=("topic", "trace", "who"))


def answer(data):
    """Return (names, fields) of C{data}, an answer or push the door writes."""
    status = wire.U16.unpack_from(data, 0)[0] if len(data) >= 2 else None
    name = _STATUS.get(status, str(status))
    fields = {"status": status}
    if status == wire.STATUS_ERR:
        fields["error"] = bytes(data[wire.ERR_HEADER.sizeof():]).decode("utf-8", "replace")
    return (name, str(status)), fields


#: The names of a pushed batch: a command filter for C{BATCH} or for the status (C{OK},
#: C{200}) keeps it.
BATCH_NAMES = ("BATCH", "OK", str(wire.STATUS_OK))


def out_frame(data, buf=None, locs=None):
    """Return (names, fields) of C{data}, which the door writes: a pushed batch of the
    stored records at C{locs} in C{buf} (its count, first and last eventId, body size),
    else an answer by its status (L{answer})."""
    if locs is None:
        return answer(data)
    eid = fmt.DELIVERY_FIELDS.unpack_from
    return BATCH_NAMES, {"status": wire.STATUS_OK, "count": len(locs),
                         "first": eid(buf, locs[0][0])[4], "last": eid(buf, locs[-1][0])[4],
                         "body": len(data) - wire.BATCH_HEADER_STRUCT.size}
