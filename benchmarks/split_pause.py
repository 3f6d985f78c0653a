"""Throughput before and after a live split, and the longest write pause of a key during the
handover (prints figures and writes JSON; asserts nothing about timings).

The split of docs/design/splits.md ("The handover", "Clients across a split"): ``--producers``
clients, each in a thread with its own in-memory store mounting every partition, bump counters
(read the key's value in the store, append ``value + 1`` under the key's WRITE lock, routed by
``key mod count``) over ``--keys`` keys, ``--in-flight`` at a time each. After ``--before``
seconds, ``waltz cluster split --to M`` runs (``SplitRun``); then ``--after`` seconds more.

Printed, and written with ``--json``:

- committed bumps per second before the split and after it (the split's own seconds left out);
- the split's wall time, from the first step to the epoch complete;
- per key, the longest gap between two of its commits from 1 s before the split began to 5 s after
  it ended; the highest over the keys that stay in their partition and over those that move to a
  new one (the targets: under 1 s for keys that stay, under the ZooKeeper session timeout for
  keys that move);
- upstream Waltz's validate: per key, the values the log holds are exactly ``1 .. n`` for its
  ``n`` commits in every store (no update lost, none doubled); a failure exits 1.

    .venv/bin/python -m benchmarks.split_pause                      # 2 -> 4, 4 producers
    .venv/bin/python -m benchmarks.split_pause --before 10 --after 10 --json out.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

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
from waltz.admin.cluster_admin import ClusterAdmin
from waltz.admin.split_run import SplitRun
from waltz.local.cluster import LocalCluster
from waltz.local.options import SecurityOptions
from waltz.protocol.split_records import SPLIT_RECORD_HEADER, SplitGenesis, decode_split_record

#: The protocol's figures, comparable with the other benchmarks: plaintext (decision 0065).
PLAINTEXT = SecurityOptions.plaintext()
#: The window around the split in which pauses are measured, seconds before and after.
WINDOW_BEFORE, WINDOW_AFTER = 1.0, 5.0


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
                record = decode_split_record(data)
                if isinstance(record, SplitGenesis) and mark in (-1, record.barrier):
                    mark = record.barrier
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


def main() -> None:
    """Parse the command line (``--help``), run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=2, help="partitions at creation")
    parser.add_argument("--to", type=int, default=4, help="partitions after the split")
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--keys", type=int, default=64)
    parser.add_argument("--in-flight", type=int, default=8, help="bumps each producer keeps in flight")
    parser.add_argument("--before", type=float, default=15.0, help="seconds before the split")
    parser.add_argument("--after", type=float, default=15.0, help="seconds after it")
    parser.add_argument("--storages", type=int, default=3)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--json", dest="json_output", help="write the figures to this file as JSON")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    commits: list[tuple[float, int]] = []  # (time, key) of every committed bump
    lock = threading.Lock()

    def done(bump: Bump, result: bool) -> None:
        if result:
            with lock:
                commits.append((time.monotonic(), bump.key))

    with (
        tempfile.TemporaryDirectory(prefix="waltz-bench-split-") as tmp,
        LocalCluster(
            security=PLAINTEXT,
            storages=args.storages,
            servers=args.servers,
            partitions=args.partitions,
            work_dir=Path(tmp),
        ) as cluster,
    ):
        marks = {pid: found.high_water_mark for pid, found in cluster.wait_ready(120).items()}
        stores = [CounterStore(dict(marks)) for _ in range(args.producers)]
        config = WaltzClientConfig(**cluster.client_settings(), zookeeper_session_timeout=10.0)
        clients = [WaltzClient(store, config) for store in stores]
        stop = threading.Event()
        failures: list[BaseException] = []

        def produce(index: int) -> None:
            client, store = clients[index], stores[index]
            try:
                for round_number in range(10_000_000):
                    if stop.is_set():
                        return
                    base = (round_number * args.in_flight + index) % args.keys
                    futures = [
                        client.submit(Bump(store, (base + i * args.producers) % args.keys, done))
                        for i in range(args.in_flight)
                    ]
                    for future in futures:
                        future.result(120)
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=produce, args=(i,), daemon=True) for i in range(args.producers)]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        time.sleep(args.before)
        split_started = time.monotonic()
        with ClusterAdmin.connect(
            cluster.zookeeper_connect_string, cluster.root, connect_timeout=30
        ) as admin:
            report = SplitRun(admin.cluster, wait=120).run(args.to)
        split_ended = time.monotonic()
        time.sleep(args.after)
        stop.set()
        for thread in threads:
            thread.join(180)
        ended = time.monotonic()
        for client in clients:
            for pid in range(args.to):
                client.wait_applied(pid, client.get_high_water_mark(pid, 30), 60)
            client.close()

    moved = {k for k in range(args.keys) if k % args.to != k % args.partitions}
    by_key: defaultdict[int, list[float]] = defaultdict(list)
    for at, key in sorted(commits):
        by_key[key].append(at)
    low, high = split_started - WINDOW_BEFORE, split_ended + WINDOW_AFTER

    def longest_gap(times: list[float]) -> float:
        inside = [t for t in times if low <= t <= high]
        around = [t for t in times if t < low][-1:] + inside + [t for t in times if t > high][:1]
        return max((b - a for a, b in itertools.pairwise(around)), default=0.0)

    gaps = {key: longest_gap(times) for key, times in by_key.items()}
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
    figures = {
        "partitions": [args.partitions, args.to],
        "producers": args.producers,
        "keys": args.keys,
        "in_flight": args.in_flight,
        "split_complete": report.complete,
        "split_seconds": round(split_ended - split_started, 3),
        "committed_per_second_before": round(before, 1),
        "committed_per_second_after": round(after, 1),
        "longest_pause_seconds_keys_that_stay": round(max(g for k, g in gaps.items() if k not in moved), 3),
        "longest_pause_seconds_keys_that_move": round(max(g for k, g in gaps.items() if k in moved), 3),
        "commits": len(commits),
        "validate": valid,
        "failures": [repr(f) for f in failures[:3]],
    }
    print(json.dumps(figures, indent=2))
    if args.json_output:
        Path(args.json_output).write_text(json.dumps(figures, indent=2) + "\n")
    if not valid:
        sys.exit(1)


if __name__ == "__main__":
    main()
