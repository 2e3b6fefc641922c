"""Every fenced block of the README and docs/ runs as written, on the ports the docs name.

Each document runs in order in its own working directory, against the broker ``make
run`` starts there (``mqserver run``: the defaults, data in ``./data``) whenever none of
its own is up:

- ``sh`` blocks: statement by statement in one bash per document (variables carry over),
  each statement must exit 0 (``curl`` fails on an HTTP error); a broker command line
  (``mqserver run``, ``make run ARGS=...``, ``.venv/bin/mqserver run``) starts, the next
  statement runs once its ``ready`` line is logged, and it serves until a later block
  starts brokers or the document ends, when SIGTERM stops it with status 0; what a
  statement starts with ``&`` runs until the end of the document;
- ``console`` blocks: each ``$ command`` runs and its output must be the lines shown
  (numbers may differ, lines may come in another order, ``...`` stands for anything);
  ``$ nc HOST PORT`` is a conversation on that socket: the lines the client types are
  sent, the server's lines must come back, and a number the server gave (an id, a
  receipt) is sent back as the server gave it;
- ``python`` blocks run to their end (or, marked ``runs until it prints``, until they
  print that);
- ``yaml`` blocks parse, and broker configurations pass ``mqserver config --check``;
  ``json`` blocks parse; ``text`` blocks are output, layouts and log lines.

The replica-group walk-through runs where etcd is installed (``make test`` installs it).

``mqserver``, ``mqctl``, ``.venv/bin/mqserver`` and ``.venv/bin/mqctl`` are this tree's
(``python -m mqserver.cli``, ``python -m protocols.admin.ctl``), and ``make run
ARGS="X"`` is ``mqserver run X`` (what the Makefile execs; test_cli.py). Blocks marked
``<!-- not run: REASON -->`` are listed with their reasons and not run."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys

import pytest
import yaml

from tests.support.docs import LANGUAGES, documents, fenced
from tests.support.etcd import SKIP_REASON, etcd_binary
from tests.support.server import ROOT, read_log_file
from tests.support.wait import wait_until

#: Every port the README names: the defaults, the slave's smss (12302, also a replica
#: group member's) and admin (9475), the third member's smss and etcd's.
PORTS = (12301, 12302, 12303, 9876, 10911, 4150, 4151, 4160, 4161, 8280, 12300, 9464, 9465,
         9475, 2379, 2380)
STOP_SECONDS = 30

SHIMS = {
    "mqserver": f'exec {sys.executable} -m mqserver.cli "$@"\n',
    "mqctl": f'exec {sys.executable} -m protocols.admin.ctl "$@"\n',
    # `make run ARGS="X"`: the Makefile's recipe, `exec .venv/bin/mqserver run X`
    "make": ('[ "$1" = run ] || { echo "make $1: not run by the docs test" >&2; exit 2; }\n'
             'case "$2" in ARGS=*) args="${2#ARGS=}";; *) args="";; esac\n'
             f'exec {sys.executable} -m mqserver.cli run $args\n'),
    # an HTTP error answer fails the statement, as it would a reader's script with set -e
    "curl": f'exec {shutil.which("curl") or "/usr/bin/curl"} --fail-with-body -sS "$@"\n',
}
_SERVER = re.compile(r"^(?:\S*/)?(?:mqserver run|make run)\b")


def blocks():
    return [b for doc, text in documents().items() for b in fenced(text, doc)]


def test_every_block_is_tagged():
    """Each fenced block says what it is (a block without a language is read as text
    and nothing in it would ever run)."""
    untagged = [(b.where, b.lang) for b in blocks() if b.lang not in LANGUAGES]
    assert untagged == []


def test_blocks_not_run_say_why():
    """The blocks not run, each with its reason (shown with ``-s``); every other block
    runs in test_document_runs."""
    skipped = [b for b in blocks() if b.not_run is not None]
    for b in skipped:
        assert b.not_run.strip(), b.where
        print(f"not run: {b.where} ({b.lang}): {b.not_run}")
    runnable = [b for b in blocks() if b.not_run is None and b.lang != "text"]
    assert len(runnable) > 2 * len(skipped)


# -- matching output -------------------------------------------------------------------

def _pattern(expected):
    """The regular expression of doc line C{expected}: its words, any number where the
    doc has one, anything where it has ``...``; each word with a number a group."""
    words = []
    for word in expected.split():
        if word == "...":
            words.append(".*")
            continue
        piece = ".*?".join(re.sub(r"\d+", r"\\d+", re.escape(p)) for p in word.split("..."))
        words.append(f"({piece})" if re.search(r"\d", word) else piece)
    return re.compile(r"\s+".join(words))


def line_matches(expected, actual, numbers=None):
    """Whether C{actual} is the doc line C{expected}: the same words, any number where the
    doc has one, anything where it has ``...``. Records in C{numbers} each word of the
    doc with a number in it mapped to the server's."""
    m = _pattern(expected).fullmatch(actual.strip())
    if m is None:
        return False
    if numbers is not None:
        numbered = [w for w in expected.split() if w != "..." and re.search(r"\d", w)]
        numbers.update(zip(numbered, m.groups()))
    return True


