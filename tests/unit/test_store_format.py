"""The storage format: construct schemas and struct fast paths agree byte for byte, and
what the store writes is exactly what the schema describes."""

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from mqserver.store import format as fmt
from mqserver.store.store import Message, MessageStore

records = st.fixed_dictionaries(
    {
        "magic": st.sampled_from([fmt.MESSAGE_MAGIC, fmt.ADMIN_MAGIC]),
        "queue_id": st.integers(-1, 1023),
        "flag": st.integers(-(2**31), 2**31 - 1),
        "queue_offset": st.integers(-1, 2**62),
        "physical_offset": st.integers(0, 2**62),
        "sys_flag": st.integers(0, 2**31 - 1),
        "born_ts": st.integers(0, 2**62),
        "born_host": st.binary(min_size=8, max_size=8),
        "store_ts": st.integers(0, 2**62),
        "store_host": st.binary(min_size=8, max_size=8),
        "reconsume_times": st.integers(0, 2**31 - 1),
        "event_id": st.integers(1, 2**62),
        "body": st.binary(max_size=300),
        "topic": st.text(min_size=1, max_size=40).map(lambda t: t.encode()[:255]),
        "properties": st.binary(max_size=200),
    }
)


@settings(max_examples=200)
@given(records)
def test_struct_packing_matches_construct_schema(r):
    """pack_record (struct) builds the bytes the construct RECORD schema builds and parses."""
    packed = fmt.pack_record(**r)
    if _utf8(r["topic"]):
        fields = dict(r, total_size=len(packed), body_crc=fmt.body_crc(r["body"]),
                      born_timestamp=r["born_ts"], store_timestamp=r["store_ts"],
                      topic=r["topic"].decode("utf-8"))
        assert fmt.RECORD.build(fields) == packed
    parsed = fmt.RECORD.parse(packed)
    assert parsed.total_size == len(packed)
    assert parsed.event_id == r["event_id"] and parsed.body == r["body"]
    view = fmt.RecordView(packed)
    assert (view.size, view.event_id, view.queue_offset, bytes(view.body), view.properties) == (
        len(packed), r["event_id"], r["queue_offset"], r["body"], r["properties"])
    assert fmt.DELIVERY_FIELDS.unpack_from(packed, 0) == (
        r["queue_id"], r["queue_offset"], r["sys_flag"], r["store_ts"], r["event_id"], len(r["body"]))


def test_field_offsets_match_the_schema():
    """The OFF_* constants (handed to the C speedups) sit where the schema puts each field."""
    packed = fmt.pack_record(
        magic=fmt.MESSAGE_MAGIC, queue_id=0x01020304, flag=0, queue_offset=0x1112131415161718,
        physical_offset=0x5152535455565758, sys_flag=0x21222324, born_ts=0, born_host=fmt.NO_HOST,
        store_ts=0x3132333435363738, store_host=fmt.NO_HOST, reconsume_times=0,
        event_id=0x4142434445464748, body=b"b" * 0x55, topic=b"t", properties=b"")
    parsed = fmt.RECORD.parse(packed)
    for off, width, value in [
        (fmt.OFF_TOTAL_SIZE, 4, parsed.total_size),
        (fmt.OFF_QUEUE_ID, 4, parsed.queue_id),
        (fmt.OFF_QUEUE_OFFSET, 8, parsed.queue_offset),
        (fmt.OFF_PHYSICAL_OFFSET, 8, parsed.physical_offset),
        (fmt.OFF_SYS_FLAG, 4, parsed.sys_flag),
        (fmt.OFF_STORE_TS, 8, parsed.store_timestamp),
        (fmt.OFF_EVENT_ID, 8, parsed.event_id),
        (fmt.OFF_BODY_LEN, 4, len(parsed.body)),
    ]:
        assert int.from_bytes(packed[off:off + width], "big") == value
    assert packed[fmt.HEADER_SIZE:fmt.HEADER_SIZE + 0x55] == b"b" * 0x55


