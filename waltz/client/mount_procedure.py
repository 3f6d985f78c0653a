"""The mount procedure of a client partition: its life cycle, placement and connection.

Source: docs/design/client.md "Mount and the client high-water mark" (the reconnect procedure, also
used for a first mount and for every reassignment), "Reconnect"; ``docs/protocol.md`` "Mount",
"Unmount". Runs on the client's event loop:

1. appends are blocked (the partition queues them while it is not mounted);
2. the partition gets a connection to the server the assignment names (a new network client
   with a new sequence number when the old one broke);
3. it sends ``MountRequest`` with the high-water mark to restart the feed from
   (:meth:`MountSteps.mount_from`) and the mount's feed window
   (:class:`~waltz.client.feed_window.FeedWindow`);
4. feed entries are processed by the transaction monitor as usual;
5. on ``MountResponse(partition_ready=true)`` every append still pending failed (the server
   holds nothing of it any more) and is re-executed;
6. appends are unblocked (:meth:`MountSteps.on_mounted` does both).

A "not ready" answer means the server does not own the partition under that generation: the
assignment is read again and the procedure starts over, with a backoff of up to
:data:`MAX_MOUNT_BACKOFF`. A refusal because the client's mark is above the partition's
high-water mark (``CLIENT_AHEAD_OF_LOG``) keeps the partition unmounted: the application is told,
the partition's appends end with the refusal (:meth:`MountSteps.on_refused`), and the procedure
asks again every :data:`REFUSED_MOUNT_PAUSE` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

from waltz.client.arguments import check_client_mark
from waltz.client.callbacks import WaltzClientCallbacks
from waltz.client.connection import ServerConnection
from waltz.client.feed_window import FeedWindow
from waltz.client.metrics import PartitionMetrics
from waltz.errors import ClientAheadOfLogError, ServerFeedError
from waltz.protocol import client_pb2
from waltz.protocol.records import ReqId

__all__ = [
    "MAX_MOUNT_BACKOFF",
    "REFUSED_MOUNT_PAUSE",
    "MountHost",
    "MountProcedure",
    "MountSteps",
    "PartitionState",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Longest pause between mount attempts, in seconds.
MAX_MOUNT_BACKOFF = 1.0
#: Seconds a partition may fail to reach its server before it is logged as a warning (a server's
#: restart or a move of the partition takes less); then again every ``MOUNT_WARNING_INTERVAL``.
MOUNT_WARNING_AFTER = 5.0
MOUNT_WARNING_INTERVAL = 30.0
#: Seconds between mounts of a partition whose server refused the client's mark as above its
#: high-water mark (docs/design/client.md "Mount and the client high-water mark"): no backoff
#: makes a database ahead of the log right, but a view of the owner that was stale (a server
#: fenced without knowing it yet) is corrected by asking again, after a fresh read of the
#: assignment.
REFUSED_MOUNT_PAUSE = 10.0


class PartitionState(enum.Enum):
    """Where a client partition is in its life cycle."""

    UNMOUNTED = "unmounted"
    MOUNTING = "mounting"
    MOUNTED = "mounted"
    CLOSED = "closed"


# Module constants for the frequent checks (an enum member read through its class costs more).
_MOUNTING = PartitionState.MOUNTING
_MOUNTED = PartitionState.MOUNTED


class MountHost(Protocol):
    """What the mount procedure needs from the client (all on the event loop)."""

    callbacks: WaltzClientCallbacks

    async def connection(self, endpoint: str) -> ServerConnection:
        """A live connection to ``endpoint`` (a new network client when there is none)."""
        ...

    def refresh_assignment(self) -> None:
        """Re-read the partition assignment from ZooKeeper (it may have changed)."""
        ...

    async def previous_apply_ended(self, partition_id: int) -> None:
        """Wait until no apply of an earlier mount of the partition runs (one an unmount left
        running); at once when there is none."""
        ...


class MountSteps(Protocol):
    """The steps of the procedure that belong to the partition it mounts (its feed, its appends)."""

    def mount_from(self, callbacks_mark: int) -> int:
        """The high-water mark to mount from, given the callbacks' (step 3); the feed restarts
        after it."""
        ...

    def on_mounted(self, mount_mark: int) -> None:
        """The server is ready (the state is MOUNTED): fail every append still pending, send the
        blocked ones (steps 5 and 6)."""
        ...

    def on_remount(self) -> None:
        """The partition mounts again: forget what was asked on the connection before."""
        ...

    def on_refused(self, error: ClientAheadOfLogError) -> None:
        """The server refused the mount: the client's mark is above the partition's high-water
        mark. End the partition's appends (sent, held, blocked) with ``error``."""
        ...


