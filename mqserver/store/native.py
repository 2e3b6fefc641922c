"""The store's C speedups, loaded and handed the storage layout.

The C code (C{_pack.c}: record packing on publish; C{_check.c}: the read-path record
check, and the audit's step over a segment's records; C{_index.c}: the key index's usual put) writes no layout of its own: this module gives each its C{configure()} the offsets
and sizes of the fields it touches, derived from the construct schemas of
L{mqserver.store.format}, once, at import. A module that is not built (or
C{MQSERVER_PURE_PYTHON}) is None here, and the store runs the Python code.
"""

import zlib

from mqserver import speedups
from mqserver.store import format as fmt
from mqserver.store.message import PutResult

__all__ = ["check", "configure_check", "configure_index", "configure_pack", "configure_usual",
           "crc32s", "first_damaged", "index", "pack", "spans", "walk"]

#: The order of the header fields in C{_pack.configure()}'s spans.
PACK_FIELDS = (
    "total_size", "magic", "body_crc", "queue_id", "flag", "queue_offset", "physical_offset",
    "sys_flag", "born_timestamp", "born_host", "store_timestamp", "store_host",
    "reconsume_times", "event_id", "body_length")
#: The order of the consume-queue entry fields in its spans.
ENTRY_FIELDS = ("offset", "size", "tag_hash")
#: The order of the header fields in C{_check.configure()}'s spans.
CHECK_FIELDS = ("total_size", "magic", "body_crc", "body_length")
#: The order of the index file's header, slot and entry fields in C{_index.configure()}.
INDEX_HEADER_FIELDS = ("begin_timestamp", "end_timestamp", "begin_phy_offset",
                       "end_phy_offset", "hash_slot_count", "index_count")
INDEX_SLOT_FIELDS = ("newest",)
INDEX_ENTRY_FIELDS = ("key_hash", "phy_offset", "time_diff", "next_index_offset")


def spans(layout, names):
    """Return C{((offset, size), ...)} of the fields C{names} of C{layout} (an
    L{mqserver.layout.Layout}): what a C{configure()} takes."""
    return tuple((layout.offset(n), layout.field_size(n)) for n in names)


def configure_pack(module, header=fmt.HEADER_LAYOUT, entry=fmt.CQ_LAYOUT):
    """Hand the record and consume-queue entry layouts to C{module} (C{_pack})."""
    module.configure(header.size, spans(header, PACK_FIELDS), entry.size,
                     spans(entry, ENTRY_FIELDS), fmt.PROPS_LEN.size, fmt.SYSFLAG_BATCH_MORE)


def configure_index(module, header=fmt.INDEX_HEADER_LAYOUT, slot=fmt.INDEX_SLOT_LAYOUT,
                    entry=fmt.INDEX_ENTRY_LAYOUT):
    """Hand the index file's header, slot and entry layouts to C{module} (C{_index})."""
    module.configure(header.size, spans(header, INDEX_HEADER_FIELDS), slot.size,
                     spans(slot, INDEX_SLOT_FIELDS), entry.size, spans(entry, INDEX_ENTRY_FIELDS))


def configure_usual(module):
    """Hand C{module} (C{_pack}) the constants of its C{usual()} (the usual publish of
    L{mqserver.store.writer.Writer}): the message magic, the BLANK size, the CRC and tag
    hash functions, and the type of the result it makes."""
    module.configure_usual(fmt.MESSAGE_MAGIC, fmt.BLANK_SIZE, zlib.crc32, fmt.tag_hash_of,
                           PutResult)


def configure_check(module, header=fmt.HEADER_LAYOUT):
    """Hand the record layout to C{module} (C{_check})."""
    module.configure(header.size, spans(header, CHECK_FIELDS), fmt.MIN_RECORD_SIZE,
                     fmt.MESSAGE_MAGIC, fmt.ADMIN_MAGIC)


#: The C speedup of the record packing (None: the Python loop, Writer._pack_py).
pack = speedups.load("mqserver.store._pack")
if pack is not None:
    configure_pack(pack)
    configure_usual(pack)
#: The C speedup of the read-path record check (format.first_damaged).
check = speedups.load("mqserver.store._check")
if check is not None:
    configure_check(check)
first_damaged = fmt.first_damaged if check is None else check.first_damaged
#: The C step over a segment's records (the audit's L{spark.audit.scan.walk}), or None.
walk = None if check is None else check.walk
#: The CRC-32s of many spans of a buffer at once (the audit's body CRCs), or None.
crc32s = None if check is None else check.crc32s
#: The C speedup of the key index's usual put (index.put_uniq_py).
index = speedups.load("mqserver.store._index")
if index is not None:
    configure_index(index)
