"""smss commands against the real broker process, through our spec-written client."""

import pytest

from protocols.smss.client import SmssClient
from protocols.smss.messages import Batch


@pytest.fixture
def client(server):
    c = SmssClient("127.0.0.1", server.smss_port)
    yield c
    c.close()


def test_create_publish_subscribe_round_trip(client):
    """Messages published in a batch come back in order with dense eventIds and headers."""
    client.create("order")
    client.publish("order", [b"hello", ([(b"k", b"v"), (b"traceId", b"t1")], b"world")])
    sub = client.subscribe("order", 0, batch=10, who="g1")
    batch = sub.next_batch(5)
    assert isinstance(batch, Batch)
    assert [(m.event_id, m.headers, m.body) for m in batch.messages] == [
        (2, [], b"hello"),
        (3, [(b"k", b"v"), (b"traceId", b"t1")], b"world"),
    ]
