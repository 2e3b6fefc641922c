"""A follower whose disk is full (the store's writes fail with ENOSPC, through FaultyIO):
the record it could not store is asked for again, so its log has no hole once the disk
has room."""

import errno

from twisted.internet.testing import MemoryReactorClock

from mqserver.broker.broker import Broker
from mqserver.errors import DiskFullError
from mqserver.replication.applier import Applier
from mqserver.replication.logreader import LogReader
from mqserver.store.fileio import FaultyIO
from mqserver.store.flush import SyncRunner
from mqserver.store.store import Message, MessageStore
from protocols.smss import binlog
from protocols.smss.follower import apply_block
from tests.support.inprocess import NOW, Node, failure_of, result_of


def follower(path, io):
    clock = MemoryReactorClock()
    clock.advance(NOW)
    store = MessageStore(str(path), clock, clock=clock.seconds, flush_level=1,
                         runner=SyncRunner(), io=io)
    broker = Broker(store, clock)
    store.open()
    broker.start()
    broker.is_master = False
    return store, Applier(broker)


def test_a_record_the_full_disk_refused_is_asked_for_again(tmp_path):
    master = Node(tmp_path / "master")
    io = FaultyIO()
    store, applier = follower(tmp_path / "follower", io)
    try:
        result_of(master.broker.create_topic("t"))
        for body in (b"one", b"two", b"three"):
            result_of(master.broker.publish("t", [Message(body=body)]))
        blocks = [binlog.record_to_block(v)
                  for v in LogReader(master.store, master.store.commitlog.min_offset).read()]
        for block in blocks[:2]:  # the CREATE and "one"
            result_of(apply_block(applier, block))
        io.write_error = errno.ENOSPC
        failure_of(apply_block(applier, blocks[2]), DiskFullError)
        # the master is asked to resume after "one": "two" is sent again
        assert applier.resume_point() == 2
        io.write_error = None
        resume = LogReader.after_event(master.store, applier.resume_point())
        for view in resume.read():
            result_of(apply_block(applier, binlog.record_to_block(view)))
        assert applier.gaps == 0
        assert store.next_event_id == master.store.next_event_id
    finally:
        store.close()
        master.close()
