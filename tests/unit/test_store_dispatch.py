"""The store's dispatch listeners hear of the message records they declared they need
(records with properties, or every record of the topics they named), both as records are
written and as they are replayed at start-up; a bare body (an smss or NSQ publish) to
any other topic reaches none of them."""

import shutil

from twisted.internet.task import Clock

from mqserver.store.store import Message, MessageStore
from tests.support.inprocess import result_of

KEYS = b"KEYS\x01k1\x02UNIQ_KEY\x01U1\x02"


def make_store(path):
    return MessageStore(str(path), Clock(), clock=lambda: 1_700_000_000.0, segment_size=4096,
                        cq_entries_per_file=10)


def listen(store, topics=None):
    heard = []

    def listener(off, topic, props, ts):
        heard.append((off, topic, props))

    if topics is None:
        store.add_dispatch_listener(listener)
    else:
        store.add_dispatch_listener(listener, topics=topics)
    return heard


def publish_mix(store):
    """Write bare bodies and messages with and without properties to topics "a" and
    "half"; return the (offset, topic, properties) of every record written, in order."""
    written = []
    for topic, messages in [
        ("a", [b"bare"]),
        ("a", [Message(body=b"no props")]),
        ("a", [Message(body=b"keys", properties=KEYS)]),
        ("a", [b"x", Message(body=b"y", properties=b"TAGS\x01t\x02"), b"z"]),
        ("half", [b"bare half"]),
        ("half", [Message(body=b"half", properties=KEYS)]),
    ]:
        result = result_of(store.put_messages(topic, 0, messages))
        for off, m in zip(result.log_offsets, messages):
            written.append((off, topic, b"" if type(m) is bytes else m.properties))
    return written


def test_a_listener_hears_only_records_with_properties(tmp_path):
    """The default listener (the key index's) gets every record that carries properties,
    in a batch mixed with bare bodies too, and never one without."""
    s = make_store(tmp_path)
    s.open()
    heard = listen(s)
    written = publish_mix(s)
    assert heard == [w for w in written if w[2]]
    assert len(heard) == 3


def test_a_topic_listener_hears_every_record_of_its_topics(tmp_path):
    """A listener that names topics (the transactions') gets every record of those
    topics, bare bodies included, and nothing else."""
    s = make_store(tmp_path)
    s.open()
    heard = listen(s, topics=("half", "op"))
    written = publish_mix(s)
    assert heard == [w for w in written if w[1] == "half"]
    assert len(heard) == 2


def test_replay_dispatches_as_the_writes_did(tmp_path):
    """Recovery replaying the whole log tells each listener of the same records."""
    s = make_store(tmp_path)
    s.open()
    written = publish_mix(s)
    s.commitlog.close()
    s.queue_table.close()
    s._lock.release()  # the kernel drops a dead process's lock
    shutil.rmtree(tmp_path / "consumequeue")
    (tmp_path / "metadata.json").unlink(missing_ok=True)
    s2 = make_store(tmp_path)
    with_props, of_half = listen(s2), listen(s2, topics=("half",))
    s2.open()
    assert with_props == [w for w in written if w[2]]
    assert of_half == [w for w in written if w[1] == "half"]
