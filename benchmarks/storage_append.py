"""Storage node append throughput: records/s and flushes (fsyncs)/s, by partitions and batch size.

Starts a real storage node process on loopback (in a temporary directory unless --directory is
given), opens one replica session stream per partition and appends 200-byte records in batches
of 1, 10 and 100 records, first with one request in flight per stream (each batch is one flush),
then with --window requests in flight (the node then combines queued batches into one flush:
group commit). Batches go in columns (storage.proto ``RecordColumns``, as servers send them) or,
with --form records, as a message per record (docs/design/storage.md, "Group commit and I/O
threads"; docs/decisions/0001-group-commit-on-storage-nodes.md). Prints a table (with the
storage node's CPU time, user and system, per request: the fixed cost of a request shows at
batch 1); asserts nothing.

    .venv/bin/python -m benchmarks.storage_append [--seconds 3] [--partitions 1,4] [--form records]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from pathlib import Path

from waltz.local.nodes import LocalStorageNode
from waltz.perf.cost import process_cpu_seconds
from waltz.protocol.records import Record, ReqId
from waltz.protocol.storage_client import (
    StorageAdminClient,
    StorageSessionClient,
    check_response,
    columns_append,
)

FLUSHES = "waltz_storage_append_flushes_total"


async def send_columns(client: StorageSessionClient, pid: int, records: list[Record]) -> None:
    """Append records as one ``RecordColumns`` request (as servers send them).

    Args:
        client: the replica session stream.
        pid: the partition.
        records: the records.

    Raises:
        StorageRpcError: the node refused the append.
    """
    check_response(await client.submit_append(pid, columns_append(records)), client.address, "append")


async def send_records(client: StorageSessionClient, pid: int, records: list[Record]) -> None:
    """Append records as a ``Record`` message each.

    Args:
        client: the replica session stream.
        pid: the partition.
        records: the records.
    """
    await client.append(pid, records)


async def run_case(
    node: LocalStorageNode,
    key: str,
    partitions: int,
    batch: int,
    window: int,
    seconds: float,
    size: int,
    form: str = "columns",
) -> tuple[float, float, float]:
    """One case: ``partitions`` streams appending ``batch``-record requests, ``window`` in flight
    each, for ``seconds``.

    Args:
        node: the storage node.
        key: the cluster key.
        partitions: partitions (a stream each).
        batch: records per request.
        window: requests in flight per stream.
        seconds: how long the case runs.
        size: bytes per record.
        form: ``columns`` or ``records``.

    Returns:
        Records/s, flushes/s and the node's CPU microseconds per request.

    Raises:
        RuntimeError: the storage node is not running.
    """
    send = send_columns if form == "columns" else send_records
    async with StorageAdminClient(node.admin_address, key, 16) as admin:
        before = await admin.metrics()
        next_txn = {}
        for pid in range(partitions):
            next_txn[pid] = await admin.max_transaction_id(pid) + 1
    clients = [StorageSessionClient(node.address, key, 16, session_id=1) for _ in range(partitions)]
    for client in clients:
        await client.open()
    data = b"x" * size
    node_pid = node.process.pid
    if node_pid is None:
        raise RuntimeError("the storage node is not running")
    cpu_before = process_cpu_seconds(node_pid)
    deadline = time.perf_counter() + seconds
    appended = 0

    async def writer(pid: int, client: StorageSessionClient) -> None:
        nonlocal appended
        in_flight: list[asyncio.Future[None]] = []
        while time.perf_counter() < deadline:
            while len(in_flight) < window:
                first = next_txn[pid]
                records = [
                    Record.create(t, ReqId(1, 1, pid, t), 0, data) for t in range(first, first + batch)
                ]
                next_txn[pid] = first + batch
                in_flight.append(asyncio.ensure_future(send(client, pid, records)))
            await in_flight.pop(0)
            appended += batch
        for future in in_flight:
            await future
            appended += batch

    started = time.perf_counter()
    await asyncio.gather(*(writer(pid, c) for pid, c in enumerate(clients)))
    elapsed = time.perf_counter() - started
    cpu = process_cpu_seconds(node_pid) - cpu_before
    for client in clients:
        await client.close()
    async with StorageAdminClient(node.admin_address, key, 16) as admin:
        after = await admin.metrics()
    flushes = sum(v for k, v in after.items() if k.startswith(FLUSHES)) - sum(
        v for k, v in before.items() if k.startswith(FLUSHES)
    )
    return appended / elapsed, flushes / elapsed, cpu * 1e6 / (appended / batch)


async def main_async(args: argparse.Namespace, directory: Path) -> None:
    """Start a storage node in ``directory``, run every case, print the table.

    Args:
        args: the command line's options.
        directory: the run's directory.
    """
    key = str(uuid.uuid4())
    with LocalStorageNode(directory / "storage", log_path=directory / "storage.log") as node:
        async with StorageAdminClient(node.admin_address, key, 16) as admin:
            for pid in range(max(args.partitions)):
                await admin.assign_partition(pid, True)
        print(
            f"storage node pid {node.process.pid}, directory {directory}, record size {args.size} bytes, "
            f"requests in {args.form}"
        )
        print(
            f"{'partitions':>10} {'batch':>6} {'in flight':>9} {'records/s':>12} {'flushes/s':>10} "
            f"{'CPU µs/request':>14}"
        )
        for partitions in args.partitions:
            for window in (1, args.window):
                for batch in (1, 10, 100):
                    rate, flushes, cpu = await run_case(
                        node, key, partitions, batch, window, args.seconds, args.size, args.form
                    )
                    print(
                        f"{partitions:>10} {batch:>6} {window:>9} {rate:>12,.0f} {flushes:>10,.0f} "
                        f"{cpu:>14,.0f}"
                    )


def main() -> None:
    """Parse the command line (``--help``), run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of each case (default 3)")
    parser.add_argument(
        "--partitions", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4], help="e.g. 1,4"
    )
    parser.add_argument(
        "--window", type=int, default=16, help="requests in flight per stream when pipelining"
    )
    parser.add_argument("--size", type=int, default=200, help="transaction data bytes per record")
    parser.add_argument(
        "--form",
        choices=("columns", "records"),
        default="columns",
        help="append requests in columns (as servers send them; default) or a message per record",
    )
    parser.add_argument(
        "--directory", type=Path, help="where to put the storage directory (default: a temp dir)"
    )
    args = parser.parse_args()
    if args.directory:
        args.directory.mkdir(parents=True, exist_ok=True)
        asyncio.run(main_async(args, args.directory))
    else:
        with tempfile.TemporaryDirectory(prefix="waltz-bench-") as tmp:
            asyncio.run(main_async(args, Path(tmp)))


if __name__ == "__main__":
    main()
