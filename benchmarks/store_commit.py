"""Replicated store commit throughput: committed records/s and submit-to-commit latency at RF 3.

The store of docs/design/server.md ("Store sessions", "Quorum writes and batching"), measured
apart from the server's lock checks and the clients. It varies the store's batch size and its
batches in flight (``--batch``, ``--in-flight-batches``; the default of the second is
docs/decisions/0011-in-flight-defaults.md's).

Starts a real ZooKeeper and --storages storage node processes on loopback in a temporary
directory, creates a cluster whose partitions are replicated on every storage node, and drives
``StorePartition.submit`` directly (no Waltz server, no client): 200-byte records are submitted
"as they come", keeping --window records in flight per partition; the store session forms its
batches from whatever is queued when it may send (at most --batch records per append request,
--in-flight-batches requests in flight). A record counts once a quorum of replicas has flushed
it. For each partition count it prints committed records/s, p50/p99 submit-to-commit latency,
records per append request and per flush on the storage nodes, and how the CPU was split between
the processes (percent of one core; the machine's total is 100 % x cores).

A last, separate case kills one storage node with SIGKILL while appends continue on a fresh
partition, and prints the time from the kill to the first commit after it, to the first commit
of the next store session (which runs at quorum 2 of 3), the longest commit gap, and the rate
afterwards.

With --profile, py-spy samples the benchmark process and storage node 0 during the first case
(raw folded stacks under /tmp) and the top frames are printed.

    .venv/bin/python -m benchmarks.store_commit [--seconds 8] [--partitions 1,4] [--profile]

Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import logging
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from kazoo.client import KazooClient

from waltz.local.nodes import LocalStorageNode
from waltz.local.zookeeper import LocalZooKeeper
from waltz.metadata.values import (
    ClusterParams,
    ConnectionMetadata,
    GroupDescriptor,
    ReplicaAssignments,
)
from waltz.metadata.zk import ClusterZk
from waltz.perf.cost import process_cpu_seconds
from waltz.protocol.records import Record, ReqId
from waltz.protocol.storage_client import StorageAdminClient
from waltz.services.server.store.config import StoreConfig
from waltz.services.server.store.store_partition import StorePartition

PY_SPY = Path(sys.executable).parent / "py-spy"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: Frames left out of the inclusive profile listing: every sample passes through them.
PLUMBING = ("asyncio/", "threading.py", "concurrent/", "typer/", "<frozen", "<module>", "main (")


# ---- CPU accounting from /proc ----


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds per thread name (threads of the same name added up)."""
    result: dict[str, float] = collections.defaultdict(float)
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                text = f.read()
        except FileNotFoundError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        result[name] += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return result


def machine_cpu_seconds() -> dict[str, float]:
    """CPU seconds of the whole machine so far (all cores): busy, idle (with iowait), steal."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = ticks
    return {
        "busy": (user + nice + system + irq + softirq) / CLOCK_TICKS,
        "softirq": (irq + softirq) / CLOCK_TICKS,
        "idle": (idle + iowait) / CLOCK_TICKS,
        "steal": steal / CLOCK_TICKS,
    }


@dataclass
class CpuSampler:
    """CPU seconds used by named processes between :meth:`start` and :meth:`stop`."""

    pids: dict[str, int]
    used: dict[str, float] = field(default_factory=dict)
    threads: dict[str, float] = field(default_factory=dict)
    machine: dict[str, float] = field(default_factory=dict)
    elapsed: float = 0.0

    def start(self) -> None:
        """Read every process's, this process's threads' and the machine's CPU so far."""
        self._before = {name: process_cpu_seconds(pid) for name, pid in self.pids.items()}
        self._threads_before = thread_cpu_seconds(os.getpid())
        self._machine_before = machine_cpu_seconds()
        self._started = time.perf_counter()

    def stop(self) -> None:
        """Read them again; :attr:`used`, :attr:`threads`, :attr:`machine` and :attr:`elapsed` then
        hold the differences."""
        self.elapsed = time.perf_counter() - self._started
        self.used = {name: process_cpu_seconds(pid) - self._before[name] for name, pid in self.pids.items()}
        after = thread_cpu_seconds(os.getpid())
        self.threads = {n: after[n] - self._threads_before.get(n, 0.0) for n in after}
        self.machine = {k: v - self._machine_before[k] for k, v in machine_cpu_seconds().items()}

    def percent(self, seconds: float) -> float:
        """CPU seconds as a percentage of one core over the sampled time.

        Args:
            seconds: CPU seconds used between :meth:`start` and :meth:`stop`.

        Returns:
            The percentage (100 is one core busy).
        """
        return 100.0 * seconds / self.elapsed


# ---- the cluster ----


@dataclass
class Cluster:
    """The benchmark's cluster: its metadata in ZooKeeper and its processes.

    Attributes:
        zk: the cluster's metadata.
        params: its parameters (name, partitions, key).
        storages: its storage nodes.
        zookeeper: its ZooKeeper.
    """

    zk: ClusterZk
    params: ClusterParams
    storages: list[LocalStorageNode]
    zookeeper: LocalZooKeeper

    @property
    def key(self) -> str:
        """The cluster key, as the storage nodes' admin clients take it."""
        return str(self.params.cluster_key)


