"""The storage node's file formats: byte layouts and codecs, big-endian (Java ``DataOutput``).

Design: docs/design/storage.md "Files on disk". ``docs/format.md`` documents every layout here;
this module is the only place that packs or unpacks them (the Spark reader and ``waltz disk`` use
it).

Layouts (all integers big-endian, CRCs are CRC-32 stored as unsigned 32-bit):

* control file header, 128 bytes: format version (int), creation time in ms since the epoch
  (long), cluster key (UUID, 16 bytes), number of partitions (int), 96 reserved zero bytes.
* control file body: per partition, partition ID (int) and two partition-info structs of
  session ID, low-water mark, local low-water mark (longs) and a CRC (int) over the partition ID
  and the three longs; then the fence section: per partition two slots of fence session ID
  (long) and a CRC (int) over the partition ID and the session ID.
* segment data and index file header, 128 bytes: format version (int), creation time (long),
  cluster key (UUID), partition ID (int), first transaction ID (long), 88 reserved zero bytes.
* transaction record: transaction ID (long), ReqId (four ints), transaction header (int), data
  length (int), data CRC (int), data (bytes), record CRC (int) over every preceding byte of the
  record.
* index file body: one record offset (long) per transaction of the segment.
"""

from __future__ import annotations

import struct
import time
import uuid
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from waltz.errors import CorruptDataError
from waltz.protocol import common_pb2, storage_pb2
from waltz.protocol.records import Record, RecordHeader, ReqId, unequal_columns

__all__ = [
    "CONTROL_FILE_NAME",
    "FENCE_SLOT_SIZE",
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "INDEX_ENTRY_SIZE",
    "INDEX_SUFFIX",
    "LOST_INDEX_MARK",
    "MAX_DATA_LENGTH",
    "PARTITION_INFO_SIZE",
    "PARTITION_INFO_STRUCT_SIZE",
    "RECORD_FIXED_SIZE",
    "RECORD_HEADER_SIZE",
    "RESYNC_REACH",
    "SEGMENT_SUFFIX",
    "UNASSIGNED_MARKER",
    "ControlEntry",
    "ControlFileHeader",
    "PartitionInfo",
    "RecordOrderError",
    "RecordProblem",
    "SegmentHeader",
    "WireRow",
    "checkpoint_written",
    "column_rows",
    "control_file_size",
    "decode_control_file",
    "decode_fence_slot",
    "decode_partition_info_struct",
    "decode_record_at",
    "encode_fence_slot",
    "encode_partition_info_struct",
    "encode_record",
    "encode_records",
    "encode_wire_records",
    "encode_wire_rows",
    "fence_slot_offset",
    "iter_records",
    "kept_unassigned",
    "lost_index_name",
    "now_ms",
    "partition_directories",
    "partition_entry_offset",
    "partition_info_struct_offset",
    "record_follows",
    "record_row",
    "record_size",
    "segment_file_name",
    "wire_rows",
]

FORMAT_VERSION: Final = 1
HEADER_SIZE: Final = 128
CONTROL_FILE_NAME: Final = "waltz-storage.ctl"
#: An empty file in a partition's directory: the partition was unassigned with its files kept; the
#: node does not open it at start-up until it is assigned again (docs/design/storage.md "Admin port").
UNASSIGNED_MARKER: Final = "unassigned"


def kept_unassigned(partition_dir: Path) -> bool:
    """Whether a partition directory holds the files of a partition unassigned with its files kept
    (its :data:`UNASSIGNED_MARKER`): no reader takes it for one of the node's replicas."""
    return (partition_dir / UNASSIGNED_MARKER).exists()


def partition_directories(storage_dir: Path, kept: list[Path] | None = None) -> dict[int, Path]:
    """The partition directories a storage node opens, by partition ID (docs/format.md,
    "Directory layout"): named by the partition ID in canonical decimal form (``7``, not ``07``),
    and not :func:`kept_unassigned` (those are appended to ``kept`` when it is given). Other names
    are ignored.
    """
    found: dict[int, Path] = {}
    for child in sorted(storage_dir.iterdir()):
        name = child.name
        if not (name.isascii() and name.isdigit() and str(int(name)) == name and child.is_dir()):
            continue
        if kept_unassigned(child):
            if kept is not None:
                kept.append(child)
        else:
            found[int(name)] = child
    return found


