"""A chunk's eight columns (form 1): records to an Arrow table and back, and ``data_crc``.

Source: docs/design/archive.md "The archive's layout and forms". One row per transaction, in
transaction ID order; with these columns a segment record is rebuilt exactly
(docs/format.md, "Transaction record (40 bytes + data)").
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from waltz.protocol.records import Record, ReqId

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["COLUMN_NAMES", "chunk_schema", "data_crc", "records_table", "schema_problem", "table_records"]

#: The columns of a chunk, in order.
COLUMN_NAMES = (
    "transaction_id",
    "client_id",
    "generation",
    "req_partition_id",
    "seq_num",
    "header",
    "data",
    "checksum",
)


def chunk_schema() -> pa.Schema:
    """The Arrow schema of a chunk (form 1); no column is nullable."""
    import pyarrow as pa

    kinds = (pa.int64(), pa.int32(), pa.int32(), pa.int32(), pa.int32(), pa.int32(), pa.binary(), pa.int64())
    return pa.schema([pa.field(n, k, nullable=False) for n, k in zip(COLUMN_NAMES, kinds, strict=True)])


def data_crc(checksums: Iterable[int]) -> int:
    """The CRC-32 over records' checksums in order, each as 4 bytes, big-endian (unsigned)."""
    crc = 0
    values = list(checksums)
    for start in range(0, len(values), 65_536):
        block = values[start : start + 65_536]
        crc = zlib.crc32(struct.pack(f">{len(block)}I", *block), crc)
    return crc & 0xFFFFFFFF


def records_table(records: Sequence[Record]) -> pa.Table:
    """The chunk table of records (in the order given).

    Raises:
        pyarrow.ArrowInvalid: a value does not fit its column (a header or ReqId field past 32 bits).
    """
    import pyarrow as pa

    schema = chunk_schema()
    columns = [
        [r.transaction_id for r in records],
        [r.req_id.client_id for r in records],
        [r.req_id.generation for r in records],
        [r.req_id.partition_id for r in records],
        [r.req_id.seq_num for r in records],
        [r.header for r in records],
        [r.data for r in records],
        [r.checksum for r in records],
    ]
    arrays = [pa.array(values, type=field.type) for values, field in zip(columns, schema, strict=True)]
    return pa.Table.from_arrays(arrays, schema=schema)


def schema_problem(schema: pa.Schema) -> str | None:
    """What keeps a table's schema from being a chunk's: None when it is one."""
    expected = chunk_schema()
    names = tuple(schema.names)
    if names != COLUMN_NAMES:
        return f"its columns are {list(names)}, not {list(COLUMN_NAMES)}"
    for have, want in zip(schema, expected, strict=True):
        if have.type != want.type:
            return f"column {have.name} is {have.type}, not {want.type}"
    return None


def table_records(table: pa.Table) -> list[Record]:
    """The records of a chunk table, in its row order (checked by the caller)."""
    ids, clients, generations, partitions, seqs, headers, data, checksums = (
        table.column(name).to_pylist() for name in COLUMN_NAMES
    )
    return [
        Record(t, ReqId(c, g, p, s), h, d, k)
        for t, c, g, p, s, h, d, k in zip(
            ids, clients, generations, partitions, seqs, headers, data, checksums, strict=True
        )
    ]
