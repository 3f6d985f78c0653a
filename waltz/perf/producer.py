"""``waltz perf producer``: clients submitting transactions, like upstream Waltz's ProducerPerf.

Each client is a :class:`~waltz.client.client.WaltzClient` in a process of its own (one client
runs in the calling process), driven by :func:`waltz.perf.loadgen.run_load`. A transaction carries
``payload_size`` bytes of raw data and, with a lock pool, one WRITE lock drawn from it; its
partition is ``lock_id % active_partitions`` (``index % active_partitions`` without locks), so
the pool's locks are all the locks of the run, spread over the active partitions, and a pool
smaller than the active partitions is refused (:func:`check_lock_pool`). The
client high-water mark (the concurrency check) is the client's last applied transaction of the
partition, kept in memory by :class:`PerfCallbacks`; a lock failure makes the client re-run
``execute``, counted as a retry.

Every client first mounts, starting from the partitions' current high-water marks (so a long
existing log is not replayed), submits a few warm-up transactions, and then waits for the other
clients (a barrier) before the measured phase. Between the two, once every client has warmed up,
``run_producer`` may call back in the calling process (``on_warmed_up``: ``waltz perf consumer``
mounts its reader after the warm-up transactions there).
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from waltz.client import (
    PartitionLocalLock,
    Transaction,
    TransactionBuilder,
    TransactionContext,
    WaltzClient,
    WaltzClientCallbacks,
    WaltzClientConfig,
)
from waltz.perf.cost import measure_nodes
from waltz.perf.loadgen import LoadSpec, Outcome, Request, run_load
from waltz.perf.stats import RunStats
from waltz.protocol.channels import TlsConfig
from waltz.tuning import tuned_garbage_collector

__all__ = [
    "CLIENT_STAGES",
    "LOCK_NAME",
    "PerfCallbacks",
    "PerfContext",
    "ProducerSettings",
    "check_lock_pool",
    "client_stage_totals",
    "client_stages_since",
    "current_high_water_marks",
    "run_producer",
    "waltz_submitter",
]

_LOG = logging.getLogger(__name__)

#: The name of the perf tool's write locks.
LOCK_NAME = "perf"
#: Warm-up transactions per client before the measured phase (not counted).
WARMUP_TRANSACTIONS = 20
#: Seconds a client may take to mount its partitions.
MOUNT_TIMEOUT = 60.0
#: Seconds the clients wait, warmed up, for ``run_producer``'s ``on_warmed_up`` to return.
WARMED_UP_TIMEOUT = 2 * MOUNT_TIMEOUT
#: The stages of a transaction's latency that the producer reports (``RunStats.client_stages``), by
#: the client metric that times them (``waltz/client/metrics.py``): from ``submit`` to the end of
#: the first attempt's ``execute`` (lock and read-your-writes waits included); from the end of an
#: attempt's ``execute`` to its append leaving for the server; from there to seeing it committed
#: in the feed (the cluster's share); from ``submit`` to seeing the commit (every attempt
#: included); from that to the end of the completion; from seeing the commit to the start of its
#: apply; the apply itself.
CLIENT_STAGES = {
    "first attempt": "waltz_client_first_attempt_seconds",
    "append queue": "waltz_client_append_queue_seconds",
    "log round trip": "waltz_client_log_round_trip_seconds",
    "submit->commit": "waltz_client_commit_seconds",
    "commit->completion": "waltz_client_completion_delay_seconds",
    "apply wait": "waltz_client_apply_wait_seconds",
    "apply": "waltz_client_apply_seconds",
}


@dataclass(frozen=True, slots=True)
class ProducerSettings:
    """A producer run.

    Attributes:
        clients: client processes (1: the client runs in this process).
        load: what each client offers (its ``transactions`` are per client).
        active_partitions: partitions written, ``0 .. active_partitions - 1``; None means all.

    Raises:
        ValueError: fewer than 1 client or active partition, or a lock pool smaller than the
            active partitions given (:func:`check_lock_pool`).
    """

    clients: int
    load: LoadSpec
    active_partitions: int | None = None

    def __post_init__(self) -> None:
        if self.clients < 1:
            raise ValueError(f"clients must be at least 1, got {self.clients}")
        if self.active_partitions is not None:
            if self.active_partitions < 1:
                raise ValueError(f"active_partitions must be at least 1, got {self.active_partitions}")
            check_lock_pool(self.load.lock_pool_size, self.active_partitions)


def check_lock_pool(lock_pool_size: int, active_partitions: int) -> None:
    """Refuse a lock pool that leaves active partitions unwritten (docs/benchmarks.md
    "`waltz perf producer` and `waltz perf consumer`").

    A transaction's partition is its lock's ID modulo the active partitions, so that the pool's
    locks are the run's only locks (partition-local locks of the same ID on two partitions would
    be two locks); a pool of fewer locks than active partitions would write only some of them.

    Args:
        lock_pool_size: write locks in the pool; 0 means no lock (every partition is written).
        active_partitions: partitions the run writes, ``0 .. active_partitions - 1``.

    Raises:
        ValueError: ``0 < lock_pool_size < active_partitions``; the message names both and what
            to change.
    """
    if 0 < lock_pool_size < active_partitions:
        unwritten = (
            f"partition {lock_pool_size}"
            if lock_pool_size == active_partitions - 1
            else f"partitions {lock_pool_size}..{active_partitions - 1}"
        )
        raise ValueError(
            f"a lock pool of {lock_pool_size} lock(s) cannot cover {active_partitions} active partitions: "
            f"lock i is written on partition i mod {active_partitions}, so {unwritten} would get no "
            f"transaction; use at least {active_partitions} locks, 0 (no lock), or fewer active partitions"
        )


class PerfCallbacks(WaltzClientCallbacks):
    """In-memory high-water marks: a transaction is applied by recording its ID.

    Args:
        start_marks: partition ID -> the mark to start from (-1 for partitions not given).
        on_apply: called with each applied transaction (on the partition's apply thread).
    """

    def __init__(
        self,
        start_marks: Mapping[int, int] | None = None,
        on_apply: Callable[[Transaction], None] | None = None,
    ) -> None:
        # A dict read and a dict write are atomic in CPython, and each partition's marks are
        # written by its apply thread alone: no lock (the perf tools' own cost stays small).
        self._marks = dict(start_marks or {})
        self._on_apply = on_apply

    def get_client_high_water_mark(self, partition_id: int) -> int:
        """The last applied transaction ID of the partition (-1: none)."""
        return self._marks.get(partition_id, -1)

    def apply_transaction(self, transaction: Transaction) -> None:
        """Record the transaction's ID as the partition's mark, then call ``on_apply``."""
        self._marks[transaction.partition_id] = transaction.transaction_id
        if self._on_apply is not None:
            self._on_apply(transaction)

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        """Ignore: ``on_apply`` of the perf tools does not raise."""


class PerfContext(TransactionContext):
    """One perf transaction: raw data and at most one WRITE lock; counts its attempts.

    Tells the load generator how it ended from the context's own callbacks (docs/design/client.md
    "Transaction contexts and callbacks": ``on_completion``, ``on_exception``); submitted with
    ``WaltzClient.execute`` (no future), as an application that does not wait on each transaction.

    Args:
        request: the load generator's request (payload, lock ID).
        partition: the partition to write.
        done: the load generator's callback, called once when the context ends.
    """

    def __init__(
        self, request: Request, partition: int, done: Callable[[Outcome], None] | None = None
    ) -> None:
        super().__init__()
        self.request = request
        self.partition = partition
        self.attempts = 0
        self._done = done

    def partition_id(self, num_partitions: int) -> int:
        """The partition chosen at construction."""
        return self.partition

    def execute(self, builder: TransactionBuilder) -> bool:
        """Set the payload and the write lock; always append."""
        self.attempts += 1
        builder.set_raw_data(self.request.payload)
        if self.request.lock_id is not None:
            builder.set_write_locks([PartitionLocalLock(LOCK_NAME, self.request.lock_id)])
        return True

    def on_completion(self, result: bool) -> None:
        """Committed (``execute`` never drops): tell the load generator."""
        if self._done is not None:
            self._done(Outcome(max(0, self.attempts - 1), None))

    def on_exception(self, exception: BaseException) -> None:
        """Failed: tell the load generator."""
        if self._done is not None:
            self._done(Outcome(max(0, self.attempts - 1), exception))

    def on_expiration(self) -> None:
        """Expired (perf contexts have no timeout, so only if one is set): tell the load generator."""
        if self._done is not None:
            self._done(Outcome(max(0, self.attempts - 1), TimeoutError("the transaction context expired")))


def waltz_submitter(
    client: WaltzClient, active_partitions: int
) -> Callable[[Request, Callable[[Outcome], None]], None]:
    """A load-generator submitter that submits :class:`PerfContext` contexts to ``client``.

    Raises (from the submitter):
        ClientClosedError: the client is closed.
    """

    def submit(request: Request, done: Callable[[Outcome], None]) -> None:
        key = request.lock_id if request.lock_id is not None else request.index
        client.execute(PerfContext(request, key % active_partitions, done))

    return submit


def client_stage_totals(client: WaltzClient) -> dict[str, tuple[float, float]]:
    """The client's stage metrics so far (:data:`CLIENT_STAGES`): stage -> (seconds, count)."""
    registry = client.metrics
    totals: dict[str, tuple[float, float]] = {}
    for stage, name in CLIENT_STAGES.items():
        seconds = registry.get_sample_value(f"{name}_sum") or 0.0
        count = registry.get_sample_value(f"{name}_count") or 0.0
        totals[stage] = (seconds, count)
    return totals


