"""The client's core: its partitions, discovery, connections and server messages, on the client loop.

Source: docs/design/client.md "The client's parts" (the connections are in
:mod:`waltz.client.connection_pool`, the data RPCs in :mod:`waltz.client.transaction_data`, the
attempt path of submitted contexts in :mod:`waltz.client.attempt_runner`; an asyncio core on its
own thread, a synchronous facade and an async API on top, in :mod:`waltz.client.client`).
Application code never runs on the core's event loop: ``execute`` runs on the submitting thread
(first attempt) or a retry thread, the context callbacks on a retry thread (a committed context's
on the completion thread), ``apply_transaction`` on the partition's apply thread, and
``get_client_high_water_mark`` of a mount on a worker thread of the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from waltz.client.apply_worker import ApplyWorker
from waltz.client.attempt_runner import AttemptRunner
from waltz.client.callbacks import WaltzClientCallbacks
from waltz.client.client_partition import ClientPartition
from waltz.client.config import WaltzClientConfig
from waltz.client.connection import ServerConnection, tls_hint
from waltz.client.connection_pool import ConnectionPool
from waltz.client.discovery import ServerDiscovery
from waltz.client.exit_hook import close_at_exit
from waltz.client.in_flight import InFlight
from waltz.client.metrics import ClientMetrics, PartitionGauges
from waltz.client.mount_procedure import PartitionState
from waltz.client.routing import EpochRouting, SplitOrigin, opened_children
from waltz.client.transaction import TransactionDataSource
from waltz.client.transaction_data import REQUEST_TIMEOUT, TransactionDataClient
from waltz.client.waiting import Watermark
from waltz.errors import (
    ClientClosedError,
    WaltzClientError,
    WaltzTimeoutError,
)
from waltz.metadata.assignment import PartitionAssignment
from waltz.metadata.epochs import PartitionEpochs
from waltz.protocol import client_pb2
from waltz.protocol.event_loop import shared_event_loop
from waltz.protocol.records import ReqId
from waltz.tracing import client_tracing

if TYPE_CHECKING:
    from waltz.tracing import ClientTracing

__all__ = ["ClientCore"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_INT32_MAX = (1 << 31) - 1

#: Seconds ``set_partitions`` waits for the apply in progress of a partition it unmounts; past
#: them it returns, and a mount of the partition waits for that apply (docs/design/client.md
#: "Applying transactions").
UNMOUNT_APPLY_WAIT = 10.0
#: Seconds between two looks of a mount at an apply left running by an unmount.
_RETIRING_POLL = 0.05


class ClientCore:
    """Everything of a client but its public API (see :class:`waltz.client.client.WaltzClient`).

    Construction blocks: it connects to ZooKeeper, takes a client ID, reads the number of
    partitions, starts the event loop thread and (with auto-mount) starts mounting every partition.
    The new children of splits become partitions of the client as the epochs' watch shows them
    opened (docs/design/splits.md "Clients across a split"), mounted at once with auto-mount.

    Args:
        callbacks: the application's callbacks.
        config: the client configuration.
        metrics: the metrics to count in (default: new ones); their gauges then read this core's
            partitions.

    Raises:
        ExpiredCertificateError: ``client.ssl.certFile`` or ``zookeeper.ssl.certFile`` has
            expired (the servers and ZooKeeper would refuse it, saying nothing of dates); nothing
            is contacted (docs/operations.md, "Certificates").
        ConfigurationError: a TLS file cannot be used: missing, not PEM, or a ``client.ssl.keyFile``
            that is not the certificate's key (a ``TlsFilesError``); nothing is contacted.
        ZooKeeperUnavailableError: ZooKeeper did not answer.
        ClusterNotFoundError: no cluster under ``config.cluster_root``.
    """

    def __init__(
        self, callbacks: WaltzClientCallbacks, config: WaltzClientConfig, metrics: ClientMetrics | None = None
    ) -> None:
        self.callbacks = callbacks
        self.config = config
        self.metrics = metrics if metrics is not None else ClientMetrics()
        config.check_files()  # a key not the certificate's fails here, not in a handshake
        tls = config.tls()
        self._discovery = ServerDiscovery(
            config.zookeeper_connect_string,
            config.cluster_root,
            session_timeout=config.zookeeper_session_timeout,
            connect_timeout=config.zookeeper_session_timeout,
            security=config.zookeeper_security(),
        )
        self._closed = False
        self._seq = 0
        self._tls = tls
        self._pool = ConnectionPool(
            on_messages=self._on_messages,
            on_lost=self._connection_lost,
            tls=tls,
            max_message_bytes=config.client_max_message_bytes,
        )
        self._hwm_requests: dict[int, asyncio.Future[int]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._waits: set[concurrent.futures.Future[Any]] = set()  # _wait_on_loop's, until done
        self._waits_lock = threading.Lock()
        # Partition -> the apply workers of its unmounts whose threads may still run (on the loop).
        self._retiring: dict[int, list[ApplyWorker]] = {}
        self.metrics.watch(self.partition_gauges)
        self._tracing: ClientTracing | None = None
        try:
            self.client_id = self._discovery.next_client_id()
            if config.client_tracing:  # OpenTelemetry is imported only then (docs/tracing.md)
                self._tracing = client_tracing(self.client_id, config.client_tracing_sample_ratio)
            self.initial_count = self._discovery.num_partitions
            """The partition count of ``discovery``: the count the cluster was created with."""
            self.routing = EpochRouting(self.initial_count)
            """The client's view of ``partitions/epochs``, by which contexts are routed
            (docs/design/splits.md "Clients across a split")."""
            self._loop, self._thread = shared_event_loop()
            self.partitions: dict[int, ClientPartition] = {}
            self.data_client = TransactionDataClient(
                self._loop,
                self._thread,
                self._pool,
                self.partitions,
                self.client_id,
                self.next_seq_num,
                config.client_transaction_data_timeout,
            )
            self.data_source: TransactionDataSource = self.data_client
            self.in_flight = InFlight(range(self.initial_count), config.client_max_concurrent_transactions)
            """The submitted contexts that have not ended, with their partitions' concurrency slots."""
            self.attempts = AttemptRunner(
                self.client_id,
                config,
                callbacks,
                self.metrics,
                self._loop,
                self.partitions,
                self.in_flight,
                self._spawn,
                self.nudge,
                self._tracing,
                self.routing,
            )
            """The attempt path of the contexts submitted to this client."""
            self.partitions.update(self._call(self._create_partitions()))
            self._discovery.watch_epochs(self._epochs_changed)  # read once before any submit
            self._discovery.watch_assignment(self._assignment_changed)
            # With auto-mount, mount every partition; either way, once this returns the client
            # has the partitions of the children its first read of the epochs showed opened.
            self._call(self._mount(range(self.initial_count) if config.client_auto_mount else ()))
        except BaseException:
            self.close()
            raise
        close_at_exit(self)
        log.info(
            "Waltz client %d started on %s%s (%d partitions)",
            self.client_id,
            config.zookeeper_connect_string,
            config.cluster_root,
            self.num_partitions,
        )

    # --- the event loop ----------------------------------------------------------------------------

    def _call(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run a coroutine on the core loop from another thread and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def _wait_on_loop(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start a wait on the core loop for a caller on another thread or loop.

        Cancelling the returned future cancels the wait (an ``asyncio`` caller's cancelled await
        leaves nothing running); :meth:`close` cancels every wait still running, and
        :meth:`_block` and :meth:`_await` then raise :class:`ClientClosedError`.

        Raises:
            ClientClosedError: the client is closed.
        """
        if self._closed:
            coroutine.close()
            self.check_open()
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        with self._waits_lock:
            self._waits.add(future)
            closed = self._closed  # set before close() cancels the waits it holds
        future.add_done_callback(self._wait_done)
        if closed:
            future.cancel()
        return future

    def _wait_done(self, future: concurrent.futures.Future[Any]) -> None:
        with self._waits_lock:
            self._waits.discard(future)

    def _cancel_waits(self) -> None:
        with self._waits_lock:
            waits = list(self._waits)
        for future in waits:
            future.cancel()

    def _closed_while(self, what: str) -> ClientClosedError:
        return ClientClosedError(f"Waltz client {self.client_id} closed while {what}")

    def _block(self, future: concurrent.futures.Future[T], what: str) -> T:
        """The result of a wait from :meth:`_wait_on_loop`, on a thread that may block."""
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            if self._closed:
                raise self._closed_while(what) from None
            raise
        except BaseException:
            future.cancel()  # interrupted (Ctrl-C): the wait on the loop ends too
            raise

    async def _await(self, future: concurrent.futures.Future[T], what: str) -> T:
        """The result of a wait from :meth:`_wait_on_loop`, awaited on the caller's loop;
        cancelling the await cancels the wait."""
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._closed and (task is None or task.cancelling() == 0):
                raise self._closed_while(what) from None
            raise

    def _spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        task = self._loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("client task failed", exc_info=task.exception())

    @property
    def num_partitions(self) -> int:
        """The newest count in the client's view of the partition epochs, finished or not: what
        ``TransactionContext.partition_id`` is asked with (docs/design/splits.md "Clients across a
        split"); the count of ``discovery`` when the cluster never split."""
        routing: EpochRouting | None = getattr(self, "routing", None)
        return routing.view.count if routing is not None else self._discovery.num_partitions

    @property
    def partition_ids(self) -> tuple[int, ...]:
        """The partitions that exist in the client's view of the partition epochs: those at
        creation and every new partition of a split once opened (docs/design/splits.md "Clients
        across a split")."""
        routing: EpochRouting | None = getattr(self, "routing", None)
        if routing is None:
            return tuple(range(self._discovery.num_partitions))
        return routing.view.partition_ids

    def first_transaction_id(self, partition_id: int) -> int:
        """Where the partition's log starts in the client's view of the partition epochs: 0, or a
        new partition's genesis, ``B(p) + 1`` (docs/design/splits.md "The handover", step 4)."""
        routing: EpochRouting | None = getattr(self, "routing", None)
        if routing is None:
            return 0
        return routing.view.first_ids.get(partition_id, 0)

    async def _create_partitions(self) -> dict[int, ClientPartition]:
        return {pid: self._new_partition(pid) for pid in range(self.initial_count)}

    def _new_partition(self, pid: int, origin: SplitOrigin | None = None) -> ClientPartition:
        return ClientPartition(
            pid,
            self,
            self.attempts,
            self.config.client_max_apply_batch_size,
            self.metrics.partition(pid),
            apply_linger=self.config.client_apply_linger,
            max_apply_backlog=self.config.client_max_apply_backlog,
            hold_conflicting_appends=self.config.client_hold_conflicting_appends,
            retry_linger=self.config.client_retry_linger,
            origin=origin,
        )

    def _add_children(self, epochs: PartitionEpochs) -> None:
        """Make a partition of every new child the epochs show opened that the client does not
        have yet (on the loop; docs/design/splits.md "Clients across a split"): its slots, its
        floor ``B(p)``, its metrics; with auto-mount it starts mounting. Contexts waiting for a
        partition the client did not have then route again."""
        if self._closed:
            return
        added: list[SplitOrigin] = []
        for child, origin in opened_children(epochs).items():
            if child in self.partitions:
                continue
            self.in_flight.add_partition(child)
            self.attempts.set_floor(child, origin.barrier)
            partition = self._new_partition(child, origin)
            if self.config.client_auto_mount:
                partition.mount()
            # Published once mounting: a submitting thread that finds it must not see it unwanted
            # (it would refuse the context as routed to a partition the client does not mount).
            self.partitions[child] = partition
            added.append(origin)
        if not added:
            return
        for origin in added:
            log.info(
                "Waltz client %d: partition %d, a child of partition %d in epoch %d, opened at its floor "
                "%d (%s)",
                self.client_id,
                origin.child,
                origin.parent,
                origin.epoch,
                origin.barrier,
                "mounting it" if self.config.client_auto_mount else "set_partitions may mount it",
            )
        self._spawn(self._refresh_assignment())
        self.routing.wake()

    def own_applied_mark(self, partition_id: int) -> Watermark | None:
        """This client's applied mark of a partition it mounts (None: it does not mount it); any
        thread (a child's genesis hold reads its parent's)."""
        partition = self.partitions.get(partition_id)
        if partition is None or not partition.wanted:
            return None
        return partition.applied

    # --- PartitionHost ----------------------------------------------------------------------------

    def next_seq_num(self) -> int:
        """The next ReqId sequence number (loop only)."""
        self._seq = self._seq + 1 if self._seq < _INT32_MAX else 1
        return self._seq

    async def connection(self, endpoint: str) -> ServerConnection:
        """A live connection to ``endpoint`` (see :meth:`ConnectionPool.get`)."""
        return await self._pool.get(endpoint)

    def refresh_assignment(self) -> None:
        """Re-read the assignment from ZooKeeper in the background."""
        if not self._closed:
            self._spawn(self._refresh_assignment())

    async def _refresh_assignment(self) -> None:
        try:
            assignment = await asyncio.to_thread(self._discovery.read_assignment)
        except Exception as exc:
            log.info("cannot read the partition assignment: %s", exc)
            return
        self._apply_assignment(assignment)

    def _assignment_changed(self, assignment: PartitionAssignment) -> None:
        """The assignment watch fired (on a kazoo thread)."""
        if not self._closed:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self._apply_assignment, assignment)

    def _epochs_changed(self, epochs: PartitionEpochs, version: int) -> None:
        """The epochs' watch fired (on a kazoo thread): a new routing view, and the partitions of
        the children opened since (made on the loop)."""
        if not self._closed:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self._add_children, epochs)
        if self.routing.update(epochs, version):
            log.info(
                "Waltz client %s: partitions/epochs at version %d (epoch %d, %d partitions)",
                getattr(self, "client_id", "?"),
                version,
                epochs.current_number,
                epochs.current_count,
            )

    def _apply_assignment(self, assignment: PartitionAssignment) -> None:
        for pid, placement in assignment.placements.items():
            partition = self.partitions.get(pid)
            if partition is not None:
                partition.set_placement(placement.endpoint, placement.generation)

    # --- messages from servers --------------------------------------------------------------------

    def _on_messages(
        self, connection: ServerConnection, messages: Sequence[client_pb2.ServerMessage]
    ) -> None:
        partitions = self.partitions
        fed: set[ClientPartition] = set()
        for message in messages:
            kind = message.WhichOneof("body")
            if kind == "feed_entries":
                feed = message.feed_entries
                partition = partitions.get(feed.partition_id)
                if partition is not None:
                    partition.on_feed_entries(connection, feed)
                    fed.add(partition)
            elif kind == "high_water_mark":
                answer = message.high_water_mark
                partition = partitions.get(answer.req_id.partition_id)
                if partition is not None and answer.transaction_id > partition.server_high_water_mark:
                    partition.server_high_water_mark = answer.transaction_id
                future = self._hwm_requests.pop(answer.req_id.seq_num, None)
                if future is not None and not future.done():
                    future.set_result(answer.transaction_id)
            elif kind is not None:
                body = getattr(message, kind)
                partition = partitions.get(body.req_id.partition_id)
                if partition is not None:
                    partition.on_message(connection, kind, body)
                elif kind == "error":
                    log.warning("server %s reported an error: %s", connection.endpoint, body.message)
        for partition in fed:
            partition.end_of_batch()
        self.attempts.hand_over_completions()

    def _connection_lost(self, connection: ServerConnection) -> None:
        for partition in self.partitions.values():
            partition.connection_lost(connection)

    # --- submissions ------------------------------------------------------------------------------

    def check_open(self) -> None:
        if self._closed:
            raise ClientClosedError(f"Waltz client {self.client_id} is closed; create a new one")

    def applied_mark(self, partition_id: int) -> Watermark:
        """The applied high-water mark of a partition (see ``WaltzClient.wait_applied``).

        Raises:
            ValueError: no such partition.
        """
        partition = self.partitions.get(partition_id)
        if partition is None:
            raise ValueError(
                f"partition {partition_id} does not exist (this client has {sorted(self.partitions)})"
            )
        return partition.applied

    def nudge(self, partition_ids: Iterable[int] | None = None) -> None:
        """Send flush requests to partitions with appends pending (learn lost appends sooner)."""
        ids = list(self.partitions) if partition_ids is None else list(partition_ids)

        def send() -> None:
            for pid in ids:
                partition = self.partitions.get(pid)  # not a new partition of a split, not open here
                if partition is not None:
                    partition.send_flush()

        if not self._closed:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(send)

    # --- mounting ---------------------------------------------------------------------------------

    async def _mount(self, partition_ids: Iterable[int]) -> None:
        for pid in partition_ids:
            self.partitions[pid].mount()
        self._spawn(self._refresh_assignment())

    async def _set_partitions(self, partition_ids: set[int]) -> None:
        for pid, partition in list(self.partitions.items()):
            if pid in partition_ids:
                partition.mount()
            elif partition.wanted:
                worker = partition.detach()
                if worker is not None:
                    # Noted before the wait: a mount made meanwhile waits for this worker too.
                    self._retiring.setdefault(pid, []).append(worker)
                    await asyncio.to_thread(worker.close, UNMOUNT_APPLY_WAIT)
        self._spawn(self._refresh_assignment())

    async def previous_apply_ended(self, partition_id: int) -> None:
        """Wait (on the loop) until no apply of an earlier mount of the partition runs: an unmount
        stops the partition's apply worker after its apply in progress, and ``set_partitions``
        returns after :data:`UNMOUNT_APPLY_WAIT` seconds even when that apply still runs. A mount
        reads the callbacks' mark only after this, so the transaction that apply had is not
        handed to a second one beside it (docs/design/client.md "Applying transactions").
        Returns at once when there is no such apply."""
        workers = self._retiring.get(partition_id)
        waiting = False
        while workers:
            workers[:] = [worker for worker in workers if worker.running]
            if not workers:
                break
            if not waiting:
                waiting = True
                log.info(
                    "partition %d: mounting again once the apply_transaction still running since its "
                    "unmount returns",
                    partition_id,
                )
            await asyncio.sleep(_RETIRING_POLL)
        if waiting:
            log.info("partition %d: the apply left running at its unmount returned", partition_id)
        if workers is not None and not workers and self._retiring.get(partition_id) is workers:
            del self._retiring[partition_id]

    def set_partitions(self, partition_ids: Iterable[int]) -> None:
        """Mount exactly these partitions (auto-mount off); unmount the others, waiting up to
        :data:`UNMOUNT_APPLY_WAIT` seconds for each one's apply in progress (a mount of it waits
        for an apply still running then: :meth:`previous_apply_ended`).

        Raises:
            ValueError: a partition does not exist.
            WaltzError: a partition to unmount has transactions in flight (flush first).
        """
        self.check_open()
        wanted = set(partition_ids)
        bad = sorted(p for p in wanted if p not in self.partitions)
        if bad:
            raise ValueError(f"partitions {bad} do not exist (this client has {sorted(self.partitions)})")
        for pid, partition in list(self.partitions.items()):
            in_flight = self.in_flight.count(pid) if pid not in wanted and partition.wanted else 0
            if in_flight:
                raise WaltzClientError(
                    f"partition {pid} has {in_flight} transaction(s) in flight; flush() before unmounting it"
                )
        self._call(self._set_partitions(wanted))

    async def wait_mounted(self, partition_ids: Iterable[int]) -> None:
        """Wait (on the loop) until the partitions are mounted; raises a partition's
        :class:`~waltz.errors.ClientAheadOfLogError` when its server refused its mount."""
        for pid in partition_ids:
            await self.partitions[pid].wait_mounted()

    def _wanted_or(self, partition_ids: Iterable[int] | None) -> list[int]:
        """``partition_ids`` as a list, or every wanted partition for None.

        Raises:
            ValueError: a partition does not exist.
        """
        if partition_ids is None:
            return [p.partition_id for p in list(self.partitions.values()) if p.wanted]
        ids = list(partition_ids)
        bad = sorted(p for p in set(ids) if p not in self.partitions)
        if bad:
            raise ValueError(f"partitions {bad} do not exist (this client has {sorted(self.partitions)})")
        return ids

    async def _mounted_within(self, ids: list[int], timeout: float) -> None:
        """Wait (on the loop) until the partitions are mounted; WaltzTimeoutError after ``timeout``
        seconds, with each partition's state and what a failed TLS handshake suggests. Partitions
        mounted already return at once, whatever the timeout (zero included)."""
        if all(self.partitions[pid].mounted for pid in ids):
            return
        try:
            await asyncio.wait_for(self.wait_mounted(ids), timeout)
        except TimeoutError:
            states = {pid: repr(self.partitions[pid]) for pid in ids}
            said = tls_hint(self._tls)
            hint = f"; if no server accepted a connection, {said}" if said else ""
            raise WaltzTimeoutError(f"partitions not mounted within {timeout:g}s: {states}{hint}") from None

    def wait_until_mounted(self, timeout: float, partition_ids: Iterable[int] | None = None) -> None:
        """Block until the partitions (default: every wanted one) are mounted.

        Raises:
            WaltzTimeoutError: not mounted within ``timeout`` seconds.
            ClientAheadOfLogError: a server refused a partition's mount (docs/design/client.md
                "Mount and the client high-water mark").
            ClientClosedError: the client closed meanwhile.
        """
        ids = self._wanted_or(partition_ids)
        self._block(self._wait_on_loop(self._mounted_within(ids, timeout)), "waiting for a mount")

    async def wait_until_mounted_async(
        self, timeout: float, partition_ids: Iterable[int] | None = None
    ) -> None:
        """As :meth:`wait_until_mounted`, awaited on the caller's loop; cancelling the await ends
        the wait on the core loop too."""
        ids = self._wanted_or(partition_ids)
        await self._await(self._wait_on_loop(self._mounted_within(ids, timeout)), "waiting for a mount")

    async def _caught_up(self, timeout: float) -> dict[int, int]:
        """On the loop: every wanted partition mounted, then applied up to the committed high-water
        mark its server gives now (``WaltzClient.ready``), all within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        ids = self._wanted_or(None)
        await self._mounted_within(ids, timeout)
        marks = {pid: await self.high_water_mark(pid, max(0.0, deadline - time.monotonic())) for pid in ids}
        behind: dict[int, tuple[int, int]] = {}
        for pid, mark in marks.items():
            applied = self.partitions[pid].applied
            if not await applied.wait_async(mark, max(0.0, deadline - time.monotonic())):
                behind[pid] = (applied.value, mark)
        if behind:
            detail = ", ".join(
                f"partition {pid} applied {a} of {m}" for pid, (a, m) in sorted(behind.items())
            )
            raise WaltzTimeoutError(
                f"not caught up with the log within {timeout:g}s: {detail} (a slow or failing "
                "apply_transaction: see unhealthy_partitions())"
            )
        return marks

    def wait_ready(self, timeout: float) -> dict[int, int]:
        """Block until every wanted partition is mounted and applied up to its committed
        high-water mark asked of its server now (``WaltzClient.ready``).

        Returns:
            Partition ID -> the mark it caught up to.

        Raises:
            WaltzTimeoutError: not caught up within ``timeout`` seconds.
            ClientClosedError: the client closed meanwhile.
        """
        return self._block(self._wait_on_loop(self._caught_up(timeout)), "waiting until it is ready")

    async def wait_ready_async(self, timeout: float) -> dict[int, int]:
        """As :meth:`wait_ready`, awaited on the caller's loop; cancelling the await ends the wait
        on the core loop too."""
        return await self._await(self._wait_on_loop(self._caught_up(timeout)), "waiting until it is ready")

    # --- requests ---------------------------------------------------------------------------------

    async def high_water_mark(self, partition_id: int, timeout: float) -> int:
        """Ask the owner of a partition for its committed high-water mark (loop only).

        Raises:
            WaltzTimeoutError: no answer within ``timeout`` seconds (no owner, or it is not ready).
        """
        partition = self.partitions[partition_id]
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaltzTimeoutError(
                    f"partition {partition_id}: no high-water mark from {partition.endpoint} "
                    f"within {timeout:g}s"
                )
            endpoint = partition.endpoint
            if endpoint is None:
                await self._refresh_assignment()
                await asyncio.sleep(min(0.2, remaining))
                continue
            try:
                connection = await asyncio.wait_for(self._pool.get(endpoint), remaining)
            except (ConnectionError, TimeoutError):
                await asyncio.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
                continue
            req_id = ReqId(self.client_id, partition.generation, partition_id, self.next_seq_num())
            future: asyncio.Future[int] = self._loop.create_future()
            self._hwm_requests[req_id.seq_num] = future
            try:
                connection.send(
                    client_pb2.ClientMessage(
                        high_water_mark=client_pb2.HighWaterMarkRequest(req_id=req_id.to_proto())
                    )
                )
                return await asyncio.wait_for(
                    future, min(REQUEST_TIMEOUT, max(0.01, deadline - time.monotonic()))
                )
            except (ConnectionError, TimeoutError):
                continue  # dropped (stale generation, connection lost): try again with fresh news
            finally:
                self._hwm_requests.pop(req_id.seq_num, None)

    def _known_partition(self, partition_id: int) -> None:
        self.check_open()
        if partition_id not in self.partitions:
            raise ValueError(
                f"partition {partition_id} does not exist (this client has {sorted(self.partitions)})"
            )

    def get_high_water_mark(self, partition_id: int, timeout: float) -> int:
        """Blocking :meth:`high_water_mark` (ClientClosedError if the client closes meanwhile)."""
        self._known_partition(partition_id)
        future = self._wait_on_loop(self.high_water_mark(partition_id, timeout))
        return self._block(future, "asking for a high-water mark")

    async def get_high_water_mark_async(self, partition_id: int, timeout: float) -> int:
        """:meth:`high_water_mark` awaited on the caller's loop; cancelling the await cancels the
        request."""
        self._known_partition(partition_id)
        future = self._wait_on_loop(self.high_water_mark(partition_id, timeout))
        return await self._await(future, "asking for a high-water mark")

    # --- closing ----------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once :meth:`close` began."""
        return self._closed

    async def _shutdown(self) -> None:
        for partition in getattr(self, "partitions", {}).values():
            partition.close()
        for task in list(self._tasks):
            task.cancel()
        await self._pool.close()
        for future in self._hwm_requests.values():
            future.cancel()

    def in_flight_at_exit(self, wait: float) -> tuple[str, int, int]:
        """For the exit hook (:mod:`waltz.client.exit_hook`): this client's name in messages, how
        many transactions it had in flight, and how many still are after waiting up to ``wait``
        seconds for them to end."""
        name = f"Waltz client {getattr(self, 'client_id', '?')}"
        attempts: AttemptRunner | None = getattr(self, "attempts", None)
        if attempts is None:
            return name, 0, 0
        before = attempts.in_flight()
        if before:
            attempts.wait_idle(wait)
        return name, before, attempts.in_flight()

    def close(self, timeout: float = 10.0) -> None:
        """Stop everything; submissions still in flight fail with :class:`ClientClosedError`.

        Their appends may or may not have been committed: the log (the high-water mark after the
        next start) tells. Idempotent. Called on a thread of the client (a callback closing it),
        it waits for the client's other threads, not for its own, which ends once the callback
        returns (docs/design/client.md "WaltzClient and AsyncWaltzClient").
        """
        if self._closed:
            return
        self._closed = True
        self._cancel_waits()  # every wait ends now, not once the apply workers have stopped
        attempts: AttemptRunner | None = getattr(self, "attempts", None)
        if attempts is not None:
            attempts.closing()
        self._discovery.close()
        # Stop the apply workers first: an apply in progress may still fetch data over the loop.
        workers = [p.worker for p in list(getattr(self, "partitions", {}).values()) if p.worker is not None]
        for worker in workers:
            worker.close(timeout)
        thread = getattr(self, "_thread", None)
        if thread is not None and thread.is_alive():
            try:
                self._call(self._shutdown(), timeout)
            except Exception:
                log.exception(
                    "Waltz client %s: shutting down its connections failed", getattr(self, "client_id", "?")
                )
        closed = f"Waltz client {getattr(self, 'client_id', '?')} closed before the transaction was applied"
        for partition in list(getattr(self, "partitions", {}).values()):
            partition.applied.close(lambda: ClientClosedError(closed))
        data_client = getattr(self, "data_client", None)
        if data_client is not None:
            data_client.open = False
        if attempts is not None:
            try:
                attempts.close()
            except Exception:  # the rest of the close (client_closed) happens all the same
                log.exception(
                    "Waltz client %s: stopping its retry and completion threads failed",
                    getattr(self, "client_id", "?"),
                )
        if self._tracing is not None:
            self._tracing.close()
        try:
            callbacks = getattr(self, "callbacks", None)
            if callbacks is not None:
                callbacks.client_closed()
        except Exception:
            log.exception(
                "Waltz client %s: its callbacks' client_closed raised", getattr(self, "client_id", "?")
            )
        log.info("Waltz client %s closed", getattr(self, "client_id", "?"))

    def drop_connections(self, reason: str = "dropped on purpose") -> None:
        """Fault injection: break every server connection now, as a network failure would.

        Every mounted partition then runs the reconnect procedure (docs/design/client.md
        "Reconnect"). For fault tests.
        """

        if not self._closed:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._pool.abort_all, reason)

    # --- state for tests and metrics --------------------------------------------------------------

    @property
    def pending_waits(self) -> int:
        """Waits started on the core loop for callers (``ready``, ``wait_mounted``,
        ``get_high_water_mark``) that have not ended: 0 once each was answered or cancelled."""
        with self._waits_lock:
            return len(self._waits)

    def mounted_partitions(self) -> list[int]:
        """The partitions this client mounts (or is mounting), in order."""
        return sorted(pid for pid, p in list(self.partitions.items()) if p.wanted)

    def partition_states(self) -> dict[int, PartitionState]:
        """Partition ID -> its state."""
        return {pid: p.state for pid, p in list(self.partitions.items())}

    def held_partitions(self) -> dict[int, int]:
        """New children of a split whose apply holds their genesis (docs/design/splits.md "Clients
        across a split") -> the parent they wait for. A pause, not a failure: they are not among
        :meth:`unhealthy_partitions`."""
        return {
            pid: p.origin.parent
            for pid, p in list(getattr(self, "partitions", {}).items())
            if p.origin is not None and p.holding_genesis
        }

    def unhealthy_partitions(self) -> dict[int, BaseException | None]:
        """Partitions whose ``apply_transaction`` keeps failing -> the last exception."""
        return {
            pid: p.worker.last_error
            for pid, p in list(getattr(self, "partitions", {}).items())
            if p.worker is not None and not p.worker.healthy
        }

    def apply_backlogs(self) -> dict[int, int]:
        """Partition -> committed transactions queued for ``apply_transaction`` (mounted ones)."""
        return {
            pid: p.worker.backlog
            for pid, p in list(getattr(self, "partitions", {}).items())
            if p.worker is not None
        }

    def partition_gauges(self) -> list[PartitionGauges]:
        """Every partition's gauges (thread-safe: the metrics registry calls it when scraped)."""
        partitions: dict[int, ClientPartition] = dict(getattr(self, "partitions", {}))
        counted: InFlight | None = getattr(self, "in_flight", None)
        if counted is None:
            return []
        in_flight, submitted = counted.counts()
        unhealthy = self.unhealthy_partitions()
        return [
            PartitionGauges(
                partition_id=pid,
                in_flight=in_flight[pid],
                client_high_water_mark=p.applied.value,
                server_high_water_mark=p.server_high_water_mark,
                mounted=p.mounted,
                unhealthy=pid in unhealthy,
                apply_backlog=p.worker.backlog if p.worker is not None else 0,
                submitted=submitted[pid],
            )
            for pid, p in partitions.items()
        ]