async def assign_partitions(cluster: Cluster) -> None:
    """Assign every partition to every storage node (each a replica).

    Args:
        cluster: the cluster.
    """
    for node in cluster.storages:
        async with StorageAdminClient(
            node.admin_address, cluster.key, cluster.params.num_partitions
        ) as admin:
            for pid in range(cluster.params.num_partitions):
                await admin.assign_partition(pid, True)


async def storage_counters(cluster: Cluster) -> dict[str, float]:
    """Append requests, flushes and records over the live storage nodes (metric name prefixes)."""
    totals: dict[str, float] = collections.defaultdict(float)
    for node in cluster.storages:
        if not node.process.is_running():
            continue
        async with StorageAdminClient(
            node.admin_address, cluster.key, cluster.params.num_partitions
        ) as admin:
            metrics = await admin.metrics()
        for name, value in metrics.items():
            if name.startswith("waltz_storage_append_flushes_total"):
                totals["flushes"] += value
            elif name.startswith("waltz_storage_appended_records_total"):
                totals["records"] += value
            elif name.startswith("waltz_storage_requests_total") and 'type="append"' in name:
                totals["requests"] += value
    return totals


# ---- the load ----


class Driver:
    """Keeps ``window`` records in flight on one store partition and measures their commits.

    Args:
        partition_id: the partition.
        window: records kept in flight.
        data: each record's transaction data.
    """

    def __init__(self, partition_id: int, window: int, data: bytes) -> None:
        self.partition_id = partition_id
        self.window = window
        self.data = data
        self.partition: StorePartition | None = None
        self.submitted_at: list[float] = []  # by ReqId.seq_num
        self.futures: deque[asyncio.Future[int]] = deque()
        self.wake = asyncio.Event()
        self.measuring = False
        self.measured = 0
        self.latencies: list[float] = []
        self.failed = 0
        self.commits: list[tuple[float, int, int]] = []  # (time, session count, records), if tracing
        self.tracing = False

    def on_commit(self, records: list[Record]) -> None:
        """The store partition's commit callback: record the latencies (when measuring) and the commit
        (when tracing).

        Args:
            records: the records the commit made durable.
        """
        now = time.perf_counter()
        if self.measuring:
            self.measured += len(records)
            submitted_at = self.submitted_at
            self.latencies.extend(now - submitted_at[r.req_id.seq_num] for r in records)
        if self.tracing:
            assert self.partition is not None
            self.commits.append((now, self.partition.sessions_started, len(records)))
        self.wake.set()

    def _reap(self) -> None:
        futures = self.futures
        while futures and futures[0].done():
            if futures.popleft().exception() is not None:
                self.failed += 1

    async def run(self, stop: asyncio.Event) -> None:
        """Submit records until ``stop`` is set, keeping :attr:`window` in flight.

        Args:
            stop: set to end the load.
        """
        assert self.partition is not None
        partition = self.partition
        submitted_at = self.submitted_at
        while not stop.is_set():
            self._reap()
            for _ in range(self.window - len(self.futures)):
                seq = len(submitted_at)
                submitted_at.append(time.perf_counter())
                self.futures.append(partition.submit(ReqId(1, 1, self.partition_id, seq), 0, self.data))
            self.wake.clear()
            await self.wake.wait()

    async def drain(self, timeout: float) -> None:
        """Wait for the records in flight, at most ``timeout`` seconds, and count the failed ones.

        Args:
            timeout: seconds to wait.
        """
        if self.futures:
            await asyncio.wait(list(self.futures), timeout=timeout)
        self._reap()


async def ticker(drivers: list[Driver], stop: asyncio.Event) -> None:
    """Wake the drivers now and then, so that appends that fail (no commit) are replaced too."""
    while not stop.is_set():
        await asyncio.sleep(0.05)
        for driver in drivers:
            driver.wake.set()


