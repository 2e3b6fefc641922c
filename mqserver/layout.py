"""Fixed byte layouts derived from construct schemas, once, at import time.

A wire or file format is written once, as a ``construct`` schema. Hot paths cannot
afford construct's per-call cost, so the modules that own a format call L{layout} on
its schema at import and use what it derives: a precompiled C{struct.Struct}, the
offset and size of every field (for C speedups' C{configure()} calls and for
single-field reads), and the rows of the layout tables in the docs.

Only fixed-size fields are understood: integers (C{Int8ul} ... C{Int64sb}, and
C{Int24ub}-style widths, see below), C{Bytes(n)}, C{Padding(n)}, and C{Const},
C{Rebuild} or a nested C{Struct} around them, and the length field of C{Prefixed} or
C{PascalString} (named C{"<field>.length"}, or C{"length"} for a prefixed schema). Any
field of no fixed size (C{Switch}, C{GreedyBytes}, C{Bytes(this.x)}, ...) raises
L{LayoutError}, or with C{prefix=True} ends the layout: the fixed head of a
variable-length record.

An integer whose width C{struct} has no code for (the remoting frame's 24-bit header
length) is packed with the fields before it into one word of 2, 4 or 8 bytes: the
struct then yields the word, and L{Layout.bits} tells where in it each field sits.

This module imports only the standard library and construct.
"""

import struct
from dataclasses import dataclass, field

from construct import (
    BytesInteger,
    Bytes,
    Const,
    FormatField,
    Padded,
    Pass,
    Prefixed,
    Rebuild,
    Renamed,
    StringEncoded,
    Struct,
)

__all__ = ["Field", "Layout", "LayoutError", "layout"]

_INT_CODES = {1: "b", 2: "h", 4: "i", 8: "q"}


class LayoutError(ValueError):
    """The schema has a field L{layout} cannot place at a fixed offset."""


@dataclass(frozen=True)
class Field:
    """One field of a fixed layout.

    @ivar name: dotted path (C{"args.payload_len"} for a field of a nested struct);
        None for padding.
    @ivar offset: byte offset from the start of the schema.
    @ivar size: width in bytes.
    @ivar kind: C{"u8"}, C{"i64"}, C{"u24"}..., C{"bytes"}, or C{"pad"}.
    @ivar value: the constant of a C{Const} field, else None.
    """

    name: object
    offset: int
    size: int
    kind: str
    value: object = None


@dataclass
class Layout:
    """What L{layout} derives from one schema.

    @ivar fields: every L{Field} in order, padding included.
    @ivar format: the C{struct} format string (with byte order) of the whole layout.
    @ivar struct: C{struct.Struct(format)}.
    @ivar names: the name of each value C{struct} packs or unpacks, in order; a packed
        word is named by its fields joined with C{"|"}.
    @ivar bits: for fields packed into a word, name -> (shift, mask) within that word.
    @ivar order: C{"<"} or C{">"}.
    """

    fields: list
    format: str
    struct: struct.Struct
    names: tuple
    order: str
    bits: dict = field(default_factory=dict)

    @property
    def size(self):
        """The size in bytes of the layout."""
        return self.struct.size

    def offset(self, name):
        """Return the byte offset of field C{name}."""
        return self._field(name).offset

    def field_size(self, name):
        """Return the width in bytes of field C{name}."""
        return self._field(name).size

    def field_struct(self, name):
        """Return a C{struct.Struct} of field C{name} alone (to read or write it at its
        offset with C{unpack_from}/C{pack_into})."""
        return struct.Struct(self.order + _code(self._field(name)))

    def _field(self, name):
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def select(self, *names):
        """Return a C{struct.Struct} of the named fields (in layout order) that starts
        where the layout starts and ends where the last named field ends, skipping
        the other bytes in between with pad bytes."""
        wanted = set(names)
        missing = wanted - {f.name for f in self.fields}
        if missing:
            raise KeyError(sorted(missing))
        last = max(i for i, f in enumerate(self.fields) if f.name in wanted)
        parts = [
            _code(f) if f.name in wanted else "%dx" % f.size
            for f in self.fields[: last + 1]
        ]
        return struct.Struct(self.order + "".join(parts))


def layout(schema, prefix=False):
    """Derive the L{Layout} of C{schema}, a construct C{Struct} of fixed-size fields.

    With C{prefix=True} the layout stops at the first field that has no fixed size
    (the fixed head of a record); otherwise such a field raises L{LayoutError}.
    """
    order, fields = [], []
    try:
        _visit(schema, "", 0, order, fields)
    except _Stop:
        if not prefix:
            raise LayoutError("the schema has a field of no fixed size") from None
    if not fields:
        raise LayoutError("no fixed-size field at the start of the schema")
    return _assemble(fields, order[0] if order else ">")


class _Stop(Exception):
    """Raised inside the walk at the first field of no fixed size."""


