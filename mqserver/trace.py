"""The wire trace: front doors report the frames they read and write, decoded their
protocol's way, to whoever subscribed (the admin API's C{/trace} stream).

A door reports only while L{mqserver.wiretap.WireTap.active} (someone traces, or a fault
rule is set), through L{TraceHub.frame}; the hub hands each subscriber the frames of its
door, optionally of one connection and one command. Events are dicts ready for JSON:

  - C{time}: seconds since the epoch (the reactor's clock);
  - C{door}, C{conn} (the connection's number), C{peer} (C{host:port});
  - C{dir}: C{"in"} (the client sent it) or C{"out"} (the broker wrote it);
  - C{size}: the frame's bytes, when the door knows them;
  - C{command}: the frame's name (a RocketMQ request code's name, an NSQ verb or frame
    type, an smss command or status, an HTTP method and path);
  - C{fields}: the decoded header fields (strings, numbers; bodies as their size);
  - C{raw}: the frame's bytes in hex, for subscribers that asked for them and where the
    door has them.
"""

import dataclasses

from twisted.logger import Logger


def _value(v):
    if isinstance(v, (bytes, bytearray, memoryview)):
        return len(v)  # a body: its size
    if isinstance(v, (list, tuple)):
        return [_value(x) for x in v]
    if isinstance(v, (int, float, str)) or v is None:
        return v
    return str(v)


def dataclass_fields(obj, text=()):
    """Return the trace's fields of a decoded frame C{obj} (a dataclass): bytes as their
    size (bodies), but those named in C{text} as text (names, ids); other values as
    numbers or text."""
    out = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if f.name in text and isinstance(v, (bytes, bytearray)):
            out[f.name] = bytes(v).decode("utf-8", "backslashreplace")
        else:
            out[f.name] = _value(v)
    return out


class Subscription:
    """One subscriber's filter and callback.

    @ivar door: the front door whose frames it gets.
    @ivar conn: only this connection's frames, or None.
    @ivar command: only frames of this command (any of the names a door gives it;
        several separated by C{|}), or None.
    @ivar raw: whether it wants C{raw}.
    """

    def __init__(self, hub, deliver, door, conn=None, command=None, raw=False):
        self._hub = hub
        self.deliver = deliver
        self.door = door
        self.conn = conn
        self.command = command
        self.raw = raw

    def wants(self, door, conn, names):
        """True when a frame of C{door} on connection C{conn} whose command goes by
        C{names} is for this subscriber."""
        return (door == self.door and (self.conn is None or conn == self.conn)
                and (self.command is None or any(c in names for c in self.command.split("|"))))

    def cancel(self):
        """Stop the subscription (safe to call twice)."""
        self._hub.unsubscribe(self)


class TraceHub:
    """The subscribers of the wire trace.

    @ivar active: True while anyone is subscribed.
    @ivar on_change: called with no argument when L{active} may have changed.
    """

    log = Logger()

    def __init__(self, clock, on_change=None):
        self._clock = clock
        self._subs = []
        self.active = False
        self.on_change = on_change

    def subscribe(self, deliver, door, conn=None, command=None, raw=False):
        """Call C{deliver(event)} for each frame of front door C{door} (of connection
        C{conn}, of command C{command}, if given); return the L{Subscription}."""
        sub = Subscription(self, deliver, door, conn, command, raw)
        self._subs.append(sub)
        self.log.info("wire trace of {door} started", door=door)
        self._changed()
        return sub

    def unsubscribe(self, sub):
        """Remove C{sub} (when it is there)."""
        if sub in self._subs:
            self._subs.remove(sub)
            self.log.info("wire trace of {door} stopped", door=sub.door)
            self._changed()

    def frame(self, door, conn, peer, direction, names, fields, size=None, raw=None):
        """Report a frame (see the module docstring); C{names} are the names of its
        command, the first one shown; C{raw} is its bytes, or a function returning them
        (called only when a subscriber wants them)."""
        subs = [s for s in self._subs if s.wants(door, conn, names)]
        if not subs:
            return
        event = {"time": round(self._clock(), 6), "door": door, "conn": conn, "peer": peer,
                 "dir": direction, "size": size, "command": names[0], "fields": fields}
        with_raw = None
        for s in subs:
            if s.raw and raw is not None:
                if with_raw is None:
                    data = raw() if callable(raw) else raw
                    with_raw = dict(event, raw=bytes(data).hex())
                s.deliver(with_raw)
            else:
                s.deliver(event)

    def _changed(self):
        self.active = bool(self._subs)
        if self.on_change is not None:
            self.on_change()
