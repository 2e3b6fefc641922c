"""What security costs: publish throughput with TLS against without it on each door, and
the cost of RocketMQ ACL signature checks per request.

Two brokers run side by side (real ``twistd mqserver`` processes on loopback, flush
level 1): A with plain ``tcp:`` listeners, B with ``ssl:`` listeners (certificates made
for the run) and NSQ's IDENTIFY ``tls_v1`` on its nsqd TCP door; for the ACL figure, A
has no ACL and B ``rocketmq.aclEnable`` with every request signed. Rounds alternate
A B A B so a busy (shared) machine hits both alike; each figure is printed as the range
over the rounds. One client, one connection, a request at a time (smss PUB of 50
messages, RocketMQ SEND, nsqd PUB and MPUB of 50, nsqd HTTP /mpub of 50), 200-byte bodies.

    PYTHONPATH=. .venv/bin/python bench/security_bench.py [--seconds 2] [--rounds 2]
"""

import argparse
import base64
import hashlib
import hmac
import http.client
import json
import os
import shutil
import socket
import ssl
import struct
import tempfile
import time
import timeit

from harness import RemotingClient, ServerProcess, Certs

from protocols.nsq.codec import encode_command, encode_mpub
from protocols.remoting import codes
from protocols.remoting.acl import PlainAcl
from protocols.remoting.messages import RemotingCommand
from protocols.smss.client import SmssClient

BODY = b"x" * 200
BATCH = 50
L = "tcp:0:interface=127.0.0.1"
ACL = """accounts:
  - accessKey: AKbench01
    secretKey: SKbench01
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
"""


def java_sign(ext, body, ak="AKbench01", sk=b"SKbench01"):
    fields = dict(ext, AccessKey=ak)
    content = "".join(fields[k] for k in sorted(fields)).encode() + body
    return dict(fields, Signature=base64.b64encode(hmac.new(sk, content, hashlib.sha1).digest()).decode())


def timed(seconds, step):
    """Run C{step} (returns messages done) for C{seconds}; return messages/s."""
    n, start = 0, time.perf_counter()
    end = start + seconds
    while time.perf_counter() < end:
        n += step()
    return n / (time.perf_counter() - start)


# -- one publisher per door ------------------------------------------------------------

def smss(srv, ctx, seconds):
    with SmssClient("127.0.0.1", srv.ports["SmssFactory"], ssl_context=ctx) as c:
        try:
            c.create("bench_sec")
        except Exception:
            pass
        msgs = [BODY] * BATCH

        def step():
            c.publish("bench_sec", msgs)
            return BATCH
        return timed(seconds, step)


def rocketmq(srv, ctx, seconds, signed=False):
    c = RemotingClient("127.0.0.1", srv.ports["BrokerDoor"], ssl_context=ctx)
    ext = {"producerGroup": "pg", "topic": "BenchSec", "defaultTopic": "TBW102",
           "defaultTopicQueueNums": "1", "queueId": "0", "sysFlag": "0", "bornTimestamp": "0",
           "flag": "0", "properties": ""}

    def step():
        r = c.call(codes.SEND_MESSAGE, java_sign(ext, BODY) if signed else ext, BODY)
        assert r.code == codes.SUCCESS, r.remark
        return 1
    try:
        return timed(seconds, step)
    finally:
        c.close()


def _frame(sock):
    head = b""
    while len(head) < 8:
        head += sock.recv(8 - len(head))
    size, kind = struct.unpack(">Ii", head)
    data = b""
    while len(data) < size - 4:
        data += sock.recv(size - 4 - len(data))
    return kind, data


def nsq_tcp(srv, tls, ctx, seconds, batch):
    s = socket.create_connection(("127.0.0.1", srv.ports["NsqdFactory"]))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(b"  V2" + encode_command("IDENTIFY", body=json.dumps(
        {"feature_negotiation": True, "tls_v1": tls}).encode()))
    _frame(s)
    if tls:
        s = ctx.wrap_socket(s, server_hostname="127.0.0.1")
        _frame(s)  # OK through TLS
    req = encode_mpub("bench_sec", [BODY] * batch) if batch > 1 else encode_command("PUB", "bench_sec", body=BODY)

    def step():
        s.sendall(req)
        kind, data = _frame(s)
        while data == b"_heartbeat_":
            s.sendall(b"NOP\n")
            kind, data = _frame(s)
        assert (kind, data) == (0, b"OK"), data
        return batch
    try:
        return timed(seconds, step)
    finally:
        s.close()


def nsq_http(srv, ctx, seconds):
    port = srv.ports["NsqdHttpSite"]
    conn = (http.client.HTTPSConnection("127.0.0.1", port, context=ctx) if ctx
            else http.client.HTTPConnection("127.0.0.1", port))
    body = b"\n".join([BODY] * BATCH)

    def step():
        conn.request("POST", "/mpub?topic=bench_sec", body)
        r = conn.getresponse()
        assert r.status == 200, r.read()
        r.read()
        return BATCH
    try:
        return timed(seconds, step)
    finally:
        conn.close()


