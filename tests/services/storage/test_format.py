"""Record and header codecs: round trips, and every truncation and bit flip is detected."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz.errors import CorruptDataError
from waltz.protocol.records import Record, ReqId, crc32
from waltz.services.storage import format as fmt

int32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
req_ids = st.builds(ReqId, int32, int32, int32, int32)
records = st.builds(
    Record.create,
    st.integers(min_value=0, max_value=2**63 - 1),
    req_ids,
    int32,
    st.binary(max_size=300),
)


@given(records)
def test_record_round_trip(record: Record) -> None:
    encoded = fmt.encode_record(record)
    assert len(encoded) == fmt.RECORD_FIXED_SIZE + len(record.data)
    decoded, size = fmt.decode_record_at(encoded, 0)
    assert decoded == record
    assert size == len(encoded)


@given(records, st.data())
def test_every_truncation_is_detected_as_incomplete(record: Record, data: st.DataObject) -> None:
    encoded = fmt.encode_record(record)
    cut = data.draw(st.integers(min_value=0, max_value=len(encoded) - 1))
    with pytest.raises(fmt.RecordProblem) as info:
        fmt.decode_record_at(encoded[:cut], 0)
    assert info.value.incomplete


@given(records, st.data())
def test_every_bit_flip_is_detected(record: Record, data: st.DataObject) -> None:
    encoded = bytearray(fmt.encode_record(record))
    bit = data.draw(st.integers(min_value=0, max_value=len(encoded) * 8 - 1))
    encoded[bit // 8] ^= 1 << (bit % 8)
    # A flip in the length field can make the record look longer (incomplete) or impossible;
    # every other flip fails a CRC. In no case does a record decode.
    with pytest.raises(fmt.RecordProblem):
        fmt.decode_record_at(bytes(encoded), 0)


@given(st.lists(records, max_size=20))
def test_records_back_to_back(batch: list[Record]) -> None:
    encoded, offsets = fmt.encode_records(batch)
    decoded = list(fmt.iter_records(encoded))
    assert [r for _, r in decoded] == batch
    assert [o for o, _ in decoded] == offsets


def test_record_layout_is_big_endian_and_documented() -> None:
    record = Record.create(1, ReqId(2, 3, 4, 5), 6, b"ab")
    encoded = fmt.encode_record(record)
    assert encoded[:8] == (1).to_bytes(8, "big")
    assert encoded[8:24] == b"".join(i.to_bytes(4, "big") for i in (2, 3, 4, 5))
    assert encoded[24:28] == (6).to_bytes(4, "big")
    assert encoded[28:32] == (2).to_bytes(4, "big")
    assert encoded[32:36] == crc32(b"ab").to_bytes(4, "big")
    assert encoded[36:38] == b"ab"
    assert encoded[38:42] == crc32(encoded[:38]).to_bytes(4, "big")


keys = st.uuids()


@given(keys, st.integers(min_value=0, max_value=2**31 - 1), st.integers(min_value=0, max_value=2**62))
def test_segment_header_round_trip(key: uuid.UUID, partition_id: int, first: int) -> None:
    header = fmt.SegmentHeader(fmt.FORMAT_VERSION, 123456789, key, partition_id, first)
    encoded = header.encode()
    assert len(encoded) == fmt.HEADER_SIZE
    assert fmt.SegmentHeader.decode(encoded, "x") == header


@given(keys, st.integers(min_value=0, max_value=10_000))
def test_control_header_round_trip(key: uuid.UUID, partitions: int) -> None:
    header = fmt.ControlFileHeader(fmt.FORMAT_VERSION, 42, key, partitions)
    encoded = header.encode()
    assert len(encoded) == fmt.HEADER_SIZE
    assert fmt.ControlFileHeader.decode(encoded, "x") == header


def test_short_or_unknown_headers_are_refused() -> None:
    header = fmt.SegmentHeader(fmt.FORMAT_VERSION, 1, uuid.uuid4(), 0, 0).encode()
    with pytest.raises(CorruptDataError, match="expected 128"):
        fmt.SegmentHeader.decode(header[:100], "x")
    with pytest.raises(CorruptDataError, match="version"):
        fmt.SegmentHeader.decode((99).to_bytes(4, "big") + header[4:], "x")


@given(
    st.integers(min_value=0, max_value=1000),
    st.integers(-1, 2**62),
    st.integers(-1, 2**62),
    st.integers(-1, 2**62),
    st.data(),
)
def test_partition_info_struct_detects_every_bit_flip(
    partition_id: int, session: int, lwm: int, local: int, data: st.DataObject
) -> None:
    info = fmt.PartitionInfo(session, lwm, local)
    encoded = fmt.encode_partition_info_struct(partition_id, info)
    assert len(encoded) == fmt.PARTITION_INFO_STRUCT_SIZE
    assert fmt.decode_partition_info_struct(partition_id, encoded) == info
    # The CRC covers the partition ID too: a struct copied to another partition is invalid.
    assert fmt.decode_partition_info_struct(partition_id + 1, encoded) is None
    bit = data.draw(st.integers(min_value=0, max_value=len(encoded) * 8 - 1))
    flipped = bytearray(encoded)
    flipped[bit // 8] ^= 1 << (bit % 8)
    assert fmt.decode_partition_info_struct(partition_id, bytes(flipped)) is None


@given(st.integers(min_value=0, max_value=1000), st.integers(-1, 2**62), st.data())
def test_fence_slot_detects_every_bit_flip(partition_id: int, session: int, data: st.DataObject) -> None:
    encoded = fmt.encode_fence_slot(partition_id, session)
    assert fmt.decode_fence_slot(partition_id, encoded) == session
    bit = data.draw(st.integers(min_value=0, max_value=len(encoded) * 8 - 1))
    flipped = bytearray(encoded)
    flipped[bit // 8] ^= 1 << (bit % 8)
    assert fmt.decode_fence_slot(partition_id, bytes(flipped)) is None


# --- the forms of record, kept byte for byte -----------------------------------------------------
#
# Files written today are read for years: these are the worked examples of docs/format.md, kept
# here as literal bytes, so that a change to both the writer and the reader of a form (which a
# round trip would not see) fails. The same bytes stand in the document.

FORMAT_DOC = Path(__file__).resolve().parents[3] / "docs" / "format.md"
EXAMPLE_KEY = uuid.UUID("01234567-89ab-cdef-0123-456789abcdef")

#: Segment header, version 1: created 1700000000000 ms, the key above, partition 0, first
#: transaction 5 (its first 40 bytes; the 88 reserved bytes after them are zero).
SEGMENT_HEADER_V1 = (
    "00 00 00 01 00 00 01 8b cf e5 68 00 01 23 45 67 89 ab cd ef 01 23 45 67 89 ab cd ef\n"
    "00 00 00 00 00 00 00 00 00 00 00 05"
)
#: Transaction 5, ReqId (1, 2, 0, 7), header 0, data ``hello``.
RECORD_HELLO = (
    "00 00 00 00 00 00 00 05 00 00 00 01 00 00 00 02 00 00 00 00 00 00 00 07 00 00 00 00 00 00 00 05 "
    "36 10 a6 86 68 65 6c 6c 6f cb 1b 34 7a"
)
#: Partition-info struct of partition 0: session 3, low-water mark 20, local low-water mark 20.
PARTITION_INFO_V1 = "00 00 00 00 00 00 00 03 00 00 00 00 00 00 00 14 00 00 00 00 00 00 00 14 38 1c eb 6d"
#: Fence slot of partition 0: fence session 4.
FENCE_SLOT_V1 = "00 00 00 00 00 00 00 04 7c b8 02 76"


def _hex(text: str) -> bytes:
    return bytes.fromhex(text.replace("\n", " "))


def test_the_segment_header_of_the_format_document_reads_and_writes_byte_for_byte() -> None:
    kept = _hex(SEGMENT_HEADER_V1).ljust(fmt.HEADER_SIZE, b"\0")
    header = fmt.SegmentHeader(1, 1_700_000_000_000, EXAMPLE_KEY, 0, 5)
    assert fmt.SegmentHeader.decode(kept, "kept.seg") == header
    assert header.encode() == kept
    assert SEGMENT_HEADER_V1 in FORMAT_DOC.read_text()


def test_the_record_of_the_format_document_reads_and_writes_byte_for_byte() -> None:
    kept = _hex(RECORD_HELLO)
    record = Record.create(5, ReqId(1, 2, 0, 7), 0, b"hello")
    assert fmt.decode_record_at(kept, 0) == (record, len(kept))
    assert fmt.encode_record(record) == kept
    # The document shows it as a hex dump of 16 bytes a line.
    dump = [kept[i : i + 16] for i in range(0, len(kept), 16)]
    text = FORMAT_DOC.read_text()
    assert all(f"{16 * n:04x}  {line.hex(' ')}" in text for n, line in enumerate(dump)), dump


def test_the_control_file_structs_of_the_format_document_read_and_write_byte_for_byte() -> None:
    info = fmt.PartitionInfo(session_id=3, low_water_mark=20, local_low_water_mark=20)
    assert fmt.decode_partition_info_struct(0, _hex(PARTITION_INFO_V1)) == info
    assert fmt.encode_partition_info_struct(0, info) == _hex(PARTITION_INFO_V1)
    assert fmt.decode_partition_info_struct(1, _hex(PARTITION_INFO_V1)) is None  # another partition's CRC
    assert fmt.decode_fence_slot(0, _hex(FENCE_SLOT_V1)) == 4
    assert fmt.encode_fence_slot(0, 4) == _hex(FENCE_SLOT_V1)
    assert fmt.decode_fence_slot(1, _hex(FENCE_SLOT_V1)) is None
    text = FORMAT_DOC.read_text()
    assert PARTITION_INFO_V1 in text and FENCE_SLOT_V1 in text
