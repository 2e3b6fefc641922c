"""Publish latency at flush level 2 on a slow disk: every fsync of the store takes
``--fsync-ms`` longer (the store's test-only fault injection, ``MQSERVER_FAULT_INJECT``
with a ``fsync-slow`` file; see mqserver/store/fileio.py).

One real broker process on loopback (``store.flushLevel: 2``, so each publish is
answered once a group commit's fsync covers it); ``--conns`` smss clients each publish
one 200-byte message and wait for its answer, for ``--seconds``. The checkpoint (once a
second) and the consumer-offset saves fsync files of their own on the same disk; what
the publishes wait for beyond the group commit shows in the p90 and the max.
``--tree DIR`` runs the broker from another source tree (a checkout before a change).

    python bench/slow_fsync.py [--fsync-ms 100] [--seconds 10] [--conns 1] [--tree DIR]
"""

import argparse
import os
import queue
import tempfile
import threading

import harness  # the source tree on the import path
from harness import LOOPBACK, broker
from sync_cost import _smss as publisher, pct

from mqserver.store.fileio import FAULT_ENV
from protocols.smss.client import SmssClient


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fsync-ms", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--conns", type=int, default=1)
    ap.add_argument("--tree", default=harness.ROOT)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mq-slow-fsync-") as control:
        with broker({"smss": LOOPBACK}, {"store": {"flushLevel": 2}}, tree=args.tree,
                    env={FAULT_ENV: control}) as srv:
            with SmssClient("127.0.0.1", srv.smss_port) as c:
                c.create("bench")
            with open(os.path.join(control, "fsync-slow"), "w") as f:
                f.write(str(args.fsync_ms))
            out = queue.Queue()
            threads = [threading.Thread(target=publisher,
                                        args=(srv.smss_port, args.seconds, out))
                       for _ in range(args.conns)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            os.remove(os.path.join(control, "fsync-slow"))  # a quick stop
    lat = [x for _ in threads for x in out.get()[1]]
    print(f"flush level 2, every fsync {args.fsync_ms} ms longer, {args.conns} publisher(s),"
          f" {args.seconds:g} s: {len(lat)} publishes")
    print(f"publish latency ms: p50 {pct(lat, 50) * 1000:.0f}  p90 {pct(lat, 90) * 1000:.0f}"
          f"  max {max(lat, default=0) * 1000:.0f}")


if __name__ == "__main__":
    main()
