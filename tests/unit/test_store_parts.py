"""MessageStore is a facade over its parts: what it shows outside stays as
it was before the split (its log lines' namespace, its per-message paths' cost)."""

import pytest
from twisted.internet.task import Clock
from twisted.logger import globalLogPublisher

from mqserver.store.store import Message, MessageStore

NAMESPACE = "mqserver.store.store.MessageStore"


@pytest.fixture
def events():
    """Every log event while the test runs."""
    seen = []
    globalLogPublisher.addObserver(seen.append)
    yield seen
    globalLogPublisher.removeObserver(seen.append)


def test_the_parts_log_as_the_store(tmp_path, events, monkeypatch):
    """Recovery, checkpoint, disk and retention lines keep the source operators filter on
    (docs/operations.md shows them under it)."""
    (tmp_path / "metadata.json").write_bytes(b"{not json")  # a checkpoint warning
    s = MessageStore(str(tmp_path), Clock(), segment_size=4096, clock=lambda: 2e9)
    s.open()
    s.put_messages("t", 0, [Message(body=b"x" * 600) for _ in range(20)])  # several segments
    monkeypatch.setattr(s.disk, "used_ratio", lambda: 0.99)
    s.check_disk()  # a disk-full error
    s.close()
    (tmp_path / "metadata.json").unlink()
    s = MessageStore(str(tmp_path), Clock(), segment_size=4096, clock=lambda: 2e9)
    s.open()  # replays the whole log: an info line
    s.checkpoint()
    assert s.clean(0) > 0  # a retention line
    s.close()
    texts = {e.get("log_format", "").split(" ")[0]: e["log_namespace"] for e in events
             if e.get("log_namespace", "").startswith("mqserver.store")}
    assert {"checkpoint", "{what}:", "replayed", "retention"} <= set(texts), texts
    assert set(texts.values()) == {NAMESPACE}


def test_per_message_paths_call_the_parts_straight(tmp_path):
    """put_messages, read_entries and read_records are the parts' own bound methods: a
    publish or a read pays no facade call (bench/request_cost.py counts it)."""
    s = MessageStore(str(tmp_path), Clock())
    assert s.put_messages.__self__ is s.writer
    assert s.read_entries.__self__ is s.reader
    assert s.read_records.__self__ is s.reader
