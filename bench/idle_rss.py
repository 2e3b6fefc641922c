#!/usr/bin/env python
"""The idle broker's resident size, and what makes it, for one or more source trees.

Starts ``twistd -n mqserver`` from each tree in turn (A B A B, ``--rounds`` times) with
an empty store and the front doors of ``--doors`` on loopback, waits until it listens
and then ``--wait`` seconds, and prints VmRSS with its anonymous and file-backed parts.
``--maps N`` also prints the N mappings holding the most resident memory (shared
libraries such as the TLS stack show here), from the last run of each tree.

    PYTHONPATH=. .venv/bin/python bench/idle_rss.py [--tree ../main --tree .]
        [--rounds 3] [--doors smss,nsqd_tcp] [--maps 8]

Every tree runs with this interpreter (its C extensions must be built in place).
"""

import argparse
import os
import shutil
import statistics
import tempfile
import time

from harness import ROOT, ServerProcess


def status(pid):
    """VmRSS, RssAnon, RssFile of C{pid} in MiB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = int(line.split()[1]) / 1024
    return out


def mappings(pid, top):
    """The C{top} mappings of C{pid} by resident KiB: [(kib, name)]."""
    sizes, name = {}, ""
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and not head[0].endswith(":"):
                name = head[5] if len(head) > 5 else "[anonymous]"
            elif head[0] == "Rss:":
                sizes[name] = sizes.get(name, 0) + int(head[1])
    return sorted(((k, n) for n, k in sizes.items()), reverse=True)[:top]


def one(tree, doors, wait, tmp):
    data = os.path.join(tmp, f"idle-{time.monotonic_ns()}")
    server = ServerProcess(data, config={"store": {"flushLevel": 1}}, root=tree,
                           listen={d: "tcp:0:interface=127.0.0.1" for d in doors})
    server.start(timeout=60)
    try:
        time.sleep(wait)
        return status(server.proc.pid), mappings(server.proc.pid, 40)
    finally:
        server.stop(timeout=30)
        server.close()
        shutil.rmtree(data, ignore_errors=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree", action="append", help="source tree (repeatable; default: this one)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--doors", default="smss,nsqd_tcp")
    ap.add_argument("--wait", type=float, default=2.0)
    ap.add_argument("--maps", type=int, default=0)
    a = ap.parse_args(argv)
    trees = [os.path.abspath(t) for t in (a.tree or [ROOT])]
    doors = [d for d in a.doors.split(",") if d]
    tmp = tempfile.mkdtemp(prefix="idle-rss-")
    runs = {t: [] for t in trees}
    maps = {}
    try:
        for r in range(a.rounds):
            for t in trees:
                st, maps[t] = one(t, doors, a.wait, tmp)
                runs[t].append(st)
                print(f"round {r + 1} {t}: VmRSS {st['VmRSS']:.1f} MiB (anon "
                      f"{st['RssAnon']:.1f}, file {st['RssFile']:.1f})", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nidle RSS, doors {','.join(doors)}, median of {a.rounds} (MiB):")
    for t in trees:
        med = {k: statistics.median(s[k] for s in runs[t]) for k in ("VmRSS", "RssAnon", "RssFile")}
        rng = [s["VmRSS"] for s in runs[t]]
        print(f"  {t}: {med['VmRSS']:.1f} (runs {min(rng):.1f}-{max(rng):.1f}; anon "
              f"{med['RssAnon']:.1f}, file {med['RssFile']:.1f})")
        for kib, name in maps[t][:a.maps]:
            print(f"      {kib / 1024:6.1f} MiB  {name}")


if __name__ == "__main__":
    main()
