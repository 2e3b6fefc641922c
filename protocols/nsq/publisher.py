"""The producer side of an nsqd V2 connection, mixed into L{NsqdProtocol}: PUB, MPUB and
DPUB. A publish to a topic that does not exist yet creates it first (as nsqd does)."""

from twisted.internet import defer

from mqserver.message import Message

from protocols.nsq.codec import OK


class Publisher:
    """PUB, MPUB and DPUB of an nsqd connection (counted per topic in C{pub_counts})."""

    def _publish(self, cmd, verb, topic, messages, defer_ms=0):
        broker = self.broker
        if defer_ms:
            stored = self._publish_later(topic, messages, defer_ms)
        else:
            # Published straight away: publish_now checks the topic itself, so the usual
            # PUB looks it up once; only a refused publish asks whether the topic exists.
            try:
                # The last command of a read with no reply ahead of it (the usual PUB):
                # OK goes out as soon as the message is written (_ok_now), before the
                # store's bookkeeping, so the round trip waits for less. None: answered.
                early = cmd is self.last_command and not self._answers
                stored = broker.publish_now(topic, messages, None,
                                            self._ok_now if early else None)
                if stored is None:
                    self.pub_counts[topic] = self.pub_counts.get(topic, 0) + len(messages)
                    return
            except Exception as e:
                if broker.topic(topic) is None:
                    # not there (or expired): created first, as nsqd does
                    stored = self._publish_later(topic, messages, 0)
                else:  # answered in its turn, as a failed write's would be
                    stored = defer.fail(e)
        self.pub_counts[topic] = self.pub_counts.get(topic, 0) + len(messages)
        if not isinstance(stored, defer.Deferred):
            # Stored already (flush levels 0 and 1): OK at once, without a Deferred,
            # or in turn behind the answers ahead of it.
            if self._answers:
                self._answer(OK)
            else:
                self._emit(OK)
            return
        stored.addCallback(_ok)
        self._answer(stored, verb)

    def _ok_now(self, result):
        """Answer a publish the broker has written, with no reply ahead of it: OK,
        before the broker's bookkeeping: at once when the PUB is alone in its read (the
        usual case), else with the replies of the read."""
        self._emit(OK)

    def _publish_later(self, topic, messages, defer_ms):
        # A DPUB, or a publish that creates its topic first: a Deferred.
        broker = self.broker
        if broker.topic(topic) is not None:
            return broker.delay(topic, defer_ms, messages)
        d = self.node.ensure_topic(topic)
        d.addCallback(lambda _: broker.publish(topic, messages) if not defer_ms
                      else broker.delay(topic, defer_ms, messages))
        return d

    # A body alone (bytes) is a message the store stamps with the time of its write.
    def do_pub(self, cmd):
        self._publish(cmd, "PUB", cmd.topic, [bytes(cmd.body)])

    def do_mpub(self, cmd):
        self._publish(cmd, "MPUB", cmd.topic, [bytes(b) for b in cmd.bodies])

    def do_dpub(self, cmd):
        self._publish(cmd, "DPUB", cmd.topic,
                      [Message(cmd.body, born_ts=self.broker.now_ms())], cmd.defer_ms)


def _ok(_):
    return OK