SEGMENT_SUFFIX: Final = ".seg"
INDEX_SUFFIX: Final = ".idx"
INDEX_ENTRY_SIZE: Final = 8
#: The largest transaction data a record may hold (bytes); larger lengths mean corruption.
MAX_DATA_LENGTH: Final = 64 * 1024 * 1024

_CONTROL_HEADER = struct.Struct(">iq16si")
_SEGMENT_HEADER = struct.Struct(">iq16siq")
_PARTITION_ID = struct.Struct(">i")
_INFO_FIELDS = struct.Struct(">iqqq")  # partition ID + the struct's three longs, for its CRC
_INFO_STRUCT = struct.Struct(">qqqI")
_FENCE_FIELDS = struct.Struct(">iq")
_FENCE_SLOT = struct.Struct(">qI")
_RECORD_HEADER = struct.Struct(">qiiiiiiI")  # txn ID, ReqId x4, header, data length, data CRC
_CRC = struct.Struct(">I")
_OFFSET = struct.Struct(">q")

PARTITION_INFO_STRUCT_SIZE: Final = _INFO_STRUCT.size  # 28
PARTITION_INFO_SIZE: Final = _PARTITION_ID.size + 2 * PARTITION_INFO_STRUCT_SIZE  # 60
FENCE_SLOT_SIZE: Final = _FENCE_SLOT.size  # 12
RECORD_HEADER_SIZE: Final = _RECORD_HEADER.size  # 36
RECORD_FIXED_SIZE: Final = RECORD_HEADER_SIZE + _CRC.size  # 40: a record's size without its data


def now_ms() -> int:
    """Return the current time in milliseconds since the epoch (the files' creation time unit)."""
    return int(time.time() * 1000)


def segment_file_name(first_transaction_id: int, suffix: str) -> str:
    """Return the file name of a segment file: its first transaction ID, 19 digits, and suffix."""
    return f"{first_transaction_id:019d}{suffix}"


@dataclass(frozen=True, slots=True)
class ControlFileHeader:
    """The 128-byte header of the control file (docs/design/storage.md "Control file")."""

    version: int
    creation_time_ms: int
    cluster_key: uuid.UUID
    num_partitions: int

    def encode(self) -> bytes:
        """Return the 128-byte encoding."""
        packed = _CONTROL_HEADER.pack(
            self.version, self.creation_time_ms, self.cluster_key.bytes, self.num_partitions
        )
        return packed.ljust(HEADER_SIZE, b"\0")

    @classmethod
    def decode(cls, data: bytes, path: str) -> ControlFileHeader:
        """Decode a header.

        Raises:
            CorruptDataError: the data is shorter than 128 bytes, or has an unknown version or a
                negative number of partitions.
        """
        if len(data) < HEADER_SIZE:
            raise CorruptDataError(f"control file header is {len(data)} bytes, expected 128", path=path)
        version, created, key, num_partitions = _CONTROL_HEADER.unpack_from(data)
        if version != FORMAT_VERSION:
            raise CorruptDataError(f"unknown control file format version {version}", path=path, offset=0)
        if num_partitions < 0:
            raise CorruptDataError(f"negative number of partitions {num_partitions}", path=path, offset=0)
        return cls(version, created, uuid.UUID(bytes=key), num_partitions)


@dataclass(frozen=True, slots=True, order=True)
class PartitionInfo:
    """One partition-info struct of the control file (docs/design/storage.md "Control file").

    Attributes:
        session_id: the store session that last set the low-water mark (-1: none yet).
        low_water_mark: the partition's cluster high-water mark that session last recorded here (at
            the end of its recovery, then raised as it commits).
        local_low_water_mark: the highest valid transaction ID stored here at that moment, capped
            at the low-water mark.
    """

    session_id: int
    low_water_mark: int
    local_low_water_mark: int


INITIAL_PARTITION_INFO: Final = PartitionInfo(-1, -1, -1)


def encode_partition_info_struct(partition_id: int, info: PartitionInfo) -> bytes:
    """Return the 28-byte encoding of one partition-info struct, with its CRC."""
    fields = _INFO_FIELDS.pack(partition_id, info.session_id, info.low_water_mark, info.local_low_water_mark)
    return _INFO_STRUCT.pack(
        info.session_id, info.low_water_mark, info.local_low_water_mark, zlib.crc32(fields)
    )