# -- the runs --------------------------------------------------------------------------

def start(base, name, listen, config=None):
    return ServerProcess(os.path.join(base, name), listen=listen, config=config or {}).start()


def ab_rounds(label, rounds, run_a, run_b):
    a, b = [], []
    for _ in range(rounds):
        a.append(run_a())
        b.append(run_b())
    ratio = [y / x for x, y in zip(a, b)]
    print(f"{label:<34} {min(a):>10,.0f} - {max(a):>10,.0f}   {min(b):>10,.0f} - {max(b):>10,.0f}"
          f"   {min(ratio):.2f} - {max(ratio):.2f}", flush=True)


def acl_micro():
    """In-process: µs per PlainAcl.validate of a signed SEND (HmacSHA1 over the sorted
    fields and a 200-byte body), next to computing the signature alone."""
    d = tempfile.mkdtemp(prefix="aclbench")
    try:
        path = os.path.join(d, "plain_acl.yml")
        with open(path, "w") as f:
            f.write(ACL)
        acl = PlainAcl(path, time.monotonic, check_interval=5.0)
        ext = {"producerGroup": "pg", "topic": "BenchSec", "defaultTopic": "TBW102",
               "defaultTopicQueueNums": "1", "queueId": "0", "sysFlag": "0",
               "bornTimestamp": "1700000000000", "flag": "0",
               "properties": "KEYS\x01k1\x02TAGS\x01TagA\x02UNIQ_KEY\x010100007F0000799700000C47416F0100\x02"}
        cmd = RemotingCommand(code=codes.SEND_MESSAGE, ext_fields=java_sign(ext, BODY), body=BODY)
        n = 20000
        best = min(timeit.repeat(lambda: acl.validate(cmd, "127.0.0.1"), number=n, repeat=5)) / n
        sig = min(timeit.repeat(lambda: java_sign(ext, BODY), number=n, repeat=5)) / n
        print(f"ACL validate, signed SEND (in-process): {best * 1e6:.1f} µs/request"
              f" (of which signing the content: {sig * 1e6:.1f} µs)", flush=True)
    finally:
        shutil.rmtree(d)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    base = tempfile.mkdtemp(prefix="secbench")
    servers = []
    try:
        certs = Certs(os.path.join(base, "certs"))
        ctx = certs.client_context()
        plain = start(base, "plain", {d: L for d in ("smss", "broker", "nsqd_tcp", "nsqd_http")})
        servers.append(plain)
        tls = start(base, "tls", {"smss": certs.endpoint(), "broker": certs.endpoint(),
                                  "nsqd_tcp": L, "nsqd_http": certs.endpoint()},
                    {"nsq": {"tlsCert": certs.cert, "tlsKey": certs.key}})
        servers.append(tls)
        acl_path = os.path.join(base, "plain_acl.yml")
        with open(acl_path, "w") as f:
            f.write(ACL)
        acl = start(base, "acl", {"broker": L},
                    {"rocketmq": {"aclEnable": True, "aclFile": acl_path}})
        servers.append(acl)
        s = a.seconds
        print(f"{a.rounds} rounds of {s:g} s each, A B alternating; the machine is shared,"
              " so compare within a row", flush=True)
        print(f"{'door (messages/s)':<34} {'A: plain':>23}   {'B: TLS':>23}   B/A")
        ab_rounds("smss PUB x50", a.rounds, lambda: smss(plain, None, s), lambda: smss(tls, ctx, s))
        ab_rounds("RocketMQ SEND", a.rounds, lambda: rocketmq(plain, None, s),
                  lambda: rocketmq(tls, ctx, s))
        ab_rounds("nsqd TCP PUB (tls_v1)", a.rounds, lambda: nsq_tcp(plain, False, None, s, 1),
                  lambda: nsq_tcp(tls, True, ctx, s, 1))
        ab_rounds("nsqd TCP MPUB x50 (tls_v1)", a.rounds, lambda: nsq_tcp(plain, False, None, s, BATCH),
                  lambda: nsq_tcp(tls, True, ctx, s, BATCH))
        ab_rounds("nsqd HTTP /mpub x50 (HTTPS)", a.rounds, lambda: nsq_http(plain, None, s),
                  lambda: nsq_http(tls, ctx, s))
        print(f"{'':<34} {'A: no ACL':>23}   {'B: ACL, signed':>23}   B/A")
        ab_rounds("RocketMQ SEND", a.rounds, lambda: rocketmq(plain, None, s),
                  lambda: rocketmq(acl, None, s, signed=True))
        acl_micro()
    finally:
        for srv in servers:
            srv.stop()
            srv.close()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
