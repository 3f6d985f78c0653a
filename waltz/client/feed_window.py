"""The feed window of a mounted partition: apply flow control (``client.maxApplyBacklog``).

Source: docs/design/client.md "Back pressure" (apply backlog); ``docs/protocol.md`` "Feed window".
With ``client.maxApplyBacklog`` = L, a mount carries a feed window, so the server feeds at most up
to transaction ``applied + L``; each time the application has applied half a window more, a
``FeedWindow`` message grants up to the new ``applied + L``. Transactions held for the application
stay below about L whatever the apply rate, and a far-behind client is fed as fast as it applies,
never faster. While the window is full the feed also stops telling this client about its own
commits, so its submissions wait (back pressure on writers whose application cannot keep up)
instead of piling up. Runs on the client's event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from waltz.client.connection import ServerConnection
from waltz.client.metrics import PartitionMetrics
from waltz.client.waiting import Watermark
from waltz.protocol import client_pb2
from waltz.protocol.records import ReqId

__all__ = ["FeedWindow"]


class FeedWindow:
    """One partition's feed window: its first end at a mount, and the grants that follow.

    Args:
        partition_id: the partition.
        limit: ``client.maxApplyBacklog``: transactions the server may feed beyond what the
            application applied (0: no limit, no window).
        applied: the partition's applied mark.
        applied_mark: the applied mark counting the floors a mount queued and the apply worker
            has not taken yet (:attr:`ApplyWorker.applied_mark
            <waltz.client.apply_worker.ApplyWorker.applied_mark>`): a mount's window starts there.
        req_id: makes the ReqId of a request under a generation (the client's ID and its next
            sequence number).
        metrics: the partition's counters (``feed_windows``).
    """

    def __init__(
        self,
        partition_id: int,
        limit: int,
        applied: Watermark,
        applied_mark: Callable[[], int],
        req_id: Callable[[int], ReqId],
        metrics: PartitionMetrics,
    ) -> None:
        self._partition_id = partition_id
        self._limit = limit
        self._applied = applied
        self._applied_mark = applied_mark
        self._req_id = req_id
        self._metrics = metrics
        self._task: asyncio.Task[None] | None = None
        self.end: int | None = None
        """The highest transaction ID the server may feed, or None (no limit, or not mounted)."""

    def first_end(self, mount_mark: int) -> int | None:
        """The feed window of a mount: ``applied + L`` (at least one past the mount's mark, for a
        remount while a full window still waits to be applied); None without a limit.

        ``applied`` counts the floor the mount just queued (a first mount's callbacks' mark): the
        worker thread takes it a moment later, and a window from the mark before it would start
        short by as much, too little for a grant to follow before the application applies more.
        """
        limit = self._limit
        if limit <= 0:
            return None
        return max(self._applied_mark() + limit, mount_mark + 1)

    def start(self, connection: ServerConnection, generation: int, window_end: int | None) -> None:
        """Grant the mount's feed window more as the application applies (a task per mount,
        until :meth:`stop` or until the connection closes)."""
        self.stop()
        self.end = window_end
        if window_end is not None:
            self._task = asyncio.get_running_loop().create_task(
                self._grant(connection, generation, window_end),
                name=f"waltz-feed-window-{self._partition_id}",
            )

    def stop(self) -> None:
        """Stop granting (the mount it belongs to is over: a remount, an unmount, a close)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()

    async def _grant(self, connection: ServerConnection, generation: int, window_end: int) -> None:
        """Each time half a window more is applied, send ``FeedWindow(applied + L)``.

        Ends with the mount it belongs to (cancelled by :meth:`stop`) or when its connection
        breaks; every round waits for the application to apply more.
        """
        limit = self._limit
        step = max(1, limit // 2)
        while not connection.closed:
            await self._applied.wait_async(window_end - limit + step)
            if connection.closed:
                return
            new_end = self._applied.value + limit
            message = client_pb2.ClientMessage(
                feed_window=client_pb2.FeedWindow(
                    req_id=self._req_id(generation).to_proto(), window_end=new_end
                )
            )
            try:
                connection.send(message)
            except ConnectionError:
                return  # the remount sends a window of its own
            window_end = self.end = new_end
            self._metrics.feed_windows.inc()
