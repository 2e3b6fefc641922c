"""The fenced code blocks of the README and docs/, as the docs tests read them.

A block is marked by an HTML comment on the line before its fence:

- ``<!-- not run: REASON -->``: the test does not run it, and lists it with REASON;
- ``<!-- file: NAME -->``: the block is the file NAME, written into the working
  directory of its document before any of the document's blocks run;
- ``<!-- runs until it prints: TEXT -->``: a Python snippet that serves until stopped
  runs until its output holds TEXT.
"""

import os
import re
from dataclasses import dataclass

from tests.support.server import ROOT

#: The languages a fenced block may be tagged with: runnable (sh, console, python),
#: checked (yaml, json) or text (output, layouts, log lines: nothing to run).
LANGUAGES = ("sh", "console", "python", "yaml", "json", "text")

_MARK = re.compile(r"<!--\s*(not run|file|runs until it prints):\s*(.*?)\s*-->\s*$")


@dataclass
class Block:
    doc: str
    line: int
    lang: str
    body: str
    not_run: str = None
    file: str = None
    until: str = None

    @property
    def where(self):
        return f"{self.doc}:{self.line}"


def fenced(text, doc="<text>"):
    """The fenced code blocks of markdown C{text}, in order, as L{Block}s."""
    out, block, body, previous = [], None, [], ""
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        if line.startswith("```"):
            if block is None:
                block, body = Block(doc, number, line[3:].strip(), ""), []
                mark = _MARK.search(previous)
                if mark:
                    key = {"not run": "not_run", "file": "file",
                           "runs until it prints": "until"}[mark.group(1)]
                    setattr(block, key, mark.group(2))
            else:
                block.body = "".join(body)
                out.append(block)
                block, previous = None, line
        elif block is not None:
            body.append(line)
        elif line.strip():
            previous = line
    return out


def documents():
    """The README and docs/*.md, as {name: text}, in reading order."""
    texts = {}
    for name in ["README.md"] + sorted("docs/" + n for n in os.listdir(os.path.join(ROOT, "docs"))
                                       if n.endswith(".md")):
        with open(os.path.join(ROOT, name)) as f:
            texts[name] = f.read()
    return texts


def shell_lines(block):
    """The commands of a shell block: comments dropped, continuations joined."""
    text = re.sub(r"\\\n\s*", " ", block)
    out = []
    for line in text.splitlines():
        line = re.sub(r"\s+#[^'\"]*$", "", line).strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out
