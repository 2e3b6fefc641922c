#!/usr/bin/env python
"""What statistics and metrics cost the publish path: this tree against a base revision.

The base (default ``main``) is checked out in a temporary git worktree; the C speedups
are copied from this tree when the base's C sources are the same (else it runs
``setup.py build_ext --inplace`` there). Then ``bench/request_cost.py`` runs in each tree
in turn, A B A B ..., and this prints, per request (smss PUB, NSQ PUB), the range and
median of the broker's CPU µs per round trip in each tree, the change of the medians,
and the Python bytecodes per round trip (a count that does not move with the load).

The figures are noisy on a shared machine: read the ranges, not one run. Asserts nothing.

    python bench/stats_cost.py [--base main] [--rounds 4] [--requests 20000]
"""

import argparse
import glob
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LINE = re.compile(r"^(smss PUB|nsq PUB)\s+([\d.]+)\s+([\d.]+)", re.M)
_OPS = re.compile(r"^(smss PUB|nsq PUB).*\n\s+(\d+) bytecodes per round trip", re.M)


def git(*args, cwd=ROOT):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout


def prepare_base(rev, where):
    """Check out C{rev} at C{where} with its C speedups built."""
    git("worktree", "add", "--detach", where, rev)
    same_c = not git("diff", "--name-only", rev, "--", "*.c", "*.h").strip()
    if same_c:
        for so in glob.glob(os.path.join(ROOT, "mqserver", "**", "*.so"), recursive=True) + \
                glob.glob(os.path.join(ROOT, "protocols", "**", "*.so"), recursive=True):
            dest = os.path.join(where, os.path.relpath(so, ROOT))
            shutil.copy2(so, dest)
    else:
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=where,
                       check=True, capture_output=True)


def run(tree, requests, opcodes):
    out = subprocess.run(
        [sys.executable, os.path.join(tree, "bench", "request_cost.py"), "--requests",
         str(requests), "--repeat", "3", "--opcodes", str(opcodes)],
        cwd=tree, env=dict(os.environ, PYTHONPATH=tree), check=True, capture_output=True,
        text=True).stdout
    cpu = {name: float(c) for name, c, _ in _LINE.findall(out)}
    ops = {name: int(n) for name, n in _OPS.findall(out)}
    return cpu, ops


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default="main", help="revision to compare with")
    p.add_argument("--rounds", type=int, default=4, help="A/B pairs")
    p.add_argument("--requests", type=int, default=20000, help="round trips per run")
    p.add_argument("--opcodes", type=int, default=300, help="round trips traced for bytecodes")
    args = p.parse_args()
    where = tempfile.mkdtemp(prefix="mq-base-")
    os.rmdir(where)
    prepare_base(args.base, where)
    try:
        results = {"base": [], "this": []}
        ops = {}
        for i in range(args.rounds):
            for label, tree in (("base", where), ("this", ROOT)):
                cpu, o = run(tree, args.requests, args.opcodes)
                results[label].append(cpu)
                ops[label] = o
                figures = "  ".join(f"{k} {v:.2f} µs" for k, v in cpu.items())
                print(f"round {i + 1} {label}: {figures}",
                      flush=True)
        print(f"\nbroker CPU µs per round trip, {args.rounds} runs each (best of 3 inside a run);"
              " the machine may be shared")
        for name in ("smss PUB", "nsq PUB"):
            b = [r[name] for r in results["base"]]
            t = [r[name] for r in results["this"]]
            mb, mt = statistics.median(b), statistics.median(t)
            print(f"{name}: base {min(b):.2f}-{max(b):.2f} (median {mb:.2f}), this {min(t):.2f}-"
                  f"{max(t):.2f} (median {mt:.2f}), change of medians {100 * (mt - mb) / mb:+.1f}%;"
                  f" bytecodes {ops['base'].get(name)} -> {ops['this'].get(name)}")
    finally:
        git("worktree", "remove", "--force", where)


if __name__ == "__main__":
    main()
