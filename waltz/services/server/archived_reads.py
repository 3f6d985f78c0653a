"""A server's reads below the replicas' local start: from the archive that ZooKeeper names.

Design: docs/design/archive.md "Reads below the local start". A replica answers a read below its
local start with ``RECORDS_ARCHIVED``; the server's feed catch-up and transaction-data requests
then read that range from the archive named in ``<root>/archive``, with every check of a chunk
read (the file's size and SHA-256, rows, consecutive IDs, each record's data against its
checksum, ``data_crc``). The reads run in a worker thread, never on the event loop. A range the
archive cannot give (no archive recorded, the range not in it, a chunk missing or damaged) is an
:class:`~waltz.errors.ArchivedReadError` naming the partition, the range and the archive; the
reader stops there, nothing is skipped.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from kazoo.exceptions import KazooException

from waltz.archive.errors import ArchiveError
from waltz.archive.layout import ArchiveFiles
from waltz.archive.location import LocationError
from waltz.archive.reader import ArchivedRangeReader
from waltz.errors import ArchivedReadError, MetadataError
from waltz.metadata.zk import ClusterZk
from waltz.protocol.records import Record

__all__ = ["ArchivedReads"]

log = logging.getLogger(__name__)


class ArchivedReads:
    """The archived ranges of a server's partitions, read from the archive ZooKeeper names.

    One per server, shared by its partitions: it keeps one
    :class:`~waltz.archive.reader.ArchivedRangeReader` (manifests and the chunks last read) for
    the archive's location, and a new one when the location changes.

    Args:
        zk: the cluster's znodes (``<root>/archive`` names the archive).
    """

    def __init__(self, zk: ClusterZk) -> None:
        self._zk = zk
        self._lock = threading.Lock()
        self._reader: ArchivedRangeReader | None = None
        self.records_read = 0

    async def read(self, partition_id: int, first: int, max_records: int, local_start: int) -> list[Record]:
        """The archived records from ``first`` on, up to ``max_records`` and below ``local_start``.

        Args:
            partition_id: the partition.
            first: the first transaction ID (below ``local_start``).
            max_records: at most this many records (at least one is asked).
            local_start: the local start a replica answered with: every transaction below it is
                committed and archived.

        Returns:
            Records ``first``, ``first + 1``, ... in order (never empty).

        Raises:
            ArchivedReadError: no archive is recorded in ZooKeeper, it does not hold the range, a
                file of it fails a check, or it cannot be opened (the message names the
                partition, the range, the archive, and the file).
        """
        last = min(local_start - 1, first + max(1, max_records) - 1)
        return await asyncio.to_thread(self._read, partition_id, first, last)

    def _read(self, partition_id: int, first: int, last: int) -> list[Record]:
        try:
            summary = self._zk.archive_summary()
        except (MetadataError, KazooException) as exc:
            raise ArchivedReadError(
                partition_id, first, last, None, f"ZooKeeper did not answer ({exc}); retry"
            ) from exc
        if summary is None:
            raise ArchivedReadError(
                partition_id,
                first,
                last,
                None,
                f"{self._zk.paths.archive} is missing: give the archive's location to "
                "`waltz archive run --to ...` (--relocate if it moved)",
            )
        location = summary.value.location
        try:
            reader = self._reader_of(location)
            records = reader.read(partition_id, first, last)
        except (ArchiveError, LocationError, OSError) as exc:
            log.error(
                "partition %d: archived read of %d..%d from %s failed: %s",
                partition_id,
                first,
                last,
                location,
                exc,
            )
            raise ArchivedReadError(partition_id, first, last, location, str(exc)) from exc
        self.records_read += len(records)
        return records

    def _reader_of(self, location: str) -> ArchivedRangeReader:
        with self._lock:
            reader = self._reader
            if reader is None or reader.files.location != location:
                reader = ArchivedRangeReader(ArchiveFiles.open(location))
                self._reader = reader
                log.info("reading archived ranges from %s", location)
            return reader