async def start_partitions(
    cluster: Cluster, partition_ids: list[int], args: argparse.Namespace
) -> tuple[list[Driver], list[StorePartition]]:
    """Start a store partition and its driver for each partition ID, and wait until they are writable.

    Args:
        cluster: the cluster.
        partition_ids: the partitions.
        args: the command line's options (batch sizes, window, record size).

    Returns:
        The drivers and their store partitions, in the order of ``partition_ids``.
    """
    config = StoreConfig(max_batch_records=args.batch, max_in_flight_batches=args.in_flight_batches)
    data = os.urandom(args.size)
    drivers = [Driver(pid, args.window, data) for pid in partition_ids]
    partitions = []
    for driver in drivers:
        partition = StorePartition(
            driver.partition_id,
            1,
            cluster.zk,
            cluster.key,
            cluster.params.num_partitions,
            config,
            on_commit=driver.on_commit,
        )
        driver.partition = partition
        partition.start()
        partitions.append(partition)
    for partition in partitions:
        await partition.wait_writable(30.0)
    return drivers, partitions


def start_profilers(
    pids: dict[str, int], seconds: float, prefix: str
) -> list[tuple[str, Path, subprocess.Popen[bytes]]]:
    """Start py-spy on each process for ``seconds`` (raw folded stacks, 100 samples/s).

    Args:
        pids: the processes by name.
        seconds: how long to sample.
        prefix: the output files' prefix (``<prefix>-<name>.txt``).

    Returns:
        ``(name, output file, py-spy process)`` per process.
    """
    profilers = []
    for name, pid in pids.items():
        output = Path(f"{prefix}-{name}.txt")
        command = [str(PY_SPY), "record", "--pid", str(pid), "--duration", str(max(1, round(seconds)))]
        command += ["--format", "raw", "--output", str(output), "--rate", "100", "--nonblocking", "--threads"]
        profilers.append(
            (name, output, subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        )
    return profilers


def summarize_profile(name: str, path: Path, top: int) -> None:
    """Print a py-spy raw (folded) profile: samples by thread, top functions by self and inclusive."""
    threads: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = [re.sub(r":\d+\)$", ")", frame) for frame in stack.split(";")]
        if frames[0].startswith("thread ("):
            threads[frames.pop(0)] += count
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    print(f"\nprofile of {name} ({total} samples of non-idle threads at 100/s, {path}):")
    for thread, count in threads.most_common(6):
        print(f"  {100 * count / total:5.1f}% {thread}")
    print("  self   function")
    for frame, count in own.most_common(top):
        print(f"  {100 * count / total:5.1f}% {frame}")
    print("  incl   function (event loop, thread and CLI plumbing left out)")
    shown = [(f, c) for f, c in inclusive.most_common() if not any(p in f for p in PLUMBING)]
    for frame, count in shown[:top]:
        print(f"  {100 * count / total:5.1f}% {frame}")


def quantile_ms(values: list[float], q: float) -> float:
    """A quantile of latencies, in milliseconds.

    Args:
        values: latencies in seconds.
        q: the quantile, 0 to 1.

    Returns:
        The quantile, NaN without values.
    """
    if not values:
        return float("nan")
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def throughput_case(
    cluster: Cluster, partition_ids: list[int], args: argparse.Namespace, profile: bool
) -> None:
    """One throughput case: drive the partitions for ``--seconds`` after ``--warmup``; print its line
    (and, with ``profile``, the profiles).

    Args:
        cluster: the cluster.
        partition_ids: the partitions of the case (fresh ones).
        args: the command line's options.
        profile: py-spy the benchmark and storage node 0.
    """
    drivers, partitions = await start_partitions(cluster, partition_ids, args)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(d.run(stop)) for d in drivers]
    tasks.append(asyncio.create_task(ticker(drivers, stop)))
    await asyncio.sleep(args.warmup)
    pids = {"bench": os.getpid()}
    pids |= {f"storage-{i}": n.process.pid for i, n in enumerate(cluster.storages) if n.process.pid}
    pids["zookeeper"] = cluster.zookeeper.process.pid or 0
    sampler = CpuSampler(pids)
    before = await storage_counters(cluster)
    profilers = []
    if profile:
        profilers = start_profilers(
            {"bench": os.getpid(), "storage-0": pids["storage-0"]}, args.seconds, args.profile_prefix
        )
    sampler.start()
    for d in drivers:
        d.measuring = True
    started = time.perf_counter()
    await asyncio.sleep(args.seconds)
    for d in drivers:
        d.measuring = False
    elapsed = time.perf_counter() - started
    sampler.stop()
    after = await storage_counters(cluster)
    stop.set()
    for d in drivers:
        d.wake.set()
    await asyncio.gather(*tasks)
    for d in drivers:
        await d.drain(30.0)
    for p in partitions:
        await p.close()
    committed = sum(d.measured for d in drivers)
    latencies = [x for d in drivers for x in d.latencies]
    requests = after["requests"] - before["requests"]
    flushes = after["flushes"] - before["flushes"]
    records = after["records"] - before["records"]
    print(
        f"{len(partition_ids):>10} {committed / elapsed:>12,.0f} {quantile_ms(latencies, 0.5):>8.1f}"
        f" {quantile_ms(latencies, 0.99):>8.1f} {records / max(requests, 1):>9.0f}"
        f" {records / max(flushes, 1):>10.0f} {sum(d.failed for d in drivers):>6}"
    )
    split = "  ".join(f"{name} {sampler.percent(s):.0f}%" for name, s in sampler.used.items())
    machine = {k: sampler.percent(v) for k, v in sampler.machine.items()}
    others = machine["busy"] - sum(sampler.percent(s) for s in sampler.used.values())
    print(f"{'':>10} cpu (% of one core): {split}")
    print(
        f"{'':>10} machine: busy {machine['busy']:.0f}% (irq/softirq {machine['softirq']:.0f}%,"
        f" not in these processes {others:.0f}%), idle {machine['idle']:.0f}%, steal {machine['steal']:.0f}%"
    )
    if committed:
        bench_us = 1e6 * sampler.used["bench"] / committed
        storage_us = 1e6 * sum(v for k, v in sampler.used.items() if k.startswith("storage")) / committed
        cores = os.cpu_count() or 1
        print(
            f"{'':>10} cpu per committed record: bench {bench_us:.1f} us, storage nodes {storage_us:.1f} us"
            f" (all replicas), together {bench_us + storage_us:.1f} us: {cores} busy cores would commit"
            f" {cores * 1e6 / (bench_us + storage_us):,.0f}/s, the bench's one event loop"
            f" {1e6 / bench_us:,.0f}/s"
        )
    threads = sorted(sampler.threads.items(), key=lambda kv: -kv[1])
    busy = "  ".join(f"{name} {sampler.percent(s):.0f}%" for name, s in threads if sampler.percent(s) >= 1)
    print(f"{'':>10} bench threads: {busy}")
    for name, path, process in profilers:
        _, error = process.communicate()
        if process.returncode != 0 or not path.exists():
            print(f"py-spy on {name} failed: {error.decode(errors='replace').strip()}")
        else:
            summarize_profile(name, path, args.profile_top)


