"""Write stall while a replica far behind returns: the longest gap between commits.

What catching a replica up in the background costs the writers (docs/design/recovery.md,
"Catching up in the background"; docs/decisions/0033-catch-up-in-the-background.md).

Starts a real ZooKeeper and three storage node processes on loopback in a temporary directory,
one partition replicated on all three (RF 3), and drives ``StorePartition.submit`` directly (no
Waltz server, no client; the benchmark stands in for one client): --size-byte records, --window
appends kept in flight. Storage node 2 is stopped (SIGTERM) and the others write on until it is
--lag records behind (with --fill-window appends in flight, to get there sooner); then, with
--window in flight again, it is restarted. From the restart until --after seconds after it is a
writer of the store session again, every commit is timed: the figure is the longest gap between
two commits (the write stall) and when it began after the restart, with the time the replica took
to join, the store sessions started meanwhile and the records committed per second. The --steady
seconds just before the restart give the longest gap and the rate of steady writing.

Run it against another tree (e.g. main) from a directory outside the trees compared, with that
tree on PYTHONPATH (``python -m`` puts the working directory first on ``sys.path``); the script
only uses the store partition's public surface.

    .venv/bin/python -m benchmarks.catchup_stall --lag 500000 [--lag 5000000]

Prints one line per lag; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import os
import shlex
import sys
import tempfile
import time
import uuid
from pathlib import Path

from kazoo.client import KazooClient

from waltz.local.nodes import LocalStorageNode
from waltz.local.zookeeper import LocalZooKeeper
from waltz.metadata.values import ClusterParams, ConnectionMetadata, GroupDescriptor, ReplicaAssignments
from waltz.metadata.zk import ClusterZk
from waltz.protocol.records import Record, ReqId
from waltz.protocol.storage_client import StorageAdminClient
from waltz.services.server.store.config import StoreConfig
from waltz.services.server.store.store_partition import StorePartition


class Writer:
    """Keeps ``window`` appends in flight on one partition and times every commit.

    Args:
        window: appends kept in flight (changed between the phases).
        data: each record's transaction data.
    """

    def __init__(self, window: int, data: bytes) -> None:
        self.window = window
        self.data = data
        self.partition: StorePartition | None = None
        self.in_flight: set[asyncio.Future[int]] = set()
        self.commits: list[float] = []  # perf_counter of each commit callback
        self.records: list[int] = []  # records of each commit callback
        self.failed = 0
        self.wake = asyncio.Event()
        self.seq = 0

    def on_commit(self, records: list[Record]) -> None:
        """The store partition's commit callback: time the commit and count its records.

        Args:
            records: the records the commit made durable.
        """
        self.commits.append(time.perf_counter())
        self.records.append(len(records))
        self.wake.set()

    def _done(self, future: asyncio.Future[int]) -> None:
        self.in_flight.discard(future)
        if future.exception() is not None:
            self.failed += 1
        self.wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Submit appends until ``stop`` is set, keeping :attr:`window` in flight.

        Args:
            stop: set to end the writing.
        """
        assert self.partition is not None
        while not stop.is_set():
            for _ in range(self.window - len(self.in_flight)):
                future = self.partition.submit(ReqId(1, 1, 0, self.seq), 0, self.data)
                self.seq += 1
                self.in_flight.add(future)
                future.add_done_callback(self._done)
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), 0.05)


def longest_gap(times: list[float], start: float, end: float) -> tuple[float, float]:
    """The longest stretch between ``start``, the commits within, and ``end``.

    Args:
        times: the commits' ``perf_counter`` times.
        start: the stretch's start.
        end: its end.

    Returns:
        ``(the longest gap, when it began)``, in seconds, when it began counted from ``start``.
    """
    points = [start, *(t for t in times if start < t < end), end]
    return max((b - a, a - start) for a, b in itertools.pairwise(points))


