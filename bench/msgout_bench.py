"""msgout benchmark against the real broker (``twistd mqserver``, loopback, flush level 1).

* publish: --conns HTTP clients POST batches of --batch messages (200-byte bodies) to a
  queue-mode queue, one request outstanding each, until --messages are stored;
* fetch+ack: --conns HTTP clients drain that backlog, each looping POST fetch (max
  --batch) then POST /v1/ack of the receipts, on one keep-alive connection;
* push: a push subscription (batch --batch) POSTs a second backlog of --messages to a
  local twisted.web receiver that counts and answers 204; time until it has them all;
* console PUB: one console connection pipelines PUB lines (up to 1000 unanswered) for
  --seconds.

Prints msgs/s per part, the broker's CPU per message and its peak RSS. Figures depend on
what else the machine runs: compare runs side by side.

    PYTHONPATH=. .venv/bin/python bench/msgout_bench.py [--messages 200000] [--conns 2]
        [--batch 100] [--seconds 5] [--quick]
"""

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import time

from harness import LOOPBACK, ROOT, Machine, broker, report_rate, run_workers

from procstat import cpu_seconds

BODY = "x" * 200

RECEIVER = r"""
import sys
from twisted.internet import reactor
from twisted.web import resource, server

class R(resource.Resource):
    isLeaf = True
    n = 0
    def render_POST(self, request):
        body = request.content.read()
        R.n += body.count(b'"receipt"')
        request.setResponseCode(204)
        return b""
    def render_GET(self, request):
        return str(R.n).encode()

port = reactor.listenTCP(0, server.Site(R()), interface="127.0.0.1")
print(port.getHost().port, flush=True)
reactor.run()
"""


def _call(conn, method, path, body=None):
    conn.request(method, path, body=json.dumps(body).encode() if body is not None else None,
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    if r.status != 200:
        raise RuntimeError(f"{method} {path}: {r.status} {data[:200]!r}")
    return json.loads(data)


def _publisher(port, queue, count, batch, out):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    msgs = {"messages": [{"body": BODY}] * batch}
    done = 0
    while done < count:
        _call(conn, "POST", f"/v1/queues/{queue}/messages", msgs)
        done += batch
    out.put(done)


def _fetcher(port, queue, batch, out):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    n = 0
    while True:
        ms = _call(conn, "POST", f"/v1/queues/{queue}/fetch", {"max": batch})["messages"]
        if not ms:
            break
        _call(conn, "POST", "/v1/ack", {"receipts": [m["receipt"] for m in ms]})
        n += len(ms)
    out.put(n)


def _console_pub(port, seconds):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    line = b"PUB cpub " + BODY.encode() + b"\r\n"
    sent = answered = 0
    buf = b""
    end = time.monotonic() + seconds
    start = time.monotonic()
    while time.monotonic() < end or answered < sent:
        if time.monotonic() < end and sent - answered < 1000:
            s.sendall(line * 100)
            sent += 100
        data = s.recv(1 << 16)
        if not data:
            raise RuntimeError("console closed")
        buf += data
        oks = buf.count(b"\r\n")
        if b"ERR" in buf:
            raise RuntimeError(buf[:200])
        answered += oks
        buf = buf[buf.rfind(b"\r\n") + 2:] if oks else buf
    s.close()
    return answered, time.monotonic() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--conns", type=int, default=2)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--quick", action="store_true", help="20,000 messages, 2 s console run")
    args = ap.parse_args()
    if args.quick:
        args.messages, args.seconds = 20_000, 2.0
    with broker({"msgout": LOOPBACK, "console": LOOPBACK}, prefix="msgoutbench-") as server:
        run(args, server)


def run(args, server):
    """The msgout and console figures of the broker C{server}."""
    per_conn = args.messages // args.conns
    total = per_conn * args.conns
    rec = subprocess.Popen([sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE,
                           env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        port, cport = server.ports["MsgoutSite"], server.ports["ConsoleFactory"]
        rport = int(rec.stdout.readline())
        pid = server.proc.pid
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for q in ("bq", "pq", "cpub"):
            _call(conn, "PUT", f"/v1/queues/{q}", {"ack_timeout_ms": 600000})
        machine = Machine()
        c0 = cpu_seconds(pid)
        n, t = run_workers(_publisher, args.conns, (port, "bq", per_conn, args.batch))
        c1 = cpu_seconds(pid)
        report_rate(f"publish  batches of {args.batch}, {args.conns} conns", n, t, c1 - c0,
                    width=46, cores=False)
        n, t = run_workers(_fetcher, args.conns, (port, "bq", args.batch))
        c2 = cpu_seconds(pid)
        report_rate(f"fetch+ack  batches of {args.batch}, {args.conns} conns", n, t, c2 - c1,
                    width=46, cores=False)
        if n != total:
            print(f"  (fetched {n} of {total})")
        run_workers(_publisher, args.conns, (port, "pq", per_conn, args.batch))
        rconn = http.client.HTTPConnection("127.0.0.1", rport, timeout=60)
        c3 = cpu_seconds(pid)
        start = time.monotonic()
        _call(conn, "POST", "/v1/queues/pq/subscriptions",
              {"url": f"http://127.0.0.1:{rport}/in", "sub_id": "bench", "batch": args.batch})
        got = 0
        deadline = start + 600
        while got < total and time.monotonic() < deadline:
            time.sleep(0.02)
            rconn.request("GET", "/")
            got = int(rconn.getresponse().read())
        t = time.monotonic() - start
        report_rate(f"push  batches of {args.batch} to a local receiver", got, t,
                    cpu_seconds(pid) - c3, width=46, cores=False)
        c4 = cpu_seconds(pid)
        n, t = _console_pub(cport, args.seconds)
        report_rate("console PUB lines (pipelined, 1 conn)", n, t, cpu_seconds(pid) - c4,
                    width=46, cores=False)
        machine.report(pid)
    finally:
        rec.kill()
        rec.wait(10)


if __name__ == "__main__":
    main()