async def kill_case(cluster: Cluster, partition_id: int, args: argparse.Namespace) -> None:
    """Kill a storage node (SIGKILL) while appends go on; print how long until commits resume and
    until the next store session commits.

    Args:
        cluster: the cluster (its last storage node is killed).
        partition_id: a fresh partition.
        args: the command line's options.
    """
    drivers, partitions = await start_partitions(cluster, [partition_id], args)
    driver, partition = drivers[0], partitions[0]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(driver.run(stop)), asyncio.create_task(ticker(drivers, stop))]
    await asyncio.sleep(args.warmup)
    driver.tracing = True
    sessions_before = partition.sessions_started
    victim = cluster.storages[-1]
    killed_at = time.perf_counter()
    await asyncio.to_thread(victim.kill)
    deadline = killed_at + args.kill_timeout
    new_session_at: float | None = None
    while time.perf_counter() < deadline:
        await asyncio.sleep(0.05)
        if new_session_at is None:
            new_session_at = next(
                (t for t, s, _ in driver.commits if t > killed_at and s > sessions_before), None
            )
        elif time.perf_counter() - new_session_at >= args.after_kill:
            break
    stop.set()
    driver.wake.set()
    await asyncio.gather(*tasks)
    await driver.drain(30.0)
    await partition.close()
    after = [(t - killed_at, s, n) for t, s, n in driver.commits if t > killed_at]
    first = after[0][0] if after else float("nan")
    gaps = [b[0] - a[0] for a, b in zip([(0.0, 0, 0), *after], after, strict=False)]
    print(f"storage node {victim.address} killed (SIGKILL) during appends on partition {partition_id}:")
    print(f"  first commit after the kill:          {1000 * first:9.1f} ms")
    if new_session_at is None:
        print(f"  no commit in a new store session within {args.kill_timeout:.0f} s")
    else:
        rate_from = new_session_at - killed_at
        tail = [(t, n) for t, s, n in after if s > sessions_before]
        span = tail[-1][0] - rate_from if tail else 0.0
        print(f"  first commit in the next store session: {1000 * rate_from:9.1f} ms (quorum 2 of 3)")
        print(f"  longest commit gap after the kill:    {1000 * max(gaps):9.1f} ms")
        if span > 0:
            print(f"  committed records/s afterwards:       {sum(n for _, n in tail) / span:9,.0f}")
    print(f"  appends failed (session ended before quorum): {driver.failed}")


