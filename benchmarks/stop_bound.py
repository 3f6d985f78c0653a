"""Stop times when a server, a storage node and ZooKeeper all get SIGTERM at the same moment.

The bound a node process keeps after SIGTERM in every ZooKeeper state (docs/design/server.md,
"Stopping within a bound"): starts a real ZooKeeper and one storage node on loopback in a
temporary directory, a one-partition cluster, then --rounds times: starts a server, waits until
its partition is writable, sends SIGTERM to the server, the storage node and ZooKeeper at once,
and times how long the server and the storage node take to exit (and with which status: 0 is a
graceful stop, 75 the watchdog's exit at the bound). ZooKeeper and the storage node are started
again for the next round.

    .venv/bin/python -m benchmarks.stop_bound --rounds 20

Prints one line per round and a summary; exits with 1 when a process outlived the bound or
exited with a status other than 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

import grpc
from kazoo.client import KazooClient

from waltz.local.nodes import LocalServer, LocalStorageNode
from waltz.local.options import DEFAULT_SERVER_ENV
from waltz.local.zookeeper import LocalZooKeeper
from waltz.metadata.values import ClusterParams, ConnectionMetadata, GroupDescriptor, ReplicaAssignments
from waltz.metadata.zk import ClusterZk
from waltz.protocol.server_client import ServerAdminClient
from waltz.protocol.storage_client import StorageAdminClient

try:
    from waltz.services.runtime import STOP_BOUND
except ImportError:  # code from before the bound (run against it to compare)
    STOP_BOUND = 10.0

ROOT = "/waltz/stop-bound"


async def wait_writable(endpoint: str, timeout: float) -> None:
    """Wait until the server says partition 0 is writable."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            async with ServerAdminClient(endpoint, timeout=2) as client:
                status = await client.status()
            if any(p.partition_id == 0 and p.writable for p in status.partitions):
                return
        except grpc.aio.AioRpcError:
            pass  # not up yet: ask again until the deadline
        await asyncio.sleep(0.1)
    raise TimeoutError(f"partition 0 was not writable on {endpoint} within {timeout}s")


def create_cluster(zookeeper: LocalZooKeeper, storage: LocalStorageNode) -> None:
    """A one-partition cluster whose replica is on ``storage``."""
    client = KazooClient(hosts=zookeeper.connect_string)
    client.start(timeout=10)
    try:
        params = ClusterParams("stop-bound", 1, uuid.uuid4())
        ClusterZk(client, ROOT).create(
            params,
            ReplicaAssignments({storage.address: (0,)}),
            GroupDescriptor({storage.address: 0}),
            ConnectionMetadata({storage.address: storage.admin_port}),
        )
    finally:
        client.stop()
        client.close()

    async def assign() -> None:
        async with StorageAdminClient(storage.admin_address, str(params.cluster_key), 1) as admin:
            await admin.assign_partition(0, True)

    asyncio.run(assign())


def one_round(directory: Path, attempt: int, zookeeper: LocalZooKeeper, storage: LocalStorageNode) -> bool:
    """One round; prints its line and returns whether both processes kept the bound."""
    if not zookeeper.is_running():
        zookeeper.start()
    if not storage.process.is_running():
        storage.start()
    name = f"server-{attempt}"
    with LocalServer(
        zookeeper.connect_string,
        ROOT,
        name=name,
        log_path=directory / f"{name}.log",
        session_timeout=4.0,
        env=dict(DEFAULT_SERVER_ENV),
    ) as server:
        asyncio.run(wait_writable(server.endpoint, 30))
        processes = [server.process, storage.process, zookeeper.process]
        pids = [p.pid for p in processes]
        started = time.monotonic()
        for pid in pids:
            if pid is not None:
                os.kill(pid, signal.SIGTERM)
        figures = []
        kept = True
        for process in processes[:2]:
            try:
                status = process.wait(STOP_BOUND * 3)
            except TimeoutError:
                figures.append(f"{process.name} still running after {STOP_BOUND * 3:.0f}s")
                kept = False
                continue
            elapsed = time.monotonic() - started
            kept = kept and status == 0 and elapsed < STOP_BOUND
            figures.append(f"{process.name} exited {elapsed:.2f}s after SIGTERM with status {status}")
        zookeeper.process.wait(30)
    print(f"round {attempt + 1}: {'; '.join(figures)}{'' if kept else '  <-- OUT OF BOUND'}", flush=True)
    return kept


def main() -> None:
    """Run the rounds and print their figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20, help="rounds of SIGTERM to all three at once")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="stop-bound-") as tmp:
        directory = Path(tmp)
        with (
            LocalZooKeeper(data_dir=directory / "zookeeper", tick_time_ms=500) as zookeeper,
            LocalStorageNode(
                directory / "storage", name="storage", log_path=directory / "storage.log"
            ) as storage,
        ):
            create_cluster(zookeeper, storage)
            kept = [one_round(directory, attempt, zookeeper, storage) for attempt in range(args.rounds)]
    print(f"{sum(kept)} of {len(kept)} rounds within the bound of {STOP_BOUND:.0f}s")
    sys.exit(0 if all(kept) else 1)


if __name__ == "__main__":
    main()
