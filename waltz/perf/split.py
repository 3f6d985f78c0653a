"""``waltz perf split``: throughput before and after a live split, and the longest write pause of a
key during the handover, in one run on a local cluster.

The split of docs/design/splits.md ("The handover", "Clients across a split"): ``producers``
clients, each in a thread with its own in-memory store mounting every partition, bump counters
(read the key's value in the store, append ``value + 1`` under the key's WRITE lock, routed by
``key mod count``) over ``keys`` keys, ``in_flight`` at a time each. After ``before`` seconds the
cluster's admin splits it to ``to`` partitions (``LocalCluster.split``, as ``waltz cluster split``);
then ``after`` seconds more. :func:`run_split` measures:

- committed bumps per second before the split and after it (the split's own seconds left out);
- the split's wall time, from its first step to the epoch complete;
- per key, the longest gap between two of its commits from 1 s before the split began to 5 s
  after it ended; the highest over the keys that stay in their partition and over those that move
  to a new one;
- upstream Waltz's validate: per key, the values the log holds are exactly ``1 .. n`` for its
  ``n`` commits in every store (no update lost, none doubled).
"""

from __future__ import annotations

import itertools
import logging
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from waltz import (
    BytesSerializer,
    PartitionLocalLock,
    Transaction,
    TransactionBuilder,
    TransactionContext,
    WaltzClient,
    WaltzClientCallbacks,
    WaltzClientConfig,
)
from waltz.protocol.split_records import SPLIT_RECORD_HEADER, opening_genesis

__all__ = ["SplitPerfFigures", "SplitPerfSettings", "run_split"]

log = logging.getLogger(__name__)

#: The window around the split in which pauses are measured, seconds before and after.
WINDOW_BEFORE, WINDOW_AFTER = 1.0, 5.0
#: Seconds a producer waits for one round of its bumps before the run fails.
_ROUND_TIMEOUT = 120.0


@dataclass(frozen=True, slots=True)
class SplitPerfSettings:
    """What a split run does.

    Attributes:
        partitions: partitions at creation.
        to: partitions after the split (a multiple of ``partitions`` by at least 2).
        producers: client threads, each with its own store.
        keys: counters.
        in_flight: bumps each producer keeps in flight.
        before: seconds of bumps before the split.
        after: seconds of bumps after it.
        storages: storage nodes (replicas: ``min(3, storages)``).
        servers: servers.
        secure: mutual TLS with role certificates (the default of a local cluster); False serves
            plaintext, as the other protocol benchmarks measure.

    Raises:
        ValueError: at construction, a count that is no split, or a bound below 1.
    """

    partitions: int = 2
    to: int = 4
    producers: int = 4
    keys: int = 64
    in_flight: int = 8
    before: float = 15.0
    after: float = 15.0
    storages: int = 3
    servers: int = 2
    secure: bool = True

    def __post_init__(self) -> None:
        if self.partitions < 1 or self.to < 2 * self.partitions or self.to % self.partitions:
            raise ValueError(
                f"--to {self.to} is no split of {self.partitions} partitions: give a multiple of "
                f"{self.partitions} by at least 2"
            )
        for name in ("producers", "keys", "in_flight", "storages", "servers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be at least 1")
        if self.keys < self.to:
            raise ValueError(f"--keys {self.keys}: at least one key per partition ({self.to})")
        if self.before <= 0 or self.after <= 0:
            raise ValueError("--before and --after are seconds, above 0")


@dataclass(slots=True)
class SplitPerfFigures:
    """What a split run measured (:func:`run_split`; every duration in seconds).

    Attributes:
        partitions: ``[before, after]``.
        producers, keys, in_flight: as run.
        split_complete: the split reached its complete epoch.
        split_seconds: its wall time.
        committed_per_second_before / committed_per_second_after: committed bumps per second
            before the split began and after it completed.
        longest_pause_seconds_keys_that_stay / longest_pause_seconds_keys_that_move: the longest
            gap between two commits of a key, around the split.
        commits: committed bumps in all.
        validate: upstream's validate passed and no producer failed.
        failures: the first producer failures, as text.
        secure: the cluster ran with TLS and roles.
    """

    partitions: list[int]
    producers: int
    keys: int
    in_flight: int
    split_complete: bool
    split_seconds: float
    committed_per_second_before: float
    committed_per_second_after: float
    longest_pause_seconds_keys_that_stay: float
    longest_pause_seconds_keys_that_move: float
    commits: int
    validate: bool
    failures: list[str] = field(default_factory=list)
    secure: bool = True

    def summary(self) -> dict[str, Any]:
        """The figures as one JSON-ready dict (the attribute names)."""
        return asdict(self)

    def text(self) -> str:
        """The figures for people, a few lines."""
        before, after = self.partitions
        return "\n".join(
            [
                f"split {before} -> {after} partitions: "
                + ("complete" if self.split_complete else "NOT complete")
                + f" in {self.split_seconds:.2f}s",
                f"committed/s before {self.committed_per_second_before:,.1f}, "
                f"after {self.committed_per_second_after:,.1f} ({self.commits:,} commits in all)",
                f"longest pause of a key: {self.longest_pause_seconds_keys_that_stay:.3f}s for keys "
                f"that stay, {self.longest_pause_seconds_keys_that_move:.3f}s for keys that move",
                "validate: " + ("passed" if self.validate else f"FAILED {self.failures}"),
            ]
        )


