"""No name reaches the file system as a path: the store's own check, the last line of
defence behind every protocol's name rules."""

import os

import pytest

from mqserver.errors import StoreError
from mqserver.store import format as fmt
from mqserver.store.store import Message, safe_dir_name
from tests.unit.test_broker_recovery import open_broker as open_store

UNSAFE = ["", ".", "..", "../x", "a/b", "/etc", "a\\b", "a\0b", ".trash", "x" * 256, "é" * 128]


def outcome(d):
    out = []
    d.addBoth(out.append)
    assert out, "deferred did not fire"
    return out[0]


def tree(path):
    return sorted(os.path.relpath(os.path.join(d, n), path)
                  for d, dirs, files in os.walk(path) for n in dirs + files)


@pytest.mark.parametrize("name", UNSAFE)
def test_unsafe_names_are_refused(name):
    assert not safe_dir_name(name)


@pytest.mark.parametrize("name", ["t", "%RETRY%g", "a..b", "x" * 255, "é" * 127, "a:b#ephemeral"])
def test_safe_names_pass(name):
    assert safe_dir_name(name)


@pytest.mark.parametrize("name", UNSAFE)
def test_store_refuses_writes_under_unsafe_names(tmp_path, name):
    """Neither a message nor an admin record (a replication slave applies its master's
    records straight into the store) is written under a name that is not one directory
    name, and nothing appears outside the data directory."""
    data = tmp_path / "data"
    store, _ = open_store(data)
    before = tree(tmp_path)
    end = store.commitlog.end
    r = outcome(store.put_messages(name, 0, [Message(body=b"x")]))
    assert r.check(StoreError), r
    r = outcome(store.put_admin(fmt.OP_CREATE, name, b""))
    assert r.check(StoreError), r
    assert store.commitlog.end == end
    with pytest.raises(StoreError):
        store.queue(name, 0)
    assert store.queues_of(name) == []
    assert tree(tmp_path) == before
    store.close()


def test_longest_topic_name_can_be_deleted_and_recreated(tmp_path):
    """A topic with the longest allowed name (255 bytes) is deleted: its queues move to
    the trash under a short name (``<name>.<eventId>`` is longer than a file name may be)."""
    store, broker = open_store(tmp_path)
    name = "t" * 255
    assert not isinstance(outcome(broker.create_topic(name)), Exception)
    assert outcome(broker.publish(name, [Message(body=b"x")])).queue_offsets == [0]
    r = outcome(broker.delete_topic(name))
    assert not hasattr(r, "raiseException"), r
    assert not os.path.exists(tmp_path / "consumequeue" / name)
    outcome(broker.create_topic(name))
    assert outcome(broker.publish(name, [Message(body=b"y")])).queue_offsets == [0]
    store.close()
