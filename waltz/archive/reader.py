"""Reading archived records: ``first..last`` of a partition, across its chunks, checked.

Source: docs/design/archive.md "Reads below the local start". Each chunk the range touches is
read with every check of :func:`~waltz.archive.chunks.read_chunk`, and the records are the same
:class:`~waltz.protocol.records.Record` values a segment read gives.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator

from waltz.archive.chunks import read_chunk
from waltz.archive.errors import ArchiveCheckError
from waltz.archive.layout import ArchiveFiles, partition_directory
from waltz.archive.manifests import ChunkEntry, PartitionManifest, read_partition_manifest
from waltz.protocol.records import Record

__all__ = ["ArchivedRangeReader", "read_archived"]

#: Chunks an :class:`ArchivedRangeReader` keeps decoded (a feed pages through one at a time).
CACHED_CHUNKS = 2


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
    for entry in chunks_of(files, manifest, first, last):
        for record in read_chunk(files, partition_id, entry):
            if first <= record.transaction_id <= last:
                yield record


def chunks_of(files: ArchiveFiles, manifest: PartitionManifest, first: int, last: int) -> list[ChunkEntry]:
    """The chunks of a partition's manifest that hold ``first..last``, in order.

    Raises:
        ArchiveCheckError: the manifest does not hold the whole range (the message says what it
            holds, and names the partition's directory).
    """
    partition_id = manifest.partition_id
    if manifest.start is None or first < manifest.start or last > manifest.archived_through:
        held = (
            "nothing"
            if manifest.start is None
            else f"transactions {manifest.start}..{manifest.archived_through}"
        )
        raise ArchiveCheckError(
            files.name(partition_directory(partition_id)),
            f"partition {partition_id}: the archive holds {held}",
            first,
            last,
        )
    return [entry for entry in manifest.chunks if entry.last >= first and entry.first <= last]


class ArchivedRangeReader:
    """Reads of archived ranges of one archive, page by page, for a reader that comes back often
    (a server feeding a client from an old position).

    Each partition's manifest is kept until a read asks past it (then read again), and the last
    :data:`CACHED_CHUNKS` chunks read are kept decoded and checked, so that paging through a chunk
    reads and checks its file once. Safe to call from several threads (one read at a time).

    Args:
        files: the archive's files.
    """

    def __init__(self, files: ArchiveFiles) -> None:
        self.files = files
        self._lock = threading.Lock()
        self._manifests: dict[int, PartitionManifest] = {}
        self._chunks: OrderedDict[tuple[int, ChunkEntry], list[Record]] = OrderedDict()
        self.chunk_reads = 0

    def read(self, partition_id: int, first: int, last: int) -> list[Record]:
        """The archived records ``first..last`` (inclusive) of a partition, checked as
        :func:`read_archived` checks them.

        Raises:
            ArchiveCheckError: the archive does not hold the whole range, or a chunk of it fails a
                check (the message names the file and its range).
            ArchiveFormError: the partition's manifest is not one this code reads.
        """
        if last < first:
            return []
        with self._lock:
            manifest = self._manifests.get(partition_id)
            if (
                manifest is None
                or manifest.start is None
                or not manifest.start <= first <= last <= manifest.archived_through
            ):
                manifest = read_partition_manifest(self.files, partition_id)
                self._manifests[partition_id] = manifest
            found: list[Record] = []
            for entry in chunks_of(self.files, manifest, first, last):
                records = self._chunk(partition_id, entry)
                found.extend(
                    records[max(first, entry.first) - entry.first : min(last, entry.last) - entry.first + 1]
                )
            return found

    def _chunk(self, partition_id: int, entry: ChunkEntry) -> list[Record]:
        key = (partition_id, entry)
        records = self._chunks.get(key)
        if records is not None:
            self._chunks.move_to_end(key)
            return records
        records = read_chunk(self.files, partition_id, entry)
        self.chunk_reads += 1
        self._chunks[key] = records
        while len(self._chunks) > CACHED_CHUNKS:
            self._chunks.popitem(last=False)
        return records
