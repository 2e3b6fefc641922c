"""The README's commands and snippets, run as written against real brokers on the ports
the README names: the master/slave walk-through (its ``slave.yaml``, ``mqctl stats`` on
the slave, the smss ``TOPIC INFO $replication``), the msgout curl sessions (with
docs/msgout.md's), the
``mqserver`` commands with the README's example config; and every Python snippet uses
only names it defines or imports.

``make run ARGS="X"`` runs as ``mqserver run X`` (what the Makefile execs; tested in
test_cli.py), ``.venv/bin/mqserver`` and ``.venv/bin/mqctl`` as this tree's modules."""

import builtins
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import symtable

import pytest

from tests.support.server import ROOT
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(120)
README = os.path.join(ROOT, "README.md")
PORTS = (12301, 12302, 9876, 10911, 4150, 4151, 4160, 4161, 8280, 12300, 9464, 9465, 9475)
MQSERVER = f"{sys.executable} -m mqserver.cli"
MQCTL = f"{sys.executable} -m protocols.admin.ctl"


def readme():
    with open(README) as f:
        return f.read()


def fenced(text):
    """The fenced code blocks of C{text}, in order, as (language, body)."""
    out, lang, body = [], None, []
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            if lang is None:
                lang, body = line[3:].strip(), []
            else:
                out.append((lang, "".join(body)))
                lang = None
        elif lang is not None:
            body.append(line)
    return out


def blocks(lang, text=None):
    """The fenced code blocks of language C{lang} in C{text} (default: the README)."""
    return [body for kind, body in fenced(text or readme()) if kind == lang]


def section(title):
    text = readme()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 4)
    return text[start:end if end >= 0 else None]


def as_run_here(line):
    """A README shell line with the installed commands replaced by this tree's."""
    line = re.sub(r'^make run ARGS="([^"]*)"', rf"{MQSERVER} run \1", line)
    line = line.replace(".venv/bin/mqserver ", f"{MQSERVER} ").replace(".venv/bin/mqctl ",
                                                                         f"{MQCTL} ")
    line = re.sub(r"^mqserver ", f"{MQSERVER} ", line)
    return re.sub(r"^mqctl ", f"{MQCTL} ", line)


def shell_lines(block):
    """The commands of a shell block: comments dropped, continuations joined."""
    text = re.sub(r"\\\n\s*", " ", block)
    out = []
    for line in text.splitlines():
        line = re.sub(r"\s+#[^'\"]*$", "", line).strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


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


def test_mqserver_commands_with_the_readme_config(tmp_path):
    """The quick start's ``mqserver`` commands, with ``config.yaml`` the README's
    example configuration: each runs and succeeds."""
    (example,) = blocks("yaml", section("Configuration"))
    (tmp_path / "config.yaml").write_text(example)
    (commands,) = [b for b in blocks("sh") if "mqserver config --check" in b]
    ran = 0
    for line in shell_lines(commands):
        if not line.startswith("mqserver ") or line.startswith("mqserver run"):
            continue  # mqserver run serves until stopped: the walk-through below runs it
        p = subprocess.run(as_run_here(line), shell=True, cwd=tmp_path, capture_output=True,
                           text=True, timeout=60, env=dict(os.environ, PYTHONPATH=ROOT))
        assert p.returncode == 0, (line, p.stderr)
        ran += 1
    assert ran == 3


