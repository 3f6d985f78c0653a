"""``waltz perf consumer``: how fast a client reads the log, like upstream Waltz's ConsumerPerf.

Producers first write ``transactions`` transactions (no locks, closed loop); a fresh client
mounts the active partitions from the high-water marks they had once the producers' warm-up
transactions committed (so it reads the measured transactions alone), applies every new
transaction and reads its data (``prefetch_transaction_data``: each apply batch's data is fetched
at once). Two modes:

- ``catch-up`` (upstream's): the consumer starts after the producers ended. No latency is
  recorded.
- ``live``: the consumer is mounted after the producers' warm-up, before their measured phase;
  the latency is from each transaction's submit (stamped in its payload, ``time.time()`` on this
  machine) to its apply by the consumer.

Two timers (docs/benchmarks.md "`waltz perf producer` and `waltz perf consumer`"): the
consumer's stats span its first to its last apply (upstream ConsumerPerf's timer, which leaves
out the mount and the first fetch and so overstates a short run's throughput), and
:attr:`ConsumerReport.seconds_from_mount` spans the start of the reader's mount to its last apply.
"""

from __future__ import annotations

import contextlib
import enum
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from waltz.client import Transaction, WaltzClient, WaltzClientConfig
from waltz.errors import WaltzTimeoutError
from waltz.perf.cost import measure_nodes
from waltz.perf.loadgen import LoadSpec, payload_submit_time
from waltz.perf.producer import (
    MOUNT_TIMEOUT,
    PerfCallbacks,
    ProducerSettings,
    current_high_water_marks,
    run_producer,
)
from waltz.perf.stats import RunStats
from waltz.protocol.channels import TlsConfig

__all__ = ["ConsumerMode", "ConsumerReport", "ConsumerSettings", "run_consumer"]


class ConsumerMode(enum.Enum):
    """When the consumer starts reading: after the producers (catch-up) or alongside them (live)."""

    CATCH_UP = "catch-up"
    LIVE = "live"


@dataclass(frozen=True, slots=True)
class ConsumerSettings:
    """A consumer run.

    Attributes:
        transactions: transactions the producers write in all (split evenly over them).
        payload_size: payload bytes per transaction.
        producers: producer client processes (1: in this process).
        max_in_flight: transactions each producer keeps in flight.
        active_partitions: partitions written and read, ``0 .. n - 1``; None means all.
        mode: catch-up or live.
        timeout: seconds the production and the reading may take, each.
    """

    transactions: int
    payload_size: int = 200
    producers: int = 1
    max_in_flight: int = 500
    active_partitions: int | None = None
    mode: ConsumerMode = ConsumerMode.CATCH_UP
    timeout: float = 600.0


@dataclass(slots=True)
class ConsumerReport:
    """The figures of a consumer run: the consumer's, and the producers' (for reference).

    Attributes:
        consumer: what the reader applied: the measured transactions (not the producers'
            warm-up), from its first to its last apply (upstream ConsumerPerf's timer).
        producers: the producers' merged stats.
        mount_started: wall-clock time (``time.time()``, seconds) when the reader began to mount.
    """

    consumer: RunStats
    producers: RunStats
    mount_started: float = 0.0

    @property
    def seconds_from_mount(self) -> float:
        """Seconds from the start of the reader's mount to its last apply (0.0: it applied none)."""
        if not self.consumer.committed:
            return 0.0
        return max(1e-6, self.consumer.ended - self.mount_started)

    @property
    def transactions_per_second_from_mount(self) -> float:
        """Applied transactions per second over :attr:`seconds_from_mount` (0.0: none applied)."""
        seconds = self.seconds_from_mount
        return self.consumer.committed / seconds if seconds else 0.0

    def summary(self) -> dict[str, Any]:
        """The consumer's :meth:`RunStats.summary` (its ``seconds`` from the first apply), plus
        ``seconds_from_mount`` and ``transactions_per_second_from_mount``."""
        summary = self.consumer.summary()
        summary["seconds_from_mount"] = round(self.seconds_from_mount, 3)
        summary["transactions_per_second_from_mount"] = round(self.transactions_per_second_from_mount, 1)
        return summary

    def text(self) -> str:
        """The lines the CLI prints for the consumer: its figures, both timers labelled."""
        span = "first apply -> last apply"
        lines = self.consumer.text("read", "submit->read", span).splitlines()
        lines.insert(
            3,
            f"from the reader's mount to its last apply: {self.seconds_from_mount:.2f} s, "
            f"transactions/s: {self.transactions_per_second_from_mount:,.1f}",
        )
        return "\n".join(lines)