def _utf8(b):
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_store_writes_what_the_schema_describes(tmp_path):
    """A record written by the store's inlined hot path equals pack_record of its fields,
    and consume-queue entries parse with their schema."""
    s = MessageStore(str(tmp_path), Clock(), clock=lambda: 1_700_000_000.123)
    s.open()
    s.put_messages("t", 0, [Message(body=b"abc", properties=b"TAGS\x01A\x02", flag=7, born_ts=5)])
    raw = s.commitlog.read(0, s.commitlog.end)
    expected = fmt.pack_record(
        magic=fmt.MESSAGE_MAGIC, queue_id=0, flag=7, queue_offset=0, physical_offset=0,
        sys_flag=0, born_ts=5, born_host=fmt.NO_HOST, store_ts=1_700_000_000_123,
        store_host=fmt.NO_HOST, reconsume_times=0, event_id=1, body=b"abc", topic=b"t",
        properties=b"TAGS\x01A\x02",
    )
    assert raw == expected
    entry = fmt.CQ_ENTRY_SCHEMA.parse(s.read_entries("t", 0, 0, 1))
    assert (entry.offset, entry.size, entry.tag_hash) == (0, len(raw), fmt.java_string_hash("A"))
    assert fmt.BLANK_SCHEMA.build({"total_size": 100}) == fmt.BLANK.pack(100, fmt.BLANK_MAGIC)


def test_java_string_hash_known_values():
    """String.hashCode values computed by hand: "" = 0, "a" = 97, "TagA" =
    84*31^3 + 97*31^2 + 103*31 + 65 = 2502444 + 93217 + 3193 + 65 = 2598919."""
    assert fmt.java_string_hash("") == 0
    assert fmt.java_string_hash("a") == 97
    assert fmt.java_string_hash("TagA") == 2598919
    # Overflow wraps to a signed 32-bit value, as in Java.
    assert -(2**31) <= fmt.java_string_hash("x" * 50) < 2**31


# -- layouts derived from the schemas ----------------------------------------------------

_SAMPLE = dict(
    total_size=0x01020304, magic=fmt.MESSAGE_MAGIC, body_crc=0x05060708, queue_id=0x090A0B0C,
    flag=-2, queue_offset=0x1112131415161718, physical_offset=0x2122232425262728,
    sys_flag=0x31323334, born_timestamp=0x4142434445464748, born_host=b"BORNHOST",
    store_timestamp=0x5152535455565758, store_host=b"STORHOST", reconsume_times=0x61626364,
    event_id=0x7172737475767778, body=b"body", topic="t", properties=b"p")


def test_derived_structs_read_the_fields_the_schema_writes():
    """Every struct and offset the hot paths use reads, from a record the construct schema
    built, the fields it is named for."""
    raw = fmt.RECORD.build(_SAMPLE)
    parsed = fmt.RECORD.parse(raw)
    names = fmt.HEADER_LAYOUT.names
    assert fmt.HEADER.unpack_from(raw) == tuple(parsed[n] for n in names)
    assert names[-1] == "body_length" and fmt.HEADER_SIZE == raw.index(b"body")
    assert fmt.DELIVERY_FIELDS.unpack_from(raw) == tuple(parsed[n] for n in (
        "queue_id", "queue_offset", "sys_flag", "store_timestamp", "event_id", "body_length"))
    assert fmt.CHANNEL_FIELDS.unpack_from(raw) == tuple(parsed[n] for n in (
        "total_size", "queue_id", "queue_offset", "physical_offset", "store_timestamp",
        "event_id", "body_length"))
    assert fmt._SIZE_MAGIC_CRC.unpack_from(raw) == (parsed.total_size, parsed.magic, parsed.body_crc)
    assert fmt.BLANK.unpack_from(raw) == (parsed.total_size, parsed.magic)
    # one field at its OFF_*, through the generic I64/I32: the width is the schema's
    for off, name in [(fmt.OFF_QUEUE_OFFSET, "queue_offset"), (fmt.OFF_PHYSICAL_OFFSET, "physical_offset"),
                      (fmt.OFF_STORE_TS, "store_timestamp"), (fmt.OFF_EVENT_ID, "event_id")]:
        assert fmt.HEADER_LAYOUT.field_size(name) == fmt.I64.size
        assert fmt.I64.unpack_from(raw, off)[0] == parsed[name]
    for off, name in [(fmt.OFF_QUEUE_ID, "queue_id"), (fmt.OFF_SYS_FLAG, "sys_flag"),
                      (fmt.OFF_BODY_LEN, "body_length"), (fmt.OFF_TOTAL_SIZE, "total_size")]:
        assert fmt.HEADER_LAYOUT.field_size(name) == fmt.I32.size
        assert fmt.I32.unpack_from(raw, off)[0] == parsed[name]
    assert raw[fmt.OFF_STORE_HOST:fmt.OFF_STORE_HOST + 8] == b"STORHOST"
    assert fmt.MIN_RECORD_SIZE == len(fmt.RECORD.build(dict(_SAMPLE, body=b"", topic="", properties=b"")))


