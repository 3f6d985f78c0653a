"""``waltz perf consumer``: how fast a client reads the log, like upstream Waltz's ConsumerPerf.

Producers first write ``transactions`` transactions (no locks, closed loop); then a fresh
client mounts the active partitions from the high-water marks they had before, applies every new
transaction and reads its data (``prefetch_transaction_data``: each apply batch's data is fetched
at once). Two modes:

- ``catch-up`` (upstream's): the consumer starts after the producers ended; the figures are its
  read throughput from its first to its last apply (as upstream's timer). No latency is recorded.
- ``live``: the consumer is mounted before the producers start; throughput runs from its first
  to its last apply, and the latency is from each transaction's submit (stamped in its payload,
  ``time.time()`` on this machine) to its apply by the consumer.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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
    """The figures of a consumer run: the consumer's, and the producers' (for reference)."""

    consumer: RunStats
    producers: RunStats


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
        The consumer's stats (transactions applied and bytes read; latency in live mode) and the
        producers' stats.

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
    callbacks = _ConsumerCallbacks(start_marks, partitions, live)
    reader_config = config.model_copy(update={"client_auto_mount": False})

    def read(targets: Mapping[int, int]) -> None:
        if not callbacks.wait_for(targets, settings.timeout):
            raise WaltzTimeoutError(
                f"the consumer did not read up to {dict(targets)} within {settings.timeout:g}s "
                f"(it applied {callbacks.stats.committed:,} transactions)"
            )

    if live:
        with WaltzClient(callbacks, reader_config) as reader:
            reader.set_partitions(partitions)
            reader.wait_mounted(MOUNT_TIMEOUT, partitions)
            produced = run_producer(config, producer_settings, metrics_urls, metrics_tls)
            targets = {p: m for p, m in current_high_water_marks(config).items() if p in partitions}
            read(targets)
    else:
        produced = run_producer(config, producer_settings, metrics_urls, metrics_tls)
        targets = {p: m for p, m in current_high_water_marks(config).items() if p in partitions}
        cpu_started = time.process_time()
        with measure_nodes(metrics_urls or {}, metrics_tls) as usage:
            with WaltzClient(callbacks, reader_config) as reader:
                reader.set_partitions(partitions)
                read(targets)
            callbacks.stats.client_cpu_seconds = time.process_time() - cpu_started
        callbacks.stats.node_cpu_seconds = usage.cpu_seconds
    return ConsumerReport(callbacks.stats, produced)
