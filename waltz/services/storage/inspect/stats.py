"""Statistics of a storage node's partitions (``waltz disk stats``), from a full verification.

Design: docs/design/storage.md "Files on disk". Read-only: every record is read and its CRCs checked
by :func:`~waltz.services.storage.inspect.verify.verify_storage`, so the numbers are exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from waltz.services.storage.inspect.reader import DEFAULT_CHUNK_SIZE
from waltz.services.storage.inspect.report import PartitionSummary
from waltz.services.storage.inspect.verify import verify_storage
from waltz.services.storage.storage_partition import DEFAULT_CHECKPOINT_INTERVAL

__all__ = ["collect_stats"]


def collect_stats(
    storage_dir: Path,
    partitions: Sequence[int] | None = None,
    *,
    checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> list[PartitionSummary]:
    """Return the statistics of every (or the given) partition of a storage directory.

    Every record is read and checked, as by :func:`verify_storage`, so the numbers are exact.

    Raises:
        FileNotFoundError, NotADirectoryError, StorageNotInitializedError, CorruptDataError: see
            :func:`verify_storage`.
    """
    report = verify_storage(
        storage_dir, partitions, checkpoint_interval=checkpoint_interval, chunk_size=chunk_size
    )
    summaries = []
    for partition in report.partitions:
        segments = partition.segments
        entry = report.control.partitions[partition.partition_id]
        summaries.append(
            PartitionSummary(
                partition.partition_id,
                len(segments),
                sum(s.records for s in segments),
                sum(s.record_bytes for s in segments),
                sum(s.data_bytes for s in segments),
                partition.local_start,
                segments[-1].max_transaction_id if segments else -1,
                partition.archived_through,
                entry.info,
                entry.fence,
                partition.errors,
                partition.warnings,
            )
        )
    return summaries