class MountProcedure:
    """One partition's mount state and the task that mounts it.

    Args:
        partition_id: the partition.
        host: the client.
        steps: the partition's own steps of the procedure.
        window: the partition's feed window (each mount starts it; a remount, an unmount and a
            close stop it).
        req_id: makes the ReqId of a request under a generation (the client's ID and its next
            sequence number).
        metrics: the partition's counters (``remounts``).
    """

    def __init__(
        self,
        partition_id: int,
        host: MountHost,
        steps: MountSteps,
        window: FeedWindow,
        req_id: Callable[[int], ReqId],
        metrics: PartitionMetrics,
    ) -> None:
        self._partition_id = partition_id
        self._host = host
        self._steps = steps
        self._window = window
        self._req_id = req_id
        self._metrics = metrics
        self.state = PartitionState.UNMOUNTED
        self.endpoint: str | None = None
        """The server the assignment names for the partition (None: no server)."""
        self.generation = -1
        """The partition's generation as the assignment names it (-1: not known yet)."""
        self.connection: ServerConnection | None = None
        """The connection of the latest mount request (None: none, or it broke)."""
        self.mounts = 0
        """Mounts that succeeded."""
        self._mounted = asyncio.Event()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._request: ReqId | None = None
        self._response: asyncio.Future[bool] | None = None
        self._unreached_since: float | None = None
        self._warned_at: float | None = None
        self.last_failure: str | None = None
        """Why the latest try to mount failed (a connection refused or broken before the mount was
        answered), until the partition is mounted; for the errors of a mount that times out."""
        self.refusal: ClientAheadOfLogError | None = None
        """Why the server refused the latest mount (the client's mark is above the partition's
        high-water mark), until a mount succeeds or the partition stops: the partition's appends
        end with it."""
        self._refused = asyncio.Event()  # set while refusal is
        self._refused_request: ReqId | None = None  # the mount request the latest refusal answered
        self._refusal_logged_at: float | None = None

    @property
    def wanted(self) -> bool:
        """True while the application wants the partition mounted."""
        state = self.state
        return state is _MOUNTED or state is _MOUNTING

    @property
    def mounted(self) -> bool:
        """True when the partition is mounted and appends flow."""
        return self.state is _MOUNTED

    async def wait_mounted(self) -> None:
        """Wait until the partition is mounted.

        Raises:
            ClientAheadOfLogError: the server refused the mount: the client's mark is above the
                partition's high-water mark (docs/design/client.md "Mount and the client
                high-water mark").
        """
        while not self._mounted.is_set():
            if self.refusal is not None:
                raise self.refusal
            loop = asyncio.get_running_loop()
            waits = {loop.create_task(self._mounted.wait()), loop.create_task(self._refused.wait())}
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()

    def start(self) -> None:
        """Start mounting an unmounted partition."""
        self.state = PartitionState.MOUNTING
        self._start_task()

    def remount(self, reason: str) -> None:
        """Run the reconnect procedure: block appends, mount again (docs/design/client.md "Reconnect")."""
        if not self.wanted:
            return
        log.info("partition %d: mounting again (%s)", self._partition_id, reason)
        self._metrics.remounts.inc()
        self._window.stop()
        self.state = PartitionState.MOUNTING
        self._mounted.clear()
        self._steps.on_remount()
        self._start_task()

    def _start_task(self) -> None:
        self._wakeup.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._mount_loop(), name=f"waltz-mount-{self._partition_id}"
            )
            self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """A mount task's end: an exception that escaped it is logged and told to the application
        (the partition stays unmounted until the next remount), never dropped unseen."""
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("partition %d: mounting failed: %r", self._partition_id, exc, exc_info=exc)
            self._report(exc)

    def stop(self, *, unmount: bool) -> None:
        """Stop mounting and forget the connection (the partition unmounts, or closes).

        Args:
            unmount: tell the server on the partition's connection to stop its feed
                (``UnmountRequest``, ``docs/protocol.md`` "Unmount"); False when the connections
                close anyway (the client closes).
        """
        if unmount and self.wanted:
            self._send_unmount()
        self.state = PartitionState.UNMOUNTED
        self._mounted.clear()
        self._clear_refusal()
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self._window.stop()
        self.connection = None

    def close(self) -> None:
        """Stop for good: the partition never mounts again. Idempotent."""
        self.stop(unmount=False)
        self.state = PartitionState.CLOSED

    def _send_unmount(self) -> None:
        """Ask the server of the current connection to stop feeding this partition to it."""
        connection = self.connection
        if connection is None or connection.closed:
            return  # no mount sent on a live connection: nothing to stop
        req_id = self._req_id(self.generation)
        message = client_pb2.ClientMessage(
            unmount=client_pb2.UnmountRequest(req_id=req_id.to_proto(), seq_num=connection.seq_num)
        )
        try:
            connection.send(message)
        except ConnectionError:
            return  # the stream just ended: the server forgets its feeds with it
        log.info("partition %d: unmounted from %s", self._partition_id, connection.endpoint)

    def set_placement(self, endpoint: str | None, generation: int) -> None:
        """Take the partition's place from the assignment; a change means mounting again."""
        if generation < self.generation or (generation == self.generation and endpoint == self.endpoint):
            return  # older news, or no news
        moved = self.generation >= 0
        self.endpoint, self.generation = endpoint, generation
        if moved:
            self.remount(f"assigned to {endpoint or 'no server'} with generation {generation}")
        else:
            self._wakeup.set()

    def connection_lost(self, connection: ServerConnection) -> None:
        """A connection broke: when it is the partition's, mount again (with a new network client)."""
        if connection is self.connection:
            self.connection = None
            self.remount(f"connection to {connection.endpoint} lost")

    def on_response(self, response: client_pb2.MountResponse) -> None:
        """A mount response arrived on the partition's connection."""
        if self._request is not None and ReqId.from_proto(response.req_id) == self._request:
            future = self._response
            if future is not None and not future.done():
                future.set_result(response.partition_ready)

    def on_error(self, req_id: ReqId, error: client_pb2.ServerError) -> bool:
        """A server error names ``req_id``: when it is the mount request's, that mount is not
        ready (True); False for another request.

        ``CLIENT_AHEAD_OF_LOG``: the client's mark is above the partition's high-water mark
        (docs/protocol.md "Mount"); the partition stays unmounted (see :meth:`_refuse`). Any other
        error: the server could not feed the partition from the client's position (an archived
        range it cannot read: docs/design/archive.md, "Reads below the local start"); the
        application is told with a :class:`~waltz.errors.ServerFeedError` carrying the server's
        message, and the procedure mounts again after its backoff.
        """
        if self._request is None or req_id != self._request:
            return False
        endpoint = self.endpoint or "the server"
        if error.code == client_pb2.CLIENT_AHEAD_OF_LOG:
            self._refused_request = req_id
            self._refuse(
                ClientAheadOfLogError(
                    self._partition_id,
                    endpoint,
                    error.client_high_water_mark,
                    error.high_water_mark,
                    error.message,
                )
            )
        else:
            self._report(ServerFeedError(self._partition_id, endpoint, error.message))
        future = self._response
        if future is not None and not future.done():
            future.set_result(False)
        return True

    def _refuse(self, error: ClientAheadOfLogError) -> None:
        """The server refused the mount: the client's mark is above the partition's high-water
        mark (docs/design/client.md "Mount and the client high-water mark"). The first refusal
        is logged at ERROR and told to the application (``uncaught_exception``); the partition's
        appends end with ``error``, as every append until a mount succeeds; a refusal again is
        logged as a warning every ``MOUNT_WARNING_INTERVAL`` seconds."""
        now = asyncio.get_running_loop().time()
        first = self.refusal is None
        self.refusal = error
        self.last_failure = str(error)
        self._refused.set()
        if first:
            self._refusal_logged_at = now
            log.error("%s", error)
            self._report(error)
        elif self._refusal_logged_at is None or now - self._refusal_logged_at >= MOUNT_WARNING_INTERVAL:
            self._refusal_logged_at = now
            log.warning("still refused: %s", error)
        else:
            log.info("refused again: %s", error)
        self._steps.on_refused(error)

    def _clear_refusal(self) -> None:
        self.refusal = None
        self._refused.clear()
        self._refused_request = self._refusal_logged_at = None

    def _cannot_connect(self, endpoint: str, exc: BaseException, tried_at: float, now: float) -> None:
        """Log a failed connection: at INFO until the partition has tried for
        ``MOUNT_WARNING_AFTER`` seconds, then as a warning, again every ``MOUNT_WARNING_INTERVAL``."""
        self.last_failure = str(exc)
        if self._unreached_since is None:
            self._unreached_since = tried_at
        failing = now - self._unreached_since
        due = self._warned_at is None or now - self._warned_at >= MOUNT_WARNING_INTERVAL
        if failing >= MOUNT_WARNING_AFTER and due:
            self._warned_at = now
            log.warning(
                "partition %d: cannot mount on %s for %.0fs: %s", self._partition_id, endpoint, failing, exc
            )
        else:
            log.info("partition %d: cannot mount on %s yet: %s", self._partition_id, endpoint, exc)

    async def _mount_loop(self) -> None:
        backoff = 0.05
        loop = asyncio.get_running_loop()
        while self.state is _MOUNTING:
            self._wakeup.clear()
            # An apply an unmount left running ends before the callbacks' mark is read: its
            # transaction must not be fed to this mount's worker too.
            await self._host.previous_apply_ended(self._partition_id)
            endpoint, generation = self.endpoint, self.generation
            if endpoint is None:
                await self._wakeup.wait()
                continue
            tried_at = loop.time()
            try:
                # A connection to a dead server takes a while to fail: a new assignment wins.
                connection = await self._unless_woken(self._host.connection(endpoint))
            except Exception as exc:
                self._cannot_connect(endpoint, exc, tried_at, loop.time())
                await self._pause(backoff)
                backoff = min(MAX_MOUNT_BACKOFF, backoff * 2)
                continue
            if connection is None:
                continue
            try:
                high_water_mark = check_client_mark(
                    await asyncio.to_thread(
                        self._host.callbacks.get_client_high_water_mark, self._partition_id
                    ),
                    f"the mark get_client_high_water_mark({self._partition_id}) returned",
                )
            except Exception as exc:
                log.warning(
                    "partition %d: no valid get_client_high_water_mark: %r; mounting again in %.2fs",
                    self._partition_id,
                    exc,
                    backoff,
                )
                self._report(exc)
                await self._pause(backoff)
                backoff = min(MAX_MOUNT_BACKOFF, backoff * 2)
                continue
            if self._wakeup.is_set() or self.state is not _MOUNTING:
                continue  # the assignment changed meanwhile
            self.connection = connection
            self._window.stop()  # it granted on the connection before, if any
            mount_mark = self._steps.mount_from(high_water_mark)
            req_id = self._req_id(generation)
            response: asyncio.Future[bool] = loop.create_future()
            self._request, self._response = req_id, response
            window_end = self._window.first_end(mount_mark)
            message = client_pb2.ClientMessage(
                mount=client_pb2.MountRequest(
                    req_id=req_id.to_proto(),
                    client_high_water_mark=mount_mark,
                    seq_num=connection.seq_num,
                    feed_window=0 if window_end is None else window_end - mount_mark,
                )
            )
            try:
                connection.send(message)
            except ConnectionError:
                continue
            self._window.start(connection, generation, window_end)
            wakeup = loop.create_task(self._wakeup.wait())
            waiting: set[asyncio.Future[Any]] = {response, wakeup}
            try:
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            finally:
                wakeup.cancel()
            changed = self._wakeup.is_set() or connection is not self.connection or connection.closed
            if changed or not response.done() or self.state is not _MOUNTING:
                if connection.closed and not response.done() and self.state is _MOUNTING:
                    # The connection broke before the mount was answered: a server that refuses
                    # this client (a certificate of another role) ends every stream at once. Say
                    # why, and back off (its loss woke this loop: that is no news to hurry for).
                    lost = connection.error or ConnectionError(f"connection to {endpoint} closed")
                    self._cannot_connect(endpoint, lost, tried_at, loop.time())
                    self._wakeup.clear()
                    await self._pause(backoff)
                    backoff = min(MAX_MOUNT_BACKOFF, backoff * 2)
                continue  # something changed (connection, assignment): start over
            if response.result():
                if self._ready(mount_mark):
                    return
                continue  # lost again while unblocking appends: this task mounts again
            if self._refused_request == req_id:
                # The client's mark is above the log's: ask again after a while, in case the
                # owner named by a stale assignment answered (a fresh read may name another).
                self._host.refresh_assignment()
                await self._pause(REFUSED_MOUNT_PAUSE)
                continue
            log.info(
                "partition %d: %s is not ready for it under generation %d; retrying",
                self._partition_id,
                endpoint,
                generation,
            )
            self._host.refresh_assignment()
            await self._pause(backoff)
            backoff = min(MAX_MOUNT_BACKOFF, backoff * 2)

    def _ready(self, mount_mark: int) -> bool:
        """The mount succeeded: the partition's steps 5 and 6; False when the partition was lost
        meanwhile (it mounts again)."""
        self.mounts += 1
        self._unreached_since = self._warned_at = self.last_failure = None
        if self.refusal is not None:
            log.info("partition %d: mounted; the refusal before has passed", self._partition_id)
        self._clear_refusal()
        self._request = self._response = None
        self.state = PartitionState.MOUNTED
        self._mounted.set()
        self._steps.on_mounted(mount_mark)
        return self.state is _MOUNTED

    def _report(self, exception: BaseException) -> None:
        """Tell the application about an exception of its callbacks, or why the server cannot feed
        the partition (transaction ID -1: none)."""
        try:
            self._host.callbacks.uncaught_exception(self._partition_id, -1, exception)
        except Exception:
            log.exception("partition %d: uncaught_exception raised", self._partition_id)

    async def _unless_woken(self, awaitable: Coroutine[Any, Any, T]) -> T | None:
        """Await ``awaitable`` unless a remount (new assignment, lost connection) comes first."""
        loop = asyncio.get_running_loop()
        task = loop.create_task(awaitable)
        wakeup = loop.create_task(self._wakeup.wait())
        waiting: set[asyncio.Future[Any]] = {task, wakeup}
        try:
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        finally:
            wakeup.cancel()
        if not task.done():
            task.cancel()
            return None
        return task.result()

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wakeup.wait(), seconds)
