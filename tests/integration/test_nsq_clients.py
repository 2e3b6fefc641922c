"""Real NSQ client libraries from PyPI (pynsq, gnsq, ansq) against the broker. Each
client runs in its own bounded subprocess (they retry forever and gnsq monkeypatches)."""

import pytest

from tests.support.nsq import http_json, nsq_broker, run_client


@pytest.fixture(scope="module")
def nsq(tmp_path_factory):
    with nsq_broker(tmp_path_factory.mktemp("nsqcli") / "broker") as ports:
        yield ports


PYNSQ_PRELUDE = """
import nsq, tornado.ioloop
loop = tornado.ioloop.IOLoop.current()
addr = ["127.0.0.1:%d" % PARAMS["port"]]
loop.call_later(PARAMS.get("limit", 20), loop.stop)
def done_when(cond):
    def check():
        if cond():
            loop.stop()
        else:
            loop.call_later(0.05, check)
    loop.call_later(0.05, check)
"""


def test_pynsq_publish_and_a_reader_per_channel(nsq):
    """pub/mpub/dpub through pynsq's Writer; each channel's Reader gets every message."""
    got = run_client(PYNSQ_PRELUDE + """
got = {"c1": [], "c2": []}
acks = []
def handler(name):
    def h(m):
        got[name].append(m.body.decode())
        return True
    return h
readers = [nsq.Reader(topic="py_t", channel=c, nsqd_tcp_addresses=addr,
                      message_handler=handler(c), max_in_flight=10) for c in ("c1", "c2")]
w = nsq.Writer(addr)
def pub():
    cb = lambda conn, data: acks.append(data.decode() if isinstance(data, bytes) else str(data))
    w.pub("py_t", b"one", callback=cb)
    w.mpub("py_t", [b"two", b"three"], callback=cb)
    w.dpub("py_t", 200, b"four", callback=cb)
loop.call_later(1.0, pub)
done_when(lambda: all(len(v) == 4 for v in got.values()))
loop.start()
print(json.dumps({"got": {k: sorted(v) for k, v in got.items()}, "acks": acks}))
""", port=nsq.tcp)
    assert got["acks"] == ["OK", "OK", "OK"]
    assert got["got"] == {c: ["four", "one", "three", "two"] for c in ("c1", "c2")}


def test_pynsq_two_readers_share_a_channel(nsq):
    got = run_client(PYNSQ_PRELUDE + """
seen = []
per = {0: 0, 1: 0}
def handler(i):
    def h(m):
        seen.append(m.body.decode()); per[i] += 1
        return True
    return h
readers = [nsq.Reader(topic="py_share", channel="c", nsqd_tcp_addresses=addr,
                      message_handler=handler(i), max_in_flight=5) for i in (0, 1)]
w = nsq.Writer(addr)
loop.call_later(1.0, lambda: w.mpub("py_share", [b"%d" % i for i in range(200)]))
done_when(lambda: len(seen) >= 200)
loop.start()
print(json.dumps({"seen": seen, "per": per}))
""", port=nsq.tcp)
    assert sorted(got["seen"], key=int) == [str(i) for i in range(200)]  # each once
    assert len(set(got["seen"])) == 200


def test_pynsq_requeue_counts_attempts(nsq):
    got = run_client(PYNSQ_PRELUDE + """
attempts = []
def h(m):
    attempts.append(m.attempts)
    if m.attempts < 3:
        m.requeue(backoff=False, delay=0)
        return None
    m.finish()
    return None
def handler(m):
    m.enable_async()
    h(m)
r = nsq.Reader(topic="py_req", channel="c", nsqd_tcp_addresses=addr, message_handler=handler,
               max_in_flight=1, max_tries=10)
w = nsq.Writer(addr)
loop.call_later(1.0, lambda: w.pub("py_req", b"x"))
done_when(lambda: len(attempts) >= 3)
loop.start()
print(json.dumps(attempts))
""", port=nsq.tcp)
    assert got == [1, 2, 3]


@pytest.mark.parametrize("compression", ["snappy", "deflate"])
def test_pynsq_compressed_connections(nsq, compression):
    got = run_client(PYNSQ_PRELUDE + """
kw = {PARAMS["compression"]: True}
seen = []
def handler(m):
    seen.append(m.body.decode())
    return True
r = nsq.Reader(topic="py_" + PARAMS["compression"], channel="c", nsqd_tcp_addresses=addr,
               message_handler=handler, max_in_flight=50, **kw)
w = nsq.Writer(addr, **kw)
loop.call_later(1.0, lambda: w.mpub("py_" + PARAMS["compression"],
                                    [(b"payload-%d " % i) * 20 for i in range(100)]))
done_when(lambda: len(seen) >= 100)
loop.start()
conn = list(r.conns.values())[0]
print(json.dumps({"n": len(seen), "snappy": conn.snappy, "deflate": conn.deflate}))
""", port=nsq.tcp, compression=compression)
    assert got["n"] == 100
    assert got[compression] is True
    # the server agrees the connection is compressed
    stats = http_json(nsq.http, "GET", "/stats?format=json")[1]
    assert stats["version"] == "1.3.0"


