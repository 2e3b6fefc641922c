#!/usr/bin/env python
"""What the broker does per message in a steady row of bench/compare.py, counted by the
kernel: one run of "rocketmq steady" or "nsq steady" (a paced producer, one consumer
attached) with ``perf stat`` on the broker process.

Prints the row's CPU per message (as compare.py measures it, but with perf attached,
which adds some), its split into user and system time (from /proc, tick-sampled: a
guide only), and per message: context switches, page faults, and the system calls a
request and its answer make (epoll_wait, recvfrom, sendto, pwrite64, pread64,
sched_yield, futex). Needs ``perf`` with tracepoint access (root, or
kernel.perf_event_paranoid <= -1); without it only the CPU figures are printed.
Asserts nothing.

    PYTHONPATH=. .venv/bin/python bench/steady_perf.py [--proto rocketmq|nsq]
        [--rate 2000] [--seconds 5] [--tree PATH] [--set KEY=VALUE ...]
"""

import argparse
import os
import shutil
import signal
import subprocess
import tempfile
import types

import harness  # the source tree on the import path

import compare
import compare_rocketmq as crm
from procstat import user_system_seconds

#: What perf counts: the software events, then each system call of the request path.
EVENTS = ["context-switches", "page-faults"] + [
    f"syscalls:sys_enter_{name}" for name in (
        "epoll_wait", "recvfrom", "sendto", "pwrite64", "pread64", "sched_yield", "futex")]


def perf_counts(text):
    """{event: count} from ``perf stat -x ,`` output."""
    counts = {}
    for line in text.splitlines():
        f = line.split(",")
        if len(f) > 2 and f[0].replace(".", "", 1).isdigit():
            counts[f[2]] = float(f[0])
    return counts


def run(a):
    over = compare.settings(a.set)
    tmp = tempfile.mkdtemp(prefix="mq-steadyperf-")
    opts = types.SimpleNamespace(steady_seconds=a.seconds, steady_per_write=1)
    m = compare.Mq("mqserver", tmp, over, tree=os.path.abspath(a.tree),
                   rocket=a.proto == "rocketmq").start()
    perf = None
    try:
        if shutil.which("perf"):
            perf = subprocess.Popen(["perf", "stat", "-x", ",", "-e", ",".join(EVENTS),
                                     "-p", str(m.pid)], stderr=subprocess.PIPE, text=True)
        u0 = user_system_seconds(m.pid)
        if a.proto == "rocketmq":
            r = crm.steady(m, opts, a.rate, compare._rmq_paced(opts))
        else:
            r = compare.steady(m, opts, a.proto, a.rate)
        u1 = user_system_seconds(m.pid)
        report = ""
        if perf is not None:
            perf.send_signal(signal.SIGINT)
            report = perf.communicate(timeout=30)[1]
    finally:
        if perf is not None and perf.poll() is None:
            perf.kill()
        m.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    sent = r["rate"] * a.seconds
    print(f"{a.proto} steady {a.rate}/s + consumer: {r['cpu_us']:.1f} µs of broker CPU per"
          f" message ({r['note']}); user {1e6 * (u1[0] - u0[0]) / sent:.0f},"
          f" system {1e6 * (u1[1] - u0[1]) / sent:.0f}")
    counts = perf_counts(report)
    if not counts:
        print("  (no perf counts: perf missing or not allowed; see the docstring)")
    for event in EVENTS:
        if event in counts:
            print(f"  {event.replace('syscalls:sys_enter_', ''):18s} {counts[event] / sent:6.2f}"
                  " per message")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--proto", choices=["rocketmq", "nsq"], default="rocketmq")
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--tree", default=harness.ROOT,
                    help="the source tree the broker runs from (default: this one)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config setting (e.g. server.spinMicros=0); repeatable")
    run(ap.parse_args())


if __name__ == "__main__":
    main()
