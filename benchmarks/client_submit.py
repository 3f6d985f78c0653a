#!/usr/bin/env python
"""Client throughput and submit-to-commit latency against a local cluster (prints; asserts nothing).

Starts a LocalCluster (ZooKeeper, 3 storage nodes, 2 servers) and runs one or more client
processes, each submitting ``--n`` transactions of ``--size`` bytes with an APPEND lock of its own
(no lock contention): as fast as ``client.maxConcurrentTransactions`` allows, at a fixed
``--rate``, or one at a time with ``--sequential``.

    .venv/bin/python benchmarks/client_submit.py --n 20000
    .venv/bin/python benchmarks/client_submit.py --n 10000 --clients 3
    .venv/bin/python benchmarks/client_submit.py --n 2000 --sequential
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import sys
import threading
import time
from typing import Any

from waltz import (
    PartitionLocalLock,
    Transaction,
    TransactionBuilder,
    TransactionContext,
    WaltzClient,
    WaltzClientCallbacks,
    WaltzClientConfig,
    tune_garbage_collector,
)
from waltz.services.local_cluster import LocalCluster


class Marks(WaltzClientCallbacks):
    """Keeps each partition's high-water mark in memory."""

    def __init__(self) -> None:
        self.marks: dict[int, int] = {}
        self.lock = threading.Lock()

    def get_client_high_water_mark(self, partition_id: int) -> int:
        with self.lock:
            return self.marks.get(partition_id, -1)

    def apply_transaction(self, transaction: Transaction) -> None:
        with self.lock:
            self.marks[transaction.partition_id] = transaction.transaction_id

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        print(f"uncaught in partition {partition_id} at {transaction_id}: {exception!r}", file=sys.stderr)


class Append(TransactionContext):
    def __init__(self, index: int, data: bytes) -> None:
        super().__init__()
        self.index = index
        self.data = data

    def partition_id(self, num_partitions: int) -> int:
        return self.index % num_partitions

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_raw_data(self.data)
        builder.set_append_locks([PartitionLocalLock("benchmark", self.index)])
        return True


def run_client(config: WaltzClientConfig, args: argparse.Namespace) -> tuple[float, list[float]]:
    """Submit the transactions of one client; returns (transactions/s, latencies in seconds)."""
    data = b"x" * args.size
    latencies: list[float] = []
    with WaltzClient(Marks(), config) as client:
        client.wait_mounted(30)
        if not args.no_gc_tuning:
            tune_garbage_collector()
        for future in [client.submit(Append(i, data)) for i in range(200)]:  # warm-up
            future.result(60)
        started = time.perf_counter()
        futures = []
        for i in range(args.n):
            if args.rate:
                delay = started + i / args.rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
            submitted = time.perf_counter()
            future = client.submit(Append(i, data))
            if args.sequential:
                future.result(60)
                latencies.append(time.perf_counter() - submitted)
            else:
                future.add_done_callback(lambda _, s=submitted: latencies.append(time.perf_counter() - s))
                futures.append(future)
        for future in futures:
            future.result(300)
        return args.n / (time.perf_counter() - started), latencies


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a live process has used so far (/proc/<pid>/stat)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu() -> float:
    """CPU seconds of this process and of its reaped children (the client processes)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _process(config: WaltzClientConfig, args: argparse.Namespace, results: Any, index: int) -> None:
    results[index] = run_client(config, args)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=20_000, help="transactions per client")
    parser.add_argument("--size", type=int, default=100, help="bytes of data per transaction")
    parser.add_argument("--clients", type=int, default=1, help="client processes")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--max-concurrent", type=int, default=4000, help="client.maxConcurrentTransactions")
    parser.add_argument(
        "--rate", type=float, default=0.0, help="transactions/s per client (0: as fast as possible)"
    )
    parser.add_argument(
        "--sequential", action="store_true", help="wait for each commit before the next submit"
    )
    parser.add_argument(
        "--no-gc-tuning",
        action="store_true",
        help="leave the client process's garbage collector at its defaults (waltz.tune_garbage_collector)",
    )
    args = parser.parse_args()
    print("command:", " ".join(sys.argv))
    with LocalCluster(storages=3, servers=2, partitions=args.partitions) as cluster:
        config = WaltzClientConfig(
            zookeeper_connect_string=cluster.zookeeper_connect_string,
            cluster_root=cluster.root,
            client_max_concurrent_transactions=args.max_concurrent,
        )
        pids = cluster.pids()
        cpu_before = {name: _cpu_seconds(pid) for name, pid in pids.items()}
        client_before = _own_cpu()
        if args.clients == 1:
            results = {0: run_client(config, args)}
        else:
            context = multiprocessing.get_context("spawn")
            with context.Manager() as manager:
                shared = manager.dict()
                processes = [
                    context.Process(target=_process, args=(config, args, shared, i))
                    for i in range(args.clients)
                ]
                for process in processes:
                    process.start()
                for process in processes:
                    process.join()
                results = dict(shared)
        cpu = {name: _cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
        cpu["client(s)"] = _own_cpu() - client_before
    total = sum(rate for rate, _ in results.values())
    latencies = sorted(x for _, lat in results.values() for x in lat)

    def percentile(p: float) -> float:
        return (
            latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else float("nan")
        )

    print(
        f"clients={len(results)} transactions/client={args.n} size={args.size}B "
        f"partitions={args.partitions}: {total:,.0f} transactions/s; "
        f"submit->commit p50 {percentile(0.5):.1f} ms, p99 {percentile(0.99):.1f} ms"
    )
    transactions = args.n * len(results)
    by_role: dict[str, float] = {}
    for name, seconds in cpu.items():
        role = name.rstrip("0123456789-")
        by_role[role] = by_role.get(role, 0.0) + seconds
    print(
        "CPU per committed transaction (incl. warm-up), microseconds: "
        + ", ".join(f"{role} {seconds / transactions * 1e6:.0f}" for role, seconds in sorted(by_role.items()))
        + f"; total {sum(by_role.values()) / transactions * 1e6:.0f}"
    )


if __name__ == "__main__":
    main()
