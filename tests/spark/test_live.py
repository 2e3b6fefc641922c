"""Auditing the directory of a broker that is writing: with --live, only what its
checkpoint made durable is read, and no false integrity finding comes out."""

import json
import os
import threading
import time

from protocols.smss.client import SmssClient
from spark.audit import job
from tests.support.server import ServerProcess


def test_live_broker_directory(spark, tmp_path):
    """A real broker publishes without pause, rolling 64 KiB segments, while the audit
    runs: the audit reads up to the checkpoint's logOffset, says so, and finds nothing."""
    data = tmp_path / "data"
    server = ServerProcess(str(data), config={"store": {"maxLogSize": 65536}})
    server.start()
    stop = threading.Event()
    published = []

    def publish():
        c = SmssClient("127.0.0.1", server.smss_port)
        try:
            while not stop.is_set():
                c.publish("live", [os.urandom(150) for _ in range(20)])
                published.append(20)
                # A steady trickle (~80 KB/s), not a flood: unthrottled, the log grew to
                # hundreds of MB (thousands of 64 KiB segments, one task each) before the
                # audit read the checkpoint, and the test took 6-7 minutes.
                stop.wait(0.05)
        finally:
            c.close()

    try:
        c = SmssClient("127.0.0.1", server.smss_port)
        c.create("live")
        c.close()
        writer = threading.Thread(target=publish, daemon=True)
        writer.start()
        meta = data / "metadata.json"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # bounded: a checkpoint covering a few segments
            if meta.exists() and json.loads(meta.read_text()).get("logOffset", 0) > 3 * 65536:
                break
            time.sleep(0.2)
        args = job.parse_args([str(data), "--out", str(tmp_path / "out"), "--quiet", "--live"])
        before = sum(published)
        summary, code = job.run(spark, args)
        during = sum(published) - before
    finally:
        stop.set()
        writer.join(30)
        server.stop()
        server.close()
    assert during > 0  # the broker was writing while the audit ran
    up_to = summary["log"]["read_up_to"]
    assert up_to["offset"] > 3 * 65536 and up_to["source"].startswith("checkpoint")
    assert {k: v for k, v in summary["integrity"].items() if v} == {}
    assert code == 0
    assert summary["log"]["last_event_id"] == summary["log"]["checkpoint"]["nextEventId"] - 1
