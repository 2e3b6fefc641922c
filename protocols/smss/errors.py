"""Exceptions raised by the smss codec."""


class SmssProtocolError(Exception):
    """Bytes that break the smss framing rules.

    ``fatal`` is True when the stream cannot be kept in sync (the server should
    write an ERR with ``str(exc)`` and close); False when only the one request
    or payload is bad and the connection may carry on.
    """

    fatal = True

    def __init__(self, text, *, fatal=None):
        super().__init__(text)
        if fatal is not None:
            self.fatal = fatal


class InvalidPayload(SmssProtocolError):
    """A PUB/DELAY payload that breaks the message record rules of section 5.

    Never fatal: the payload was read in full, so the stream is still in sync.
    """

    fatal = False
