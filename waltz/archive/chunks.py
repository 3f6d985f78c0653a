"""Chunks: writing one, read back and checked, and reading one with every check.

Source: docs/design/archive.md "The archive's layout and forms", "The archiver" (step 3). A chunk
is written under a hidden temporary name, read back from the location and compared with what
was written (its bytes' SHA-256 and every column), then renamed to its range's name. Reading a
chunk checks it against its manifest entry: the file's SHA-256 and size, its columns, its rows,
the transaction IDs ``first..last`` one after the other, each record's data against its checksum,
and ``data_crc``. Every problem names the file and the range.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from waltz.archive.columns import data_crc, records_table, schema_problem, table_records
from waltz.archive.errors import ArchiveCheckError
from waltz.archive.layout import ArchiveFiles, chunk_name, partition_directory, temporary_name
from waltz.archive.location import arrow_owned
from waltz.archive.manifests import ChunkEntry
from waltz.protocol.records import Record, crc32

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "COMPRESSION",
    "adopt_chunk",
    "chunk_path",
    "decode_chunk",
    "encode_chunk",
    "read_chunk",
    "read_chunk_table",
    "read_unlisted_chunk",
    "write_chunk",
]

#: The Parquet compression of a chunk's columns.
COMPRESSION = "zstd"


def chunk_path(partition_id: int, file: str) -> str:
    """A chunk's path in the archive: ``partition_id=<N>/<file>``."""
    return f"{partition_directory(partition_id)}/{file}"


def encode_chunk(records: Sequence[Record]) -> tuple[bytes, pa.Table]:
    """A chunk's Parquet bytes, and the table they hold.

    Raises:
        pyarrow.ArrowInvalid: a value does not fit its column.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = records_table(records)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression=COMPRESSION)
    return sink.getvalue().to_pybytes(), table


def decode_chunk(
    data: bytes | bytearray | memoryview, where: str, first: int | None = None, last: int | None = None
) -> pa.Table:
    """The table of a chunk's bytes, with the chunk's columns.

    Raises:
        ArchiveCheckError: not a Parquet file (truncated, overwritten), or not a chunk's columns.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    # Never the caller's bytes (docs/design/archive.md "The archive's layout and forms"): pyarrow's
    # scanner lets go of its input on one of its threads, at times after read_table returned.
    owned = arrow_owned(data)
    try:
        table = pq.read_table(pa.BufferReader(owned))
    except (pa.ArrowException, OSError) as exc:
        raise ArchiveCheckError(where, f"not a readable Parquet file ({exc})", first, last) from exc
    problem = schema_problem(table.schema)
    if problem is not None:
        raise ArchiveCheckError(where, f"not a chunk of form 1: {problem}", first, last)
    return table


def _check_records(records: Sequence[Record], first: int, last: int, where: str) -> None:
    """Rows, consecutive IDs ``first..last``, and each record's data against its checksum."""
    if len(records) != last - first + 1:
        raise ArchiveCheckError(where, f"{len(records)} rows, not {last - first + 1}", first, last)
    for expected, record in enumerate(records, start=first):
        if record.transaction_id != expected:
            raise ArchiveCheckError(
                where,
                f"row {expected - first} is transaction {record.transaction_id}, not {expected}",
                first,
                last,
            )
        if not record.checksum_ok():
            raise ArchiveCheckError(
                where,
                f"transaction {expected}: its data does not match its checksum {record.checksum}",
                first,
                last,
            )


def write_chunk(
    files: ArchiveFiles,
    partition_id: int,
    records: Sequence[Record],
    verified_replicas: Sequence[str],
) -> ChunkEntry:
    """Write the records as a chunk, read it back, check it, and give it its range's name.

    Args:
        files: the archive.
        partition_id: the partition.
        records: consecutive records, checked against a quorum of replicas.
        verified_replicas: the storage nodes they were checked against (for the manifest).

    Returns:
        The chunk's manifest entry (not yet in the manifest: the caller adds it).

    Raises:
        ArchiveCheckError: the records are not consecutive, or the location gave back other bytes
            or another table than written.
        OSError: the location refused a write, a read or the rename.
    """
    first, last = records[0].transaction_id, records[-1].transaction_id
    name = chunk_name(first, last)
    where = files.name(chunk_path(partition_id, name))
    _check_records(records, first, last, where)
    data, table = encode_chunk(records)
    digest = hashlib.sha256(data).hexdigest()
    temporary = chunk_path(partition_id, temporary_name(name))
    files.write(temporary, data)
    back = files.read(temporary)
    if hashlib.sha256(back).hexdigest() != digest:
        raise ArchiveCheckError(
            files.name(temporary),
            f"read back {len(back)} bytes that differ from the {len(data)} written",
            first,
            last,
        )
    if not decode_chunk(back, files.name(temporary), first, last).equals(table):
        raise ArchiveCheckError(files.name(temporary), "read back other rows than written", first, last)
    files.move(temporary, chunk_path(partition_id, name))
    return _entry(name, records, data, verified_replicas)