def _in_use(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def free_doc_ports():
    busy = [p for p in PORTS if _in_use(p)]
    if busy:
        pytest.skip(f"the README's ports {busy} are in use on this host")


class Started:
    """Brokers a test started from README lines; stopped (SIGTERM) at the end."""

    def __init__(self, cwd):
        self.cwd = cwd
        self.procs = []

    def start(self, line, name):
        log = open(self.cwd / f"{name}.log", "wb")
        proc = subprocess.Popen("exec " + as_run_here(line), shell=True, cwd=self.cwd, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env=dict(os.environ, PYTHONPATH=ROOT))
        log.close()
        self.procs.append(proc)

        def ready():
            assert proc.poll() is None, (self.cwd / f"{name}.log").read_text()
            return " ready: " in (self.cwd / f"{name}.log").read_text()

        wait_until(ready, 60, f"{name} ready")

    def stop(self):
        """SIGTERM each (the slave first); return their exit statuses."""
        codes = []
        for proc in reversed(self.procs):
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                codes.append(proc.wait(30))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                codes.append(proc.wait(10))
        return codes


def run_snippets_against_the_master(tmp_path):
    """The smss snippet runs to its end; the NSQ HTTP publish (``curl -d hello ...``)
    succeeds and the pynsq snippet's handler then receives that message."""
    (smss,) = [b for b in blocks("python") if "SmssClient(" in b]
    p = subprocess.run([sys.executable, "-c", smss], cwd=tmp_path, capture_output=True,
                       text=True, timeout=60, env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.returncode == 0, p.stderr
    (pub,) = re.findall(r"`(curl -d hello '[^']*')`", readme())
    p = subprocess.run(pub, shell=True, capture_output=True, text=True, timeout=60)
    assert (p.returncode, p.stdout) == (0, "OK"), p.stderr
    (pynsq,) = [b for b in blocks("python") if "import nsq" in b]
    out = tmp_path / "pynsq.out"
    with open(out, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-u", "-c", pynsq], cwd=tmp_path, stdout=f,
                                stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "b'hello'" in out.read_text() or proc.poll() is not None, 60,
                   "the pynsq reader's handler printing the message")
        assert "b'hello'" in out.read_text(), out.read_text()
    finally:
        proc.kill()
        proc.wait(10)


def test_master_slave_walk_through_and_msgout_session(tmp_path, free_doc_ports):
    """The README's master (``make run``), its slave (``slave.yaml``), ``mqctl stats``
    on the slave and ``TOPIC INFO $replication``; the smss and pynsq snippets and the NSQ
    HTTP publish against the master; then the msgout curl sessions of the README and of
    docs/msgout.md, each curl succeeding and the ack taking the fetched receipt."""
    if shutil.which("curl") is None:
        pytest.skip("curl not installed")
    walk = section("Master and slave")
    (slave_yaml,) = blocks("yaml", walk)
    (tmp_path / "slave.yaml").write_text(slave_yaml)
    (commands,) = blocks("sh", walk)
    master_line, slave_line, mqctl_line = shell_lines(commands)
    started = Started(tmp_path)
    try:
        started.start(master_line, "master")
        started.start(slave_line, "slave")

        def slave_connected():
            p = subprocess.run(as_run_here(mqctl_line), shell=True, cwd=tmp_path,
                               capture_output=True, text=True, timeout=60,
                               env=dict(os.environ, PYTHONPATH=ROOT))
            assert p.returncode == 0, p.stderr
            return "slave of 127.0.0.1:12301 (connected): applied eventId" in p.stdout

        wait_until(slave_connected, 30, "mqctl stats on the slave shows it connected")
        (call,) = re.findall(r"`(SmssClient\([^`]*\)\.topic_info\(\"\$replication\"\))`", walk)
        from protocols.smss.client import SmssClient

        status = eval(call, {"SmssClient": SmssClient})
        assert status["role"] == "slave" and status["connected"]

        run_snippets_against_the_master(tmp_path)

        with open(os.path.join(ROOT, "docs", "msgout.md")) as f:
            msgout_doc = f.read()
        for where, text in (("README.md", None), ("docs/msgout.md", msgout_doc)):
            (session,) = [b for b in blocks("sh", text) if "/v1/ack" in b]
            script = tmp_path / "msgout.sh"
            script.write_text("set -e\n" + session.replace("curl ", "curl -sSf "))
            p = subprocess.run(["bash", str(script)], cwd=tmp_path, capture_output=True,
                               text=True, timeout=60)
            assert p.returncode == 0, (where, p.stderr)
            assert '"acked":1' in p.stdout, (where, p.stdout)
    finally:
        codes = started.stop()
    assert codes == [0, 0]  # both stopped cleanly


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


def _doc_texts():
    texts = {"README.md": readme()}
    for name in sorted(os.listdir(os.path.join(ROOT, "docs"))):
        if name.endswith(".md") and name != "configuration.md":
            with open(os.path.join(ROOT, "docs", name)) as f:
                texts[f"docs/{name}"] = f.read()
    return texts


def run_commands():
    """Every broker command line the README and docs/ give (in code blocks and inline
    code): ``mqserver run ...``, ``.venv/bin/mqserver run ...``, ``make run ARGS="..."``;
    as (document, the options after ``run``)."""
    found = []
    for where, text in _doc_texts().items():
        code = "".join(body for kind, body in fenced(text) if kind in ("", "sh", "bash"))
        lines = shell_lines(code) + re.findall(r"`((?:make run ARGS=|mqserver run )[^`]*)`",
                                                text)
        for line in lines:
            m = re.match(r'(?:\S*/)?(?:mqserver run|make run ARGS=")(.*?)"?$', line)
            if m and m.group(1).strip() not in ("", "ARGS"):
                found.append((where, re.sub(r"\[(--config [^]]*)\]", r"\1",
                                            m.group(1).strip())))
    return found


def test_every_documented_broker_command_line_is_accepted(tmp_path):
    """Each ``mqserver run`` / ``make run ARGS=`` line of the README and docs/ has options
    the broker accepts: ``mqserver config`` with the same options succeeds (in a directory
    holding the README's ``config.yaml`` and ``slave.yaml``; an optional ``[--event N]``
    given as ``--event 0``)."""
    (example,) = blocks("yaml", section("Configuration"))
    (tmp_path / "config.yaml").write_text(example)
    (slave,) = blocks("yaml", section("Master and slave"))
    (tmp_path / "slave.yaml").write_text(slave)
    commands = run_commands()
    assert len(commands) >= 8, commands
    for where, options in commands:
        options = options.replace("[--event N]", "--event 0")
        p = subprocess.run(f"{MQSERVER} config {options}", shell=True, cwd=tmp_path,
                           capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, PYTHONPATH=ROOT))
        assert p.returncode == 0, (where, options, p.stderr)