class CounterStore(WaltzClientCallbacks):
    """An application's database in memory: a mark per partition and a counter per key; a new
    partition's genesis moves its mark from none (-1) to ``B(p) + 1``, as the SQL framework does.
    The client loads each feed batch's data before the apply calls (``prefetch_transaction_data``),
    as the SQL framework's callbacks ask it to."""

    prefetch_transaction_data = True

    def __init__(self, marks: dict[int, int]) -> None:
        self.lock = threading.Lock()
        self.marks: defaultdict[int, int] = defaultdict(lambda: -1, marks)
        self.counters: defaultdict[int, int] = defaultdict(int)
        self.values: defaultdict[int, list[int]] = defaultdict(list)
        self.errors: list[str] = []

    def get_client_high_water_mark(self, partition_id: int) -> int:
        """The partition's mark in the store (-1: none yet)."""
        with self.lock:
            return self.marks[partition_id]

    def apply_transaction(self, transaction: Transaction) -> None:
        """Apply a bump (or a split record) exactly once; a gap is an error."""
        pid, tid = transaction.partition_id, transaction.transaction_id
        data = transaction.get_data(BytesSerializer())
        with self.lock:
            mark = self.marks[pid]
            if tid <= mark:
                return
            if transaction.header == SPLIT_RECORD_HEADER:
                genesis = opening_genesis(tid, data)
                if genesis is not None and mark in (-1, genesis.barrier):
                    mark = genesis.barrier  # a new partition's log starts after B(p)
            if tid != mark + 1:
                self.errors.append(f"partition {pid}: transaction {tid} after {mark}")
                raise AssertionError(self.errors[-1])
            if data.startswith(b"bump "):
                key, value = (int(part) for part in data[5:].split(b":"))
                self.counters[key] = value
                self.values[key].append(value)
            self.marks[pid] = tid

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        """Noted: the run's validate fails."""
        self.errors.append(f"partition {partition_id}, transaction {transaction_id}: {exception!r}")


class Bump(TransactionContext):
    """Appends the key's counter plus one under the key's WRITE lock; notes its commit's time."""

    def __init__(self, store: CounterStore, key: int, done: Callable[[Bump, bool], None]) -> None:
        super().__init__()
        self.store, self.key, self._done = store, key, done

    def partition_id(self, num_partitions: int) -> int:
        """``key mod count``: divisible, so a key's new partition is a child of its old one."""
        return self.key % num_partitions

    def execute(self, builder: TransactionBuilder) -> bool:
        """The key's counter plus one, under its WRITE lock."""
        with self.store.lock:
            value = self.store.counters[self.key] + 1
        builder.set_raw_data(b"bump %d:%d" % (self.key, value))
        builder.set_write_locks([PartitionLocalLock("counter", self.key)])
        return True

    def on_completion(self, result: bool) -> None:
        """Note the commit's time."""
        self._done(self, result)


