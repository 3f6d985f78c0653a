"""``waltz cluster storage recover-partition``: seed a replica by copying committed records.

Copies a partition from one storage node to another while neither takes part in the copy as a
store session writer, and only up to what is known committed: the source's low-water mark (the
cluster high-water mark when the source's last store session started, docs/design/storage.md
"Control file"). The destination is first truncated to its own low-water mark (everything below it
is committed), then given the source's records up to that mark, then its low-water mark is set to
it, so that the next store session's recovery keeps the copy (a replica new to the session is
truncated to its low-water mark, docs/design/recovery.md "Cleaning each replica") and catches up
only the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from dataclasses import dataclass

from waltz.errors import MetadataError
from waltz.metadata.replicas import ReplicaChangeRefusedError
from waltz.metadata.zk import ClusterZk
from waltz.protocol.channels import TlsConfig
from waltz.protocol.storage_client import StorageAdminClient, StorageSessionClient

__all__ = ["RecoverResult", "recover_partition"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RecoverResult:
    """What ``recover-partition`` did.

    Attributes:
        committed: the known committed high-water mark copied up to (the source's low-water mark).
        kept: the destination's max transaction ID after truncating it to its low-water mark.
        copied: the number of records copied.
    """

    partition_id: int
    source: str
    destination: str
    committed: int
    kept: int
    copied: int


async def recover_partition(
    cluster: ClusterZk,
    source: str,
    destination: str,
    partition_id: int,
    *,
    timeout: float = 30.0,
    page: int = 2000,
    tls: TlsConfig | None = None,
) -> RecoverResult:
    """Copy partition ``partition_id`` from ``source`` to ``destination`` up to what is committed.

    Args:
        cluster: the cluster's znodes.
        source: connect string of the storage node to copy from (read through its admin port).
        destination: connect string of the storage node to copy to; it must be assigned the
            partition and must not be a caught-up replica of the current store session.
        partition_id: the partition.
        timeout: seconds for each storage request, and for opening each node's stream (a node
            that accepts connections but does not answer, such as a stopped process, is given up
            on then).
        page: records per request.
        tls: client TLS files for the storage nodes.

    Raises:
        MetadataError: the destination is not assigned the partition, or a node has no admin port.
        ReplicaChangeRefusedError: the destination is a writer of the current store session; its
            message says to recover a replica that is behind (there is no override: the copy
            would interleave with the live writer, docs/design/recovery.md "Cleaning each replica").
        StorageRpcError, ConnectionError: a storage node failed.
        TimeoutError: a storage node did not answer its open or a request within ``timeout``.
    """
    params = await asyncio.to_thread(cluster.params)
    metadata = (await asyncio.to_thread(cluster.partition_metadata, partition_id)).value
    assigned = (await asyncio.to_thread(cluster.assignments)).value.storages_of(partition_id)
    connection = (await asyncio.to_thread(cluster.connection)).value
    if destination not in assigned:
        raise MetadataError(
            f"{destination} is not assigned partition {partition_id}: assign it first "
            "(`waltz cluster storage assign`)"
        )
    state = metadata.replicas.get(destination)
    if (
        state is not None
        and state.session_id == metadata.session_id >= 0
        and state.closing_high_water_mark is None
    ):
        raise ReplicaChangeRefusedError(
            [
                f"partition {partition_id}: {destination} is a caught-up replica of store session "
                f"{metadata.session_id}; copying into it would interleave with the live writer"
            ],
            hint=(
                "a caught-up replica needs no copy: the store session writes it. Recover a replica "
                "that is behind (waltz cluster list shows the replica states); nothing was copied"
            ),
        )
    key, n = str(params.cluster_key), params.num_partitions
    source_admin = connection.admin_address(source)
    async with contextlib.AsyncExitStack() as opened:
        # Each client is made just before its open: a failed, refused or timed-out open closes it.
        reader = StorageAdminClient(source_admin, key, n, tls=tls, initialise=False)
        await _open_within(reader.open(), f"storage node {source_admin} (the source's admin port)", timeout)
        opened.push_async_callback(reader.close)
        # The destination joins the current session ID: it fences no live writer.
        writer = StorageSessionClient(destination, key, n, metadata.session_id, tls=tls)
        await _open_within(writer.open(), f"storage node {destination} (the destination)", timeout)
        opened.push_async_callback(writer.close)
        _, committed = await asyncio.wait_for(reader.last_session_info(partition_id), timeout)
        await asyncio.wait_for(writer.open_session(partition_id), timeout)
        _, destination_lwm = await asyncio.wait_for(writer.last_session_info(partition_id), timeout)
        # Everything up to its own low-water mark is committed: the node keeps it (the floor).
        await asyncio.wait_for(writer.truncate(partition_id, destination_lwm), timeout)
        kept = await asyncio.wait_for(writer.max_transaction_id(partition_id), timeout)
        next_id = kept + 1
        while next_id <= committed:
            records = await asyncio.wait_for(
                reader.records(partition_id, next_id, min(page, committed - next_id + 1)), timeout
            )
            if not records or records[0].transaction_id != next_id:
                raise MetadataError(
                    f"{source} does not hold transaction {next_id} of partition {partition_id}"
                )
            await asyncio.wait_for(writer.append(partition_id, records), timeout)
            next_id = records[-1].transaction_id + 1
        # A low-water mark never goes down: the destination's may be the higher one.
        await asyncio.wait_for(
            writer.set_low_water_mark(partition_id, max(committed, destination_lwm)), timeout
        )
    result = RecoverResult(partition_id, source, destination, committed, kept, max(0, committed - kept))
    log.info(
        "partition %d: copied transactions %d..%d from %s to %s",
        partition_id,
        kept + 1,
        committed,
        source,
        destination,
    )
    return result


async def _open_within(opening: Awaitable[None], what: str, timeout: float) -> None:
    """Await a client's open for at most ``timeout`` seconds (a frozen node accepts the connection
    and never answers); a timed-out open is cancelled, which closes its stream.

    Raises:
        TimeoutError: no answer within ``timeout``, naming ``what``.
    """
    try:
        await asyncio.wait_for(opening, timeout)
    except TimeoutError:
        raise TimeoutError(
            f"{what} did not answer its open within {timeout:g}s: check that it runs (waltz cluster list)"
        ) from None
