"""A storage node smoke run: append through a real node process, crash it, check every record.

It is what ``waltz demo`` runs until the full demo (cluster, ledger service, faults) exists.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from waltz.errors import StorageRpcError
from waltz.local.nodes import LocalStorageNode
from waltz.protocol.cluster_key import cluster_key_fingerprint
from waltz.protocol.event_loop import run_on_shared_loop
from waltz.protocol.records import Record, ReqId
from waltz.protocol.storage_client import StorageAdminClient, StorageSessionClient

__all__ = ["SmokeResult", "run_storage_smoke"]

log = logging.getLogger(__name__)

BATCH = 100
WINDOW = 8


@dataclass(slots=True)
class SmokeResult:
    """What the smoke run saw.

    Attributes:
        appended: records acknowledged by the node before the crash.
        append_seconds: time spent appending them.
        verified: records read back byte for byte after the restart.
        problems: everything that was wrong (empty: the run passed).
    """

    appended: int = 0
    append_seconds: float = 0.0
    verified: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """True when nothing was wrong."""
        return not self.problems


def _record(partition_id: int, txn: int, size: int) -> Record:
    rng = random.Random(partition_id * 1_000_003 + txn)
    return Record.create(txn, ReqId(1, 1, partition_id, txn), txn & 0x7FFF, rng.randbytes(size))


async def _append_all(
    node: LocalStorageNode,
    key: str,
    partitions: int,
    per_partition: int,
    size: int,
    progress: Callable[[int], None],
) -> None:
    async def writer(pid: int) -> None:
        async with StorageSessionClient(node.address, key, partitions, session_id=1) as client:
            in_flight: list[tuple[int, asyncio.Future[None]]] = []
            for first in range(0, per_partition, BATCH):
                count = min(BATCH, per_partition - first)
                batch = [_record(pid, t, size) for t in range(first, first + count)]
                in_flight.append((count, asyncio.ensure_future(client.append(pid, batch))))
                if len(in_flight) >= WINDOW:
                    done, future = in_flight.pop(0)
                    await future
                    progress(done)
            for done, future in in_flight:
                await future
                progress(done)

    await asyncio.gather(*(writer(pid) for pid in range(partitions)))


async def _verify(
    node: LocalStorageNode, key: str, partitions: int, per_partition: int, size: int
) -> SmokeResult:
    result = SmokeResult()
    async with StorageAdminClient(node.admin_address, key, partitions) as admin:
        for pid in range(partitions):
            max_txn = await admin.max_transaction_id(pid)
            if max_txn != per_partition - 1:
                result.problems.append(
                    f"partition {pid}: max transaction {max_txn}, expected {per_partition - 1}"
                )
            txn = 0
            while txn < per_partition:
                page = await admin.records(pid, txn, 2000)
                if not page:
                    result.problems.append(f"partition {pid}: records from {txn} on are missing")
                    break
                for got in page:
                    if got != _record(pid, got.transaction_id, size):
                        result.problems.append(f"partition {pid}: transaction {got.transaction_id} differs")
                    result.verified += 1
                txn = page[-1].transaction_id + 1
    # The session that wrote before the crash is still fenced by a newer one after it.
    async with StorageSessionClient(node.address, key, partitions, session_id=2) as newer:
        await newer.open_session(0)
    async with StorageSessionClient(node.address, key, partitions, session_id=1) as older:
        try:
            await older.max_transaction_id(0)
            result.problems.append("partition 0: store session 1 was not fenced by session 2")
        except StorageRpcError as exc:
            if exc.code != "SESSION_FENCED":
                result.problems.append(f"partition 0: expected SESSION_FENCED, got {exc.code}")
    return result


def run_storage_smoke(
    directory: Path,
    *,
    partitions: int = 4,
    transactions: int = 20_000,
    size: int = 200,
    progress: Callable[[int], None] = lambda n: None,
    say: Callable[[str], None] = log.info,
) -> SmokeResult:
    """Append ``transactions`` records, kill -9 the node, restart it and verify every record.

    Args:
        directory: a work directory (the storage directory and the node's log go there).
        partitions: partitions to spread the records over.
        transactions: records to append in all.
        size: transaction data bytes per record.
        progress: called with the number of records acknowledged since the last call.
        say: receives one line per step.

    Returns:
        What the run saw; ``passed`` is False when any record was lost or changed.
    """
    key = str(uuid.uuid4())
    per_partition = max(1, transactions // partitions)
    log_path = directory / "storage.log"
    with LocalStorageNode(directory / "storage", name="storage", log_path=log_path, insecure=True) as node:
        say(f"storage node started (pid {node.process.pid}, port {node.port}, admin port {node.admin_port})")

        async def setup() -> None:
            async with StorageAdminClient(node.admin_address, key, partitions) as admin:
                for pid in range(partitions):
                    await admin.assign_partition(pid, True)

        run_on_shared_loop(setup())
        say(
            f"cluster key {cluster_key_fingerprint(key)}: {partitions} partitions assigned; "
            f"appending {per_partition * partitions} records"
        )
        started = time.perf_counter()
        run_on_shared_loop(_append_all(node, key, partitions, per_partition, size, progress))
        elapsed = time.perf_counter() - started
        say(f"killing the storage node with SIGKILL (pid {node.process.pid}) and restarting it")
        node.kill()
        node.start()
        result = run_on_shared_loop(_verify(node, key, partitions, per_partition, size))
        result.appended = per_partition * partitions
        result.append_seconds = elapsed
        node.stop()
    return result