def decode_partition_info_struct(partition_id: int, data: bytes) -> PartitionInfo | None:
    """Decode one partition-info struct; return None when its CRC does not match (torn/corrupt)."""
    session_id, lwm, local_lwm, crc = _INFO_STRUCT.unpack(data)
    if zlib.crc32(_INFO_FIELDS.pack(partition_id, session_id, lwm, local_lwm)) != crc:
        return None
    return PartitionInfo(session_id, lwm, local_lwm)


def encode_fence_slot(partition_id: int, session_id: int) -> bytes:
    """Return the 12-byte encoding of a fence slot (session ID and CRC)."""
    return _FENCE_SLOT.pack(session_id, zlib.crc32(_FENCE_FIELDS.pack(partition_id, session_id)))


def decode_fence_slot(partition_id: int, data: bytes) -> int | None:
    """Decode a fence slot; return None when its CRC does not match."""
    session_id, crc = _FENCE_SLOT.unpack(data)
    if zlib.crc32(_FENCE_FIELDS.pack(partition_id, session_id)) != crc:
        return None
    return int(session_id)


def partition_entry_offset(partition_id: int) -> int:
    """Byte offset of a partition's entry (partition ID + two structs) in the control file."""
    return HEADER_SIZE + partition_id * PARTITION_INFO_SIZE


def partition_info_struct_offset(partition_id: int, slot: int) -> int:
    """Byte offset of partition-info struct ``slot`` (0 or 1) of a partition."""
    return partition_entry_offset(partition_id) + _PARTITION_ID.size + slot * PARTITION_INFO_STRUCT_SIZE


def fence_slot_offset(num_partitions: int, partition_id: int, slot: int) -> int:
    """Byte offset of fence slot ``slot`` (0 or 1) of a partition, after the body's entries."""
    return HEADER_SIZE + num_partitions * PARTITION_INFO_SIZE + (partition_id * 2 + slot) * FENCE_SLOT_SIZE


def control_file_size(num_partitions: int) -> int:
    """The size of a control file for ``num_partitions`` partitions (header, body, fences)."""
    return fence_slot_offset(num_partitions, num_partitions, 0)


@dataclass(frozen=True, slots=True)
class ControlEntry:
    """One partition's part of a decoded control file, with the byte offset of every piece.

    Attributes:
        structs: the two partition-info structs (None: failed its CRC, or the entry holds another
            partition ID).
        fences: the two fence slots (None: failed its CRC).
    """

    partition_id: int
    stored_partition_id: int
    struct_offsets: tuple[int, int]
    structs: tuple[PartitionInfo | None, PartitionInfo | None]
    fence_offsets: tuple[int, int]
    fences: tuple[int | None, int | None]


def _struct_at(data: bytes, partition_id: int, offset: int) -> PartitionInfo | None:
    return decode_partition_info_struct(partition_id, data[offset : offset + PARTITION_INFO_STRUCT_SIZE])


def decode_control_file(data: bytes, path: str) -> tuple[ControlFileHeader, list[ControlEntry]]:
    """Decode a whole control file without judging it (a broken struct decodes as None).

    Raises:
        CorruptDataError: the header is invalid or the file is shorter than its header says.
    """
    header = ControlFileHeader.decode(data, path)
    n = header.num_partitions
    if len(data) < control_file_size(n):
        raise CorruptDataError(
            f"control file is {len(data)} bytes, {n} partitions need {control_file_size(n)}", path=path
        )
    entries = []
    for pid in range(n):
        base = partition_entry_offset(pid)
        stored = decode_partition_id(data[base : base + _PARTITION_ID.size])
        struct_offsets = (partition_info_struct_offset(pid, 0), partition_info_struct_offset(pid, 1))
        structs = (
            _struct_at(data, pid, struct_offsets[0]) if stored == pid else None,
            _struct_at(data, pid, struct_offsets[1]) if stored == pid else None,
        )
        fence_offsets = (fence_slot_offset(n, pid, 0), fence_slot_offset(n, pid, 1))
        fences = (
            decode_fence_slot(pid, data[fence_offsets[0] : fence_offsets[0] + FENCE_SLOT_SIZE]),
            decode_fence_slot(pid, data[fence_offsets[1] : fence_offsets[1] + FENCE_SLOT_SIZE]),
        )
        entries.append(ControlEntry(pid, stored, struct_offsets, structs, fence_offsets, fences))
    return header, entries


