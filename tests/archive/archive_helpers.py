"""A client that writes to the archive tests' cluster, and reading its log back through the server."""

from __future__ import annotations

import asyncio

from tests.client.client_helpers import Append, MemoryStore
from waltz import WaltzClient, WaltzClientConfig
from waltz.local.cluster import LocalCluster
from waltz.protocol.records import Record, ReqId
from waltz.protocol.server_client import ServerAdminClient


def write_with_client(cluster: LocalCluster, partition: int, count: int, size: int = 64) -> list[int]:
    """Commit ``count`` transactions to a partition through a WaltzClient; their IDs."""
    marks = {pid: owner.high_water_mark for pid, owner in cluster.wait_ready(30).items()}
    config = WaltzClientConfig(**cluster.client_settings())
    store = MemoryStore(marks)
    with WaltzClient(store, config) as client:
        contexts = [Append(partition, (b"%d:" % i).ljust(size, b"x"), header=i % 7) for i in range(count)]
        futures = [client.submit(context) for context in contexts]
        ids = [future.result(timeout=60).transaction_id for future in futures]
    assert not store.errors, store.errors
    assert all(isinstance(i, int) for i in ids), ids
    return sorted(i for i in ids if i is not None)


def append_bulk(cluster: LocalCluster, partition: int, count: int, size: int = 200) -> None:
    """Commit ``count`` transactions to a partition in batches through its server's admin append
    (which sends nothing again: every transaction must commit the first time)."""

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
