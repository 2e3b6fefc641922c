"""A small blocking RocketMQ remoting client for tests: raw requests, as any client
family would send them (C++, Java or Go field conventions)."""

import json
import re
import socket
import time

from protocols.remoting import codes
from protocols.remoting.codec import encode
from protocols.remoting.framing import FrameDecoder
from protocols.remoting.messages import RemotingCommand


class RemotingClient:
    def __init__(self, host, port, timeout=10.0, language="JAVA", version=401, ssl_context=None):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ssl_context is not None:
            self.sock = ssl_context.wrap_socket(self.sock, server_hostname=host)
        self.decoder = FrameDecoder()
        self.opaque = 0
        self.language = language
        self.version = version
        self.inbox = []  # server-initiated requests received meanwhile

    def close(self):
        self.sock.close()

    def send(self, code, ext=None, body=b"", flag=0):
        opaque, frame = self.request_frame(code, ext, body, flag)
        self.sock.sendall(frame)
        return opaque

    def request_frame(self, code, ext=None, body=b"", flag=0):
        """Return (opaque, frame) of the next request, not sent (L{send_raw} sends many
        at once)."""
        self.opaque += 1
        cmd = RemotingCommand(code=code, language=self.language, version=self.version, opaque=self.opaque,
                              flag=flag, ext_fields={k: str(v) for k, v in (ext or {}).items()}, body=body)
        return self.opaque, encode(cmd)

    def send_raw(self, frame):
        self.sock.sendall(frame)

    def recv(self, opaque=None, timeout=10.0):
        deadline = time.monotonic() + timeout
        while True:
            for i, c in enumerate(self.inbox):
                if c.is_response() and (opaque is None or c.opaque == opaque):
                    return self.inbox.pop(i)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no response")
            self.sock.settimeout(left)
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("closed")
            self.inbox.extend(self.decoder.feed(data))

    def received_responses(self):
        """Return (and forget) the responses already received, without waiting."""
        out = [c for c in self.inbox if c.is_response()]
        if out:
            self.inbox = [c for c in self.inbox if not c.is_response()]
        return out

    def call(self, code, ext=None, body=b"", timeout=10.0):
        return self.recv(self.send(code, ext, body), timeout)

    def wait_request(self, code, timeout=10.0):
        """Return the next server-initiated request with C{code}, waiting up to C{timeout}."""
        deadline = time.monotonic() + timeout
        while True:
            for i, c in enumerate(self.inbox):
                if not c.is_response() and c.code == code:
                    return self.inbox.pop(i)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no request {code}")
            self.sock.settimeout(left)
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("closed")
            self.inbox.extend(self.decoder.feed(data))

    def requests(self):
        """Return (and forget) the server-initiated requests received so far."""
        out = [c for c in self.inbox if not c.is_response()]
        self.inbox = [c for c in self.inbox if c.is_response()]
        return out


def records(body):
    """Return the stored records (L{RecordView}s) of a PULL/QUERY body."""
    from mqserver.store.format import RecordView

    out, pos = [], 0
    while pos < len(body):
        v = RecordView(body, pos)
        out.append(v)
        pos += v.size
    return out


def json_of(cmd):
    return json.loads(cmd.body) if cmd.body else None


_MQ_KEY = re.compile(r'\{"brokerName":"([^"]*)","queueId":(\d+),"topic":"([^"]*)"\}:')


def mq_json(body):
    """Parse a fastjson body whose maps are keyed by MessageQueue objects:
    each key becomes C{"topic/queueId"}."""
    text = body.decode()
    assert _MQ_KEY.search(text), text
    return json.loads(_MQ_KEY.sub(lambda m: f'"{m.group(3)}/{m.group(2)}":', text))


def heartbeat_body(client_id, group, topics, consume_type=1, model=1):
    subs = [{"topic": t, "subString": "*", "subVersion": "1"} for t in topics]
    return json.dumps({"clientID": client_id, "consumerDataSet": [
        {"groupName": group, "consumeType": consume_type, "messageModel": model, "consumeFromWhere": 0,
         "subscriptionDataSet": subs}]}).encode()


SUCCESS = codes.SUCCESS