def test_other_layouts_match_their_schemas():
    """Consume-queue entries, index files, hosts and DELAY bodies: the structs build what
    the schemas build."""
    assert fmt.CQ_ENTRY.pack(1, -2, 3) == fmt.CQ_ENTRY_SCHEMA.build(dict(offset=1, size=-2, tag_hash=3))
    assert fmt.INDEX_HEADER.pack(1, 2, 3, 4, 5, 6) == fmt.INDEX_HEADER_SCHEMA.build(dict(
        begin_timestamp=1, end_timestamp=2, begin_phy_offset=3, end_phy_offset=4,
        hash_slot_count=5, index_count=6))
    assert fmt.INDEX_ENTRY.pack(-1, 2, 3, 4) == fmt.INDEX_ENTRY_SCHEMA.build(dict(
        key_hash=-1, phy_offset=2, time_diff=3, next_index_offset=4))
    assert fmt.INDEX_SLOT.pack(7) == fmt.INDEX_SLOT_SCHEMA.build(dict(newest=7))
    assert fmt.HOST.pack(b"\x7f\x00\x00\x01", 12345) == fmt.HOST_SCHEMA.build(
        dict(ipv4=b"\x7f\x00\x00\x01", port=12345)) == b"\x7f\x00\x00\x01\x00\x00\x30\x39"
    assert fmt.HOST.size == fmt.HEADER_LAYOUT.field_size("born_host") == fmt.HEADER_LAYOUT.field_size("store_host")
    messages = [Message(body=b"one", properties=b"k\x01v\x02", flag=3, sys_flag=4, reconsume_times=5),
                Message(body=b"", properties=b"")]
    body = fmt.DELAY_PREFIX.pack(99) + fmt.encode_message_list(messages)
    assert body == fmt.DELAY_BODY.build(dict(trigger_ms=99, messages=[
        dict(flag=m.flag, sys_flag=m.sys_flag, reconsume_times=m.reconsume_times, body=m.body,
             properties=m.properties) for m in messages]))
    assert fmt.decode_message_list(body, fmt.DELAY_PREFIX.size) == [
        (3, 4, 5, b"one", b"k\x01v\x02"), (0, 0, 0, b"", b"")]


def _tag_hash_by_pairs(properties):
    # the definition: the first decoded pair whose key is TAGS
    for k, v in fmt.decode_properties(properties):
        if k == b"TAGS":
            return fmt.java_string_hash(v.decode("utf-8", "replace"))
    return 0


_prop_part = st.sampled_from([b"TAGS", b"\x01", b"\x02", b"TAGSX", b"XTAGS", b"a", b"\xc3\xa9",
                              b"\xff", b"KEYS"])


@settings(max_examples=1000)
@given(st.lists(_prop_part, max_size=12).map(b"".join))
def test_tag_hash_of_finds_the_first_tags_item(properties):
    """tag_hash_of looks for the TAGS item without decoding every pair: it gives what the
    first decoded TAGS pair gives, for any mix of separators, keys and values."""
    assert fmt.tag_hash_of(properties) == _tag_hash_by_pairs(properties)
    assert fmt.tag_hash_of(memoryview(properties)) == _tag_hash_by_pairs(properties)


def test_tag_hash_of_known_cases():
    assert fmt.tag_hash_of(b"TAGS\x01TagA\x02UNIQ_KEY\x01x\x02") == 2598919
    assert fmt.tag_hash_of(b"KEYS\x01k\x02TAGS\x01TagA\x02") == 2598919
    assert fmt.tag_hash_of(b"K\x01TAGS\x01TagA\x02") == 0  # inside a value
    assert fmt.tag_hash_of(b"TAGS\x02TAGS\x01TagA\x02") == 0  # the first TAGS has no value
    assert fmt.tag_hash_of(b"XTAGS\x01a\x02TAGS\x01TagA") == 2598919
    assert fmt.tag_hash_of(b"") == 0