async def one_lag(directory: Path, lag: int, args: argparse.Namespace) -> None:
    """One measurement: a cluster of three storage nodes, node 2 stopped until it is ``lag`` records
    behind, then restarted while one writer goes on; prints the figures' line.

    Args:
        directory: where ZooKeeper's and the nodes' data go (removed by the caller).
        lag: records node 2 is behind when it returns.
        args: the command line's options.
    """
    with LocalZooKeeper(data_dir=directory / "zookeeper") as zookeeper:
        client = KazooClient(hosts=zookeeper.connect_string)
        client.start(timeout=15)
        nodes = [
            LocalStorageNode(
                directory / f"storage-{i}", name=f"storage-{i}", log_path=directory / f"storage-{i}.log"
            )
            for i in range(3)
        ]
        try:
            for node in nodes:
                node.start()
            params = ClusterParams("bench", 1, uuid.uuid4())
            zk = ClusterZk(client, "/waltz-bench")
            zk.create(
                params,
                ReplicaAssignments({n.address: (0,) for n in nodes}),
                GroupDescriptor({n.address: 0 for n in nodes}),
                ConnectionMetadata({n.address: n.admin_port for n in nodes}),
            )
            for node in nodes:
                async with StorageAdminClient(node.admin_address, str(params.cluster_key), 1) as admin:
                    await admin.assign_partition(0, True)
            writer = Writer(args.fill_window, os.urandom(args.size))
            settings: dict[str, float] = {}
            if args.page is not None:
                settings["catch_up_page"] = args.page
            if args.rate is not None:
                settings["catch_up_rate"] = args.rate  # a setting the tree measured may not have
            config = StoreConfig(**settings)  # type: ignore[arg-type]
            partition = StorePartition(
                0, 1, zk, str(params.cluster_key), 1, config=config, on_commit=writer.on_commit
            )
            writer.partition = partition
            partition.start()
            await partition.wait_writable(30.0)
            stop = asyncio.Event()
            task = asyncio.create_task(writer.run(stop))
            victim = nodes[2]
            try:
                await asyncio.sleep(1.0)
                await asyncio.to_thread(victim.stop)
                stopped_at_mark = partition.high_water_mark
                filling = time.perf_counter()
                while partition.high_water_mark < stopped_at_mark + lag:
                    await asyncio.sleep(0.2)
                fill_seconds = time.perf_counter() - filling
                writer.window = args.window
                await asyncio.sleep(2.0)  # steady writing with the measured window
                quiet_start = time.perf_counter()
                await asyncio.sleep(args.steady)
                restart = time.perf_counter()
                steady_gap, _ = longest_gap(writer.commits, quiet_start, restart)
                steady_rate = sum(
                    n
                    for t, n in zip(writer.commits, writer.records, strict=True)
                    if quiet_start < t < restart
                ) / (restart - quiet_start)
                behind = partition.high_water_mark - stopped_at_mark
                sessions = partition.sessions_started
                await asyncio.to_thread(victim.start)
                deadline = restart + args.timeout
                joined: float | None = None
                while time.perf_counter() < deadline:
                    if victim.address in partition.replicas_in_session and partition.writable:
                        joined = time.perf_counter()
                        break
                    await asyncio.sleep(0.01)
                await asyncio.sleep(args.after)
                end = time.perf_counter()
                stall, stall_at = longest_gap(writer.commits, restart, end)
                new_sessions = partition.sessions_started - sessions
                committed = sum(
                    n for t, n in zip(writer.commits, writer.records, strict=True) if restart < t < end
                )
                joined_text = (
                    f"{joined - restart:7.1f} s" if joined is not None else f" >{args.timeout:.0f} s"
                )
                print(
                    f"{behind:>10,} {fill_seconds:7.1f} s {joined_text} {1000 * stall:8.0f} ms"
                    f" {stall_at:8.1f} s {1000 * steady_gap:8.0f} ms {new_sessions:8d}"
                    f" {committed / (end - restart):9,.0f} {steady_rate:9,.0f} {writer.failed:6d}",
                    flush=True,
                )
            finally:
                stop.set()
                await task
                await partition.close()
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
    parser.add_argument(
        "--lag", type=int, action="append", help="records the replica is behind when it returns (repeatable)"
    )
    parser.add_argument(
        "--size", type=int, default=100, help="transaction data bytes per record (default 100)"
    )
    parser.add_argument(
        "--window", type=int, default=100, help="appends in flight while measured (default 100)"
    )
    parser.add_argument(
        "--fill-window",
        type=int,
        default=2000,
        help="appends in flight while the lag builds up (default 2000)",
    )
    parser.add_argument("--page", type=int, help="storage.catchUpPage (default: the tree's default)")
    parser.add_argument("--rate", type=float, help="storage.catchUpRate in bytes/s (default: the default)")
    parser.add_argument(
        "--steady", type=float, default=10.0, help="seconds of steady writing measured before the restart"
    )
    parser.add_argument("--after", type=float, default=2.0, help="seconds measured after the replica joins")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds allowed for it to join")
    parser.add_argument(
        "--directory", type=Path, help="parent of the temporary directory (default: system temp)"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    import waltz

    print(f"command: {shlex.join(sys.orig_argv)}")
    print(f"waltz from {Path(waltz.__file__).parent}, {os.cpu_count()} cores")
    print(f"record {args.size} bytes, {args.window} in flight (one writer), RF 3, storage node 2 stopped")
    print(
        f"{'behind':>10} {'fill':>9} {'to join':>9} {'stall':>11} {'stall at':>10} {'steady gap':>11}"
        f" {'sessions':>8} {'rec/s':>9} {'steady':>9} {'failed':>6}"
    )
    for lag in args.lag or [500_000]:
        with tempfile.TemporaryDirectory(prefix="catchup-stall-", dir=args.directory) as directory:
            asyncio.run(one_lag(Path(directory), lag, args))


if __name__ == "__main__":
    main()