class _ConsumerCallbacks(PerfCallbacks):
    """Reads every transaction's data and counts what it applied."""

    prefetch_transaction_data = True

    def __init__(self, start_marks: Mapping[int, int], partitions: Sequence[int], live: bool) -> None:
        super().__init__(start_marks)
        self.stats = RunStats()
        self._live = live
        self._partitions = set(partitions)
        self._targets: dict[int, int] | None = None
        self._marks_now = {p: start_marks.get(p, -1) for p in partitions}
        self._condition = threading.Condition()

    def apply_transaction(self, transaction: Transaction) -> None:
        super().apply_transaction(transaction)
        if transaction.partition_id not in self._partitions:
            return
        data = transaction.get_raw_data()
        now = time.time()
        if self._live:
            stamp = payload_submit_time(data)
            if stamp is not None:
                self.stats.latency.record(max(0.0, now - stamp))
        with self._condition:
            if self.stats.committed == 0:
                self.stats.started = now
            self.stats.committed += 1
            self.stats.payload_bytes += len(data)
            self.stats.ended = now
            self._marks_now[transaction.partition_id] = transaction.transaction_id
            self._condition.notify_all()

    def apply_transactions(self, transactions: Sequence[Transaction]) -> None:
        for transaction in transactions:
            self.apply_transaction(transaction)

    def wait_for(self, targets: Mapping[int, int], timeout: float) -> bool:
        """Block until every partition's applied mark reaches its target; False after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._condition:
            while any(self._marks_now.get(p, -1) < t for p, t in targets.items()):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._condition.wait(remaining)
        return True


def run_consumer(
    config: WaltzClientConfig,
    settings: ConsumerSettings,
    metrics_urls: Mapping[str, str] | None = None,
    metrics_tls: TlsConfig | None = None,
) -> ConsumerReport:
    """Write ``settings.transactions`` transactions, read them with a fresh client, and measure.

    In catch-up mode the consumer's stats also hold the CPU the reading client spent
    (``client_cpu_seconds``, this process) and, with ``metrics_urls`` (each cluster process's
    ``/metrics``), what every server and storage node spent while it read; the producers' stats
    hold theirs. In live mode both run at once: only the producers' are measured, the cluster's
    including what feeding the reader cost.

    Returns:
        The consumer's stats (the measured transactions applied and their bytes; latency in live
        mode), the producers' stats, and when the reader began to mount.

    Raises:
        WaltzError: the cluster could not be reached.
        WaltzTimeoutError: the consumer did not read every transaction within ``timeout``.
        RuntimeError: a producer process failed.
        ValueError: more active partitions than the cluster has.
    """
    start_marks = current_high_water_marks(config)
    num_partitions = len(start_marks)
    active = settings.active_partitions or num_partitions
    if active > num_partitions:
        raise ValueError(f"active partitions {active} exceeds the cluster's {num_partitions} partitions")
    partitions = list(range(active))
    per_producer = -(-settings.transactions // settings.producers)
    producer_settings = ProducerSettings(
        settings.producers,
        LoadSpec(
            per_producer,
            settings.payload_size,
            lock_pool_size=0,
            max_in_flight=settings.max_in_flight,
            timeout=settings.timeout,
        ),
        active,
    )
    live = settings.mode is ConsumerMode.LIVE
    reader = _Reader(config, partitions, live)
    warmed_up: dict[int, int] = {}  # the marks once the producers' warm-up committed

    def on_warmed_up() -> None:
        warmed_up.update(current_high_water_marks(config))
        if live:
            reader.mount(warmed_up, MOUNT_TIMEOUT)

    with reader:
        produced = run_producer(config, producer_settings, metrics_urls, metrics_tls, on_warmed_up)
        targets = {p: m for p, m in current_high_water_marks(config).items() if p in partitions}
        if live:
            reader.read(targets, settings.timeout)
        else:
            cpu_started = time.process_time()
            with measure_nodes(metrics_urls or {}, metrics_tls) as usage:
                reader.mount(warmed_up, None)
                reader.read(targets, settings.timeout)
                reader.close()
                reader.stats.client_cpu_seconds = time.process_time() - cpu_started
            reader.stats.node_cpu_seconds = usage.cpu_seconds
    return ConsumerReport(reader.stats, produced, reader.mount_started)


class _Reader:
    """The consuming client: mounted from given marks, read up to targets, closed (idempotent)."""

    def __init__(self, config: WaltzClientConfig, partitions: Sequence[int], live: bool) -> None:
        self._config = config.model_copy(update={"client_auto_mount": False})
        self._partitions = list(partitions)
        self._live = live
        self._callbacks: _ConsumerCallbacks | None = None
        self._stack = contextlib.ExitStack()
        self.mount_started = 0.0

    @property
    def stats(self) -> RunStats:
        """What the reader applied (empty before :meth:`mount`)."""
        return self._callbacks.stats if self._callbacks is not None else RunStats()

    def mount(self, marks: Mapping[int, int], timeout: float | None) -> None:
        """Start the reader from ``marks`` (partition -> high-water mark); with ``timeout``, wait
        that many seconds at most for its partitions to mount."""
        self._callbacks = _ConsumerCallbacks(marks, self._partitions, self._live)
        self.mount_started = time.time()
        client = self._stack.enter_context(WaltzClient(self._callbacks, self._config))
        client.set_partitions(self._partitions)
        if timeout is not None:
            client.wait_mounted(timeout, self._partitions)

    def read(self, targets: Mapping[int, int], timeout: float) -> None:
        """Wait until every partition is applied up to its target.

        Raises:
            WaltzTimeoutError: not within ``timeout`` seconds (or never mounted).
        """
        callbacks = self._callbacks
        if callbacks is None or not callbacks.wait_for(targets, timeout):
            applied = 0 if callbacks is None else callbacks.stats.committed
            raise WaltzTimeoutError(
                f"the consumer did not read up to {dict(targets)} within {timeout:g}s "
                f"(it applied {applied:,} transactions)"
            )

    def close(self) -> None:
        """Close the reader's client (nothing when closed or never mounted)."""
        self._stack.close()

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
