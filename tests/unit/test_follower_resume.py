"""Where a follower asks its master to resume: after the last write its log holds, also
when it led a term of its own since the last record a master sent it (a member of a
replica group that led and follows again)."""

from mqserver.message import Message
from mqserver.replication.applier import Applier
from mqserver.replication.logreader import LogReader
from protocols.smss import binlog
from protocols.smss.follower import apply_block
from tests.support.inprocess import Node, result_of


def _replicate(master, applier, after=0):
    reader = (LogReader(master.store, master.store.commitlog.min_offset) if after == 0
              else LogReader.after_event(master.store, after))
    for view in reader.read():
        result_of(apply_block(applier, binlog.record_to_block(view)))


def test_a_follower_that_led_since_resumes_after_its_own_writes(tmp_path):
    master = Node(tmp_path / "master")
    member = Node(tmp_path / "member")
    try:
        result_of(master.broker.create_topic("t"))
        for body in (b"one", b"two"):
            result_of(master.broker.publish("t", [Message(body=body)]))
        member.broker.is_master = False
        applier = Applier(member.broker)
        _replicate(master, applier)
        followed = applier.resume_point()
        assert followed == master.store.next_event_id - 1
        # it leads a term of its own and writes in it
        member.broker.is_master = True
        member.broker.begin_epoch()
        for body in (b"three", b"four", b"five"):
            result_of(member.broker.publish("t", [Message(body=body)]))
        # then follows again: from the end of its log, not from where it once followed
        member.broker.is_master = False
        assert applier.resume_point() == member.store.next_event_id - 1
        # and so after a restart (the checkpoint keeps the last record a master sent)
        member.close()
        member = Node(tmp_path / "member")
        member.broker.is_master = False
        again = Applier(member.broker)
        assert again.resume_point() == member.store.next_event_id - 1 > followed
    finally:
        member.close()
        master.close()
