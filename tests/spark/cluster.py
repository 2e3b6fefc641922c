"""A Spark standalone cluster (one master, one worker) from pyspark's own distribution,
on 127.0.0.1, for the cluster tests and C{bench/audit_bench.py --cluster}.

Both daemons run C{bin/spark-class} (pyspark ships no C{start-master.sh}), each in its
own process group so that stopping it also ends what it started (the worker's executors
and their Python workers). Every port is 0, so the daemons pick free ones and say which
in their logs, which we read as they come: the master's URL, and the worker's
registration with it. The worker runs in its own directory (cwd and C{--work-dir}), never
the driver's.

    with StandaloneCluster(base_dir) as cluster:
        subprocess.run([cluster.submit, "--master", cluster.url, ...])
"""

import os
import re
import signal
import subprocess
import sys
import threading

import pyspark

SPARK_HOME = os.path.dirname(os.path.abspath(pyspark.__file__))
_MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
_REGISTERED = re.compile(r"Successfully registered with master")
_START_TIMEOUT_S = 120
_STOP_TIMEOUT_S = 20


class ClusterError(RuntimeError):
    """A daemon did not start; the message ends with its log's tail."""


def _killpg(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # nothing left in the group
        pass


class _Daemon:
    """One C{spark-class} process whose merged output goes to a log file, line by line,
    while watching for one pattern."""

    def __init__(self, name, args, cwd, env, log_path, pattern):
        self.name = name
        self.log_path = log_path
        self.pattern = pattern
        self.match = None
        self.seen = threading.Event()
        self.proc = subprocess.Popen(
            [os.path.join(SPARK_HOME, "bin", "spark-class"), *args],
            cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        self.reader = threading.Thread(target=self._read, name=f"spark-{name}-log", daemon=True)
        self.reader.start()

    def _read(self):
        with open(self.log_path, "wb") as log:
            for line in self.proc.stdout:
                log.write(line)
                log.flush()
                if self.match is None:
                    m = self.pattern.search(line.decode("utf-8", "replace"))
                    if m:
                        self.match = m
                        self.seen.set()
        self.seen.set()  # the process ended: stop waiting

    def wait_for(self, timeout):
        """Return the match of the pattern; raise L{ClusterError} when the daemon
        exits or C{timeout} passes first."""
        self.seen.wait(timeout)
        if self.match is None:
            raise ClusterError(f"the Spark {self.name} did not start within {timeout}s:\n{self.tail()}")
        return self.match

    def tail(self, n=4000):
        """The end of the daemon's log."""
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self):
        """End the process group: SIGTERM (the worker then kills its executors), then
        SIGKILL if it is still there after L{_STOP_TIMEOUT_S}."""
        _killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        # Whatever is left of the group: a JVM that ignored SIGTERM, an executor the
        # worker did not get to, their Python workers.
        _killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(_STOP_TIMEOUT_S)
        self.reader.join(_STOP_TIMEOUT_S)
        self.proc.stdout.close()


class StandaloneCluster:
    """A master and one worker (C{cores}, C{memory}) under C{base}: C{base/master},
    C{base/worker} (the worker's cwd), C{base/worker/work} (its C{--work-dir}), their logs
    C{base/*.log}. L{start} returns once the worker is registered; L{stop} ends both,
    whatever state they are in."""

    def __init__(self, base, cores=2, memory="1g", daemon_memory="256m"):
        self.base = os.path.abspath(base)
        self.cores = cores
        self.memory = memory
        self.daemon_memory = daemon_memory
        self.url = None
        self.master = self.worker = None
        self.work_dir = os.path.join(self.base, "worker", "work")
        self.submit = os.path.join(SPARK_HOME, "bin", "spark-submit")

    def env(self):
        """The environment of the daemons (and of spark-submit): loopback only, this
        interpreter for Python workers, no PYTHONPATH (the job's code comes in its zip)."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_HOME", "SPARK_CONF_DIR")}
        env.update(
            SPARK_HOME=SPARK_HOME, SPARK_LOCAL_IP="127.0.0.1", SPARK_LOCAL_HOSTNAME="127.0.0.1",
            SPARK_DAEMON_MEMORY=self.daemon_memory, PYSPARK_PYTHON=sys.executable,
            PYSPARK_DRIVER_PYTHON=sys.executable,
        )  # fmt: skip
        return env

    def start(self, timeout=_START_TIMEOUT_S):
        """Start the master, then the worker; return once the worker is registered."""
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout):
        master_dir = os.path.join(self.base, "master")
        worker_dir = os.path.join(self.base, "worker")
        work = self.work_dir
        for d in (master_dir, work):
            os.makedirs(d, exist_ok=True)
        env = self.env()
        self.master = _Daemon(
            "master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0",
                       "--webui-port", "0"],
            master_dir, env, os.path.join(self.base, "master.log"), _MASTER_URL,
        )  # fmt: skip
        self.url = self.master.wait_for(timeout).group(1)
        self.worker = _Daemon(
            "worker", ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--port", "0",
                       "--webui-port", "0", "--cores", str(self.cores), "--memory", self.memory,
                       "--work-dir", work, self.url],
            worker_dir, env, os.path.join(self.base, "worker.log"), _REGISTERED,
        )  # fmt: skip
        self.worker.wait_for(timeout)

    def stop(self):
        """Stop the worker (and its executors), then the master."""
        for d in (self.worker, self.master):
            if d is not None:
                d.stop()

    def logs(self):
        """The tails of both daemons' logs, for a failing test's message."""
        return "\n".join(f"--- {d.name}:\n{d.tail()}" for d in (self.master, self.worker) if d is not None)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
