"""The Waltz client: ``WaltzClient`` (synchronous) and ``AsyncWaltzClient`` (asyncio).

Source: docs/design/client.md "WaltzClient and AsyncWaltzClient", "The client's parts". Both share
one core (:class:`~waltz.client.core.ClientCore`) that runs an event loop on a thread of its own::

    class Deposit(TransactionContext):
        def __init__(self, account: int, amount: int) -> None:
            super().__init__()
            self.account, self.amount = account, amount

        def partition_id(self, num_partitions: int) -> int:
            return self.account % num_partitions

        def execute(self, builder: TransactionBuilder) -> bool:
            builder.set_write_locks([PartitionLocalLock("account", self.account)])
            builder.set_transaction_data({"account": self.account, "amount": self.amount}, JsonSerializer())
            return True

    with WaltzClient(callbacks, WaltzClientConfig(zookeeper_connect_string=..., cluster_root=...)) as client:
        outcome = client.submit(Deposit(7, 100)).result()  # Outcome: committed, dropped, already applied
        transaction_id = outcome.transaction_id

A submitted context goes the attempt path of the core's
:class:`~waltz.client.attempt_runner.AttemptRunner` (docs/design/client.md "From submit to the
outcome").

Guarantees: a context ends exactly once (``on_completion``, ``on_exception`` or ``on_expiration``);
a committed transaction is committed once, even across reconnects and server failures (the
transaction monitor and the mount procedure: docs/design/client.md "Failed-append detection",
"Mount and the client high-water mark"); ``apply_transaction`` sees every transaction of a mounted
partition once, in ID order, on the partition's worker thread. Before an attempt executes, the
client waits (up to ``client.readYourWritesTimeout``) until it has applied its own earlier commits
on the partition, so a read-modify-write sees its previous write.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Self, TypeVar

from prometheus_client import CollectorRegistry

from waltz.client.arguments import check_limit, check_seconds
from waltz.client.callbacks import WaltzClientCallbacks
from waltz.client.config import WaltzClientConfig
from waltz.client.context import TransactionContext
from waltz.client.core import ClientCore
from waltz.client.metrics import ClientMetrics
from waltz.client.mount_procedure import PartitionState
from waltz.client.outcome import Outcome, waited_transaction_id
from waltz.errors import WaltzTimeoutError

__all__ = ["AsyncWaltzClient", "WaltzClient"]


T = TypeVar("T")

#: Seconds ``get_high_water_mark`` waits for an answer by default.
DEFAULT_REQUEST_TIMEOUT = 30.0


class WaltzClient:
    """A synchronous Waltz client; use it as a context manager.

    See docs/design/client.md "WaltzClient and AsyncWaltzClient". Construction connects to
    ZooKeeper, takes a client ID from ``<root>/client/id``, and (with ``client.autoMount``) starts
    mounting every partition; it does not wait for the mounts (appends wait for them).

    Metrics: :attr:`metrics` is a Prometheus ``CollectorRegistry`` of this client alone (see
    :mod:`waltz.client.metrics` for the metric names): serve it with
    ``prometheus_client.start_http_server(port, registry=client.metrics)``, or merge it into the
    application's registry (``REGISTRY.register(client.metrics)``; one client per registry, as
    two clients' samples carry the same names and labels).

    Args:
        callbacks: the application's callbacks.
        config: the client configuration.

    Raises:
        ExpiredCertificateError: ``client.ssl.certFile`` or ``zookeeper.ssl.certFile`` has expired
            (nothing is contacted; docs/operations.md, "Certificates").
        ZooKeeperUnavailableError: ZooKeeper did not answer within the session timeout.
        ClusterNotFoundError: no cluster under ``config.cluster_root``.
    """

    def __init__(self, callbacks: WaltzClientCallbacks, config: WaltzClientConfig) -> None:
        self._core = ClientCore(callbacks, config)

    @property
    def metrics(self) -> CollectorRegistry:
        """This client's Prometheus registry: counters per partition, gauges read when scraped."""
        return self._core.metrics.registry

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def client_id(self) -> int:
        """This client's ID (unique in the cluster, from ZooKeeper)."""
        return self._core.client_id

    @property
    def config(self) -> WaltzClientConfig:
        """The configuration this client was made with."""
        return self._core.config

    @property
    def num_partitions(self) -> int:
        """The cluster's number of partitions: the newest count in this client's view of the
        partition epochs, finished or not (the count of ``discovery`` when the cluster never
        split), the count ``TransactionContext.partition_id`` is asked with and the one to route
        keys by (``partition_of``, ``read_entities``; docs/design/splits.md "Clients across a
        split"). A split under way raises it before its new partitions are open: a context routed
        to one waits for it."""
        return self._core.num_partitions

    @property
    def partition_ids(self) -> tuple[int, ...]:
        """The partitions that exist now, in order: those at the cluster's creation and every
        new partition of a split once opened (docs/design/splits.md "Clients across a split").
        Walk these, not ``range(num_partitions)``, to read every partition's mark: while a split
        is under way ``num_partitions`` counts new partitions that are not open yet."""
        return self._core.partition_ids

    def first_transaction_id(self, partition_id: int) -> int:
        """Where the partition's log starts, in this client's view of the partition epochs: 0, or
        for a new partition of a split its genesis, ``B(p) + 1`` (docs/design/splits.md "The
        handover", step 4). A read of a new partition's state waits for its genesis
        (``ChangeSetCallbacks.read_entities`` given the client)."""
        return self._core.first_transaction_id(partition_id)

    def partition_for(self, choose: Callable[[int], int]) -> int:
        """The partition a key goes to now, as a context's: ``choose(count)`` at the newest count
        of this client's view of the partition epochs, routed down to the count before while the
        key's parent there is not sealing (docs/design/splits.md "Clients across a split"). Pass
        the client where a count is taken (``partition_of``, ``read_entities``).

        Raises:
            ValueError: ``choose`` gave a partition outside ``0 .. count - 1``.
        """
        return self._core.routing.view.partition_for(choose)

    def submit(self, context: TransactionContext) -> concurrent.futures.Future[Outcome]:
        """Submit a transaction context; runs its first attempt on this thread.

        Blocks while the context's partition has ``client.maxConcurrentTransactions`` contexts in
        flight (nudging the server with a flush after ``client.longWaitThreshold``); a context
        with a ``timeout`` waits at most that long, then expires without a slot
        (``on_expiration``, and the future raises :class:`~waltz.errors.TransactionExpiredError`;
        docs/design/client.md "Back pressure").

        Returns:
            A future of the context's :class:`~waltz.client.outcome.Outcome` (docs/design/client.md
            "Outcomes"): committed (with the transaction ID), dropped by ``execute`` (with the
            reason it gave) or already applied (with the earlier transaction's ID); true only
            when committed. It raises what ``execute`` raised,
            :class:`~waltz.errors.TransactionExpiredError`, :class:`~waltz.errors.MessageTooLargeError`
            (the data and locks exceed ``client.maxMessageBytes``),
            :class:`~waltz.errors.ClientAheadOfLogError` (the server refused the partition's mount:
            the application's database is ahead of the log; docs/design/client.md "Mount and the
            client high-water mark"), or :class:`~waltz.errors.ClientClosedError`. It cannot be
            cancelled.

        Raises:
            ClientClosedError: the client is closed.
            PartitionNotMountedError: the partition is not mounted (auto-mount off).
            ValueError: ``partition_id`` returned a partition that does not exist.
            TypeError: ``partition_id`` returned something other than an int.
            WaltzClientError: called from a completion callback (``on_completion``, a future's
                done-callback) while the partition is at its limit: only that thread could free a
                slot, so waiting would never end.
        """
        future = self._core.attempts.submit(context, with_future=True).future
        assert future is not None
        return future

    def execute(self, context: TransactionContext) -> None:
        """Execute a transaction context: :meth:`submit` without a future (docs/design/client.md
        "WaltzClient and AsyncWaltzClient"). The context's own callbacks tell how it ended
        (``on_completion``, ``on_exception``, ``on_expiration``); :meth:`flush` waits for every
        context to end.

        For applications that do not wait on each transaction: no ``concurrent.futures.Future``
        is made and resolved per transaction (a few microseconds each, on the client's threads).

        Raises:
            ClientClosedError: the client is closed.
            PartitionNotMountedError: the partition is not mounted (auto-mount off).
            ValueError: ``partition_id`` returned a partition that does not exist.
            TypeError: ``partition_id`` returned something other than an int.
        """
        self._core.attempts.submit(context, with_future=False)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every submitted context has ended (committed, dropped, failed or expired).

        Raises:
            WaltzTimeoutError: contexts are still in flight after ``timeout`` seconds.
            ValueError: ``timeout`` is negative, NaN or infinite.
            ClientClosedError: the client closed meanwhile.
        """
        attempts = self._core.attempts
        if not attempts.wait_idle(check_seconds(timeout, "flush timeout")):
            raise WaltzTimeoutError(
                f"{attempts.in_flight()} transaction(s) still in flight after {timeout:g}s of flush()"
            )

    def has_pending_transactions(self) -> bool:
        """True while a submitted context has not ended."""
        return self._core.attempts.in_flight() > 0

    def get_high_water_mark(self, partition_id: int, timeout: float = DEFAULT_REQUEST_TIMEOUT) -> int:
        """The partition's committed high-water mark, asked of the server that owns it.

        Raises:
            WaltzTimeoutError: no answer within ``timeout`` seconds.
            TypeError: ``timeout`` is None or not a number (this call has no unbounded form).
            ValueError: ``timeout`` is negative, NaN or infinite.
            ValueError: no such partition.
            ClientClosedError: the client closed meanwhile (or before).
        """
        return self._core.get_high_water_mark(
            partition_id, check_limit(timeout, "get_high_water_mark timeout")
        )

    def wait_applied(self, partition_id: int, transaction_id: int, timeout: float | None = None) -> bool:
        """Block until this client has applied ``transaction_id`` of a partition it mounts.

        "Applied" means ``apply_transaction`` returned for it on this client, or the callbacks'
        high-water mark was at or past it when the partition was mounted.

        Returns:
            True when applied, False after ``timeout`` seconds (None: no limit).

        Raises:
            ValueError: no such partition, or ``timeout`` is negative, NaN or infinite.
            TypeError: ``transaction_id`` is not an ``int`` (None: the outcome did not commit).
            ClientClosedError: the client closed before applying it.
        """
        checked = waited_transaction_id(transaction_id)
        return self._core.applied_mark(partition_id).wait(
            checked, check_seconds(timeout, "wait_applied timeout")
        )

    def when_applied(self, partition_id: int, transaction_id: int, callback: Callable[[], None]) -> None:
        """Call ``callback`` once this client has applied ``transaction_id`` (as :meth:`wait_applied`
        means it), without blocking: at once on this thread when it is applied already, else on the
        thread that applies it, right after.

        The callback must be quick and must not raise (an exception is logged, not propagated);
        there is no timeout or cancel (a callback that is no longer wanted checks that itself).
        A callback still waiting when the client closes is never called (:meth:`wait_applied`
        raises ``ClientClosedError`` in that case).

        Raises:
            ValueError: no such partition.
            TypeError: ``transaction_id`` is not an ``int`` (None: the outcome did not commit).
        """
        self._core.applied_mark(partition_id).call_when(waited_transaction_id(transaction_id), callback)

    def ready(self, timeout: float = DEFAULT_REQUEST_TIMEOUT) -> dict[int, int]:
        """Block until every partition this client mounts is mounted and applied up to the log's
        high-water mark taken at the call: an instance about to serve has caught up with what was
        committed before it started (docs/design/client.md "Ready to serve").

        Returns:
            Partition ID -> the high-water mark it caught up to.

        Raises:
            WaltzTimeoutError: not caught up within ``timeout`` seconds (the message names the
                partitions behind, with their marks).
            ClientAheadOfLogError: a server refused a partition's mount: the application's
                database is ahead of the log (docs/design/client.md "Mount and the client
                high-water mark").
            TypeError: ``timeout`` is None or not a number (this call has no unbounded form).
            ValueError: ``timeout`` is negative, NaN or infinite.
            ClientClosedError: the client closed meanwhile (or before).
        """
        return self._core.wait_ready(check_limit(timeout, "ready timeout"))

    def set_partitions(self, partition_ids: Iterable[int]) -> None:
        """Mount exactly these partitions (for ``client.autoMount: false``); unmount the others.

        An unmounted partition's apply in progress is waited for up to 10 s; past them this returns
        with it still running, and a mount of that partition waits until it has returned, so a
        partition never runs two applies (docs/design/client.md "Applying transactions").

        Raises:
            ValueError: a partition does not exist.
            WaltzClientError: a partition to unmount has contexts in flight (``flush()`` first).
        """
        self._core.set_partitions(partition_ids)

    def mounted_partitions(self) -> list[int]:
        """The partitions this client mounts (or is mounting), in order."""
        return self._core.mounted_partitions()

    def wait_mounted(
        self, timeout: float = DEFAULT_REQUEST_TIMEOUT, partition_ids: Iterable[int] | None = None
    ) -> None:
        """Block until the partitions (default: all it mounts) are mounted.

        Raises:
            WaltzTimeoutError: not all mounted within ``timeout`` seconds.
            ClientAheadOfLogError: a server refused a partition's mount: the application's
                database is ahead of the log (docs/design/client.md "Mount and the client
                high-water mark").
            TypeError: ``timeout`` is None or not a number (this call has no unbounded form).
            ValueError: ``timeout`` is negative, NaN or infinite, or a partition does not exist.
            ClientClosedError: the client closed meanwhile (or before).
        """
        self._core.wait_until_mounted(check_limit(timeout, "wait_mounted timeout"), partition_ids)

    def partition_states(self) -> dict[int, PartitionState]:
        """Partition ID -> its state (unmounted, mounting, mounted, closed)."""
        return self._core.partition_states()

    def unhealthy_partitions(self) -> dict[int, BaseException | None]:
        """Partitions whose ``apply_transaction`` keeps failing -> the last exception."""
        return self._core.unhealthy_partitions()

    def held_partitions(self) -> dict[int, int]:
        """New partitions of a split whose apply holds their genesis until their parent is applied
        up to its barrier -> that parent (docs/design/splits.md "Clients across a split"). A pause,
        not a failure: they are not among :meth:`unhealthy_partitions`."""
        return self._core.held_partitions()

    def apply_backlogs(self) -> dict[int, int]:
        """Partition -> committed transactions queued for ``apply_transaction``: about
        ``client.maxApplyBacklog`` each at most (the feed window, ``docs/protocol.md`` "Feed
        window")."""
        return self._core.apply_backlogs()

    def on_completion_thread(self) -> bool:
        """Whether the calling thread is the client's completion thread, where the callbacks of
        committed contexts and their futures' done-callbacks run (docs/design/client.md, "The
        client's parts"): code there must not wait for another context to end, since only this
        thread ends them and frees their concurrency slots."""
        return self._core.attempts.on_completion_thread()

    def close(self) -> None:
        """Close the client (connections, threads, the ZooKeeper session). Idempotent.

        Contexts still in flight fail with :class:`~waltz.errors.ClientClosedError` (their
        appends may or may not have been committed); call :meth:`flush` first to avoid that.
        It may be called from the client's callbacks, on its own threads: it does not wait for the
        thread it runs on, which ends once the callback returns (docs/design/client.md
        "WaltzClient and AsyncWaltzClient").
        """
        self._core.close()


class AsyncWaltzClient:
    """The asyncio twin of :class:`WaltzClient`; use ``async with AsyncWaltzClient(...) as c``.

    The core still runs on a thread of its own; ``execute`` of a first attempt and
    ``get_client_high_water_mark`` run on the caller's event loop (keep them non-blocking), later
    attempts on the client's retry threads. A context whose ``execute`` blocks on I/O
    (``TransactionContext.execute_blocks``, e.g. the SQL framework's entity contexts) runs its
    first attempt on the retry threads too, never on the loop.

    Metrics: :attr:`metrics` is the client's Prometheus ``CollectorRegistry``, as
    :attr:`WaltzClient.metrics`, available before :meth:`start` (its gauges show the partitions
    once started): ``prometheus_client.start_http_server(port, registry=client.metrics)``.

    Args:
        callbacks: the application's callbacks.
        config: the client configuration.
    """

    def __init__(self, callbacks: WaltzClientCallbacks, config: WaltzClientConfig) -> None:
        self._callbacks = callbacks
        self._config = config
        self._metrics = ClientMetrics()
        self._core_or_none: ClientCore | None = None
        self._starting = asyncio.Lock()

    async def start(self) -> Self:
        """Connect to ZooKeeper and start the core (see :class:`WaltzClient`). Idempotent, also
        when awaited several times at once (docs/design/client.md "WaltzClient and
        AsyncWaltzClient"): one start runs and the others wait for it, so the client has one core
        and one ZooKeeper session.

        The core is made on a thread (connecting blocks). Cancelling the await does not leave a
        started client behind: the one being made is closed once made, and this client stays
        unstarted. A start that failed or was cancelled leaves the client startable: a start
        waiting for it then makes the core itself.

        Returns:
            This client.

        Raises:
            ExpiredCertificateError, ZooKeeperUnavailableError, ClusterNotFoundError: as
                :class:`WaltzClient` does when made.
        """
        async with self._starting:
            if self._core_or_none is None:
                self._core_or_none = await _made_on_a_thread(
                    lambda: ClientCore(self._callbacks, self._config, self._metrics), ClientCore.close
                )
        return self

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @property
    def _core(self) -> ClientCore:
        if self._core_or_none is None:
            raise RuntimeError("AsyncWaltzClient is not started: use `async with` or `await client.start()`")
        return self._core_or_none

    @property
    def metrics(self) -> CollectorRegistry:
        """This client's Prometheus registry (see :attr:`WaltzClient.metrics`)."""
        return self._metrics.registry

    @property
    def config(self) -> WaltzClientConfig:
        """The configuration this client was made with (before :meth:`start` too)."""
        return self._config

    @property
    def client_id(self) -> int:
        """This client's ID."""
        return self._core.client_id

    @property
    def num_partitions(self) -> int:
        """The cluster's number of partitions: the newest count in this client's view of the
        partition epochs, finished or not (the count of ``discovery`` when the cluster never
        split), the count ``TransactionContext.partition_id`` is asked with and the one to route
        keys by (``partition_of``, ``read_entities``; docs/design/splits.md "Clients across a
        split"). A split under way raises it before its new partitions are open: a context routed
        to one waits for it."""
        return self._core.num_partitions

    @property
    def partition_ids(self) -> tuple[int, ...]:
        """As :attr:`WaltzClient.partition_ids`."""
        return self._core.partition_ids

    def first_transaction_id(self, partition_id: int) -> int:
        """As :meth:`WaltzClient.first_transaction_id`."""
        return self._core.first_transaction_id(partition_id)

    def partition_for(self, choose: Callable[[int], int]) -> int:
        """The partition a key goes to now (see :meth:`WaltzClient.partition_for`; memory only)."""
        return self._core.routing.view.partition_for(choose)

    async def submit(self, context: TransactionContext) -> asyncio.Future[Outcome]:
        """Submit a context; waits only while its partition is at the concurrency limit (and,
        for a context whose ``execute`` blocks, while its first attempt runs on a retry thread).

        Returns:
            A future of the context's :class:`~waltz.client.outcome.Outcome`, as
            :meth:`WaltzClient.submit`.
        """
        submission = await self._core.attempts.submit_async(context)
        assert submission.future is not None
        return asyncio.wrap_future(submission.future)

    async def submit_async(self, context: TransactionContext) -> Outcome:
        """Submit a context and wait for its outcome.

        Cancelling the await (``asyncio.wait_for``, a client that hung up) stops the waiting, not
        the submission: an append may already be on its way and commit. Bound a request with
        ``asyncio.wait_for`` and the context's ``timeout``, and retry with the same idempotency
        key (docs/asyncio-service.md, "Answers in bounded time").

        Returns:
            The context's :class:`~waltz.client.outcome.Outcome`: committed (with the transaction
            ID), dropped (with the reason) or already applied (with the earlier transaction's ID).

        Raises:
            Exception: what the submission's future raises (see :meth:`WaltzClient.submit`).
        """
        return await (await self.submit(context))

    async def flush(self, timeout: float | None = None) -> None:
        """As :meth:`WaltzClient.flush`."""
        attempts = self._core.attempts
        if not await attempts.wait_idle_async(check_seconds(timeout, "flush timeout")):
            raise WaltzTimeoutError(
                f"{attempts.in_flight()} transaction(s) still in flight after {timeout:g}s of flush()"
            )

    def apply_backlogs(self) -> dict[int, int]:
        """Partition -> committed transactions queued for ``apply_transaction`` (see
        :meth:`WaltzClient.apply_backlogs`)."""
        return self._core.apply_backlogs()

    def mounted_partitions(self) -> list[int]:
        """The partitions this client mounts (or is mounting), in order. Reads memory only, as
        the other inspections below (docs/design/client.md "WaltzClient and AsyncWaltzClient").

        Raises:
            RuntimeError: the client is not started.
        """
        return self._core.mounted_partitions()

    def partition_states(self) -> dict[int, PartitionState]:
        """Partition ID -> its state (unmounted, mounting, mounted, closed).

        Raises:
            RuntimeError: the client is not started.
        """
        return self._core.partition_states()

    def unhealthy_partitions(self) -> dict[int, BaseException | None]:
        """Partitions whose ``apply_transaction`` keeps failing -> the last exception: those a
        :meth:`ready` that timed out names as behind (docs/design/client.md "Applying
        transactions").

        Raises:
            RuntimeError: the client is not started.
        """
        return self._core.unhealthy_partitions()

    def held_partitions(self) -> dict[int, int]:
        """New partitions of a split whose apply holds their genesis -> the parent they wait for
        (see :meth:`WaltzClient.held_partitions`; docs/design/splits.md "Clients across a split").

        Raises:
            RuntimeError: the client is not started.
        """
        return self._core.held_partitions()

    def has_pending_transactions(self) -> bool:
        """True while a submitted context has not ended."""
        return self._core.attempts.in_flight() > 0

    def on_completion_thread(self) -> bool:
        """As :meth:`WaltzClient.on_completion_thread`."""
        return self._core.attempts.on_completion_thread()

    async def get_high_water_mark(self, partition_id: int, timeout: float = DEFAULT_REQUEST_TIMEOUT) -> int:
        """As :meth:`WaltzClient.get_high_water_mark`."""
        return await self._core.get_high_water_mark_async(
            partition_id, check_limit(timeout, "get_high_water_mark timeout")
        )

    async def wait_applied(
        self, partition_id: int, transaction_id: int, timeout: float | None = None
    ) -> bool:
        """As :meth:`WaltzClient.wait_applied`."""
        checked = waited_transaction_id(transaction_id)
        return await self._core.applied_mark(partition_id).wait_async(
            checked, check_seconds(timeout, "wait_applied timeout")
        )

    async def ready(self, timeout: float = DEFAULT_REQUEST_TIMEOUT) -> dict[int, int]:
        """As :meth:`WaltzClient.ready`: return once every mounted partition has applied the
        log's high-water mark taken at the call (the loop does not wait; cancelling the await ends
        the wait)."""
        return await self._core.wait_ready_async(check_limit(timeout, "ready timeout"))

    async def set_partitions(self, partition_ids: Iterable[int]) -> None:
        """As :meth:`WaltzClient.set_partitions`."""
        await asyncio.to_thread(self._core.set_partitions, list(partition_ids))

    async def wait_mounted(
        self, timeout: float = DEFAULT_REQUEST_TIMEOUT, partition_ids: Iterable[int] | None = None
    ) -> None:
        """As :meth:`WaltzClient.wait_mounted`."""
        ids = None if partition_ids is None else list(partition_ids)
        await self._core.wait_until_mounted_async(check_limit(timeout, "wait_mounted timeout"), ids)

    async def close(self) -> None:
        """As :meth:`WaltzClient.close`. Idempotent. A :meth:`start` under way is waited for, and
        the client it makes closed (docs/design/client.md "WaltzClient and AsyncWaltzClient"): no
        client is left started behind a close."""
        async with self._starting:
            core = self._core_or_none
        if core is not None:
            await asyncio.to_thread(core.close)


async def _made_on_a_thread(make: Callable[[], T], discard: Callable[[T], object]) -> T:
    """``make()`` on a thread of the loop's default executor, awaited; if the await is cancelled,
    what ``make`` returns is given to ``discard`` (on that thread, or on one of its own when it was
    made already), never dropped running."""
    lock = threading.Lock()
    abandoned = False
    made: list[T] = []

    def run() -> T | None:
        thing = make()
        with lock:
            if not abandoned:
                made.append(thing)
                return thing
        discard(thing)
        return None

    making = asyncio.get_running_loop().run_in_executor(None, run)
    # An exception raised once nobody awaits is retrieved here, not reported as never retrieved.
    making.add_done_callback(lambda f: f.cancelled() or f.exception())
    try:
        result = await asyncio.shield(making)
    except asyncio.CancelledError:
        with lock:
            abandoned = True
            orphan = made.pop() if made else None
        if orphan is not None:
            threading.Thread(target=discard, args=(orphan,), name="waltz-discard-unclaimed").start()
        raise
    assert result is not None
    return result
