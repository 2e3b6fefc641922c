"""Consumer offsets: (topic, group, queue) -> the next queue offset the group consumes.

No wire knowledge: RocketMQ's QUERY/UPDATE_CONSUMER_OFFSET (and any other protocol with
server-side group offsets) read and write this table. It is saved to
``<store.path>/consumerOffset.json`` in RocketMQ's own layout,
``{"offsetTable": {"topic@group": {"0": 12}}}``, atomically, every few seconds when it
changed (on the store's runner thread) and at stop.
"""

import os

from mqserver.store.flush import read_json, write_json_atomic

FILE_NAME = "consumerOffset.json"


class ConsumerOffsets:
    """The offset table of every consumer group.

    @ivar table: C{(topic, group)} -> C{{queue_id: offset}}.
    """

    def __init__(self, path, write=write_json_atomic):
        """
        @param write: writes a JSON file atomically (the store's file I/O:
            L{mqserver.store.fileio.FileIO.write_json}).
        """
        self.path = os.path.join(path, FILE_NAME)
        self.table = {}
        self._dirty = False
        self._write = write

    def load(self):
        """Read the file written by L{snapshot} (a missing file is an empty table)."""
        data = read_json(self.path) or {}
        self.table = {}
        for key, queues in (data.get("offsetTable") or {}).items():
            topic, sep, group = key.rpartition("@")
            if not sep:
                continue
            self.table[(topic, group)] = {int(q): int(o) for q, o in queues.items()}
        self._dirty = False

    def commit(self, topic, group, queue_id, offset):
        """Record that C{group} has consumed C{topic}/C{queue_id} up to C{offset} (exclusive)."""
        queues = self.table.setdefault((topic, group), {})
        if queues.get(queue_id) != offset:
            queues[queue_id] = offset
            self._dirty = True

    def query(self, topic, group, queue_id):
        """Return the committed offset, or None when the group never committed one."""
        return self.table.get((topic, group), {}).get(queue_id)

    def groups_of(self, topic):
        """Return the groups with offsets on C{topic}."""
        return sorted(g for t, g in self.table if t == topic)

    def drop_topic(self, topic):
        """Forget every offset of C{topic} (it was deleted)."""
        for key in [k for k in self.table if k[0] == topic]:
            del self.table[key]
            self._dirty = True

    def drop_group(self, group):
        """Forget every offset of C{group} (an admin deleted it with its offsets)."""
        for key in [k for k in self.table if k[1] == group]:
            del self.table[key]
            self._dirty = True

    def snapshot(self):
        """Return the table in RocketMQ's consumerOffset.json layout."""
        return {
            "offsetTable": {
                f"{topic}@{group}": {str(q): o for q, o in sorted(queues.items())}
                for (topic, group), queues in sorted(self.table.items())
            }
        }

    def save(self, runner=None):
        """Write the file if the table changed: on C{runner}'s thread (returns its
        Deferred) or, without a runner, synchronously (at stop)."""
        if not self._dirty:
            return None
        self._dirty = False
        data = self.snapshot()
        if runner is None:
            self._write(self.path, data)
            return None
        d = runner.run(self._write, self.path, data)

        def failed(f):
            self._dirty = True
            return f

        return d.addErrback(failed)
