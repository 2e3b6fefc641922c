"""The body of an etcd watch response (newline-separated JSON objects), fed in-process."""

import json

from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone

from mqserver.cluster.etcd import _LineStream


class Producer(StringTransport):
    """The transport a response body gets: a push producer that can be stopped."""

    stopped = False

    def stopProducing(self):
        self.stopped = True


def stream(limit=1 << 20):
    got = []
    s = _LineStream(got.append, limit)
    s.makeConnection(Producer())
    return s, got


def test_objects_split_anywhere_arrive_whole_and_in_order():
    s, got = stream()
    data = b"".join(json.dumps({"result": {"n": i}}).encode() + b"\n" for i in range(3))
    for i in range(len(data)):
        s.dataReceived(data[i:i + 1])
    assert got == [{"result": {"n": 0}}, {"result": {"n": 1}}, {"result": {"n": 2}}]
    assert not s.transport.stopped


def test_blank_lines_are_skipped():
    s, got = stream()
    s.dataReceived(b'\n\r\n{"a":1}\n')
    assert got == [{"a": 1}]


def test_a_line_beyond_the_limit_stops_the_stream_before_it_is_buffered_further():
    s, got = stream(limit=64)
    s.dataReceived(b'{"a":"' + b"x" * 100)
    assert s.transport.stopped and got == []
    assert len(s._buffer) == 0


def test_garbage_stops_the_stream():
    s, got = stream()
    s.dataReceived(b'{"a":1}\nnot json\n{"b":2}\n')
    assert got == [{"a": 1}] and s.transport.stopped


def test_finished_fires_with_none_and_keeps_the_reason():
    s, _ = stream()
    done = []
    s.finished.addCallback(done.append)
    s.connectionLost(Failure(ResponseDone()))
    assert done == [None] and s.reason.check(ResponseDone)