def client_stages_since(
    client: WaltzClient, started: Mapping[str, tuple[float, float]]
) -> dict[str, tuple[float, float]]:
    """The client's stage metrics since ``started`` (what :func:`client_stage_totals` returned
    then): stage -> (seconds, count)."""
    return {
        stage: (seconds - started[stage][0], count - started[stage][1])
        for stage, (seconds, count) in client_stage_totals(client).items()
    }


def current_high_water_marks(config: WaltzClientConfig) -> dict[int, int]:
    """Every partition's committed high-water mark, asked of the owning servers.

    Uses a client that mounts nothing (``client.autoMount`` off).

    Raises:
        WaltzError: ZooKeeper or a server did not answer.
    """
    quiet = config.model_copy(update={"client_auto_mount": False})
    with WaltzClient(PerfCallbacks(), quiet) as client:
        return {pid: client.get_high_water_mark(pid) for pid in client.partition_ids}


def _run_client(
    config: WaltzClientConfig,
    settings: ProducerSettings,
    start_marks: Mapping[int, int],
    index: int,
    barriers: tuple[Any, Any] | None,
    on_warmed_up: Callable[[], None] | None = None,
) -> RunStats:
    """Mount, warm up, wait at the barriers (``(warmed_up, go)``, shared with the other clients and
    the parent; None: the only client, which calls ``on_warmed_up`` itself), then run one client's
    load."""
    with WaltzClient(PerfCallbacks(start_marks), config) as client:
        active = settings.active_partitions or client.num_partitions
        if active > client.num_partitions:
            raise ValueError(
                f"active partitions {active} exceeds the cluster's {client.num_partitions} partitions"
            )
        client.wait_mounted(MOUNT_TIMEOUT, range(active))
        submit = waltz_submitter(client, active)
        seed = None if settings.load.seed is None else settings.load.seed + index
        warmup = LoadSpec(
            WARMUP_TRANSACTIONS,
            settings.load.payload_size,
            settings.load.lock_pool_size,
            settings.load.max_in_flight,
            timeout=settings.load.timeout,
            seed=seed,
        )
        run_load(submit, warmup)
        if barriers is not None:
            warmed_up, go = barriers
            warmed_up.wait(MOUNT_TIMEOUT)
            go.wait(WARMED_UP_TIMEOUT)
        elif on_warmed_up is not None:
            on_warmed_up()
        load = LoadSpec(
            settings.load.transactions,
            settings.load.payload_size,
            settings.load.lock_pool_size,
            settings.load.max_in_flight,
            settings.load.rate,
            settings.load.timeout,
            None if seed is None else seed + 1_000_003,
        )
        # As a throughput-minded application would (docs/configuration.md); restored afterwards,
        # for a producer run inside a longer-lived process.
        cpu_started = time.process_time()
        stages_started = client_stage_totals(client)
        with tuned_garbage_collector():
            stats = run_load(submit, load)
        client.flush(settings.load.timeout)
        stats.client_cpu_seconds = time.process_time() - cpu_started
        stats.client_stages = client_stages_since(client, stages_started)
        return stats


