"""Statistics of a storage node's partitions (``waltz disk stats``), from a full verification.

Design: docs/design/storage.md "Files on disk". Read-only: every record is read and its CRCs checked
by :func:`~waltz.services.storage.inspect.verify.verify_storage`, so the numbers are exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from waltz.errors import WaltzError
from waltz.services.storage import format as fmt
from waltz.services.storage.inspect.reader import DEFAULT_CHUNK_SIZE
from waltz.services.storage.inspect.report import PartitionSummary
from waltz.services.storage.inspect.verify import verify_storage
from waltz.services.storage.storage_partition import DEFAULT_CHECKPOINT_INTERVAL

__all__ = ["PartitionNotHeldError", "collect_stats"]


class PartitionNotHeldError(WaltzError):
    """A partition asked for is not one the storage directory holds: no directory of it that a
    node opens (docs/design/storage.md "Files on disk"), or beyond the cluster's partition count."""


def collect_stats(
    storage_dir: Path,
    partitions: Sequence[int] | None = None,
    *,
    checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> list[PartitionSummary]:
    """Return the statistics of every (or the given) partition of a storage directory.

    Every record is read and checked, as by :func:`verify_storage`, so the numbers are exact.

    Args:
        storage_dir: the storage directory (holding ``waltz-storage.ctl``).
        partitions: partition IDs; None: every partition directory a node opens.
        checkpoint_interval: transactions between index flushes (storage.index.checkpointInterval).
        chunk_size: bytes read per chunk.

    Returns:
        One summary per partition, by partition ID.

    Raises:
        PartitionNotHeldError: one of ``partitions`` is not held here, named with the partitions
            that are (an empty table would read as a partition without records).
        FileNotFoundError, NotADirectoryError, StorageNotInitializedError, CorruptDataError: see
            :func:`verify_storage`.
    """
    report = verify_storage(
        storage_dir, partitions, checkpoint_interval=checkpoint_interval, chunk_size=chunk_size
    )
    reported = {partition.partition_id for partition in report.partitions}
    missing = sorted(set(partitions or ()) - reported)
    if missing:
        count = report.control.header.num_partitions
        held = sorted(pid for pid in fmt.partition_directories(storage_dir) if pid < count)
        beyond = f"; the cluster has {count}" if missing[0] >= count else ""
        raise PartitionNotHeldError(
            f"partition {missing[0]}: {storage_dir} holds no such partition (it holds "
            f"{', '.join(map(str, held)) or 'none'}{beyond})"
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
