"""Digests of every replica's committed records, read through the storage nodes' admin ports.

Design: docs/design/storage.md "Admin port" (the admin port's record reads); docs/design/server.md
"Quorum writes and batching" (every replica of a partition must end up with the same records up
to the high-water mark). Used by the ledger demo's and ``waltz chaos``'s checks: with no server
writing, each replica's records ``0..mark`` are read and hashed; one digest per partition means
the replicas are identical. Reads go through the admin port only: no store session is opened,
nobody is fenced.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Mapping, Sequence

from waltz.protocol.channels import TlsConfig
from waltz.protocol.event_loop import run_on_shared_loop
from waltz.protocol.storage_client import StorageAdminClient

__all__ = ["RECORDS_PER_READ", "replica_digests"]

#: Records asked for per admin read.
RECORDS_PER_READ = 1000


async def _digest(admin: StorageAdminClient, partition_id: int, mark: int, first: int = 0) -> int | None:
    """CRC-32 over ``(transaction ID, header, data)`` of records first..mark; None when some are missing."""
    crc = 0
    next_id = first
    while next_id <= mark:
        page = await admin.records(partition_id, next_id, min(RECORDS_PER_READ, mark + 1 - next_id))
        if not page:
            return None  # not caught up yet
        for record in page[: mark + 1 - next_id]:
            crc = zlib.crc32(repr((record.transaction_id, record.header, bytes(record.data))).encode(), crc)
        next_id += len(page)
    return crc


def replica_digests(
    admin_addresses: Sequence[str],
    cluster_key: str,
    num_partitions: int,
    high_water_marks: Mapping[int, int],
    *,
    timeout: float = 60.0,
    tls: TlsConfig | None = None,
    first_ids: Mapping[int, int] | None = None,
) -> dict[int, set[int]]:
    """Per partition, the set of digests of its replicas' records ``0..mark`` (one digest: identical).

    A replica still catching up (a restarted node) is read again every 0.2 s until it holds the
    records or ``timeout`` seconds pass.

    Args:
        admin_addresses: ``host:admin_port`` of every storage node holding the partitions.
        cluster_key: the cluster key (UUID text), for the admin open.
        num_partitions: the cluster's number of partitions, for the admin open.
        high_water_marks: partition -> the committed high-water mark to read up to (-1: none).
        timeout: seconds allowed in all.
        tls: client TLS files for the admin ports, or None.
        first_ids: partition -> the first transaction to read (default 0), e.g. the highest local
            start of its replicas when retention deleted archived segments (docs/design/archive.md,
            "Retention on the storage nodes").

    Returns:
        Partition -> the distinct digests of its replicas.

    Raises:
        TimeoutError: a replica lacked records up to the mark for ``timeout`` seconds.
        StorageRpcError: a storage node refused or could not be reached.
        RecordsArchivedError: a replica's local start is above the first transaction to read.
    """

    async def all_digests() -> dict[int, set[int]]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        result: dict[int, set[int]] = {pid: set() for pid in high_water_marks}
        for address in admin_addresses:
            async with StorageAdminClient(
                address, cluster_key, num_partitions, tls=tls, initialise=False
            ) as admin:
                for pid, mark in high_water_marks.items():
                    while (found := await _digest(admin, pid, mark, (first_ids or {}).get(pid, 0))) is None:
                        if loop.time() > deadline:
                            raise TimeoutError(
                                f"replica {address} of partition {pid} lacks records up to {mark}"
                            )
                        await asyncio.sleep(0.2)
                    result[pid].add(found)
        return result

    return run_on_shared_loop(all_digests())