def _client_process(
    config: dict[str, Any],
    settings: ProducerSettings,
    start_marks: dict[int, int],
    index: int,
    barriers: tuple[Any, Any],
    results: Any,
) -> None:
    try:
        stats = _run_client(WaltzClientConfig(**config), settings, start_marks, index, barriers)
        results.put((index, stats.to_wire(), None))
    except BaseException as exc:
        for barrier in barriers:
            barrier.abort()
        results.put((index, None, f"{type(exc).__name__}: {exc}"))


def run_producer(
    config: WaltzClientConfig,
    settings: ProducerSettings,
    metrics_urls: Mapping[str, str] | None = None,
    metrics_tls: TlsConfig | None = None,
    on_warmed_up: Callable[[], None] | None = None,
) -> RunStats:
    """Run the producer clients against a cluster and merge their stats.

    ``config.client_max_concurrent_transactions`` is raised to ``load.max_in_flight`` when lower,
    so that the load generator, not the client, decides how many transactions are in flight.

    Args:
        config: the client configuration of the target cluster.
        settings: clients and load.
        metrics_urls: ``/metrics`` URL of each cluster process by name
            (``LocalCluster.metrics_urls()``), to report their CPU per transaction
            (``RunStats.node_cpu_seconds``), the storage nodes' records per flush
            (``RunStats.storage_batches``), the servers' receipt-to-commit time
            (``RunStats.server_commits``) and records per store batch
            (``RunStats.server_batches``); None or empty: the client's CPU alone.
        metrics_tls: the client TLS files that read ``https`` metrics URLs (an operator's), or None.
        on_warmed_up: called in this process once every client has mounted and its warm-up
            transactions have committed, before any client starts its measured phase (they wait
            for it, at most ``WARMED_UP_TIMEOUT`` seconds); what it raises ends the run and is
            raised here. None: the clients go on at once.

    Returns:
        The merged stats of the measured phase (warm-up excluded); throughput is the committed
        transactions of all clients over the span from the first client's start to the last
        client's end.

    Raises:
        WaltzError: the cluster could not be reached.
        RuntimeError: a client process failed (the message names it and its error).
        ValueError: more active partitions than the cluster has, or a lock pool smaller than
            the active partitions (:func:`check_lock_pool`).
    """
    if config.client_max_concurrent_transactions < settings.load.max_in_flight:
        config = config.model_copy(update={"client_max_concurrent_transactions": settings.load.max_in_flight})
    with measure_nodes(metrics_urls or {}, metrics_tls) as usage:
        stats = _run_clients(config, settings, on_warmed_up)
    stats.node_cpu_seconds = usage.cpu_seconds
    stats.storage_batches = usage.storage_batches
    stats.server_commits = usage.server_commits
    stats.server_batches = usage.server_batches
    return stats


