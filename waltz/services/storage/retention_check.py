"""The storage node's periodic retention check: every partition, on its own I/O thread.

Design: docs/design/archive.md, "Retention on the storage nodes". Every
``storage.retention.checkInterval`` seconds (and once at start), each open partition runs
:meth:`StoragePartition.apply_retention
<waltz.services.storage.storage_partition.StoragePartition.apply_retention>` on its I/O thread
(:meth:`StorageNode.run <waltz.services.storage.node.StorageNode.run>`), after every earlier work
of the partition: a deletion never overlaps an append, a read, a truncation or a segment roll of
that partition, since they all run there too (an append runs on the event loop only while nothing
of its partition is queued on the thread). Each deletion is logged by the partition and counted
here; the local start and archived-through gauges are set for every partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from waltz.errors import WaltzError
from waltz.services.storage.metrics import StorageMetrics
from waltz.services.storage.node import StorageNode
from waltz.services.storage.retention import DeletedSegment
from waltz.services.storage.storage_partition import StoragePartition

__all__ = ["RetentionChecker"]

log = logging.getLogger(__name__)


class RetentionChecker:
    """Runs the retention check of every partition of a node, periodically.

    Use :meth:`start` on the node's event loop and :meth:`close` before the node closes.

    Args:
        node: the storage node (its ``retention`` settings say what may go, and how often to look).
        metrics: the node's metrics.
        clock: the time in seconds since the epoch (segments' seal times are on that clock).
    """

    def __init__(
        self, node: StorageNode, metrics: StorageMetrics, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._node = node
        self._metrics = metrics
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        self._seen: set[int] = set()

    def start(self) -> None:
        """Check now, then every ``check_interval`` seconds, in the background."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="storage-retention")

    async def close(self) -> None:
        """Stop checking (a check under way on a partition's thread finishes first). Idempotent."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        interval = self._node.retention.check_interval
        while True:
            try:
                await self.check_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug of ours: say it, and look again at the next interval
                log.exception("the retention check failed")
            await asyncio.sleep(interval)

    async def check_once(self) -> list[DeletedSegment]:
        """Check every open partition once.

        Returns:
            The segments deleted, partition by partition, oldest first.
        """
        node = self._node
        if not node.initialized:
            return []
        settings = node.retention
        deleted: list[DeletedSegment] = []
        assigned = set(node.assigned_partitions())
        for pid in sorted(assigned):
            try:
                partition = node.partition(pid)
            except WaltzError:
                continue  # broken (did not open) or unassigned meanwhile: nothing to check

            def check(
                partition: StoragePartition = partition,
            ) -> tuple[list[DeletedSegment], int, int] | None:
                if partition.closed:  # unassigned since it was looked up
                    return None
                gone = partition.apply_retention(settings, self._clock())
                return gone, partition.local_start, partition.archived_through

            try:
                outcome = await node.run(pid, check)
            except OSError as exc:
                log.error(
                    "partition %d: retention could not delete a segment: %s; trying again later", pid, exc
                )
                continue
            if outcome is None:
                continue
            gone, local_start, archived_through = outcome
            label = str(pid)
            for segment in gone:
                self._metrics.retention_deleted_segments.labels(label).inc()
                self._metrics.retention_deleted_bytes.labels(label).inc(segment.size)
            self._metrics.set_retention_state(pid, local_start, archived_through)
            deleted.extend(gone)
        for pid in self._seen - assigned:
            self._metrics.forget_partition(pid)
        self._seen = assigned
        return deleted
