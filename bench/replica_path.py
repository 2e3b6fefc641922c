"""CPU per message of the smss replication stream in process, the C path of plain writes
(``protocols/smss/_feed.c``) against the Python path, alternated.

A master door with one confirming follower over StringTransports, real stores, no
sockets: each round, ``--publishers`` publishers send one 200-byte PUB each, the master
writes them and its feed sends the frames, the follower applies them and confirms, the
master answers. Printed per round: the master's and the follower's CPU µs per message
(``time.process_time`` around each side's share), then the leader's feed alone (read
back the log written, frames made) per record. What it leaves out is the kernel's part
(the sockets), which ``bench/chaos.py --rate`` measures with it.

    python bench/replica_path.py [--rounds 3] [--writes 20000] [--publishers 64]
"""

import argparse
import sys
import tempfile
import time

from harness import Node, connect_follower

from mqserver.message import MESSAGE_MAGIC
from mqserver.replication.logreader import LogReader
from protocols.smss import binlog, codec, replica
from protocols.smss import client_codec as cc
from protocols.smss.factory import make_factory
from protocols.smss.payload import encode_payload

PATHS = {"C": (binlog.plain_frames, binlog.plain_run), "Python": (None, None)}


def use(path):
    """Make the feed and the follower take C{path}'s way."""
    frames, run = PATHS[path]
    replica.plain_frames = frames
    binlog.plain_run = run


def gated_round(work, writes, publishers):
    """Return (master µs, follower µs) per message of C{writes} gated publishes."""
    master, fnode = Node(f"{work}/m"), Node(f"{work}/f")
    fnode.broker.is_master = False
    try:
        master.broker.require_replicas(1, 60_000)
        door = master.door(make_factory)
        proto, to_master, stream = connect_follower(master, door, fnode)
        pubs = [master.connect(door) for _ in range(publishers)]
        pubs[0].send(cc.encode_create(b"bench"))
        master.clock.advance(0)
        request = cc.encode_pub(b"bench", encode_payload([b"x" * 200]))
        follower = 0.0
        start = time.process_time()
        for _ in range(writes // publishers):
            for p in pubs:
                p.send(request)
            master.clock.advance(0)
            data = stream.take()
            t = time.process_time()
            proto.dataReceived(data)
            fnode.clock.advance(0)
            confirmation = to_master.value()
            to_master.clear()
            follower += time.process_time() - t
            stream.send(confirmation)
            master.clock.advance(0)
            for p in pubs:
                p.take()
        total = time.process_time() - start
        n = (writes // publishers) * publishers
        return 1e6 * (total - follower) / n, 1e6 * follower / n, master
    finally:
        fnode.close()


def feed_alone(master):
    """CPU µs per record of reading C{master}'s log back from its first message on and
    making its frames."""
    first = next(v.offset for v in LogReader(master.store, 0).read() if v.topic == "bench"
                 and v.magic == MESSAGE_MAGIC)
    reader = LogReader(master.store, first)
    feed = replica.ReplicaFeed.__new__(replica.ReplicaFeed)
    feed._write, feed.confirms = [], True
    count = 0
    start = time.process_time()
    while True:
        made, views = reader.read_encoded(None if feed._write else replica.plain_frames)
        if made is not None:
            count += made[2]
            continue
        if not views:
            break
        b"".join(codec.replica_frame(b) for b in feed._blocks(views))
        count += len(views)
    return 1e6 * (time.process_time() - start) / max(1, count)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--writes", type=int, default=20_000)
    ap.add_argument("--publishers", type=int, default=64)
    args = ap.parse_args(argv)
    if binlog.plain_frames is None:
        print("the C speedup protocols.smss._feed is not built (or MQSERVER_PURE_PYTHON"
              " is set): nothing to compare", file=sys.stderr)
        return 2
    print(f"{args.writes} gated smss publishes per round, {args.publishers} publishers,"
          " one confirming follower, in process")
    for r in range(args.rounds):
        for path in PATHS:
            use(path)
            with tempfile.TemporaryDirectory(prefix="mq-replica-path-") as work:
                m, f, master = gated_round(work, args.writes, args.publishers)
                feed = feed_alone(master)
                master.close()
            print(f"round {r + 1}: {path:6s} master {m:5.2f} µs/msg, follower {f:5.2f}"
                  f" µs/msg; the feed alone {feed:5.2f} µs/record", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
