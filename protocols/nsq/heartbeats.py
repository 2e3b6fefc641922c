"""Heartbeats of an nsqd V2 connection, mixed into L{NsqdProtocol}: a C{_heartbeat_}
frame every negotiated interval, and the connection closed when the client sent nothing
at all for two intervals (nsqd's read deadline)."""

from protocols.nsq.codec import HEARTBEAT


class Heartbeats:
    """The heartbeat timer of an nsqd connection (C{_hb_call}); reads C{settings},
    C{reactor}, C{_last_recv} and C{_dead}."""

    def _arm_heartbeat(self):
        if self._hb_call is not None and self._hb_call.active():
            self._hb_call.cancel()
        self._hb_call = None
        interval = self.settings.heartbeat_interval_ms
        if interval > 0 and not self._dead:
            self._hb_call = self.reactor.callLater(interval / 1000.0, self._heartbeat)

    def _heartbeat(self):
        self._hb_call = None
        interval = self.settings.heartbeat_interval_ms / 1000.0
        if self.reactor.seconds() - self._last_recv >= 2 * interval - 0.001:
            # nsqd's read deadline: nothing at all from the client for 2 intervals
            self.transport.loseConnection()
            return
        self._flush()
        self._write(HEARTBEAT)
        self._arm_heartbeat()
