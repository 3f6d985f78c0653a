"""The archiver and the replicas: a range read from a quorum and compared record by record, and
the replicas told what is archived.

Source: docs/design/archive.md "The archiver" (steps 2 and 4). The records of a chunk come from a
quorum of the replicas that a live plan proved (:func:`~waltz.committed.plan.plan_live_on`),
each CRC-checked by :func:`~waltz.committed.reads.read_replica`. A replica that fails is replaced
by another proven one, if there is one, and the chunk read again; two replicas that answer with
different records stop the partition (:class:`~waltz.archive.errors.ReplicaMismatchError`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

from waltz.admin.storage_nodes import NodeOutcome, call_admin_on_nodes
from waltz.archive.errors import ArchiveError, ReplicaMismatchError
from waltz.committed.plan import CommittedPartition, LiveReplica, LiveSource
from waltz.committed.reads import DEFAULT_BATCH_RECORDS, read_replica
from waltz.errors import RecordsArchivedError, StorageRpcError, WaltzError
from waltz.metadata.values import ClusterParams
from waltz.metadata.zk import ClusterZk
from waltz.protocol import storage_pb2
from waltz.protocol.channels import TlsConfig
from waltz.protocol.event_loop import run_on_shared_loop
from waltz.protocol.records import Record
from waltz.protocol.storage_client import StorageAdminClient

__all__ = [
    "TOLD",
    "UNKNOWN_REQUEST",
    "QuorumRead",
    "QuorumUnavailableError",
    "read_quorum",
    "replica_partition_statuses",
    "statuses_by_partition",
    "tell_replicas",
    "was_told",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: What a replica that answered "told" says in :func:`tell_replicas`'s outcome.
TOLD = "told"
#: What a replica that does not know the request yet says in :func:`tell_replicas`'s outcome.
UNKNOWN_REQUEST = "does not know set-archived-through"


def was_told(outcome: str) -> bool:
    """Whether a replica's outcome in :func:`tell_replicas` leaves nothing to tell it again: told,
    or a node that does not know the request (it keeps every segment: telling it again changes
    nothing)."""
    return outcome in (TOLD, UNKNOWN_REQUEST)


class QuorumUnavailableError(ArchiveError):
    """Fewer than a quorum of the proven replicas could deliver the range (names each answer)."""


@dataclass(frozen=True, slots=True)
class QuorumRead:
    """Records every replica of a quorum returned identically.

    Attributes:
        records: consecutive records from the range's first transaction.
        replicas: the storage nodes (connect strings) they were read from and compared across.
        data_bytes: the records' data bytes in all.
    """

    records: list[Record]
    replicas: tuple[str, ...]
    data_bytes: int


def _difference(a: Record, b: Record) -> str:
    for name in ("transaction_id", "req_id", "header", "checksum", "data"):
        if getattr(a, name) != getattr(b, name):
            return name
    return "nothing"


def read_quorum(
    plan: CommittedPartition,
    first: int,
    last: int,
    *,
    max_bytes: int | None = None,
    batch_records: int = DEFAULT_BATCH_RECORDS,
    timeout: float = 30.0,
) -> QuorumRead:
    """Read ``first..last`` of a partition from a quorum of its proven replicas and compare them.

    Args:
        plan: a live plan of the partition; ``last`` must not exceed its high-water mark.
        first: the first transaction ID.
        last: the last transaction ID.
        max_bytes: stop after the record that brings the data bytes to this (None: read to ``last``).
        batch_records: records per admin request.
        timeout: seconds for each admin request.

    Returns:
        The records read (all of ``first..last`` unless ``max_bytes`` stopped it).

    Raises:
        QuorumUnavailableError: fewer than a quorum of proven replicas hold ``last`` or could
            deliver the range.
        ReplicaMismatchError: two replicas returned different records at a transaction.
        ArchiveError: the plan is not a live plan.
    """
    source = plan.source
    if not isinstance(source, LiveSource):
        raise ArchiveError(f"partition {plan.partition_id}: the archiver reads live clusters only")
    candidates = [r for r in source.replicas if r.max_transaction_id >= last]
    holding = len(candidates)
    failures: list[_ReplicaFailedError] = []
    while True:
        if len(candidates) < source.quorum:
            raise QuorumUnavailableError(
                _quorum_unavailable(
                    plan.partition_id, first, last, source, holding, len(candidates), failures
                )
            )
        chosen = candidates[: source.quorum]
        try:
            return _compare(plan.partition_id, first, last, chosen, source, max_bytes, batch_records, timeout)
        except _ReplicaFailedError as failed:
            failures.append(failed)
            log.warning(
                "partition %d: reading %d..%d from %s failed (%r); reading from another replica",
                plan.partition_id,
                first,
                last,
                failed.replica.storage,
                failed.cause,
            )
            candidates = [r for r in candidates if r is not failed.replica]


def _quorum_unavailable(
    partition_id: int,
    first: int,
    last: int,
    source: LiveSource,
    holding: int,
    untried: int,
    failures: list[_ReplicaFailedError],
) -> str:
    """Why fewer than a quorum of replicas could deliver ``first..last``, counted, and what to do:
    start the nodes that are down, or, for replicas that answered that the range is below their
    local start (:class:`~waltz.errors.RecordsArchivedError`: retention deleted it after they were
    told it was archived), check the archive and copy its chunks back (docs/design/archive.md,
    "The archiver")."""
    counted = (
        f"partition {partition_id}: transactions {first}..{last} need a quorum of {source.quorum} "
        f"replicas of store session {source.session_id}; {holding} of its {len(source.replicas)} "
        f"replicas hold them, {len(failures)} failed, leaving {untried} untried, fewer than the quorum"
    )
    if not failures:
        return (
            counted
            + " (the others hold less): start the storage nodes that are down, then run the archiver again"
        )
    archived = {f.replica.storage: f.cause for f in failures if isinstance(f.cause, RecordsArchivedError)}
    others = [f for f in failures if f.replica.storage not in archived]
    lines = (
        [counted + ": " + "; ".join(f"{f.replica.storage}: {f.cause!r}" for f in others)]
        if others
        else [counted]
    )
    if archived:
        starts = ", ".join(
            f"{storage} from {cause.local_start}"
            for storage, cause in archived.items()
            if isinstance(cause, RecordsArchivedError)
        )
        lines.append(
            f"the range is below the local start of {len(archived)} replica(s) ({starts}): retention "
            "deleted it after they were told it was archived, yet the archive does not hold it (ZooKeeper's "
            "archived-through or the partition's manifest went back, or this is another archive than the "
            "one they were told of): run `waltz archive verify` to see what the archive holds, then copy "
            f"the chunks of {first}..{last} back from a copy of the archive (`waltz archive verify "
            "--archive COPY` checks one)"
        )
    if others:
        lines.append("start the storage nodes that are down, then run the archiver again")
    return "; ".join(lines)


class _ReplicaFailedError(Exception):
    def __init__(self, replica: LiveReplica, cause: BaseException) -> None:
        super().__init__(replica.storage)
        self.replica = replica
        self.cause = cause


def _next(replica: LiveReplica, records: Iterator[Record]) -> Record:
    try:
        return next(records)
    except StopIteration as exc:
        raise _ReplicaFailedError(replica, ConnectionError("the replica's records ended early")) from exc
    except (WaltzError, ConnectionError, OSError, TimeoutError) as exc:
        raise _ReplicaFailedError(replica, exc) from exc


def _compare(
    partition_id: int,
    first: int,
    last: int,
    chosen: list[LiveReplica],
    source: LiveSource,
    max_bytes: int | None,
    batch_records: int,
    timeout: float,
) -> QuorumRead:
    records: list[Record] = []
    data_bytes = 0
    with contextlib.ExitStack() as stack:
        readers = [
            (
                replica,
                stack.enter_context(
                    contextlib.closing(
                        read_replica(
                            partition_id,
                            first,
                            last,
                            replica,
                            source,
                            batch_records=batch_records,
                            timeout=timeout,
                        )
                    )
                ),
            )
            for replica in chosen
        ]
        for _ in range(first, last + 1):
            base_replica, base_reader = readers[0]
            base = _next(base_replica, base_reader)
            for replica, reader in readers[1:]:
                other = _next(replica, reader)
                if other != base:
                    raise ReplicaMismatchError(
                        f"partition {partition_id} transaction {base.transaction_id}: replicas "
                        f"{base_replica.storage} and {replica.storage} hold different records (their "
                        f"{_difference(base, other)} differs); the archiver stops here: check the replicas "
                        "(waltz cluster verify, waltz disk verify)"
                    )
            records.append(base)
            data_bytes += len(base.data)
            if max_bytes is not None and data_bytes >= max_bytes:
                break
    return QuorumRead(records, tuple(r.storage for r in chosen), data_bytes)


def tell_replicas(
    cluster: ClusterZk,
    params: ClusterParams,
    partition_id: int,
    archived_through: int,
    location: str,
    *,
    operator: str = "",
    timeout: float = 10.0,
    tls: TlsConfig | None = None,
    said: dict[str, str] | None = None,
    only: Collection[str] | None = None,
) -> dict[str, str]:
    """Tell every replica of a partition its archived-through (``set archived through``).

    A node that does not know the request yet (it answers ``INVALID_REQUEST``) or does not
    answer is logged and passed over: telling it again later is harmless, and until it is told it
    keeps every segment.

    Args:
        cluster: the cluster's znodes (the partition's replicas and their admin ports).
        params: the cluster's parameters (the admin open's key and partition count).
        partition_id: the partition.
        archived_through: what the archive holds of it, verified (-1: nothing).
        location: the archive's location, for the node's log.
        operator: who asks, as the tool states it.
        timeout: seconds for each node.
        tls: client TLS files for the admin ports.
        said: storage connect string -> the failure last logged for it, kept by a caller that
            tells often (the archiver, once per chunk): the same failure again is logged at DEBUG,
            a new one at WARNING (and recorded here).
        only: tell these replicas of the partition only (None: every one).

    Returns:
        Storage connect string -> ``"told"``, ``"does not know set-archived-through"`` or why it
        was not told.
    """
    connection = cluster.connection().value
    storages = cluster.assignments().value.storages_of(partition_id)
    if only is not None:
        storages = [s for s in storages if s in only]
    addresses: Mapping[str, str] = {
        s: connection.admin_address(s) for s in storages if s in connection.admin_ports
    }

    async def tell(storage: str, admin: StorageAdminClient) -> str:
        try:
            await admin.set_archived_through(
                partition_id, archived_through, archive=location, operator=operator
            )
        except StorageRpcError as exc:
            if exc.code != "INVALID_REQUEST":
                raise
            return UNKNOWN_REQUEST
        return TOLD

    # Each failure is logged below, with the partition.
    outcomes = _on_nodes_quietly(addresses, params, tell, timeout, tls)
    told = {s: (o.value or "") if o.ok else (o.failure or "failed") for s, o in outcomes.items()}
    told.update({s: "no admin port on record" for s in storages if s not in addresses})
    for storage, outcome in sorted(told.items()):
        if was_told(outcome):
            if said is not None:
                said.pop(storage, None)
            log.info(
                "partition %d: %s archived through %d: %s", partition_id, storage, archived_through, outcome
            )
        elif said is not None and said.get(storage) == outcome:
            log.debug(
                "partition %d: %s was not told it is archived through %d: %s (as before)",
                partition_id,
                storage,
                archived_through,
                outcome,
            )
        else:
            if said is not None:
                said[storage] = outcome
            log.warning(
                "partition %d: %s was not told it is archived through %d: %s",
                partition_id,
                storage,
                archived_through,
                outcome,
            )
    return told


def replica_partition_statuses(
    cluster: ClusterZk, params: ClusterParams, *, timeout: float = 10.0, tls: TlsConfig | None = None
) -> dict[str, storage_pb2.PartitionStatusResponse | str]:
    """Every storage node's status of all its partitions (local start, last transaction, and the
    archived-through it was told), one admin call per node, all at once.

    Args:
        cluster: the cluster's znodes (the nodes' admin ports).
        params: the cluster's parameters (the admin open's key and partition count).
        timeout: seconds for each node.
        tls: client TLS files for the admin ports.

    Returns:
        Storage connect string -> its status, or why it did not answer (a node with no admin
        port on record is absent).
    """
    connection = cluster.connection().value
    addresses = {s: connection.admin_address(s) for s in connection.admin_ports}

    async def status(storage: str, admin: StorageAdminClient) -> storage_pb2.PartitionStatusResponse:
        return await admin.partition_status(-1)

    # The caller reports a node that did not answer.
    outcomes = _on_nodes_quietly(addresses, params, status, timeout, tls)
    return {s: o.value if o.value is not None else (o.failure or "failed") for s, o in outcomes.items()}


def statuses_by_partition(
    statuses: Mapping[str, storage_pb2.PartitionStatusResponse | str],
) -> dict[int, dict[str, storage_pb2.PartitionStatus]]:
    """:func:`replica_partition_statuses`' answers by partition: partition ID -> storage connect
    string -> that node's status of it (a node that did not answer is left out)."""
    found: dict[int, dict[str, storage_pb2.PartitionStatus]] = {}
    for storage, status in statuses.items():
        if isinstance(status, str):
            continue
        for entry in status.partitions:
            found.setdefault(entry.partition_id, {})[storage] = entry
    return found


def _on_nodes_quietly(
    addresses: Mapping[str, str],
    params: ClusterParams,
    work: Callable[[str, StorageAdminClient], Awaitable[T]],
    timeout: float,
    tls: TlsConfig | None,
) -> dict[str, NodeOutcome[T]]:
    """:func:`call_admin_on_nodes` for the archive's requests to the replicas: never initialising a
    node, each failure left to the caller to report."""
    return run_on_shared_loop(
        call_admin_on_nodes(
            addresses,
            str(params.cluster_key),
            params.num_partitions,
            work,
            timeout=timeout,
            tls=tls,
            initialise=False,
            log_failures=False,
        )
    )
