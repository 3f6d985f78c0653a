"""A client that writes to the archive tests' cluster, and reading its log back through the server."""

from __future__ import annotations

import asyncio
import threading

from waltz import (
    Transaction,
    TransactionBuilder,
    TransactionContext,
    WaltzClient,
    WaltzClientCallbacks,
    WaltzClientConfig,
)
from waltz.local.cluster import LocalCluster
from waltz.protocol.records import Record, ReqId
from waltz.protocol.server_client import ServerAdminClient


class _Marks(WaltzClientCallbacks):
    """An application that applies nothing: its mark is the log's end when it starts."""

    def __init__(self, marks: dict[int, int]) -> None:
        self.marks = marks
        self.lock = threading.Lock()

    def get_client_high_water_mark(self, partition_id: int) -> int:
        with self.lock:
            return self.marks[partition_id]

    def apply_transaction(self, transaction: Transaction) -> None:
        with self.lock:
            self.marks[transaction.partition_id] = transaction.transaction_id

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        raise AssertionError(f"partition {partition_id} transaction {transaction_id}: {exception!r}")


class _Write(TransactionContext):
    def __init__(self, partition: int, data: bytes, header: int) -> None:
        super().__init__()
        self.partition, self.data, self.header = partition, data, header

    def partition_id(self, num_partitions: int) -> int:
        return self.partition

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_header(self.header)
        builder.set_raw_data(self.data)
        return True


def write_with_client(cluster: LocalCluster, partition: int, count: int, size: int = 64) -> list[int]:
    """Commit ``count`` transactions to a partition through a WaltzClient; their IDs."""
    marks = {pid: owner.high_water_mark for pid, owner in cluster.wait_ready(30).items()}
    config = WaltzClientConfig(
        zookeeper_connect_string=cluster.zookeeper_connect_string, cluster_root=cluster.root
    )
    with WaltzClient(_Marks(marks), config) as client:
        futures = [
            client.submit(_Write(partition, (b"%d:" % i).ljust(size, b"x"), i % 7)) for i in range(count)
        ]
        ids = [future.result(timeout=60) for future in futures]
    assert all(isinstance(i, int) for i in ids), ids
    return sorted(i for i in ids if i is not None)


def append_bulk(cluster: LocalCluster, partition: int, count: int, size: int = 200) -> None:
    """Commit ``count`` transactions to a partition in batches through its server's admin append."""

    async def run() -> None:
        async with ServerAdminClient(cluster.owner(partition), timeout=60) as admin:
            for start in range(0, count, 500):
                batch = [
                    (ReqId(99, 1, partition, start + i), 3, bytes([i % 256]) * size)
                    for i in range(min(500, count - start))
                ]
                outcomes = await admin.append(partition, batch)
                assert all(isinstance(o, int) for o in outcomes), outcomes

    asyncio.run(run())


def read_log(cluster: LocalCluster, partition: int, first: int, last: int) -> list[Record]:
    """The committed records ``first..last`` of a partition, read from its server."""

    async def run() -> list[Record]:
        records: list[Record] = []
        async with ServerAdminClient(cluster.owner(partition), timeout=60) as admin:
            while first + len(records) <= last:
                batch = await admin.read(
                    partition, first + len(records), min(1000, last - first - len(records) + 1)
                )
                assert batch, f"the server returned nothing at {first + len(records)}"
                records.extend(r for r in batch if r.transaction_id <= last)
        return records

    return asyncio.run(run())
