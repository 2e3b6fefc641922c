"""A short run of the fault harness (bench/chaos.py): a real etcd and a group of three,
producers on smss, NSQ and RocketMQ, and one fault of each kind but the partition (which
needs root and network namespaces: `python bench/chaos.py --netns`)."""

import importlib
import os
import sys

import pytest

from tests.support.etcd import SKIP_REASON, etcd_binary
from tests.support.server import ROOT

pytestmark = pytest.mark.timeout(420)

#: one of each, in an order that has a leader killed first and a disk full last
SEQUENCE = ("kill", "pause", "etcd", "wipe", "diskfull")


def load_harness():
    """Import bench/chaos.py as its scripts are run: bench/ first on the import path
    (for its C{harness} module), for the import only."""
    bench = os.path.join(ROOT, "bench")
    sys.path.insert(0, bench)
    try:
        return importlib.import_module("chaos")
    finally:
        sys.path.remove(bench)


def test_a_short_fault_run_loses_nothing(capsys):
    """Every acknowledged message survives one fault of each kind, no eventId names two
    messages, every member's log ends equal to the leader's, and no consumer receives a
    message never sent."""
    if etcd_binary() is None:
        pytest.skip(SKIP_REASON)
    chaos = load_harness().chaos

    # the harness's report goes to the captured output: pytest shows it on a failure
    results = chaos(out=sys.stdout, runs=1, faults=len(SEQUENCE), seed=36, lease_ms=2000,
                    sequence=SEQUENCE)
    report = capsys.readouterr().out
    assert results.problems == [], report
    assert [kind for _, kind, _ in results.faults] == list(SEQUENCE), report
    assert results.acknowledged > 0, report