def _entry(name: str, records: Sequence[Record], data: bytes, verified_replicas: Sequence[str]) -> ChunkEntry:
    return ChunkEntry(
        first=records[0].transaction_id,
        last=records[-1].transaction_id,
        file=name,
        rows=len(records),
        size_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        data_crc=data_crc(r.checksum for r in records),
        verified_replicas=tuple(verified_replicas),
        archived_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )


def adopt_chunk(
    files: ArchiveFiles,
    partition_id: int,
    name: str,
    records: Sequence[Record],
    verified_replicas: Sequence[str],
) -> ChunkEntry:
    """The manifest entry of a chunk file already written, whose records (read with
    :func:`read_unlisted_chunk`) were found equal to a quorum's.

    Raises:
        OSError: the file cannot be read.
    """
    return _entry(name, records, files.read(chunk_path(partition_id, name)), verified_replicas)


def _checked_bytes(files: ArchiveFiles, partition_id: int, entry: ChunkEntry) -> tuple[bytes, str]:
    """A chunk file's bytes, once their size and SHA-256 are the entry's; and the file's name."""
    relative = chunk_path(partition_id, entry.file)
    where = files.name(relative)
    try:
        data = files.read(relative)
    except FileNotFoundError as exc:
        raise ArchiveCheckError(where, "missing", entry.first, entry.last) from exc
    except OSError as exc:
        raise ArchiveCheckError(where, f"unreadable ({exc})", entry.first, entry.last) from exc
    if len(data) != entry.size_bytes:
        raise ArchiveCheckError(
            where,
            f"{len(data)} bytes, the manifest says {entry.size_bytes} (truncated or replaced)",
            entry.first,
            entry.last,
        )
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry.sha256:
        raise ArchiveCheckError(
            where,
            f"its SHA-256 is {digest}, the manifest says {entry.sha256}; the file was changed or damaged",
            entry.first,
            entry.last,
        )
    return data, where


def read_chunk(files: ArchiveFiles, partition_id: int, entry: ChunkEntry) -> list[Record]:
    """A chunk's records, after every check against its manifest entry.

    Raises:
        ArchiveCheckError: the file is missing or unreadable, or its size, SHA-256, columns, rows,
            transaction IDs, a record's checksum or ``data_crc`` differ from the entry.
    """
    data, where = _checked_bytes(files, partition_id, entry)
    records = table_records(decode_chunk(data, where, entry.first, entry.last))
    _check_records(records, entry.first, entry.last, where)
    crc = data_crc(r.checksum for r in records)
    if crc != entry.data_crc:
        raise ArchiveCheckError(
            where, f"its data_crc is {crc}, the manifest says {entry.data_crc}", entry.first, entry.last
        )
    return records


def read_chunk_table(files: ArchiveFiles, partition_id: int, entry: ChunkEntry) -> pa.Table:
    """A chunk's table (its eight columns), after every check :func:`read_chunk` makes, made on
    the columns: for a reader that hands the rows on as Arrow data (Spark).

    Raises:
        ArchiveCheckError: as :func:`read_chunk`.
    """
    import pyarrow as pa

    data, where = _checked_bytes(files, partition_id, entry)
    first, last = entry.first, entry.last
    table = decode_chunk(data, where, first, last)
    if table.num_rows != last - first + 1:
        raise ArchiveCheckError(where, f"{table.num_rows} rows, not {last - first + 1}", first, last)
    ids = table.column("transaction_id").combine_chunks()
    if not ids.equals(pa.array(range(first, last + 1), pa.int64())):
        row = next(i for i, t in enumerate(ids.to_pylist()) if t != first + i)
        raise ArchiveCheckError(
            where, f"row {row} is transaction {ids[row].as_py()}, not {first + row}", first, last
        )
    checksums = table.column("checksum").to_pylist()
    for row, (value, checksum) in enumerate(zip(table.column("data").to_pylist(), checksums, strict=True)):
        if crc32(value) != checksum:
            raise ArchiveCheckError(
                where,
                f"transaction {first + row}: its data does not match its checksum {checksum}",
                first,
                last,
            )
    crc = data_crc(checksums)
    if crc != entry.data_crc:
        raise ArchiveCheckError(
            where, f"its data_crc is {crc}, the manifest says {entry.data_crc}", first, last
        )
    return table


def read_unlisted_chunk(
    files: ArchiveFiles, partition_id: int, name: str, first: int, last: int
) -> list[Record]:
    """The records of a chunk file that no manifest lists yet (a write the archiver did not finish
    recording), checked by themselves: columns, rows, consecutive IDs, data against checksums.

    Raises:
        ArchiveCheckError: the file is unreadable or fails a check.
    """
    relative = chunk_path(partition_id, name)
    where = files.name(relative)
    try:
        data = files.read(relative)
    except OSError as exc:
        raise ArchiveCheckError(where, f"unreadable ({exc})", first, last) from exc
    records = table_records(decode_chunk(data, where, first, last))
    _check_records(records, first, last, where)
    return records
