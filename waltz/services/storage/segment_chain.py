"""Opening a partition's segments at start-up: the chain checks and an interrupted roll.

Design: docs/design/storage.md "Start-up checks and torn tails"; docs/format.md "Durability
rules". The segments of a partition directory must chain: each starts at the transaction after
the previous one's last, or the partition does not open. The chain may start above 0 (retention
deleted the oldest segments, or the log was started at a later transaction: docs/design/archive.md,
"Terms"). A roll (or the first segment's creation) that a crash interrupted can leave a last
segment of at most a header whose header does not decode: start-up removes it.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

from waltz.errors import CorruptDataError
from waltz.services.storage import format as fmt
from waltz.services.storage.fsutil import fsync_directory
from waltz.services.storage.segment import Segment

__all__ = ["first_id_of", "open_segments"]

log = logging.getLogger(__name__)


def open_segments(
    directory: Path,
    partition_id: int,
    cluster_key: uuid.UUID,
    checkpoint_interval: int,
    first_transaction_id: int = 0,
) -> list[Segment]:
    """Open a partition directory's segments, oldest first, and create the first one if none is left.

    Args:
        directory: the partition directory.
        partition_id: the partition.
        cluster_key: the cluster key every segment must carry.
        checkpoint_interval: transactions between index flushes.
        first_transaction_id: where a partition without any segment starts (a new partition).

    Returns:
        The open segments; the last one is recovered (docs/design/storage.md "Start-up checks and
        torn tails").

    Raises:
        CorruptDataError: a segment header is invalid, or the segments do not chain.
        DiskFullError: no space for the first segment.
    """
    paths = sorted(directory.glob("*" + fmt.SEGMENT_SUFFIX))
    segments: list[Segment] = []
    first_id = first_transaction_id  # of the segment created when none is left
    try:
        for i, path in enumerate(paths):
            is_last = i == len(paths) - 1
            if (
                is_last
                and path.stat().st_size <= fmt.HEADER_SIZE
                and _incomplete(path, partition_id, cluster_key, checkpoint_interval)
            ):
                log.warning("partition %d: removing incomplete new segment %s", partition_id, path)
                path.unlink()
                path.with_suffix(fmt.INDEX_SUFFIX).unlink(missing_ok=True)
                fsync_directory(directory)
                first_id = first_id_of(path)
                continue
            segment = Segment.open(
                path,
                partition_id=partition_id,
                cluster_key=cluster_key,
                recover=is_last,
                checkpoint_interval=checkpoint_interval,
            )
            if segments:
                previous = segments[-1]
                if previous.corruption is not None or (
                    previous.max_transaction_id + 1 != segment.first_transaction_id
                ):
                    segment.close()
                    raise CorruptDataError(
                        f"segment chain broken: {previous.data_path.name} ends at transaction "
                        f"{previous.max_transaction_id} but the next segment starts at "
                        f"{segment.first_transaction_id}",
                        path=str(segment.data_path),
                        partition_id=partition_id,
                        offset=0,
                        transaction_id=previous.max_transaction_id + 1,
                    )
            segments.append(segment)
        if not segments:
            segments.append(
                Segment.create(directory, partition_id, cluster_key, first_id, checkpoint_interval)
            )
    except BaseException:
        for segment in segments:
            segment.close()
        raise
    return segments


def _incomplete(path: Path, partition_id: int, cluster_key: uuid.UUID, checkpoint_interval: int) -> bool:
    """Whether a last segment file of at most a header is an interrupted creation: its header
    does not decode or does not match (it then holds no record)."""
    try:
        Segment.open(
            path,
            partition_id=partition_id,
            cluster_key=cluster_key,
            recover=True,
            checkpoint_interval=checkpoint_interval,
        ).close()
    except CorruptDataError:
        return True
    return False


def first_id_of(path: Path) -> int:
    """The first transaction ID a segment file's name gives (0 when the name is not a number).

    Start-up creates the partition's first segment there when it removed an incomplete new
    segment ``path`` and no other segment is left (docs/design/storage.md "Start-up checks and
    torn tails").
    """
    try:
        return max(0, int(path.stem))
    except ValueError:
        return 0
