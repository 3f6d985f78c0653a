"""The ``waltz`` data source's archived ranges: planned from the archive's manifests, read as Arrow.

Source: docs/design/archive.md "Reads below the local start" (Spark); docs/design/spark.md
"Archived ranges". A partition's range that the archive holds (its manifest's chunks, from the
first chunk's first transaction to ``archived_through``) is read from the chunks, one Spark
partition per chunk, with pyarrow: every check of a chunk read (the file's size and SHA-256, its
columns, rows, consecutive transaction IDs, each record's data against its checksum,
``data_crc``), made on the columns. The rest of the range is read from the storage nodes as
before. A live read finds the archive in ZooKeeper (``<root>/archive``); the ``archive`` option
names one (an offline read) or turns it off (``archive=off``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from waltz.archive.chunks import read_chunk_table
from waltz.archive.layout import ArchiveFiles
from waltz.archive.manifests import ArchiveManifest, ChunkEntry, read_partition_manifest
from waltz.committed.sources import CommittedPartition, LiveSource

__all__ = ["ARCHIVE_OFF", "ArchivedRange", "archive_cluster_problem", "plan_archived", "read_archived_range"]

#: The ``archive`` option's value that reads only the storage nodes.
ARCHIVE_OFF = "off"


@dataclass(frozen=True)
class ArchivedRange(InputPartition):
    """One Spark partition: transactions ``first..last`` of a partition, in one chunk of the archive."""

    partition_id: int
    first: int
    last: int
    location: str
    chunk: ChunkEntry


def archive_cluster_problem(manifest: ArchiveManifest, plans: Sequence[CommittedPartition]) -> str | None:
    """Why an archive given to a read is not the archive of the log's cluster, or None when it is
    (docs/design/spark.md, "Archived ranges"), as the archiver tells (``claim_archive``): its
    ``archive.json`` must list the cluster's key fingerprint, and have the cluster's partition
    count (that at creation, which a live cluster's ZooKeeper keeps; storage directories count
    the partitions splits added too, so offline the archive's count must not be higher).

    Args:
        manifest: the archive's ``archive.json``.
        plans: the log's plan (live: each partition's source names the cluster key; offline: the
            storage directories' control files do).

    Returns:
        The problem, as words that follow the archive's location; None when none, or when the
        plan names no source to compare with.

    Raises:
        StorageNotInitializedError, CorruptDataError, OSError: a storage directory's control file
            is unusable (offline).
    """
    from waltz.protocol.cluster_key import cluster_key_fingerprint

    for plan in plans:
        source = plan.source
        if isinstance(source, LiveSource):
            key, partitions, exact = source.cluster_key, source.num_partitions, True
            break
        if source.replicas:
            from waltz.services.storage import inspect

            header = inspect.read_control_file(Path(source.replicas[0].directory)).header
            key, partitions, exact = str(header.cluster_key), header.num_partitions, False
            break
    else:
        return None
    fingerprint = cluster_key_fingerprint(key)
    if fingerprint not in manifest.cluster_key_fingerprints:
        return (
            f"is another cluster's archive: its archive.json lists the cluster key fingerprints "
            f"{list(manifest.cluster_key_fingerprints)}, and the log's cluster has the key fingerprint "
            f"{fingerprint}"
        )
    count = manifest.num_partitions
    if count > partitions or (exact and count != partitions):
        return (
            f"holds an archive of {count} partitions, and the log's cluster has {partitions}: it is "
            "another log's archive"
        )
    return None


def plan_archived(
    files: ArchiveFiles, partition_id: int, first: int, last: int
) -> tuple[list[ArchivedRange], tuple[int, int] | None]:
    """The archived ranges of ``first..last`` of a partition: one per chunk it touches.

    Args:
        files: the archive.
        partition_id: the partition.
        first: the first transaction to read.
        last: the last transaction to read (inclusive).

    Returns:
        The ranges, in order, and the span ``(first, last)`` they cover (None: the archive holds
        none of it; the caller reads the rest from the storage nodes).

    Raises:
        ArchiveFormError, ArchiveCheckError: the partition's manifest is not one this code reads.
        OSError: the manifest is unreadable.
    """
    manifest = read_partition_manifest(files, partition_id)
    if manifest.start is None:
        return [], None
    low, high = max(first, manifest.start), min(last, manifest.archived_through)
    if high < low:
        return [], None
    ranges = [
        ArchivedRange(partition_id, max(low, c.first), min(high, c.last), files.location, c)
        for c in manifest.chunks
        if c.last >= low and c.first <= high
    ]
    return ranges, (low, high)


def read_archived_range(
    archived: ArchivedRange, schema: pa.Schema, rows_per_batch: int
) -> Iterator[pa.RecordBatch]:
    """The rows of an archived range, as the data source's Arrow batches (in a Spark task).

    Args:
        archived: the planned range.
        schema: the data source's Arrow schema (``partition_id``, ``transaction_id``, ``header``,
            the ReqId's four fields, ``data``).
        rows_per_batch: rows per batch at most.

    Raises:
        ArchiveCheckError: the chunk is missing or fails a check (named with its range).
        LocationError: the archive cannot be opened where the task runs.
    """
    files = ArchiveFiles.open(archived.location)
    table = read_chunk_table(files, archived.partition_id, archived.chunk)
    part = table.slice(archived.first - archived.chunk.first, archived.last - archived.first + 1)
    columns = [
        pa.array([archived.partition_id] * part.num_rows, pa.int32()),
        part.column("transaction_id"),
        part.column("header"),
        part.column("client_id"),
        part.column("generation"),
        part.column("req_partition_id"),
        part.column("seq_num"),
        part.column("data"),
    ]
    out = pa.Table.from_arrays(columns, schema=schema)
    yield from out.to_batches(max_chunksize=rows_per_batch)