def _run_clients(
    config: WaltzClientConfig, settings: ProducerSettings, on_warmed_up: Callable[[], None] | None
) -> RunStats:
    start_marks = current_high_water_marks(config)
    if settings.active_partitions is None:  # all partitions, known now (given ones: by the settings)
        check_lock_pool(settings.load.lock_pool_size, len(start_marks))
    if settings.clients == 1:
        return _run_client(config, settings, start_marks, 0, None, on_warmed_up)
    context = multiprocessing.get_context("spawn")
    # The clients and this process: all warmed up, then (after on_warmed_up) all go.
    barriers = (context.Barrier(settings.clients + 1), context.Barrier(settings.clients + 1))
    results = context.Queue()
    processes = [
        context.Process(
            target=_client_process,
            args=(config.model_dump(), settings, start_marks, i, barriers, results),
            name=f"waltz-perf-client-{i}",
            daemon=True,
        )
        for i in range(settings.clients)
    ]
    for process in processes:
        process.start()
    timeout = settings.load.timeout + 2 * MOUNT_TIMEOUT + WARMED_UP_TIMEOUT + 30
    warmed_up, go = barriers
    try:
        warmed_up.wait(settings.load.timeout + MOUNT_TIMEOUT + 30)
        if on_warmed_up is not None:
            on_warmed_up()
        go.wait(MOUNT_TIMEOUT)
    except threading.BrokenBarrierError:
        pass  # a client failed (or timed out) and aborted the barriers: _collect names it
    except BaseException:
        for barrier in barriers:
            barrier.abort()
        try:
            _collect(processes, results, MOUNT_TIMEOUT)
        except RuntimeError as failed:
            # The clients failed because this process did: its error is the one to raise.
            _LOG.warning("perf clients stopped after on_warmed_up failed: %s", failed)
        raise
    return _collect(processes, results, timeout)


def _collect(processes: Sequence[Any], results: Any, timeout: float) -> RunStats:
    """Gather one result per process; kill the processes on failure or timeout."""
    import queue

    merged = RunStats()
    failures: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        for _ in processes:
            try:
                index, wire, error = results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                failures.append(f"no result from the client processes within {timeout:g}s")
                break
            if error is not None:
                failures.append(f"client {index}: {error}")
            else:
                merged.merge(RunStats.from_wire(wire))
    finally:
        for process in processes:
            process.join(max(0.1, min(10.0, deadline - time.monotonic())))
            if process.is_alive():
                process.kill()
                process.join(5)
    if failures:
        raise RuntimeError("perf client process(es) failed: " + "; ".join(failures))
    return merged
