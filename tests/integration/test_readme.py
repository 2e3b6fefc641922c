"""What test_docs.py's run of every block leaves out: every Python snippet of the README
uses only names it defines or imports (also in code that runs only later, as a
handler), every broker command line of the README and docs/, in blocks or inline, has
options the broker accepts, and docs/security.md's table of each door's authentication
names real doors and config keys."""

import builtins
import os
import re
import shlex
import symtable

import pytest

from tests.support.docs import documents, fenced, shell_lines
from tests.support.server import ROOT

pytestmark = pytest.mark.timeout(120)
README = os.path.join(ROOT, "README.md")


def readme():
    with open(README) as f:
        return f.read()


def blocks(lang, text=None):
    """The fenced code blocks of language C{lang} in C{text} (default: the README)."""
    return [b.body for b in fenced(text or readme()) if b.lang == lang]


def section(title):
    text = readme()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 4)
    return text[start:end if end >= 0 else None]


def undefined_names(code):
    """Names C{code} reads that nothing in it defines or imports, nor builtins."""
    top = symtable.symtable(code, "<snippet>", "exec")
    defined = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    missing = set()

    def walk(table):
        for s in table.get_symbols():
            name = s.get_name()
            if s.is_referenced() and (table is top or s.is_global()) and not s.is_local():
                if name not in defined and not hasattr(builtins, name):
                    missing.add(name)
            elif table is top and s.is_referenced() and name not in defined \
                    and not hasattr(builtins, name):
                missing.add(name)
        for child in table.get_children():
            walk(child)

    walk(top)
    return missing


def test_undefined_names_are_found():
    assert undefined_names("r = f(handle)\n") == {"f", "handle"}
    assert undefined_names("def h(m):\n    return m + g\nx = h(1)\n") == {"g"}
    assert undefined_names("import os\ndef h(m):\n    return os.sep + m\nh('a')\n") == set()


def test_python_snippets_define_every_name_they_use():
    snippets = blocks("python")
    assert len(snippets) >= 3
    for code in snippets:
        assert undefined_names(code) == set(), code


def test_security_table_covers_every_door_with_real_keys():
    """docs/security.md's table states each door's authentication, and what turns it on
    is a config key the broker has."""
    from mqserver.config import CORE, door_keysets
    from mqserver.frontdoor import front_doors

    with open(os.path.join(ROOT, "docs", "security.md")) as f:
        text = f.read()
    start = text.index("## Authentication of each door")
    rows = [r for r in text[start:text.index("\n## ", start + 4)].splitlines()
            if r.startswith("| ") and not r.startswith("| door")]
    doors = {d for r in rows for d in re.findall(r"\(`([a-z_]+)`", r.split("|")[1])}
    doors |= {d for r in rows for d in re.findall(r"`([a-z_]+)`", r.split("|")[1])}
    assert set(front_doors()) <= doors, set(front_doors()) - doors
    keys = set(CORE.keys)
    for keyset in door_keysets(front_doors()):
        keys |= set(keyset.keys)
    named = {k for r in rows for k in re.findall(r"`([a-zA-Z]+\.[a-zA-Z.]+)`", r.split("|")[3])}
    assert named and named <= keys, named - keys
    assert "admin.token" in named


def run_commands():
    """Every broker command line the README and docs/ give (in code blocks and inline
    code): ``mqserver run ...``, ``.venv/bin/mqserver run ...``, ``make run ARGS="..."``;
    as (document, the options after ``run``)."""
    found = []
    for where, text in documents().items():
        code = "".join(b.body for b in fenced(text) if b.lang == "sh")
        lines = shell_lines(code) + re.findall(r"`((?:make run ARGS=|mqserver run )[^`]*)`",
                                                text)
        for line in lines:
            m = re.match(r'(?:\S*/)?(?:mqserver run|make run ARGS=")(.*?)"?$', line)
            if m and m.group(1).strip() not in ("", "ARGS"):
                found.append((where, re.sub(r"\[(--config [^]]*)\]", r"\1",
                                            m.group(1).strip())))
    return found


def test_every_documented_broker_command_line_is_accepted(tmp_path, monkeypatch):
    """Each ``mqserver run`` / ``make run ARGS=`` line of the README and docs/ has options
    the broker accepts: the parsing and checks of ``mqserver run`` and ``mqserver
    config`` (L{mqserver.cli.effective_config}) take them (in a directory holding the
    README's ``config.yaml`` and ``slave.yaml``; an optional ``[--event N]`` given as
    ``--event 0``)."""
    from mqserver.cli import effective_config
    from mqserver.config import ConfigError

    (example,) = blocks("yaml", section("Configuration"))
    (tmp_path / "config.yaml").write_text(example)
    (slave,) = blocks("yaml", section("Master and slave"))
    (tmp_path / "slave.yaml").write_text(slave)
    monkeypatch.chdir(tmp_path)
    commands = run_commands()
    assert len(commands) >= 8, commands
    for where, options in commands:
        options = options.replace("[--event N]", "--event 0")
        try:
            effective_config(shlex.split(options))
        except ConfigError as e:
            raise AssertionError((where, options, str(e))) from None
