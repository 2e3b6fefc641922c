"""Start and stop the reference servers (the Go smss server, nsqd) for bench/compare.py.

Their binaries are built by whoever runs the comparison, outside this repository, and
named by path (command-line options or the environment variables below). Nothing here
builds or fetches them. Every server listens on 127.0.0.1 only, with its data in a
temporary directory that goes with it.

- C{SMSS_BIN}: the Go smss server. It reads C{./config/config.yaml} from its working
  directory; we write one with the port and data path. Its upstream code listens on
  every interface; build it to listen on 127.0.0.1 (see docs/performance.md).
- C{NSQD_BIN}: nsqd 1.3 (C{--tcp-address}, C{--http-address} and C{--data-path} given).
- C{NSQ_BENCH_WRITER}, C{NSQ_BENCH_READER}: nsq's own C{bench/bench_writer} and
  C{bench/bench_reader} programs.
- C{SMSS_SDK_LOAD}: a load driver built on the smss Go SDK (L{sdk_load}).

Kinds C{"null"} and C{"null-nowrite"} start C{bench/null_smss.py} (no binary), the floor
under a broker's smss publish rows.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time

from harness import free_port

NULL_SMSS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "null_smss.py")

SMSS_CONFIG = """\
port: {port}
log:
  path: stdout
  sample: 10000
  withGid: false
  rotate:
    maxSize: 500
    maxBackups: 1
    maxAge: 1
store:
  path: data
  maxLogSize: 1073741824
  flushLevel: 1
  maxDays: 7
  clearInterval: 7200
  waitDelLockTimeoutMs: 3000
  noCache: false
  folderCount: 10
worker:
  buffSize: 1000
  waitMsgTimeout: 1000
  waitMsgTimeoutLogSample: 30
timeout:
  net:
    write: 1000
  server:
    alive: 30000
background:
  defaultScanSecond: 7200
  firstExecSecond: 1
"""


def binary(option, env_name):
    """The path given by C{option} or the environment, or C{None} with no such file."""
    path = option or os.environ.get(env_name)
    if path and os.path.isfile(path) and os.access(path, os.X_OK):
        return path
    return None


def sdk_load(path, port, *args, timeout):
    """Run the smss Go SDK load driver at C{path} against C{port} with C{args}; return
    its C{(messages, seconds)}."""
    done = subprocess.run([path, "-port", str(port), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"smss SDK driver failed: {done.stderr[-500:]}")
    r = json.loads(done.stdout.strip().splitlines()[-1])
    return r["messages"], r["seconds"]


def wait_listening(port, proc, timeout=30.0):
    """Wait until something accepts on 127.0.0.1:C{port}; raise if C{proc} dies first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"reference server exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"reference server did not listen on {port} in {timeout:.0f} s")


class RefServer:
    """One reference server process in its own temporary directory.

    @ivar port: the port of its (smss or NSQ TCP) protocol.
    @ivar proc: the C{Popen}.
    """

    def __init__(self, kind, path, tmp, extra_args=()):
        self.kind, self.path = kind, path
        self.extra_args = list(extra_args)
        self.dir = os.path.join(tmp, f"{kind}-{time.monotonic_ns()}")
        self.proc = None
        self.port = free_port()

    def start(self):
        os.makedirs(self.dir)
        if self.kind == "smss":
            os.makedirs(os.path.join(self.dir, "config"))
            with open(os.path.join(self.dir, "config", "config.yaml"), "w") as f:
                f.write(SMSS_CONFIG.format(port=self.port))
            argv = [self.path, "-role", "master"]
        elif self.kind in ("null", "null-nowrite"):
            argv = [sys.executable, NULL_SMSS, "--port", str(self.port), "--dir", self.dir]
            if self.kind == "null-nowrite":
                argv.append("--no-pwrite")
        else:
            data = os.path.join(self.dir, "data")
            os.makedirs(data)
            argv = [self.path, f"--tcp-address=127.0.0.1:{self.port}",
                    f"--http-address=127.0.0.1:{free_port()}", f"--data-path={data}"]
        argv += self.extra_args
        log = open(os.path.join(self.dir, "server.log"), "wb")
        try:
            self.proc = subprocess.Popen(argv, cwd=self.dir, stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL)
        finally:
            log.close()
        wait_listening(self.port, self.proc)
        return self

    @property
    def pid(self):
        return self.proc.pid

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)