def lines_match(expected, actual):
    """Whether the lines C{actual} are the doc's C{expected}, in any order."""
    want = [x for x in expected if x.strip()]
    got = [x for x in actual if x.strip()]
    if len(want) != len(got):
        return False
    left = list(got)
    for w in want:
        hit = next((g for g in left if line_matches(w, g)), None)
        if hit is None:
            return False
        left.remove(hit)
    return True


def test_line_matching():
    assert line_matches("OK 7", "OK 12")
    assert not line_matches("OK 7", "ERR 7")
    assert not line_matches("OK 7", "OK 7 8")
    numbers = {}
    assert line_matches("MSG jobs 7 1.7.1 1 5", "MSG jobs 9 2.9.1 1 5", numbers)
    assert numbers == {"7": "9", "1.7.1": "2.9.1", "1": "1", "5": "5"}
    assert not line_matches("MSG jobs 7 1.7.1 1 5", "MSG jobs 9 2.9 1 5")
    assert line_matches("cannot start: ...", "cannot start: anything at all")
    assert line_matches("path .../data cannot", "path /x/y/data cannot")
    assert not line_matches("path .../data cannot", "path /x/y/datum cannot")
    assert lines_match(["m1 leader 1", "m2 follower 1"], ["m1 follower 1", "m2 leader 1"])
    assert not lines_match(["m1 leader 1", "m2 follower 1"], ["m1 leader 1", "m2 leader 1"])


# -- running a document ----------------------------------------------------------------

