"""The output side of an nsqd V2 connection, mixed into L{NsqdProtocol}: frames through
the compressor and the connection's output, the buffer of delivery frames, replies in
command order and errors (a fatal one is sent, then the socket closes).

Replies go out in command order: a PUB answers when the store has the message, so
pipelined PUBs share a group commit, and a reply that is not ready yet holds back the
ones behind it (a L{PendingAnswer} in C{_answers}). Past L{MAX_PIPELINE} waiting
replies the connection stops reading.
"""

from twisted.internet import defer
from twisted.python.failure import Failure

from mqserver.answers import PendingAnswer
from mqserver.errors import BrokerError

from protocols.nsq import errors as E
from protocols.nsq.codec import error
from protocols.nsq.faults import DOOR
from protocols.nsq.trace import out_frames

#: Replies waiting before the connection stops reading (bounds a pipelining producer).
MAX_PIPELINE = 512


class Replies:
    """Writing, buffering and ordered replies of an nsqd connection.

    Uses the connection's C{transport}, C{output}, C{_compressor}, C{_out},
    C{_out_size}, C{_flush_call}, C{_answers}, C{_dead}, C{_read_paused}.
    """

    # -- output --------------------------------------------------------------------------

    def _write(self, data):
        if self.tap.active and self.tap.trace.active:
            for names, fields, raw in out_frames(data):
                self.tap.frame(DOOR, self, "out", names, fields, len(raw), raw)
        if self._compressor is not None:
            data = self._compressor.compress(data)
        self.output.write(data)

    def _flush(self):
        if self.defer_room:
            # arrivals the channel left in the store for this flush (Subscriber.deliver);
            # their delivery may flush on its own, and this flush then sends the rest
            if self.channel is not None:
                self.channel.pump_deferred()
            self.defer_room = 0  # the buffer goes out whole: no flush is scheduled
        if self._flush_call is not None:
            if self._flush_call.active():
                self._flush_call.cancel()
            self._flush_call = None
        if self._out:
            data = b"".join(self._out)
            self._out = []
            self._out_size = 0
            if not self._dead:
                self._write(data)

    # -- replies in order ----------------------------------------------------------------

    def _answer(self, item, verb="PUB"):
        """Queue a reply: bytes, a Deferred firing with bytes (a failure is answered as
        C{verb}'s error), or a callable run in turn."""
        answers = self._answers
        if isinstance(item, defer.Deferred):
            slot = PendingAnswer(item)
            answers.append(slot)
            item.addBoth(self._settle, slot, verb)  # at once if it has fired
        elif not answers:
            self._emit(item)
            return
        else:
            answers.append(item)
        if len(answers) > MAX_PIPELINE and not self._read_paused:
            self._read_paused = True
            self.transport.pauseProducing()

    def _emit(self, item):
        if callable(item):
            item()
        elif item:
            self._flush()
            self._write(item)

    def _settle(self, value, slot, verb):
        # A Deferred's answer is ready (a failure becomes verb's error, so nothing is
        # left unhandled): write what the head of the queue now allows.
        if isinstance(value, Failure):
            value = self._fatal_later(self._publish_error(verb, value))
        slot.settle(value)
        self._drain()

    def _drain(self):
        answers = self._answers
        while answers:
            head = answers[0]
            if type(head) is PendingAnswer:
                if not head.ready:
                    return
                head = head.value
            answers.popleft()
            if not self._dead:
                self._emit(head)
        if self._read_paused and not self._dead:
            self._read_paused = False
            if not self._inflating():
                self.transport.resumeProducing()
            elif self._inflate_call is None:
                self._inflate_call = self.reactor.callLater(0, self._inflate_more)

    def _publish_error(self, verb, failure):
        reason = failure.getErrorMessage() if failure.check(BrokerError) else "internal error"
        if not failure.check(BrokerError):
            self.log.failure("NSQ {verb} failed", failure, verb=verb)
        make = {"PUB": E.pub_failed, "MPUB": E.mpub_failed, "DPUB": E.dpub_failed,
                "SUB": E.sub_failed}[verb]
        return make(reason)

    def _fatal_later(self, err):
        def send():
            self._send_error(err)
        return send

    def _send_error(self, err):
        if err.send_frame:
            self._flush()
            self._write(error(err))
        if err.fatal:
            # nsqd runs nothing after a fatal error, not even what the same read holds
            self._dead = self._dead_input = True
            self.can_receive = False
            self.transport.loseConnection()

    def _fail(self, err):
        """Answer an NsqError in order; a fatal one stops reading and closes."""
        if err.fatal:
            self._dead_input = True
        self._answer(self._fatal_later(err))