def encode_partition_id(partition_id: int) -> bytes:
    """Return the 4-byte partition ID that starts a partition's entry in the control file body."""
    return _PARTITION_ID.pack(partition_id)


def decode_partition_id(data: bytes) -> int:
    """Decode the 4-byte partition ID of a control file body entry."""
    return int(_PARTITION_ID.unpack(data)[0])


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    """The 128-byte header of a segment data file and of its index file.

    See docs/design/storage.md "Segments and index files".
    """

    version: int
    creation_time_ms: int
    cluster_key: uuid.UUID
    partition_id: int
    first_transaction_id: int

    def encode(self) -> bytes:
        """Return the 128-byte encoding."""
        packed = _SEGMENT_HEADER.pack(
            self.version,
            self.creation_time_ms,
            self.cluster_key.bytes,
            self.partition_id,
            self.first_transaction_id,
        )
        return packed.ljust(HEADER_SIZE, b"\0")

    @classmethod
    def decode(cls, data: bytes, path: str) -> SegmentHeader:
        """Decode a segment header.

        Raises:
            CorruptDataError: short header or unknown format version.
        """
        if len(data) < HEADER_SIZE:
            raise CorruptDataError(f"segment header is {len(data)} bytes, expected 128", path=path, offset=0)
        version, created, key, partition_id, first = _SEGMENT_HEADER.unpack_from(data)
        if version != FORMAT_VERSION:
            raise CorruptDataError(
                f"unknown segment format version {version}", path=path, partition_id=partition_id, offset=0
            )
        return cls(version, created, uuid.UUID(bytes=key), partition_id, first)


#: A record as the append path encodes it: transaction ID, the ReqId's client ID, generation,
#: partition and sequence number, header, data, and the CRC-32 of the data as the writer sent it.
WireRow = tuple[int, int, int, int, int, int, bytes, int]


def encode_record(record: Record) -> bytes:
    """Return the on-disk encoding of a record (40 bytes plus its data).

    The record's own ``checksum`` is written as the data CRC; callers verify it first.
    """
    transaction_id, client_id, generation, partition_id, seq_num, header, data, checksum = record_row(record)
    head = _RECORD_HEADER.pack(
        transaction_id, client_id, generation, partition_id, seq_num, header, len(data), checksum
    )
    crc = zlib.crc32(data, zlib.crc32(head))
    return b"".join((head, data, _CRC.pack(crc)))


def encode_records(records: list[Record]) -> tuple[bytes, list[int]]:
    """Encode records back to back.

    Returns:
        The concatenated encodings and the offset of each record relative to the start.
    """
    parts: list[bytes] = []
    offsets: list[int] = []
    position = 0
    for record in records:
        encoded = encode_record(record)
        offsets.append(position)
        parts.append(encoded)
        position += len(encoded)
    return b"".join(parts), offsets


class RecordOrderError(ValueError):
    """A record of a batch does not carry the expected transaction ID or a valid data CRC."""


def record_row(record: Record | common_pb2.Record) -> WireRow:
    """The row of a record (a :class:`Record`, or its protobuf form as received on the wire)."""
    req = record.req_id
    return (
        record.transaction_id,
        req.client_id,
        req.generation,
        req.partition_id,
        req.seq_num,
        record.header,
        record.data,
        record.checksum,
    )


def wire_rows(records: Iterable[common_pb2.Record]) -> Iterator[WireRow]:
    """The rows of records received as messages (``AppendRequest.records``)."""
    return map(record_row, records)


def column_rows(columns: storage_pb2.RecordColumns, partition_id: int) -> Iterator[WireRow]:
    """The rows of records received in columns (``AppendRequest.columns``) for ``partition_id``.

    Raises:
        RecordOrderError: the columns differ in length (when the rows are read).
    """
    client_ids = columns.client_ids
    problem = unequal_columns(
        {
            "client_ids": len(client_ids),
            "generations": len(columns.generations),
            "seq_nums": len(columns.seq_nums),
            "headers": len(columns.headers),
            "data": len(columns.data),
            "checksums": len(columns.checksums),
        }
    )
    if problem is not None:
        raise RecordOrderError(f"record {problem}")
    first = columns.first_transaction_id
    for index, (client_id, generation, seq_num, header, data, checksum) in enumerate(
        zip(
            client_ids,
            columns.generations,
            columns.seq_nums,
            columns.headers,
            columns.data,
            columns.checksums,
            strict=True,
        )
    ):
        yield first + index, client_id, generation, partition_id, seq_num, header, data, checksum