class Document:
    """One document's working directory, its bash, the brokers it started."""

    def __init__(self, name, cwd):
        self.name = name
        self.cwd = cwd
        bin_dir = cwd / ".venv" / "bin"
        bin_dir.mkdir(parents=True)
        for shim, body in SHIMS.items():
            (bin_dir / shim).write_text("#!/bin/sh\n" + body)
            (bin_dir / shim).chmod(0o755)
        self.env = dict(os.environ, PYTHONPATH=ROOT, PATH=f"{bin_dir}:{os.environ['PATH']}")
        self.servers = []   # (process, log path, what), in the order they started
        self.count = 0
        self.bash = subprocess.Popen(["bash", "--noprofile", "--norc"], cwd=cwd, env=self.env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)

    # the shell

    def sh(self, statement, merge=False):
        """Run C{statement} in the document's bash; return (status, stdout, stderr)."""
        self.count += 1
        out, err = self.cwd / f".out{self.count}", self.cwd / f".err{self.count}"
        redirect = f"> {out} 2>&1" if merge else f"> {out} 2> {err}"
        self.bash.stdin.write(f"{{ {statement}\n}} < /dev/null {redirect}\n"
                              "__st=$?; echo \"__done__ $__st\"; (exit $__st)\n")
        self.bash.stdin.flush()
        while True:
            line = self.bash.stdout.readline()
            assert line, f"bash ended running {statement!r}"
            if line.startswith("__done__ "):
                status = int(line.split()[1])
                break
        return status, out.read_text(), read_log_file(err)

    def has_jobs(self):
        return self.sh("jobs -p")[1].strip() != ""

    # brokers

    def start_server(self, line, what):
        log = self.cwd / f"{what}.log"
        with open(log, "wb") as f:
            proc = subprocess.Popen(["bash", "-c", "exec " + line], cwd=self.cwd, env=self.env,
                                    stdout=f, stderr=subprocess.STDOUT, start_new_session=True)

        def ready():
            text = read_log_file(log)
            assert proc.poll() is None, f"{what} ended:\n{text}"
            return " ready: " in text

        wait_until(ready, 60, f"{what} ready")
        return proc, log, what

    def stop_server(self, server):
        proc, log, what = server
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            status = proc.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            status = proc.wait(10)
        assert status == 0, f"{what} exited with {status} on SIGTERM:\n{read_log_file(log)}"

    def need_broker(self, block):
        """Brokers for C{block}: when it starts its own, every broker up is stopped first
        (they hold the same ports); else make run's broker, unless one an earlier block
        started (or started in the background) still serves."""
        if "mqserver run" in block.body or "make run" in block.body:
            self.stop_servers()
        elif self.servers or self.has_jobs():
            return
        elif not self.servers:
            self.servers.append(self.start_server("mqserver run", "make-run"))

    def stop_servers(self):
        servers, self.servers = self.servers, []
        for server in reversed(servers):   # a slave before its master
            self.stop_server(server)

    def close(self):
        self.stop_servers()
        try:
            os.killpg(self.bash.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        self.bash.stdin.close()
        self.bash.wait(STOP_SECONDS)

        def ports_free():
            return not [p for p in PORTS if _in_use(p)]

        try:
            wait_until(ports_free, STOP_SECONDS, "what the document started to stop")
        finally:
            try:
                os.killpg(self.bash.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    # blocks

    def run(self, block):
        assert block.lang in LANGUAGES, f"{block.where}: a block tagged {block.lang!r}"
        if block.lang == "text" or block.not_run is not None:
            return
        if block.lang in ("sh", "console") and "etcd" in block.body and etcd_binary() is None:
            # the replica-group walk-through needs etcd, which `make test` installs
            print(f"not run: {block.where}: {SKIP_REASON}")
            return
        if block.lang == "json":
            json.loads(block.body)
        elif block.lang == "yaml":
            self.check_yaml(block)
        else:
            self.need_broker(block)
            getattr(self, "run_" + block.lang)(block)

    def check_yaml(self, block):
        parsed = yaml.safe_load(block.body)
        if isinstance(parsed, dict):
            # what `mqserver config --check FILE` runs, in this process: the broker's
            # parsing and checks of a config file (test_cli.py runs the command)
            from mqserver.cli import effective_config
            from mqserver.config import ConfigError

            path = self.cwd / ".checked.yaml"
            path.write_text(block.body)
            try:
                effective_config(["--config", str(path)])
            except ConfigError as e:
                raise AssertionError((block.where, str(e))) from None

    def run_sh(self, block):
        for statement in statements(block.body):
            if _SERVER.match(statement) and not statement.endswith("&"):
                self.servers.append(self.start_server(statement, f"server{block.line}-{len(self.servers)}"))
                continue
            status, out, err = self.sh(statement)
            assert status == 0, (block.where, statement, status, out, err)

    def run_console(self, block):
        lines = block.body.splitlines()
        i = 0
        while i < len(lines):
            assert lines[i].startswith("$ "), (block.where, lines[i])
            command = lines[i][2:]
            j = i + 1
            while j < len(lines) and not lines[j].startswith("$ "):
                j += 1
            expected = lines[i + 1:j]
            if command.startswith("nc "):
                _host, _port = command.split()[1:3]
                converse(_host, int(_port), expected, block.where)
            else:
                def matches():
                    status, out, _ = self.sh(command, merge=True)
                    return lines_match(expected, out.splitlines()) or (status, out)

                result = wait_until(lambda: matches() is True or None, 60,
                                    f"{block.where}: {command} printing what the doc shows")
                assert result, (block.where, command, matches())
            i = j

    def run_python(self, block):
        code = self.cwd / f".snippet{block.line}.py"
        code.write_text(block.body)
        out = self.cwd / f".snippet{block.line}.out"
        with open(out, "wb") as f:
            proc = subprocess.Popen([sys.executable, "-u", str(code)], cwd=self.cwd, env=self.env,
                                    stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            if block.until:
                wait_until(lambda: block.until in read_log_file(out) or proc.poll() is not None,
                           60, f"{block.where} printing {block.until}")
                assert block.until in read_log_file(out), (block.where, read_log_file(out))
            else:
                status = proc.wait(60)
                assert status == 0, (block.where, read_log_file(out))
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def statements(body):
    """The statements of shell C{body}: lines joined until bash finds them complete
    (continuations, loops, here-documents, open quotes), comments dropped."""
    out, pending = [], []
    for line in body.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending.append(line)
        text = "\n".join(pending)
        if text.endswith("\\"):
            continue
        if subprocess.run(["bash", "-n"], input=text, text=True,
                          capture_output=True).returncode == 0:
            out.append(text)
            pending = []
    assert not pending, pending
    return out


def converse(host, port, transcript, where):
    """Hold the conversation of C{transcript} on a socket to C{host}:C{port}: the
    client's lines (those starting with a console command) are sent, the others must be
    the server's next lines."""
    from protocols.console.protocol import HELP

    commands = set(re.findall(r"\b([A-Z]+)\b", HELP.split(":", 1)[1])) - {"FROM", "ID"}
    numbers = {}
    with socket.create_connection((host, port), timeout=60) as s:
        replies = s.makefile("rb")
        for line in transcript:
            if line.split()[0] in commands:
                sent = " ".join(numbers.get(w, w) for w in line.split())
                s.sendall(sent.encode() + b"\n")
            else:
                got = replies.readline().decode().rstrip("\r\n")
                assert line_matches(line, got, numbers), (where, line, got)


def _in_use(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", list(documents()))
def test_document_runs(name, tmp_path):
    """The document's blocks, in order (see the module docstring)."""
    busy = [p for p in PORTS if _in_use(p)]
    if busy:
        pytest.skip(f"the docs' ports {busy} are in use on this host")
    doc_blocks = fenced(documents()[name], name)
    document = Document(name, tmp_path)
    try:
        for block in doc_blocks:
            if block.file is not None:
                (tmp_path / block.file).write_text(block.body)
        for block in doc_blocks:
            document.run(block)
    finally:
        document.close()
