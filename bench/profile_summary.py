#!/usr/bin/env python
"""Summarise a py-spy ``--format raw`` profile (collapsed stacks) by function.

    python bench/profile_summary.py /tmp/prof/publish-1.txt [--top 25] [--lines]

Prints, for the busiest functions, the share of samples in which the function was on
the stack (inclusive) and at the top of the stack (self), as ``file:function``. With
``--lines`` frames keep their line number. py-spy leaves idle threads out unless run
with --idle, so 100% is the time the server's Python threads were busy.
"""

import argparse
import collections
import re
import sys

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^():]+)(?::(?P<line>\d+))?\)$")


def frame_key(frame, lines):
    m = _FRAME.match(frame)
    if not m:
        return frame
    path = m["file"]
    for marker in ("site-packages/", "lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
    key = f"{path}:{m['func']}"
    if lines and m["line"]:
        key += f":{m['line']}"
    return key


def load(path, lines=False):
    total = 0
    incl = collections.Counter()
    self_ = collections.Counter()
    threads = collections.Counter()
    with open(path) as f:
        for raw in f:
            raw = raw.rstrip("\n")
            if not raw:
                continue
            stack, _, count = raw.rpartition(" ")
            n = int(count)
            frames = stack.split(";")
            thread = frames[0] if frames[0].startswith("thread") else ""
            if thread:
                frames = frames[1:]
                threads[re.sub(r"\(\d+\)", "", thread).strip()] += n
            keys = [frame_key(fr, lines) for fr in frames]
            total += n
            for k in set(keys):
                incl[k] += n
            if keys:
                self_[keys[-1]] += n
    return total, incl, self_, threads


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("profile")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--lines", action="store_true", help="keep line numbers")
    p.add_argument("--min-incl", type=float, default=0.0,
                   help="inclusive list: hide functions below this percent")
    a = p.parse_args(argv)
    total, incl, self_, threads = load(a.profile, a.lines)
    if not total:
        sys.exit("no samples")
    print(f"{a.profile}: {total} samples")
    for t, n in threads.most_common():
        print(f"  {100 * n / total:5.1f}%  {t}")
    print(f"\nself (top of stack), top {a.top}:")
    for k, n in self_.most_common(a.top):
        print(f"  {100 * n / total:5.1f}%  {k}")
    print(f"\ninclusive (on the stack), top {a.top}:")
    shown = 0
    for k, n in incl.most_common():
        pct = 100 * n / total
        if pct < a.min_incl or shown >= a.top:
            break
        print(f"  {pct:5.1f}%  {k}")
        shown += 1


if __name__ == "__main__":
    main()
