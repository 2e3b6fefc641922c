"""mqserver.layout: struct formats, offsets and sizes derived from construct schemas."""

import pytest
from construct import (
    Bytes,
    Const,
    GreedyBytes,
    Int8ub,
    Int8ul,
    Int16sb,
    Int16ul,
    Int24ub,
    Int32ub,
    Int32ul,
    Int64sl,
    PascalString,
    Padding,
    Prefixed,
    Rebuild,
    Struct,
    Switch,
    this,
)

from mqserver.layout import LayoutError, layout

HEADER = Struct(
    "code" / Int8ul,
    "length" / Rebuild(Int16ul, lambda ctx: 7),
    "inner" / Struct("a" / Int32ul, Padding(3)),
    "magic" / Const(0xBEEF, Int16ul),
    "id" / Bytes(4),
    "when" / Int64sl,
)


def test_formats_offsets_and_sizes():
    """Every field gets its offset and width; the struct packs what construct builds."""
    lay = layout(HEADER)
    assert lay.format == "<BHI3xH4sq"
    assert lay.size == 24 == HEADER.sizeof()
    assert lay.names == ("code", "length", "inner.a", "magic", "id", "when")
    assert [lay.offset(n) for n in lay.names] == [0, 1, 3, 10, 12, 16]
    assert lay.field_size("id") == 4
    assert lay.field_struct("inner.a").format == "<I"
    assert lay.field_struct("when").format == "<q"
    assert [f.value for f in lay.fields if f.name == "magic"] == [0xBEEF]
    values = (9, 7, 0x01020304, 0xBEEF, b"abcd", -5)
    built = HEADER.build(dict(code=9, inner=dict(a=0x01020304), id=b"abcd", when=-5))
    assert lay.struct.pack(*values) == built
    assert lay.struct.unpack(built) == values


def test_select_reads_some_fields_and_stops_at_the_last():
    """select() skips the other fields with pad bytes and ends at the last one named."""
    lay = layout(HEADER)
    assert lay.select("length", "id").format == "<1xH4x3x2x4s"
    assert lay.select("code").size == 1
    with pytest.raises(KeyError):
        lay.select("nope")


def test_odd_width_integer_shares_a_word():
    """A 24-bit field is packed with the byte before it: the struct gives the word and
    bits tells where each field sits."""
    lay = layout(Struct("length" / Int32ub, "kind" / Int8ub, "header_length" / Int24ub))
    assert lay.format == ">II"
    assert lay.names == ("length", "kind|header_length")
    assert lay.bits == {"kind": (24, 0xFF), "header_length": (0, 0xFFFFFF)}
    assert lay.offset("header_length") == 5
    with pytest.raises(LayoutError):
        layout(Struct("header_length" / Int24ub))


def test_prefix_stops_at_the_first_variable_field():
    """prefix=True gives the fixed head of a record; a length prefix is a field of its
    own; without prefix=True a variable field is an error."""
    record = Struct(
        "code" / Int16sb,
        "remark" / PascalString(Int32ub, "utf8"),
        "body" / Bytes(this.code),
    )
    lay = layout(record, prefix=True)
    assert lay.format == ">hI"
    assert lay.names == ("code", "remark.length")
    framed = Prefixed(Int32ub, Struct("kind" / Int32ub, "data" / GreedyBytes))
    assert layout(framed, prefix=True).names == ("length", "kind")
    with pytest.raises(LayoutError):
        layout(record)
    switch = Struct("code" / Int8ul, "args" / Switch(this.code, {1: Int8ul}))
    assert layout(switch, prefix=True).names == ("code",)
    with pytest.raises(LayoutError):
        layout(switch)


def test_mixed_byte_orders_are_refused():
    """A schema mixing little- and big-endian fields has no one struct format."""
    with pytest.raises(LayoutError):
        layout(Struct("a" / Int16ul, "b" / Int32ub))



def test_field_docs_keep_the_field_name():
    """A field documented with C{* "text"} keeps its name and dotted path."""
    lay = layout(Struct("a" / Int8ul * "first", "b" / Struct("c" / Int16ul * "inner")))
    assert lay.names == ("a", "b.c")