def test_pynsq_reader_finds_nsqd_through_embedded_lookupd(nsq):
    got = run_client(PYNSQ_PRELUDE + """
seen = []
def handler(m):
    seen.append(m.body.decode())
    return True
w = nsq.Writer(addr)
def start_reader():
    global r
    r = nsq.Reader(topic="py_lookup", channel="c", message_handler=handler,
                   lookupd_http_addresses=["http://127.0.0.1:%d" % PARAMS["lookupd"]],
                   lookupd_poll_interval=1)
loop.call_later(0.5, lambda: w.pub("py_lookup", b"found me"))
loop.call_later(1.5, start_reader)
done_when(lambda: seen)
loop.start()
print(json.dumps(seen))
""", port=nsq.tcp, lookupd=nsq.lookupd_http)
    assert got == ["found me"]


def test_gnsq_producer_consumer_and_http_clients(nsq):
    got = run_client("""
import gevent, gnsq
addr = "127.0.0.1:%d" % PARAMS["port"]
p = gnsq.Producer(addr)
p.start()
acks = [p.publish("gn_t", b"a"), p.multipublish("gn_t", [b"b", b"c"]),
        p.publish("gn_t", b"d", defer=100)]
seen = []
c = gnsq.Consumer("gn_t", "c", addr, max_in_flight=10)
@c.on_message.connect
def handler(consumer, message):
    seen.append(message.body.decode())
c.start(block=False)
deadline = 20
while len(seen) < 4 and deadline > 0:
    gevent.sleep(0.05); deadline -= 0.05
c.close(); p.close()
h = gnsq.NsqdHTTPClient("127.0.0.1", PARAMS["http"])
h.publish("gn_http", b"x")
h.multipublish("gn_http", [b"y", b"z"])
h.multipublish("gn_http", [b"bin\\n1", b"bin2"], binary=True)
stats = h.stats(topic="gn_http")
lk = gnsq.LookupdClient("127.0.0.1", PARAMS["lookupd"])
lookup = lk.lookup("gn_t")
print(json.dumps({"acks": [a.decode() if isinstance(a, bytes) else a for a in acks],
                  "seen": sorted(seen), "ping": h.ping().decode(), "info": h.info(),
                  "depth": stats["topics"][0]["depth"], "lookup": lookup,
                  "topics": lk.topics()}))
""", port=nsq.tcp, http=nsq.http, lookupd=nsq.lookupd_http)
    assert got["acks"] == ["OK", "OK", "OK"]
    assert got["seen"] == ["a", "b", "c", "d"]
    assert got["ping"] == "OK"
    assert got["info"]["tcp_port"] == nsq.tcp and got["info"]["version"] == "1.3.0"
    assert got["depth"] == 5  # topic with no channel keeps its backlog
    assert got["lookup"]["channels"] == ["c"]
    assert [p["tcp_port"] for p in got["lookup"]["producers"]] == [nsq.tcp]
    assert "gn_t" in got["topics"]["topics"]


def test_ansq_writer_and_reader(nsq):
    got = run_client("""
import asyncio
from ansq import create_reader, create_writer
async def main():
    addr = ["127.0.0.1:%d" % PARAMS["port"]]
    w = await create_writer(nsqd_tcp_addresses=addr)
    r1 = await w.pub("an_t", "one")
    r2 = await w.mpub("an_t", "two", "three")
    r3 = await w.dpub("an_t", "four", 100)
    reader = await create_reader("an_t", "ch", nsqd_tcp_addresses=addr)
    seen = []
    async def consume():
        async for m in reader.messages():
            seen.append((m.body.decode(), m.attempts))
            if m.body == b"two" and m.attempts == 1:
                await m.req(0)
            else:
                await m.fin()
            if len(seen) == 5:
                return
    await asyncio.wait_for(consume(), 20)
    await reader.close(); await w.close()
    return {"acks": [str(r1), str(r2), str(r3)], "seen": seen}
print(json.dumps(asyncio.run(main())))
""", port=nsq.tcp)
    assert sorted(map(tuple, got["seen"])) == [("four", 1), ("one", 1), ("three", 1),
                                               ("two", 1), ("two", 2)]
