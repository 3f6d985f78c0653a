"""Reading archived records: ``first..last`` of a partition, across its chunks, checked.

Source: docs/design/archive.md "Reads below the local start". Each chunk the range touches is
read with every check of :func:`~waltz.archive.chunks.read_chunk`, and the records are the same
:class:`~waltz.protocol.records.Record` values a segment read gives.
"""

from __future__ import annotations

from collections.abc import Iterator

from waltz.archive.chunks import read_chunk
from waltz.archive.errors import ArchiveCheckError
from waltz.archive.layout import ArchiveFiles, partition_directory
from waltz.archive.manifests import read_partition_manifest
from waltz.protocol.records import Record

__all__ = ["read_archived"]


def read_archived(location: str | ArchiveFiles, partition_id: int, first: int, last: int) -> Iterator[Record]:
    """Yield the archived records ``first..last`` (inclusive) of a partition, in order.

    Args:
        location: the archive (a directory or a URL pyarrow opens), or its opened files.
        partition_id: the partition.
        first: the first transaction ID.
        last: the last transaction ID (nothing is yielded when below ``first``).

    Raises:
        ArchiveCheckError: the archive does not hold the whole range (the message says what it
            holds), or a chunk of it fails a check (named with its range).
        ArchiveFormError: the partition's manifest is not one this code reads.
        LocationError: the location cannot be opened.
    """
    if last < first:
        return
    files = location if isinstance(location, ArchiveFiles) else ArchiveFiles.open(location)
    manifest = read_partition_manifest(files, partition_id)
    held = (
        "nothing" if manifest.start is None else f"transactions {manifest.start}..{manifest.archived_through}"
    )
    if manifest.start is None or first < manifest.start or last > manifest.archived_through:
        raise ArchiveCheckError(
            files.name(partition_directory(partition_id)),
            f"partition {partition_id}: the archive holds {held}",
            first,
            last,
        )
    for entry in manifest.chunks:
        if entry.last < first or entry.first > last:
            continue
        for record in read_chunk(files, partition_id, entry):
            if first <= record.transaction_id <= last:
                yield record
