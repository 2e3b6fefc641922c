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