def encode_wire_records(
    records: Sequence[common_pb2.Record], first_transaction_id: int
) -> tuple[bytes, list[int]]:
    """:func:`encode_wire_rows` of records received as messages."""
    return encode_wire_rows(wire_rows(records), first_transaction_id)


def encode_wire_rows(rows: Iterable[WireRow], first_transaction_id: int) -> tuple[bytes, list[int]]:
    """Encode records as received on the wire straight into their on-disk form.

    The batch must hold consecutive transaction IDs from ``first_transaction_id`` on, each with
    the CRC-32 of its data; no intermediate objects are built (the storage node's append path).

    Returns:
        The concatenated encodings and the offset of each record relative to the start.

    Raises:
        RecordOrderError: a transaction ID out of sequence or a data CRC that does not match.
    """
    pack = _RECORD_HEADER.pack
    pack_crc = _CRC.pack
    crc = zlib.crc32
    parts: list[bytes] = []
    offsets: list[int] = []
    position = 0
    expected = first_transaction_id
    for transaction_id, client_id, generation, partition_id, seq_num, header, data, checksum in rows:
        if transaction_id != expected:
            raise RecordOrderError(
                f"append of transaction {transaction_id}, expected {expected} "
                "(records must follow the max transaction ID in order)"
            )
        data_crc = crc(data)
        if data_crc != checksum:
            raise RecordOrderError(f"transaction {expected} has a data checksum that does not match its data")
        head = pack(expected, client_id, generation, partition_id, seq_num, header, len(data), data_crc)
        parts.append(head)
        parts.append(data)
        parts.append(pack_crc(crc(data, crc(head))))
        offsets.append(position)
        position += RECORD_FIXED_SIZE + len(data)
        expected += 1
    return b"".join(parts), offsets


