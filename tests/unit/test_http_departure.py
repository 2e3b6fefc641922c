"""HTTP doors answering late: the answer is written when it is ready, and
not at all when the client left first.

The doors learn that the client left through C{IRequest.notifyFinish} (public API),
so they are driven here with twisted.web's L{DummyRequest}, which implements that
contract and none of the real request's private flags (they read C{_disconnected}
before, which a DummyRequest does not have). Each door gets an answer that waits on a
store write held by the test (flush level 2, fsync held) or on a long poll.
"""

import io
import json

import pytest
from twisted.internet.error import ConnectionDone
from twisted.python.failure import Failure
from twisted.web.server import NOT_DONE_YET
from twisted.web.test.requesthelper import DummyRequest

from mqserver.store.store import Message
from protocols.admin.door import AdminResource
from protocols.msgout.api import MsgoutApi
from protocols.msgout.http import MsgoutResource
from protocols.nsq.http import NsqdHttpResource
from protocols.nsq.node import get_node
from tests.support.inprocess import door_fixtures, result_of

node, held = door_fixtures()


def request(method, path, body=b"", args=None):
    r = DummyRequest([p for p in path.split(b"?")[0].split(b"/") if p])
    r.method = method
    r.path = path
    r.args = args or {}
    r.content = io.BytesIO(body)
    return r


def render(resource, r):
    assert resource.render(r) is NOT_DONE_YET
    assert r.written == [] and not r.finished, "the answer waits"


def leave(r):
    # what the channel's connectionLost does to a request that is not finished
    r.processingFailed(Failure(ConnectionDone()))


def nsq_pub(n):
    """An nsqd /pub to a new topic: answers once the topic's creation is durable."""
    resource = NsqdHttpResource(get_node(n.broker, n.config, n.clock))
    r = request(b"POST", b"/pub", b"hi", {b"topic": [b"t"]})
    render(resource, r)
    return r, n.runner.release


def admin_create(n):
    """The admin API's POST /topics: answers once the creation is durable."""
    r = request(b"POST", b"/topics", json.dumps({"name": "t"}).encode())
    render(AdminResource(n.broker), r)
    return r, n.runner.release


def msgout_fetch(n):
    """A msgout long poll: answers when a message arrives."""
    d = n.broker.queues.declare("q", {})
    n.runner.release()
    result_of(d)
    r = request(b"POST", b"/v1/queues/q/fetch", b'{"max": 1, "wait_ms": 5000}')
    render(MsgoutResource(MsgoutApi(n.broker, n.clock)), r)

    def arrive():
        n.broker.publish("q", [Message(b"late")])
        n.runner.release()
        n.clock.advance(0)

    return r, arrive


DOORS = [nsq_pub, admin_create, msgout_fetch]


@pytest.mark.parametrize("door", DOORS)
def test_a_late_answer_is_written_when_it_is_ready(held, door):
    r, ready = door(held)
    ready()
    assert r.finished == 1
    assert r.responseCode in (None, 200)
    assert b"".join(r.written)


@pytest.mark.parametrize("door", DOORS)
def test_no_answer_is_written_for_a_client_that_left(held, door):
    r, ready = door(held)
    leave(r)
    ready()
    assert r.written == [] and not r.finished
