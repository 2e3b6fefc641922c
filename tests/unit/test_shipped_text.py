"""The text the project ships (docs, README, changelog, the code's docstrings and
comments, benchmarks, tests) speaks of the project itself: it names no work item or work
period that produced it, no path outside the repository, and no section of a protocol
description the repository does not carry. A fact's source is named by its public
source instead (e.g. "RocketMQ 4.9.4's Broker2Client", "nsqd 1.3.0's http.go")."""

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: What must not appear, and why.
FORBIDDEN = [
    (r"\bspec(?:ification)?s?\s*§", "a section of a description the repository does not ship"),
    (r"\bspec(?:ification)?(?:'s)?\s+(?:section\s+)?\d", "a section of a description the "
     "repository does not ship"),
    (r"\bspec(?:ification)?\s+sections?\b", "a section of a description the repository "
     "does not ship"),
    (r"\bspecs/", "a file outside the repository"),
    (r"\bshared/", "a file outside the repository"),
    (r"\bseeds/", "a file outside the repository"),
    (r"(?<![\w.])/work/", "a path outside the repository"),
    (r"benchmarks\.md", "a document that no longer exists"),
    (r"\bissues?\s+#?\d", "a work item"),
    (r"\bwaves?\s+\d", "a work period"),
    (r"\bsessions?\s+\d", "a work period"),
    (r"\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|last|previous)"
     r"\s+(?:session|wave)\b", "a work period"),
]
_PATTERN = re.compile("|".join(f"(?:{p})" for p, _ in FORBIDDEN), re.IGNORECASE)

#: Where the shipped text is: top-level files, and trees with the file endings read.
FILES = ["README.md", "CHANGELOG.md", "Makefile", "setup.cfg", "setup.py", "MANIFEST.in"]
TREES = {
    "docs": (".md",),
    "mqserver": (".py", ".c", ".h"),
    "protocols": (".py", ".c", ".h"),
    "spark": (".py", ".md", ".cfg", ".txt"),
    "bench": (".py", ".md"),
    "tests": (".py", ".md"),
    "twisted": (".py",),
    "contrib": (".md", ".py", ".yml", ".yaml", ".json", ".service", ".conf", ".sh"),
}
#: Not shipped text: raw dated benchmark outputs, and this file's own patterns.
SKIP = {os.path.join("bench", "results"), os.path.join("tests", "unit", "test_shipped_text.py")}


def shipped_files():
    out = [f for f in FILES if os.path.exists(os.path.join(ROOT, f))]
    for tree, endings in TREES.items():
        for d, dirs, files in os.walk(os.path.join(ROOT, tree)):
            rel = os.path.relpath(d, ROOT)
            dirs[:] = [x for x in dirs if os.path.join(rel, x) not in SKIP
                       and not x.startswith(".") and x != "__pycache__"]
            out += [os.path.join(rel, f) for f in files
                    if f.endswith(endings) and os.path.join(rel, f) not in SKIP]
    return sorted(out)


def findings(text):
    """The forbidden references in C{text}: (line number, the line) for each."""
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1)
            if _PATTERN.search(line)]


@pytest.mark.parametrize("text", [
    "Frames follow spec §1.2.", "(spec 4.1, 4.2)", "Spec 10.1's hex", "the spec section 15 vectors",
    "see specs/rocketmq-remoting.md", "../shared/vectors", "the seeds/ tree", "cd /work/main",
    "docs/benchmarks.md", "(issue 16.3)", "issue #19.4", "wave 3", "Session 12", "(fourth session)",
])
def test_each_kind_of_reference_is_found(text):
    assert findings(text) == [(1, text)]


@pytest.mark.parametrize("text", [
    "RocketMQ 4.9.4's Broker2Client", "nsqd 1.3.0's http.go", "importlib.util.module_from_spec(spec)",
    "def nsq_buffer(spec):", "an issue a client may hit", "the working directory /data/work/x",
])
def test_ordinary_text_passes(text):
    assert findings(text) == []


def test_shipped_text_names_no_work_items_or_outside_paths():
    files = shipped_files()
    assert os.path.join("docs", "configuration.md") in files and "README.md" in files
    bad = []
    for rel in files:
        with open(os.path.join(ROOT, rel), encoding="utf-8", errors="replace") as f:
            bad += [f"{rel}:{n}: {line}" for n, line in findings(f.read())]
    assert bad == [], "\n".join(bad)