async def main_async(args: argparse.Namespace, directory: Path) -> None:
    """Start ZooKeeper and the storage nodes in ``directory``, run the cases, stop everything.

    Args:
        args: the command line's options.
        directory: the run's temporary directory.
    """
    with LocalZooKeeper(data_dir=directory / "zookeeper") as zookeeper:
        client = KazooClient(hosts=zookeeper.connect_string)
        client.start(timeout=15)
        nodes = [
            LocalStorageNode(
                directory / f"storage-{i}", name=f"storage-{i}", log_path=directory / f"storage-{i}.log"
            )
            for i in range(args.storages)
        ]
        try:
            for node in nodes:
                node.start()
            num_partitions = sum(args.partitions) + 1
            params = ClusterParams("bench", num_partitions, uuid.uuid4())
            zk = ClusterZk(client, "/waltz-bench")
            zk.create(
                params,
                ReplicaAssignments({n.address: tuple(range(num_partitions)) for n in nodes}),
                GroupDescriptor({n.address: 0 for n in nodes}),
                ConnectionMetadata({n.address: n.admin_port for n in nodes}),
            )
            cluster = Cluster(zk, params, nodes, zookeeper)
            await assign_partitions(cluster)
            print(f"command: {shlex.join(sys.orig_argv)}")
            print(
                f"{args.storages} storage nodes (pids {', '.join(str(n.process.pid) for n in nodes)}),"
                f" benchmark pid {os.getpid()}, ZooKeeper pid {zookeeper.process.pid},"
                f" {os.cpu_count()} cores,"
                f" directory {directory}"
            )
            print(
                f"record {args.size} bytes, window {args.window} records in flight per partition,"
                f" batch <= {args.batch} records, <= {args.in_flight_batches} batches in flight,"
                f" warm-up {args.warmup:g} s, measured {args.seconds:g} s"
            )
            print(
                f"{'partitions':>10} {'commits/s':>12} {'p50 ms':>8} {'p99 ms':>8} {'rec/req':>9}"
                f" {'rec/flush':>10} {'failed':>6}"
            )
            next_partition = 0
            for i, count in enumerate(args.partitions):
                ids = list(range(next_partition, next_partition + count))
                next_partition += count
                await throughput_case(cluster, ids, args, profile=args.profile and i == 0)
            if args.kill and args.storages >= 3:
                print()
                await kill_case(cluster, next_partition, args)
        finally:
            for node in nodes:
                node.close()
            client.stop()
            client.close()


def main() -> None:
    """Parse the command line (``--help``), run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per case (default 8)")
    parser.add_argument("--warmup", type=float, default=1.5, help="seconds before measuring (default 1.5)")
    parser.add_argument(
        "--partitions", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4], help="e.g. 1,4"
    )
    parser.add_argument("--size", type=int, default=200, help="transaction data bytes per record")
    parser.add_argument("--window", type=int, default=2000, help="records in flight per partition")
    parser.add_argument(
        "--batch", type=int, default=StoreConfig().max_batch_records, help="StoreConfig.max_batch_records"
    )
    parser.add_argument(
        "--in-flight-batches",
        type=int,
        default=StoreConfig().max_in_flight_batches,
        help="StoreConfig.max_in_flight_batches",
    )
    parser.add_argument("--storages", type=int, default=3, help="storage nodes, each a replica (default 3)")
    parser.add_argument("--no-kill", dest="kill", action="store_false", help="skip the kill -9 case")
    parser.add_argument("--kill-timeout", type=float, default=20.0, help="seconds to wait for a new session")
    parser.add_argument("--after-kill", type=float, default=2.0, help="seconds measured in the new session")
    parser.add_argument("--profile", action="store_true", help="py-spy the first case (bench and storage-0)")
    parser.add_argument("--profile-prefix", default="/tmp/store_commit-profile", help="py-spy output prefix")
    parser.add_argument("--profile-top", type=int, default=15, help="frames printed per profile")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory(prefix="waltz-store-bench-") as tmp:
        asyncio.run(main_async(args, Path(tmp)))


if __name__ == "__main__":
    main()
