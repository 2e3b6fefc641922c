"""A small blocking smss client for tests, benchmarks and tools.

Plain sockets, no Twisted, so it works from threads and subprocesses.  One
request at a time; a server ERR raises ``SmssError`` and the connection stays
usable, as the server keeps it open (section 1).
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections import deque

from . import client_codec as cc
from .client_codec import Expect, ResponseDecoder, to_bytes
from .messages import AliveResponse, Batch, ErrResponse, SubEnd
from .payload import encode_payload

__all__ = ["SmssClient", "SmssError", "Subscription", "Expect"]


#: a follower's refusal of a write, naming its master: "just master can ... (master: H:P)"
_MASTER_HINT = re.compile(r"just master can .* \(master: (\S+):(\d+)\)\Z")


class SmssError(Exception):
    """The server answered with ERR (400); ``text`` is its message.

    ``master`` is ``(host, port)`` when a follower refused a write and named its master
    (nothing was stored: the write may be sent there), else None."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text
        hint = _MASTER_HINT.match(text)
        self.master = (hint.group(1).strip("[]"), int(hint.group(2))) if hint else None


class SmssClient:
    """Blocking client for one smss connection.

    ``timeout`` (seconds) bounds the connect and every wait for a reply; an
    ``ssl_context`` (L{ssl.SSLContext}) speaks TLS to an ``ssl:`` listener.
    Topic, who and trace arguments accept str (sent as UTF-8) or bytes.

    With ``follow_master``, a write that a follower refuses naming its master (a replica
    group's member that does not lead) is sent again to that master, on a new connection
    that the client keeps from then on (at most ``MAX_HOPS`` times a request).
    """

    MAX_HOPS = 3

    def __init__(self, host: str, port: int, timeout: float = 10.0, ssl_context=None,
                 follow_master: bool = False):
        self.timeout = timeout
        self.follow_master = follow_master
        self._ssl_context = ssl_context
        self._sock = None
        self._connect(host, port)
        self._subscription = None

    def _connect(self, host, port):
        self.close()
        self.address = (host, port)
        sock = socket.create_connection((host, port), timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._ssl_context is not None:  # an ssl: listener (the TLS handshake comes first)
            sock = self._ssl_context.wrap_socket(sock, server_hostname=host)
        self._sock = sock
        self._decoder = ResponseDecoder()
        self._events = deque()

    # -- plumbing -------------------------------------------------------------

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def close(self) -> None:
        """Close the socket (also the clean way to leave a subscription)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def send_raw(self, data: bytes) -> None:
        """Write ``data`` as is; for bad-input tests."""
        self._sock.sendall(data)

    def read_response(self, kind="simple", timeout: float | None = None):
        """Read the next frame, decoding a 200 as ``kind`` (an Expect or its name).

        Returns the event itself, ErrResponse included (nothing is raised for
        ERR), so bad-input tests can inspect it.  Raises TimeoutError.
        """
        self._decoder.expect = Expect(kind)
        return self._next_event(timeout)

    def _next_event(self, timeout: float | None = None):
        """Return the next decoded frame, reading from the socket as needed."""
        if timeout is None:
            timeout = self.timeout
        deadline = time.monotonic() + timeout
        while not self._events:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no reply from smss server")
            self._sock.settimeout(remaining)
            chunk = self._sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("smss server closed the connection")
            self._events.extend(self._decoder.feed(chunk))
        return self._events.popleft()

    def _call(self, request: bytes, kind: Expect):
        """Send one request and return its reply; ERR raises SmssError."""
        if self._subscription is not None:
            raise RuntimeError("connection is in subscription mode")
        for hop in range(self.MAX_HOPS + 1):
            self._decoder.expect = kind
            self._sock.sendall(request)
            event = self._next_event()
            if not isinstance(event, ErrResponse):
                return event
            error = SmssError(event.text)
            if not (self.follow_master and error.master and hop < self.MAX_HOPS):
                raise error
            # refused, so not stored: the master named takes it
            self._connect(*error.master)

    def _json(self, request: bytes):
        """Send a JSON command; an empty body decodes as None."""
        body = self._call(request, Expect.JSON).body
        return json.loads(body) if body else None

    # -- commands -------------------------------------------------------------

    def create(self, topic, expire_at: int = 0, trace=b"") -> None:
        """CREATE ``topic``; ``expire_at`` is absolute Unix ms, 0 = permanent."""
        self._call(cc.encode_create(topic, expire_at, trace), Expect.SIMPLE)

    def delete(self, topic, trace=b"") -> None:
        """DELETE ``topic``."""
        self._call(cc.encode_delete(topic, trace), Expect.SIMPLE)

    def publish(self, topic, messages, trace=b"") -> None:
        """PUB ``messages`` (``(headers, body)`` pairs or bare bodies) in one request."""
        self.publish_raw(topic, encode_payload(messages), trace)

    def publish_raw(self, topic, payload: bytes, trace=b"") -> None:
        """PUB a raw payload exactly as given (for bad-input tests)."""
        self._call(cc.encode_pub(topic, payload, trace), Expect.SIMPLE)

    def delay(self, topic, delay_ms: int, messages, trace=b"") -> None:
        """DELAY ``messages`` by ``delay_ms`` milliseconds (the server wants >= 1000)."""
        request = cc.encode_delay(topic, delay_ms, encode_payload(messages), trace)
        self._call(request, Expect.SIMPLE)

    def alive(self) -> None:
        """ALIVE round trip."""
        self._call(cc.encode_alive(), Expect.SIMPLE)

    def topic_info(self, topic, trace=b"") -> dict:
        """TOPIC INFO as a dict."""
        return self._json(cc.encode_topic_info(topic, trace))

    def list(self, trace=b"") -> list:
        """LIST: every topic, as dicts (an empty reply body means no topics)."""
        return self._json(cc.encode_list(trace)) or []

    def valid_list(self, event_id: int = 0, trace=b"") -> list:
        """VALID LIST: live topics with createEventId <= ``event_id`` (0 = all)."""
        return self._json(cc.encode_valid_list(event_id, trace)) or []

    def subscribe(
        self,
        topic,
        event_id: int = 0,
        batch: int = 1,
        ack_timeout_ms=None,
        who=b"",
        trace=b"",
    ) -> "Subscription":
        """Send SUB and return the Subscription; the connection is then taken over.

        The server sends no reply on success, so a refusal (``topic not exist``
        and the like) surfaces as SmssError from the first ``next_batch``.
        """
        if self._subscription is not None:
            raise RuntimeError("connection is already in subscription mode")
        ack_ns = None if ack_timeout_ms is None else int(ack_timeout_ms * 1_000_000)
        request = cc.encode_sub(topic, event_id, batch, ack_ns, who, trace)
        self._decoder.expect = Expect.SUB
        self._sock.sendall(request)
        self._subscription = Subscription(self, to_bytes(topic))
        return self._subscription


class Subscription:
    """A live SUB stream on an SmssClient connection."""

    def __init__(self, client: SmssClient, topic: bytes):
        self.topic = topic
        self.active = True
        self._client = client
        self._pending = False

    def next_batch(self, timeout: float | None = None):
        """Wait for the next frame: Batch, AliveResponse or SubEnd.

        Every Batch must be acked before the next one comes.  ERR raises
        SmssError and ends the subscription; a wait over ``timeout`` raises
        TimeoutError (the subscription stays usable).
        """
        if not self.active:
            raise RuntimeError("subscription is over")
        if self._pending:
            raise RuntimeError("ack the previous batch first")
        event = self._client._next_event(timeout)
        if isinstance(event, Batch):
            self._pending = True
        elif isinstance(event, SubEnd):
            self._finish()
        elif isinstance(event, ErrResponse):
            self._finish()
            raise SmssError(event.text)
        elif not isinstance(event, AliveResponse):
            raise RuntimeError(f"unexpected frame in subscription: {event!r}")
        return event

    def ack(self) -> None:
        """Ack the last batch and ask for the next one."""
        self._send_ack(cc.encode_ack(0))

    def ack_end(self) -> None:
        """Ack the last batch and end the subscription; the connection returns to
        ordinary requests (a reference server needs ~5 s before it is safe, 7.4)."""
        self._send_ack(cc.encode_ack(1))
        self._finish()

    def _send_ack(self, data: bytes) -> None:
        """Send an ack; acking with no batch pending would stall the server."""
        if not self._pending:
            raise RuntimeError("no batch to ack")
        self._pending = False
        self._client._sock.sendall(data)

    def _finish(self) -> None:
        """Leave subscription mode on the client."""
        self.active = False
        self._pending = False
        self._client._subscription = None
        self._client._decoder.expect = Expect.SIMPLE