def _visit(con, name, offset, order, out):
    """Append the fields of C{con} (named C{name}) at C{offset}; return the new offset."""
    if isinstance(con, Renamed):
        # A Struct has already named its field (with its dotted path); a Renamed that
        # only adds docs (C{Int8ul * "text"}) has no name.
        return _visit(con.subcon, name or con.name, offset, order, out)
    if isinstance(con, Struct):
        for sub in con.subcons:
            sub_name = getattr(sub, "name", None)
            if sub_name is not None and name:
                sub_name = f"{name}.{sub_name}"
            offset = _visit(sub, sub_name, offset, order, out)
        return offset
    if isinstance(con, Const):
        before = len(out)
        end = _visit(con.subcon, name, offset, order, out)
        if len(out) == before + 1:
            out[-1] = Field(name, offset, end - offset, out[-1].kind, con.value)
        return end
    if isinstance(con, (Rebuild, StringEncoded)):
        return _visit(con.subcon, name, offset, order, out)
    if isinstance(con, Prefixed):
        # The length prefix is a field of its own; the data follows it.
        offset = _visit(con.lengthfield, f"{name}.length" if name else "length",
                        offset, order, out)
        return _visit(con.subcon, name, offset, order, out)
    if isinstance(con, Padded) and con.subcon is Pass and isinstance(con.length, int):
        out.append(Field(None, offset, con.length, "pad"))
        return offset + con.length
    if isinstance(con, FormatField):
        code = con.fmtstr[1:]
        _note_order(con.fmtstr[0], order, name)
        signed = "s" if code.islower() else "u"
        out.append(Field(name, offset, con.length, f"{signed}{con.length * 8}"))
        return offset + con.length
    if isinstance(con, BytesInteger) and isinstance(con.length, int):
        if not isinstance(con.swapped, bool):
            raise LayoutError(f"{name}: byte order decided at parse time")
        _note_order("<" if con.swapped else ">", order, name)
        signed = "s" if con.signed else "u"
        out.append(Field(name, offset, con.length, f"{signed}{con.length * 8}"))
        return offset + con.length
    if isinstance(con, Bytes) and isinstance(con.length, int):
        out.append(Field(name, offset, con.length, "bytes"))
        return offset + con.length
    raise _Stop()


def _note_order(char, order, name):
    """Record the byte order of an integer field; a schema must use one."""
    char = {"=": ">", "!": ">"}.get(char, char)
    if order and order[0] != char:
        raise LayoutError(f"{name}: mixed byte orders in one schema")
    if not order:
        order.append(char)


def _code(f):
    """The struct code of one field (pad and bytes included)."""
    if f.kind == "pad":
        return "%dx" % f.size
    if f.kind == "bytes":
        return "%ds" % f.size
    code = _INT_CODES[f.size]
    return code if f.kind[0] == "s" else code.upper()


def _assemble(fields, order):
    """Build the Layout: packs odd-width integers into words, then the struct."""
    parts, names, bits = [], [], {}
    i = 0
    while i < len(fields):
        f = fields[i]
        if f.kind in ("pad", "bytes") or f.size in _INT_CODES:
            nxt = fields[i + 1] if i + 1 < len(fields) else None
            if nxt is not None and nxt.kind not in ("pad", "bytes") and nxt.size not in _INT_CODES:
                i = _pack_word(fields, i, order, parts, names, bits)
                continue
            parts.append(_code(f))
            if f.kind != "pad":
                names.append(f.name)
            i += 1
            continue
        raise LayoutError(f"{f.name}: a {f.size}-byte integer needs a field before it to share a word")
    fmt = order + "".join(parts)
    return Layout(fields, fmt, struct.Struct(fmt), tuple(names), order, bits)


def _pack_word(fields, i, order, parts, names, bits):
    """Pack fields[i] and the odd-width integer after it (and more, up to 8 bytes) into
    one unsigned word; return the index after the word."""
    if order != ">":
        raise LayoutError("packed words are only supported big-endian")
    group, width, j = [], 0, i
    while j < len(fields):
        f = fields[j]
        if f.kind in ("pad", "bytes") or (f.kind[0] == "s" and f.size not in _INT_CODES):
            raise LayoutError(f"{f.name}: cannot share a word")
        group.append(f)
        width += f.size
        j += 1
        if width > 8:
            raise LayoutError(f"{f.name}: packed word over 8 bytes")
        nxt = fields[j] if j < len(fields) else None
        if width in (2, 4, 8) and (nxt is None or nxt.kind in ("pad", "bytes")
                                   or nxt.size in _INT_CODES):
            break
    else:
        raise LayoutError(f"{group[-1].name}: packed word of {width} bytes")
    shift = width * 8
    for f in group:
        shift -= f.size * 8
        bits[f.name] = (shift, (1 << (f.size * 8)) - 1)
    parts.append(_INT_CODES[width].upper())
    names.append("|".join(f.name for f in group))
    return j
