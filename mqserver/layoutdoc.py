"""Layout tables for the docs, generated from construct schemas.

A document holds each table between a C{<!-- schema: NAME -->} line and a
C{<!-- end schema -->} line; C{NAME} is a key of the C{DOC_SCHEMAS} dict of the module
that owns the format (C{protocols.smss.wire}, ...). This module writes what goes
between the markers: one row per field, with its offset while every field before it
has a fixed size, its size, type, name and the text the schema gives it
(C{"name" / Int32ul * "text"}). Run::

    python -m mqserver.layoutdoc docs/smss.md protocols.smss.wire           # rewrite
    python -m mqserver.layoutdoc --check docs/smss.md protocols.smss.wire   # exit 1 if stale

The module is named on the command line (C{mqserver} imports no protocol itself).
"""

import argparse
import importlib
import re
import sys

from construct import (
    Array,
    BytesInteger,
    Bytes,
    Check,
    Computed,
    Const,
    FixedSized,
    FormatField,
    GreedyBytes,
    GreedyRange,
    Padded,
    Pass,
    Prefixed,
    Rebuild,
    Renamed,
    StringEncoded,
    Struct,
    Tell,
)

__all__ = ["main", "render", "table"]

_BLOCK = re.compile(r"(<!-- schema: (\w+) -->\n)(.*?)(<!-- end schema -->)", re.S)
_HEAD = "| offset | size | type | field | notes |\n|---:|---:|---|---|---|\n"


class _Rows:
    """The rows being written and the running offset (None once a size varies)."""

    def __init__(self, names):
        self.rows = []
        self.offset = 0
        self.names = names

    def add(self, size, kind, name, notes):
        at = "" if self.offset is None else self.offset
        self.rows.append(f"| {at} | {size} | {kind} | {name} | {notes} |")
        if isinstance(size, int) and self.offset is not None:
            self.offset += size
        else:
            self.offset = None


def _int_kind(con):
    if isinstance(con, FormatField):
        code = con.fmtstr[1:]
        return ("i" if code.islower() else "u") + str(con.length * 8)
    return ("i" if con.signed else "u") + str(con.length * 8)


def _expr(expr):
    """A construct expression as the doc shows it: C{this.body_len} -> C{`body_len`};
    one that uses a parse-time position (C{_headers_end}) is just C{n}."""
    text = re.sub(r"this\['(\w+)'\]", r"\1", str(expr))
    if re.search(r"\b_\w", text):
        return "n"
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    return f"`{text}`"


def _unwrap(con, notes):
    """Strip value-only wrappers, noting a constant's value."""
    while True:
        if isinstance(con, Const):
            value = con.value
            notes.append(f"always {value!r}" if isinstance(value, bytes) else f"always {value}")
        elif not isinstance(con, Rebuild):
            return con
        con = con.subcon


def _visit(con, name, docs, rows):
    """Add the rows of one field (C{name} is its dotted name, or None)."""
    notes = [docs] if docs else []
    con = _unwrap(con, notes)
    shown = f"`{name}`" if name else "—"
    text = "; ".join(notes)
    if con is Tell or isinstance(con, (Check, Computed)):
        return
    if isinstance(con, Struct):
        for sub in con.subcons:
            _visit_named(sub, name, rows)
        return
    if isinstance(con, Padded) and con.subcon is Pass:
        rows.add(con.length, "pad", "—", text or "zeros")
    elif isinstance(con, (FormatField, BytesInteger)):
        rows.add(con.length, _int_kind(con), shown, text)
    elif isinstance(con, Bytes):
        size = con.length if isinstance(con.length, int) else _expr(con.length)
        rows.add(size, "bytes", shown, text)
    elif isinstance(con, FixedSized):
        rows.add(_expr(con.length), _item_kind(con.subcon, rows), shown, text)
    elif isinstance(con, StringEncoded):
        lf = con.subcon.lengthfield
        rows.add(f"{lf.sizeof()} + n", f"{_int_kind(lf)} length, {con.encoding} text",
                 shown, text)
    elif isinstance(con, Prefixed) and isinstance(_unwrap(con.subcon, []), Struct):
        rows.add(con.lengthfield.sizeof(), _int_kind(con.lengthfield),
                 f"`{name}.length`" if name else "`length`", text or "bytes after it")
        _visit(con.subcon, name, "", rows)
    elif isinstance(con, Prefixed):
        lf = con.lengthfield
        rows.add(f"{lf.sizeof()} + n", f"{_int_kind(lf)} length, {_item_kind(con.subcon, rows)}",
                 shown, text)
    elif isinstance(con, Array):
        rows.add(f"{_expr(con.count)} x", _item_kind(con.subcon, rows), shown, text)
    elif con is GreedyBytes:
        rows.add("n", "bytes", shown, text or "the rest")
    else:
        raise ValueError(f"no table row for {con!r}")


def _item_kind(con, rows):
    """How a table names the items of an array or the content of a prefixed field."""
    con = _unwrap(con, [])
    if con is GreedyBytes:
        return "bytes"
    for key, schema in rows.names.items():
        if schema is con:
            return f"`{key}`"
    if isinstance(con, Array):
        return f"{_expr(con.count)} x {_item_kind(con.subcon, rows)}"
    if isinstance(con, GreedyRange):
        return f"{_item_kind(con.subcon, rows)}s"
    raise ValueError(f"no table name for {con!r}")


def _visit_named(sub, parent, rows):
    """Visit a subcon of a Struct with its dotted name and its docs."""
    name, docs = None, ""
    while isinstance(sub, Renamed):
        name = name or sub.name
        docs = docs or sub.docs
        sub = sub.subcon
    if name is not None and parent:
        name = f"{parent}.{name}"
    _visit(sub, name, docs, rows)


def table(schema, names=None):
    """Return the markdown table of C{schema}; C{names} (name -> schema) lets a row name
    a schema it holds (an array of C{`MESSAGE_HEADER`}s)."""
    rows = _Rows(names or {})
    _visit(schema, None, "", rows)
    return _HEAD + "\n".join(rows.rows) + "\n"


def render(text, schemas):
    """Return C{text} (a document) with every schema block's table regenerated from
    C{schemas} (name -> construct schema)."""

    def block(m):
        if m.group(2) not in schemas:
            raise KeyError(f"the document names an unknown schema {m.group(2)!r}")
        return m.group(1) + table(schemas[m.group(2)], schemas) + m.group(4)

    return _BLOCK.sub(block, text)


def shown(text):
    """Return the names of the schemas C{text} has a block for."""
    return [m.group(2) for m in _BLOCK.finditer(text)]


def main(argv=None):
    """Rewrite a document's tables, or with C{--check} say whether they are up to date."""
    parser = argparse.ArgumentParser(prog="python -m mqserver.layoutdoc",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the document differs")
    parser.add_argument("path", help="the document, e.g. docs/smss.md")
    parser.add_argument("module", help="the module whose DOC_SCHEMAS it shows")
    args = parser.parse_args(argv)
    schemas = importlib.import_module(args.module).DOC_SCHEMAS
    with open(args.path, encoding="utf-8") as f:
        text = f.read()
    new = render(text, schemas)
    missing = sorted(set(schemas) - set(shown(text)))
    if args.check:
        if new != text or missing:
            print(f"{args.path}: tables differ from {args.module}, or lack {missing}; run "
                  f"python -m mqserver.layoutdoc {args.path} {args.module}", file=sys.stderr)
            return 1
        return 0
    if new != text:
        with open(args.path, "w", encoding="utf-8") as f:
            f.write(new)
    if missing:
        print(f"{args.path}: no block for {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
