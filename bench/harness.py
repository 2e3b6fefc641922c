"""What the benchmarks share: the source tree on the import path, the broker run as a
process with the ports its ready file names, the reference servers by path, the
blocking clients, and the figures printed the same way.

Every script of bench/ imports this module before anything of the project's (run as
C{python bench/NAME.py}, bench/ is first on the import path):

    import harness
    from harness import broker, report_rate

It is the one module here that knows where the source tree is; the broker process and
the clients are the test suite's own (C{tests/support}), so a benchmark measures the
broker as the integration tests run it.
"""

import contextlib
import importlib
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
#: The source tree this harness belongs to (a broker runs from it unless told otherwise).
ROOT = os.path.dirname(BENCH)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# The broker process, with its ports from its ready file: the one the tests run.
from tests.support.server import ServerProcess  # noqa: E402

from procstat import peak_rss_mb, steal_seconds  # noqa: E402

#: What a benchmark may use of the test suite's clients and fixtures: name -> the module
#: defining it (C{module:attribute} where the name differs). Each is imported when it is
#: first asked for (C{from harness import RemotingClient}), so a script pays only for what
#: it uses.
SHARED = {
    **dict.fromkeys(["RemotingClient", "records"], "tests.support.remoting_client"),
    **dict.fromkeys(["V2", "http"], "tests.support.nsq"),
    **dict.fromkeys(["connect", "read_topic"], "tests.support.smss"),
    **dict.fromkeys(["broker_port", "namesrv_addr", "rocket_server"], "tests.support.rmq"),
    "Certs": "tests.support.tls",
    **dict.fromkeys(["DOORS", "PORT_NAMES", "conversation", "healthy", "prepare"],
                    "tests.support.fuzzframes"),
    "running": "tests.support.inprocess",
    "Node": "tests.support.inprocess",
    "connect_follower": "tests.unit.test_follower_runs",
    **dict.fromkeys(["SKIP_REASON", "EtcdProcess", "etcd_binary", "free_port"],
                    "tests.support.etcd"),
    **dict.fromkeys(["Member", "leader_of", "member_config", "wait_converged",
                     "writable_leader"], "tests.support.group"),
    "wait_until": "tests.support.wait",
    "write_data_dir": "tests.spark.biglog",
    "StandaloneCluster": "tests.spark.cluster",
    # the crash test's publishers and checks, which bench/crash_loop.py repeats many times
    **dict.fromkeys(["THREADS", "TOPICS", "Publisher", "read_back_and_check"],
                    "tests.integration.test_smss_crash"),
    "crash_config": "tests.integration.test_smss_crash:config",
    "rocketmq_send": "tests.integration.test_replication_sync:_send",
}


def __getattr__(name):
    where = SHARED.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, attr = where.partition(":")
    return getattr(importlib.import_module(module), attr or name)


def support_module(name):
    """The test suite's support module C{tests.support.NAME} itself, for a benchmark that
    adjusts it (the command a broker starts with, say)."""
    return importlib.import_module(f"tests.support.{name}")


#: Every door on a loopback port the system picks.
LOOPBACK = "tcp:0:interface=127.0.0.1"


@contextlib.contextmanager
def broker(listen, config=None, prefix="bench-", tree=ROOT, **kw):
    """Run a broker process with the doors C{listen} (door -> endpoint) and C{config}
    in a fresh temporary data directory, from source tree C{tree}; yield its
    L{ServerProcess} (C{.ports} by door, C{.proc.pid}), and stop it and remove the
    directory afterwards. Keywords go to L{ServerProcess}."""
    data = tempfile.mkdtemp(prefix=prefix)
    server = ServerProcess(os.path.join(data, "broker"), config=config, listen=listen,
                           root=tree, **kw).start()
    try:
        yield server
    finally:
        try:
            server.stop()
        finally:
            server.close()
            shutil.rmtree(data, ignore_errors=True)


def run_workers(target, n, args):
    """Run C{target(*args, queue)} in C{n} processes at once; each puts the number of
    messages it handled on the queue. Return (the sum, seconds from the first start to
    the last count)."""
    out = mp.Queue()
    procs = [mp.Process(target=target, args=(*args, out)) for _ in range(n)]
    start = time.monotonic()
    for p in procs:
        p.start()
    counts = [out.get(timeout=600) for _ in procs]
    elapsed = time.monotonic() - start
    for p in procs:
        p.join(30)
    return sum(counts), elapsed


def report_rate(label, n, seconds, cpu, width=44, cores=True):
    """Print one throughput figure: C{n} messages in C{seconds}, with the broker's CPU
    seconds C{cpu} as microseconds per message (a figure that depends less on what else
    the machine runs) and, when C{cores}, as the rate one broker core would reach."""
    per = cpu / n * 1e6 if n else 0.0
    line = (f"{label:<{width}}{n / seconds:>10,.0f} msgs/s  ({n} in {seconds:.1f}s; "
            f"broker CPU {per:.1f} us/msg")
    if cores:
        line += f" = {n / cpu if cpu else 0.0:,.0f} msgs/s per broker core"
    print(line + ")", flush=True)


class Machine:
    """What else the machine did during a run: load average, the host's steal time,
    and the broker's peak RSS, printed by L{report}."""

    def __init__(self):
        self.steal0, self.wall0 = steal_seconds(), time.monotonic()

    def report(self, pid):
        """Print the load average now, the steal since this object was made, and the
        peak RSS of process C{pid}."""
        with open("/proc/loadavg") as f:
            print(f"load average during the run: {f.read().split()[0]} ({os.cpu_count()} cores)")
        steal = steal_seconds() - self.steal0
        print(f"host steal during the run: {steal:.1f} s "
              f"({100 * steal / (time.monotonic() - self.wall0):.0f}% of one core)")
        print(f"broker peak RSS: {peak_rss_mb(pid):.0f} MiB", flush=True)