class RecordProblem(Exception):  # noqa: N818 - an outcome, not an error raised to callers
    """Why the bytes at an offset are not a valid record (used by recovery and verification).

    Attributes:
        incomplete: True when the bytes end before the record does (a torn tail candidate).
        reason: a human readable reason.
    """

    def __init__(self, reason: str, *, incomplete: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.incomplete = incomplete


def decode_record_at(buffer: bytes | memoryview, position: int) -> tuple[Record, int]:
    """Decode and verify the record starting at ``position`` in ``buffer``.

    Returns:
        The record and its total encoded size in bytes.

    Raises:
        RecordProblem: the bytes are incomplete, or a length or a CRC check fails.
    """
    available = len(buffer) - position
    if available < RECORD_HEADER_SIZE:
        raise RecordProblem(f"{available} bytes left, a record header needs 36", incomplete=True)
    txn, client, gen, pid, seq, header, length, data_crc = _RECORD_HEADER.unpack_from(buffer, position)
    if length < 0 or length > MAX_DATA_LENGTH:
        raise RecordProblem(f"impossible data length {length}", incomplete=False)
    size = RECORD_FIXED_SIZE + length
    if available < size:
        raise RecordProblem(f"{available} bytes left, the record needs {size}", incomplete=True)
    end_of_data = position + RECORD_HEADER_SIZE + length
    (record_crc,) = _CRC.unpack_from(buffer, end_of_data)
    view = memoryview(buffer)
    data = bytes(view[position + RECORD_HEADER_SIZE : end_of_data])
    if zlib.crc32(view[position:end_of_data]) != record_crc:
        where = "in the header or the record CRC" if zlib.crc32(data) == data_crc else "in the data"
        raise RecordProblem(f"record CRC mismatch (damage {where})", incomplete=False)
    if zlib.crc32(data) != data_crc:
        raise RecordProblem("data CRC mismatch", incomplete=False)
    return Record(txn, ReqId(client, gen, pid, seq), header, data, data_crc), size


#: Bytes after an invalid record searched for the next one: a record's reach at most.
RESYNC_REACH: Final = 2 * RECORD_FIXED_SIZE + MAX_DATA_LENGTH


def record_follows(region: bytes, transaction_id: int) -> bool:
    """Whether a whole, valid record of ``transaction_id`` starts in ``region`` after its first
    byte (``region`` starts at an invalid record and spans up to :data:`RESYNC_REACH` bytes).

    The torn-tail rule's second proof (docs/design/storage.md "Start-up checks and torn tails"):
    invalid bytes followed by the next transaction's valid record are not a torn tail, even when
    the index has no entry for that record yet.
    """
    marker = _OFFSET.pack(transaction_id)  # a record starts with its transaction ID, big-endian
    found = region.find(marker, 1)
    while found >= 0:
        try:
            record, _size = decode_record_at(region, found)
        except RecordProblem:
            pass
        else:
            if record.transaction_id == transaction_id:
                return True
        found = region.find(marker, found + 1)
    return False


def record_size(header: bytes | memoryview) -> int:
    """Return the encoded size of a record from its first 36 bytes (header fields).

    Raises:
        RecordProblem: the header is shorter than 36 bytes or holds an impossible data length.
    """
    if len(header) < RECORD_HEADER_SIZE:
        raise RecordProblem(f"{len(header)} bytes left, a record header needs 36", incomplete=True)
    length = _RECORD_HEADER.unpack_from(header)[6]
    if length < 0 or length > MAX_DATA_LENGTH:
        raise RecordProblem(f"impossible data length {length}", incomplete=False)
    return int(RECORD_FIXED_SIZE + length)


def decode_record_header_at(buffer: bytes | memoryview, position: int) -> RecordHeader:
    """Decode the header fields of the record at ``position`` without verifying CRCs.

    Raises:
        RecordProblem: fewer than 36 bytes are left at ``position``.
    """
    available = len(buffer) - position
    if position < 0 or available < RECORD_HEADER_SIZE:
        raise RecordProblem(f"{max(available, 0)} bytes left, a record header needs 36", incomplete=True)
    txn, client, gen, pid, seq, header, _length, _crc = _RECORD_HEADER.unpack_from(buffer, position)
    return RecordHeader(txn, ReqId(client, gen, pid, seq), header)


def iter_records(buffer: bytes | memoryview, position: int = 0) -> Iterator[tuple[int, Record]]:
    """Yield ``(offset, record)`` for each valid record from ``position`` to the end of ``buffer``.

    Stops silently at the end of the buffer; raises RecordProblem at the first invalid record.
    """
    end = len(buffer)
    while position < end:
        record, size = decode_record_at(buffer, position)
        yield position, record
        position += size


def encode_offset(offset: int) -> bytes:
    """Return the 8-byte encoding of an index entry."""
    return _OFFSET.pack(offset)


def encode_offsets(offsets: Sequence[int], base: int = 0) -> bytes:
    """Return the index entries of ``base + offset`` for each offset, back to back (one
    ``struct.pack`` for the run: the append path writes one per record)."""
    return struct.pack(f">{len(offsets)}q", *[base + offset for offset in offsets])


def decode_offsets(data: bytes) -> list[int]:
    """Decode a run of 8-byte index entries (a trailing partial entry is ignored)."""
    count = len(data) // INDEX_ENTRY_SIZE
    return list(struct.unpack(f">{count}q", data[: count * INDEX_ENTRY_SIZE]))


#: What a kept index of lost records adds to its index file's name, before the first lost
#: transaction ID (docs/format.md, "Durability rules").
LOST_INDEX_MARK: Final = ".lost-"


def lost_index_name(index_name: str, first_lost: int) -> str:
    """The name an index listing flushed records the data file lost is kept under
    (``<index file>.lost-<first_lost>``; docs/format.md, "Durability rules")."""
    return f"{index_name}{LOST_INDEX_MARK}{first_lost}"


def checkpoint_written(offset: int, previous: int | None) -> bool:
    """Whether a checkpoint's index entry ``offset`` follows the entry before it (``previous``,
    None for the first entry) as a written entry does; a torn write of the index leaves bytes that
    do not (docs/format.md, "Durability rules"). A written checkpoint at or past the end of the
    data file lists records that were flushed and lost."""
    if previous is None:
        return offset >= HEADER_SIZE
    return HEADER_SIZE <= previous < offset