def run_split(settings: SplitPerfSettings, say: Callable[[str], None] | None = None) -> SplitPerfFigures:
    """Start a local cluster, bump counters, split it under the bumps, and measure (module docstring).

    Args:
        settings: what to run.
        say: called with a line at each stage, if given.

    Returns:
        The figures; ``validate`` is False when a producer failed or a key's values are not
        exactly ``1 .. n``.

    Raises:
        ServiceStartError, ClusterNotReadyError: the local cluster did not start.
    """
    from waltz.local.cluster import LocalCluster
    from waltz.local.options import SecurityOptions

    tell = say or (lambda line: None)
    commits: list[tuple[float, int]] = []  # (time, key) of every committed bump
    lock = threading.Lock()

    def done(bump: Bump, result: bool) -> None:
        if result:
            with lock:
                commits.append((time.monotonic(), bump.key))

    with (
        tempfile.TemporaryDirectory(prefix="waltz-perf-split-") as tmp,
        LocalCluster(
            security=SecurityOptions() if settings.secure else SecurityOptions.plaintext(),
            storages=settings.storages,
            servers=settings.servers,
            partitions=settings.partitions,
            work_dir=Path(tmp),
        ) as cluster,
    ):
        marks = {pid: found.high_water_mark for pid, found in cluster.wait_ready(120).items()}
        stores = [CounterStore(dict(marks)) for _ in range(settings.producers)]
        config = WaltzClientConfig(**cluster.client_settings(), zookeeper_session_timeout=10.0)
        clients = [WaltzClient(store, config) for store in stores]
        stop = threading.Event()
        failures: list[BaseException] = []

        def produce(index: int) -> None:
            client, store = clients[index], stores[index]
            try:
                for round_number in itertools.count():
                    if stop.is_set():
                        return
                    base = (round_number * settings.in_flight + index) % settings.keys
                    futures = [
                        client.submit(Bump(store, (base + i * settings.producers) % settings.keys, done))
                        for i in range(settings.in_flight)
                    ]
                    for future in futures:
                        future.result(_ROUND_TIMEOUT)
            except BaseException as exc:
                log.exception("producer %d failed", index)
                failures.append(exc)

        threads = [
            threading.Thread(target=produce, args=(i,), daemon=True) for i in range(settings.producers)
        ]
        tell(
            f"{settings.producers} producers bumping {settings.keys} counters on "
            f"{settings.partitions} partitions"
        )
        started = time.monotonic()
        for thread in threads:
            thread.start()
        time.sleep(settings.before)
        tell(f"splitting to {settings.to} partitions under the bumps")
        split_started = time.monotonic()
        report = cluster.split(settings.to, wait=120)
        split_ended = time.monotonic()
        tell(
            f"split {'complete' if report.complete else 'NOT complete'} in {split_ended - split_started:.2f}s"
        )
        time.sleep(settings.after)
        stop.set()
        for thread in threads:
            thread.join(_ROUND_TIMEOUT + 60)
        ended = time.monotonic()
        tell("applying every partition in every store, then validating")
        for client in clients:
            for pid in range(settings.to):
                client.wait_applied(pid, client.get_high_water_mark(pid, 30), 60)
            client.close()

    return _figures(
        settings, commits, failures, stores, report.complete, (started, split_started, split_ended, ended)
    )


def _figures(
    settings: SplitPerfSettings,
    commits: list[tuple[float, int]],
    failures: list[BaseException],
    stores: list[CounterStore],
    complete: bool,
    times: tuple[float, float, float, float],
) -> SplitPerfFigures:
    """The figures of a run from its commits' times and its stores."""
    started, split_started, split_ended, ended = times
    moved = {k for k in range(settings.keys) if k % settings.to != k % settings.partitions}
    by_key: defaultdict[int, list[float]] = defaultdict(list)
    for at, key in sorted(commits):
        by_key[key].append(at)
    low, high = split_started - WINDOW_BEFORE, split_ended + WINDOW_AFTER

    def longest_gap(moments: list[float]) -> float:
        inside = [t for t in moments if low <= t <= high]
        around = [t for t in moments if t < low][-1:] + inside + [t for t in moments if t > high][:1]
        return max((b - a for a, b in itertools.pairwise(around)), default=0.0)

    gaps = {key: longest_gap(moments) for key, moments in by_key.items()}
    stay = [gap for key, gap in gaps.items() if key not in moved]
    move = [gap for key, gap in gaps.items() if key in moved]
    before = sum(1 for at, _ in commits if started <= at < split_started) / (split_started - started)
    after = sum(1 for at, _ in commits if split_ended <= at <= ended) / (ended - split_ended)
    counts: defaultdict[int, int] = defaultdict(int)
    for _, key in commits:
        counts[key] += 1
    valid = not failures and all(
        not store.errors
        and all(sorted(store.values[key]) == list(range(1, n + 1)) for key, n in counts.items())
        for store in stores
    )
    return SplitPerfFigures(
        partitions=[settings.partitions, settings.to],
        producers=settings.producers,
        keys=settings.keys,
        in_flight=settings.in_flight,
        split_complete=complete,
        split_seconds=round(split_ended - split_started, 3),
        committed_per_second_before=round(before, 1),
        committed_per_second_after=round(after, 1),
        longest_pause_seconds_keys_that_stay=round(max(stay, default=0.0), 3),
        longest_pause_seconds_keys_that_move=round(max(move, default=0.0), 3),
        commits=len(commits),
        validate=valid,
        failures=[repr(f) for f in failures[:3]],
        secure=settings.secure,
    )
