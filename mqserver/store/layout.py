"""Fixed binary layouts derived from construct schemas: struct formats, offsets, sizes.

The store's formats are written once, as construct C{Struct}s in L{mqserver.store.format}.
Hot paths cannot afford construct per record, so L{Layout} walks a schema of fixed-size
fields once, at import, and derives what they use instead: a precompiled
C{struct.Struct} of the whole layout, the offset and size of each field, and
C{struct.Struct}s that read a few fields and skip the rest. The C speedups get the same
offsets and sizes through their C{configure()}.

Like L{mqserver.store.format}, this module imports only the standard library and
construct (the Spark audit job ships both to its executors).
"""

import struct

from construct import Bytes, Const, Default, FormatField, Prefixed, Rebuild, Renamed, StringEncoded

__all__ = ["Layout", "LayoutError", "field_docs", "length_prefix", "unwrap"]

#: struct codes -> numpy type codes (without the byte order), for the audit's arrays.
#: construct writes 32-bit ints as "l"/"L"; with an explicit byte order they are "i"/"I".
_SAME = {"l": "i", "L": "I"}
_NUMPY = {"b": "i1", "B": "u1", "h": "i2", "H": "u2", "i": "i4", "I": "u4", "q": "i8", "Q": "u8"}


class LayoutError(ValueError):
    """A schema holds something a fixed layout cannot be derived from."""


def field_docs(subcon):
    """Return C{(name, docs, inner)} of one field of a C{Struct}: its name, the text
    given with C{* "..."} (or ""), and the construct under the C{Renamed} wrappers."""
    name, docs = None, ""
    while isinstance(subcon, Renamed):
        name = name or subcon.name
        docs = docs or subcon.docs
        subcon = subcon.subcon
    return name, docs, subcon


def unwrap(subcon):
    """Return the construct that says how a field is encoded, under the wrappers that only
    say what value it holds (C{Const}, C{Rebuild}, C{Default}, C{Renamed})."""
    while isinstance(subcon, (Renamed, Const, Rebuild, Default)):
        subcon = subcon.subcon
    return subcon


def length_prefix(schema, name):
    """Return a C{struct.Struct} of the length field in front of the variable-size field
    C{name} (C{Prefixed}, C{PascalString}) of C{schema}."""
    subcon = next((sc for sc in schema.subcons if sc.name == name), None)
    if subcon is None:
        raise LayoutError(f"no field {name!r}")
    inner = unwrap(field_docs(subcon)[2])
    while not isinstance(inner, Prefixed):
        if not isinstance(inner, StringEncoded):
            raise LayoutError(f"{inner!r} has no length prefix")
        inner = inner.subcon
    fmtstr = unwrap(inner.lengthfield).fmtstr
    return struct.Struct(fmtstr)


def _code(name, subcon):
    """Return (byte order, struct code) of a fixed-size field."""
    inner = unwrap(subcon)
    if isinstance(inner, FormatField):
        code = inner.fmtstr[1:]
        return inner.fmtstr[0], _SAME.get(code, code)
    if isinstance(inner, Bytes) and isinstance(inner.length, int):
        return None, f"{inner.length}s"
    raise LayoutError(f"field {name!r} ({inner!r}) has no fixed size")


class Layout:
    """The fixed layout of a construct C{Struct} whose fields all have a fixed size.

    @ivar names: the field names, in order.
    @ivar codes: field name -> struct code (C{"i"}, C{"q"}, C{"8s"}, ...).
    @ivar offsets: field name -> byte offset.
    @ivar sizes: field name -> size in bytes.
    @ivar docs: field name -> the text the schema gives with it.
    @ivar order: the struct byte-order character (C{">"}).
    @ivar struct: a C{struct.Struct} of the whole layout.
    @ivar size: its size in bytes.
    """

    def __init__(self, schema, prefix=False):
        """Derive the layout of C{schema}; with C{prefix}, of its leading fixed-size
        fields only (a record's header, before the fields whose size its data says)."""
        self.names, self.codes, self.offsets, self.sizes, self.docs = [], {}, {}, {}, {}
        orders = set()
        offset = 0
        for sc in schema.subcons:
            name, docs, inner = field_docs(sc)
            try:
                order, code = _code(name, inner)
            except LayoutError:
                if prefix:
                    break
                raise
            if order is not None:
                orders.add(order)
            size = struct.calcsize(">" + code)
            if size != inner.sizeof():
                raise LayoutError(f"field {name!r}: struct size {size}, construct {inner.sizeof()}")
            self.names.append(name)
            self.codes[name], self.offsets[name], self.sizes[name] = code, offset, size
            self.docs[name] = docs
            offset += size
        if len(orders) > 1:
            raise LayoutError(f"fields of mixed byte orders {sorted(orders)}")
        self.order = orders.pop() if orders else ">"
        self.struct = struct.Struct(self.order + "".join(self.codes[n] for n in self.names))
        self.size = self.struct.size
        if self.size != offset or not (prefix or self.size == schema.sizeof()):
            raise LayoutError(f"layout of {self.size} bytes, schema of {schema.sizeof()}")

    def fields(self, *names):
        """Return a C{struct.Struct} that unpacks only C{names} (in layout order) from the
        start of a layout, skipping the fields between them with pad bytes."""
        at = [self.offsets[n] for n in names]
        if at != sorted(at) or len(set(at)) != len(at):
            raise LayoutError(f"fields {names} are not in layout order")
        parts, pos = [self.order], 0
        for name in names:
            gap = self.offsets[name] - pos
            if gap:
                parts.append(f"{gap}x")
            parts.append(self.codes[name])
            pos = self.offsets[name] + self.sizes[name]
        return struct.Struct("".join(parts))

    def field(self, name):
        """Return a C{struct.Struct} of the one field C{name}, to read or write it at
        C{start + offsets[name]}."""
        return struct.Struct(self.order + self.codes[name])

    def span(self, name):
        """Return C{(offset, size)} of the field C{name}: what a C speedup's
        C{configure()} takes for it."""
        return self.offsets[name], self.sizes[name]

    def numpy_fields(self, rename=None):
        """Return the fields as a numpy structured dtype description,
        C{[(name, ">i4"), ...]}, byte strings as C{"V<n>"}; C{rename} maps schema
        names to the names wanted."""
        rename = rename or {}
        out = []
        for n in self.names:
            code = self.codes[n]
            kind = f"V{self.sizes[n]}" if code.endswith("s") else self.order + _NUMPY[code]
            out.append((rename.get(n, n), kind))
        return out
