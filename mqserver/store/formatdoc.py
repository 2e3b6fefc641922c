"""The layout tables of C{docs/storage-format.md}, generated from the format's schemas.

Each table in the document sits between a C{<!-- schema: NAME -->} line and a
C{<!-- end schema -->} line, where C{NAME} is one of L{SCHEMAS} (a construct schema of
L{mqserver.store.format}); this module writes what goes between them. Run::

    python -m mqserver.store.formatdoc            # rewrite the tables in place
    python -m mqserver.store.formatdoc --check    # exit 1 when the document differs

C{tests/unit/test_store_format.py} fails when the document and the schemas differ.
"""

import argparse
import os
import re
import sys

from construct import Array, Bytes, FormatField, Prefixed, StringEncoded

from mqserver.store import format as fmt
from mqserver.store.layout import field_docs, unwrap

__all__ = ["SCHEMAS", "DOC", "render", "table", "main"]

#: The schemas the document shows, by the name it gives them.
SCHEMAS = {
    name: getattr(fmt, name)
    for name in ("RECORD", "HOST_SCHEMA", "BLANK_SCHEMA", "CQ_ENTRY_SCHEMA", "DELAY_BODY", "DELAYED_MESSAGE",
                 "INDEX_HEADER_SCHEMA", "INDEX_SLOT_SCHEMA", "INDEX_ENTRY_SCHEMA")
}
#: The document, relative to the project's root.
DOC = os.path.join("docs", "storage-format.md")

_TYPES = {"b": "i8", "B": "u8", "h": "i16", "H": "u16", "i": "i32", "l": "i32",
          "I": "u32", "L": "u32", "q": "i64", "Q": "u64"}
_BLOCK = re.compile(r"(<!-- schema: (\w+) -->\n)(.*?)(<!-- end schema -->)", re.S)


def _int_type(subcon):
    return _TYPES[unwrap(subcon).fmtstr[1:]]


def _length_name(expr):
    # construct prints this.name as this['name']
    m = re.fullmatch(r"this\['(\w+)'\]", str(expr))
    return f"`{m.group(1) if m else expr}`"


def _describe(inner):
    """Return (size, type) of one field, or (size None, ...) when its size is not fixed."""
    u = unwrap(inner)
    if isinstance(u, FormatField):
        return u.sizeof(), _int_type(u)
    if isinstance(u, Bytes):
        if isinstance(u.length, int):
            return u.length, "bytes"
        return None, (_length_name(u.length), "bytes")
    if isinstance(u, StringEncoded):
        lf = u.subcon.lengthfield
        return None, (f"{lf.sizeof()} + n", f"{_int_type(lf)} length, {u.encoding} text")
    if isinstance(u, Prefixed):
        lf = u.lengthfield
        return None, (f"{lf.sizeof()} + n", f"{_int_type(lf)} length, bytes")
    if isinstance(u, Array):
        names = [n for n, s in SCHEMAS.items() if s is u.subcon]
        item = f"`{names[0]}`" if names else repr(u.subcon)
        return None, (f"{_length_name(u.count)} x", item)
    raise ValueError(f"no table row for {u!r}")


def table(schema):
    """Return the markdown table of C{schema}: one row per field, with its offset (while
    every field before it has a fixed size), size, type, name and the schema's text."""
    rows = ["| offset | size | type | field | notes |", "|---:|---:|---|---|---|"]
    offset = 0
    for sc in schema.subcons:
        name, docs, inner = field_docs(sc)
        size, kind = _describe(inner)
        if size is None:
            (size, kind), at = kind, ""
            offset = None
        else:
            at = "" if offset is None else offset
            if offset is not None:
                offset += size
        rows.append(f"| {at} | {size} | {kind} | `{name}` | {docs} |")
    return "\n".join(rows) + "\n"


def render(text):
    """Return C{text} (the document) with every schema block's table regenerated."""
    def block(m):
        if m.group(2) not in SCHEMAS:
            raise KeyError(f"the document names an unknown schema {m.group(2)!r}")
        return m.group(1) + table(SCHEMAS[m.group(2)]) + m.group(4)
    return _BLOCK.sub(block, text)


def shown(text):
    """Return the names of the schemas C{text} has a block for."""
    return [m.group(2) for m in _BLOCK.finditer(text)]


def main(argv=None):
    """Rewrite the document's tables, or with C{--check} say whether it is up to date."""
    parser = argparse.ArgumentParser(prog="python -m mqserver.store.formatdoc",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the document differs")
    parser.add_argument("path", nargs="?", default=DOC, help=f"the document (default {DOC})")
    args = parser.parse_args(argv)
    with open(args.path, encoding="utf-8") as f:
        text = f.read()
    new = render(text)
    missing = sorted(set(SCHEMAS) - set(shown(text)))
    if args.check:
        if new != text or missing:
            print(f"{args.path}: tables differ from the schemas, or lack {missing}; "
                  "run python -m mqserver.store.formatdoc", file=sys.stderr)
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
