"""Which records of the log are committed, and where a reader may fetch them from.

Source: docs/design/spark.md "Reading committed records only", "Live reads through admin ports",
"Offline reads from replica directories"; docs/design/storage.md "Admin port". ``docs/spark.md``
gives the argument.

A replica may hold records above the committed high-water mark (written by a session that ended
before a quorum flushed them), and a replica that missed a recovery may hold a *dirty* record at
an ID that was later committed with other contents. A reader therefore never trusts a replica by
itself:

- **live** (:func:`plan_live`): only replicas whose replica state in ZooKeeper holds the
  partition's current store session (closing high-water mark unresolved) *and* whose storage node
  says its low-water mark was set by that session are read; the committed high-water mark is the
  highest of their low-water marks (resolved by the session's recovery) and of the highest ID held
  by a quorum of them. Everything goes through the admin port: no store session is opened, so the
  live server is never fenced.
- **offline** (:func:`plan_offline`): a replica directory proves its records up to its own
  low-water mark; above it a record is taken only when a quorum of the partition's replicas hold
  identical records at that ID (majority mode), or up to a high-water mark the user vouches for
  (explicit mode, preferring the directories of the latest session).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from waltz.admin.storage_nodes import DEFAULT_STORAGE_TIMEOUT, call_admin
from waltz.committed.errors import CommittedReadError
from waltz.committed.sources import (
    CommittedPartition,
    LiveReplica,
    LiveSource,
    OfflineReplica,
    OfflineSource,
)
from waltz.errors import ConfigurationError, WaltzError
from waltz.metadata.epochs import PartitionEpochsZk
from waltz.metadata.replicas import quorum_of
from waltz.metadata.zk import ClusterZk
from waltz.metadata.zk_security import ZooKeeperSecurity, security_from_environment
from waltz.metadata.zk_session import connect_zookeeper
from waltz.protocol import storage_pb2
from waltz.protocol.channels import TlsConfig
from waltz.protocol.cluster_key import cluster_key_fingerprint
from waltz.protocol.event_loop import run_on_shared_loop
from waltz.protocol.split_records import SPLIT_RECORD_HEADER, SplitGenesis, opening_genesis
from waltz.protocol.storage_client import StorageAdminClient
from waltz.services.storage import format as fmt
from waltz.services.storage import inspect

__all__ = [
    "CommittedPartition",
    "LiveReplica",
    "LiveSource",
    "OfflineReplica",
    "OfflineSource",
    "last_transaction_id",
    "plan_live",
    "plan_live_on",
    "plan_offline",
]

log = logging.getLogger(__name__)

#: Attempts at a consistent live plan: the current session must not change while it is made, and
#: a partition in the middle of a recovery proves nothing until its new session is recorded.
MAX_PLAN_ATTEMPTS = 20
#: Seconds between attempts when no replica of the current session proved its state yet.
PLAN_RETRY_PAUSE = 0.5


# ---- live ----


def plan_live(
    zookeeper: str,
    cluster_root: str,
    partitions: Iterable[int] | None = None,
    *,
    timeout: float = DEFAULT_STORAGE_TIMEOUT,
    tls: TlsConfig | None = None,
    security: ZooKeeperSecurity | None = None,
) -> list[CommittedPartition]:
    """Find each partition's committed high-water mark on a live cluster.

    Reads ``store/partition/<id>``, ``store/assignment``, ``store/connection`` and ``archive`` (the
    archive's location, for the ranges below the replicas' local start) from ZooKeeper and
    each current-session replica's partition status through its admin port (never a store session);
    see docs/design/spark.md "Live reads through admin ports".

    Args:
        zookeeper: ZooKeeper connect string.
        cluster_root: the cluster root znode.
        partitions: partition IDs (None: every partition).
        timeout: seconds for each storage node's admin call.
        tls: client TLS files for the admin ports.
        security: the cluster's ZooKeeper credential and TLS (docs/design/zookeeper.md,
            "Security"); None: from the ``WALTZ_ZOOKEEPER_AUTH_*``/``SSL_*`` environment.

    Returns:
        One :class:`CommittedPartition` per partition, in partition order.

    Raises:
        ZooKeeperUnavailableError, ClusterNotFoundError: ZooKeeper or the cluster is missing.
        ConfigurationError: unknown partition IDs.
        CommittedReadError: no replica of the current session of a partition answered and proved
            its state (the message lists each replica's answer).
    """
    zk = connect_zookeeper(zookeeper, security=security or security_from_environment())
    try:
        return plan_live_on(ClusterZk(zk, cluster_root), partitions, timeout=timeout, tls=tls)
    finally:
        zk.stop()
        zk.close()


def plan_live_on(
    cluster: ClusterZk,
    partitions: Iterable[int] | None = None,
    *,
    timeout: float = DEFAULT_STORAGE_TIMEOUT,
    tls: TlsConfig | None = None,
) -> list[CommittedPartition]:
    """:func:`plan_live` over a ZooKeeper session the caller holds (a process that plans again and
    again, such as the archiver).

    Raises:
        ClusterNotFoundError, ConfigurationError, CommittedReadError: as :func:`plan_live`.
    """
    params = cluster.params()
    # Every partition that exists: those at creation, and every child a split opened
    # (docs/design/splits.md "Spark across a split").
    existing = PartitionEpochsZk(cluster.zk, cluster.paths, timeout=cluster.timeout).read().value
    ids = _partition_ids(partitions, existing.partition_ids)
    summary = cluster.archive_summary()
    archive = None if summary is None else summary.value.location
    firsts = existing.first_transaction_ids
    return [
        dataclasses.replace(
            _plan_live_partition(
                cluster, pid, str(params.cluster_key), params.num_partitions, timeout, tls, archive
            ),
            first_transaction_id=firsts.get(pid, 0),
        )
        for pid in ids
    ]


def _partition_ids(partitions: Iterable[int] | None, existing: int | Sequence[int]) -> list[int]:
    """The partitions asked for (default: every one that exists), checked against ``existing``
    (a count: ``0 .. count - 1``; or the partition IDs that exist).

    Raises:
        ConfigurationError: a partition asked for does not exist.
    """
    ids_there = list(range(existing)) if isinstance(existing, int) else list(existing)
    if partitions is None:
        return ids_there
    ids = sorted(set(partitions))
    bad = [p for p in ids if p not in set(ids_there)]
    if bad:
        raise ConfigurationError(
            f"partitions {bad} do not exist: the log has partitions {_ranges(ids_there)}"
        )
    return ids


def _ranges(ids: Sequence[int]) -> str:
    """``0..3`` for consecutive IDs from 0, else the list."""
    return f"0..{len(ids) - 1}" if list(ids) == list(range(len(ids))) else str(list(ids))


def _plan_live_partition(
    cluster: ClusterZk,
    partition_id: int,
    cluster_key: str,
    num_partitions: int,
    timeout: float,
    tls: TlsConfig | None,
    archive: str | None,
) -> CommittedPartition:
    answers: list[str] = []
    for _ in range(MAX_PLAN_ATTEMPTS):
        metadata = cluster.partition_metadata(partition_id).value
        if metadata.session_id < 0:
            return CommittedPartition(
                partition_id,
                -1,
                LiveSource(cluster_key, num_partitions, -1, (), tls, archive=archive),
                "never had a store session",
            )
        assigned = set(cluster.assignments().value.storages_of(partition_id))
        connection = cluster.connection().value
        in_session = sorted(
            storage
            for storage, state in metadata.replicas.items()
            if state.session_id == metadata.session_id and state.unresolved
        )
        replica_set = assigned | set(metadata.replicas)
        quorum = quorum_of(len(replica_set))
        addresses = {s: connection.admin_address(s) for s in in_session if s in connection.admin_ports}
        statuses = run_on_shared_loop(
            _statuses(addresses, partition_id, cluster_key, num_partitions, timeout, tls)
        )
        proven: list[LiveReplica] = []
        answers = []
        for storage in in_session:
            status = statuses.get(storage)
            if isinstance(status, storage_pb2.PartitionStatus):
                if status.last_session_id == metadata.session_id:
                    proven.append(
                        LiveReplica(
                            storage, addresses[storage], status.low_water_mark, status.max_transaction_id
                        )
                    )
                    answers.append(
                        f"{storage}: max {status.max_transaction_id}, low-water mark {status.low_water_mark}"
                    )
                else:
                    answers.append(f"{storage}: its low-water mark is of session {status.last_session_id}")
            else:
                answers.append(f"{storage}: {status if status is not None else 'no admin port on record'}")
        if cluster.partition_metadata(partition_id).value.session_id != metadata.session_id:
            log.info("partition %d: a new store session started while planning; planning again", partition_id)
            continue
        if not proven:
            time.sleep(PLAN_RETRY_PAUSE)  # a recovery under way, or a node restarting: ask again
            continue
        maxima = sorted((r.max_transaction_id for r in proven), reverse=True)
        low = max(r.low_water_mark for r in proven)
        quorum_mark = maxima[quorum - 1] if len(maxima) >= quorum else -1
        mark = max(low, quorum_mark)
        replicas = tuple(sorted(proven, key=lambda r: (-r.max_transaction_id, r.storage)))
        holding = sum(1 for m in maxima if m >= quorum_mark) if quorum_mark >= 0 else 0
        proof = (
            f"session {metadata.session_id}: low-water mark {low}; {holding} of {len(replica_set)} "
            f"replicas hold transactions up to {quorum_mark}, a quorum being {quorum} "
            f"({'; '.join(answers)})"
        )
        return CommittedPartition(
            partition_id,
            mark,
            LiveSource(cluster_key, num_partitions, metadata.session_id, replicas, tls, quorum, archive),
            proof,
        )
    raise CommittedReadError(
        f"partition {partition_id}: no replica of the current store session proved its state "
        f"({'; '.join(answers) or 'no replica in the session'}); start the storage nodes, or read the "
        "replica directories offline"
    )


async def _statuses(
    addresses: Mapping[str, str],
    partition_id: int,
    cluster_key: str,
    num_partitions: int,
    timeout: float,
    tls: TlsConfig | None,
) -> dict[str, storage_pb2.PartitionStatus | str]:
    async def one(address: str) -> storage_pb2.PartitionStatus | str:
        async def status(admin: StorageAdminClient) -> storage_pb2.PartitionStatusResponse:
            return await admin.partition_status(partition_id)

        try:
            response = await call_admin(
                address, cluster_key, num_partitions, status, timeout=timeout, tls=tls, initialise=False
            )
        except WaltzError as exc:
            return str(exc)
        for entry in response.partitions:
            if entry.partition_id == partition_id:
                return entry
        return "the node does not hold the partition"

    storages = list(addresses)
    results = await asyncio.gather(*(one(addresses[s]) for s in storages))
    return dict(zip(storages, results, strict=True))


# ---- offline ----


def last_transaction_id(partition_dir: Path) -> int:
    """The ID of the last valid record in a replica directory's last non-empty segment (-1: none).

    Raises:
        OSError: a segment file cannot be read.
    """
    for path in reversed(sorted(partition_dir.glob("*" + fmt.SEGMENT_SUFFIX))):
        with inspect.SegmentFile(path) as segment:
            last = -1
            start = fmt.HEADER_SIZE
            index_path = path.with_suffix(fmt.INDEX_SUFFIX)
            if index_path.exists():
                with inspect.IndexFile(index_path) as index:
                    count = index.entry_count if index.header == segment.header else 0
                if count > 0:
                    start = inspect.find_record_offset(
                        segment, segment.header.first_transaction_id + count - 1
                    )
            for scanned in segment.scan(start):
                last = scanned.record.transaction_id
            if last >= 0:
                return last
    return -1


def split_genesis(partition_dir: Path) -> SplitGenesis | None:
    """The genesis a replica directory's log starts with, when it is a new partition of a split
    (its first record, at ``B(p) + 1``: docs/design/splits.md "Record forms"); else None.

    Raises:
        OSError: a segment file cannot be read.
    """
    for path in sorted(partition_dir.glob("*" + fmt.SEGMENT_SUFFIX), key=lambda p: int(p.stem)):
        with inspect.SegmentFile(path) as segment:
            for scanned in segment.scan():
                record = scanned.record
                if record.header != SPLIT_RECORD_HEADER:
                    return None
                return opening_genesis(record.transaction_id, bytes(record.data))
    return None


def plan_offline(
    directories: Sequence[str | Path],
    partitions: Iterable[int] | None = None,
    *,
    replicas: int | None = None,
    high_water_marks: Mapping[int, int] | None = None,
) -> list[CommittedPartition]:
    """Find what replica directories prove committed.

    See docs/design/spark.md "Offline reads from replica directories".

    Args:
        directories: storage directories (each holding ``waltz-storage.ctl``), of one cluster.
        partitions: partition IDs (None: every partition of the control files).
        replicas: replicas per partition in the cluster (its replication factor). Required for
            every partition without an entry in ``high_water_marks``: the quorum is a majority of
            the cluster's replicas, never of the directories given (three directories of a
            five-replica partition are a majority, but two of them agreeing prove nothing).
            With fewer than a quorum of directories, a partition is read up to its highest
            low-water mark only.
        high_water_marks: partition -> a committed high-water mark vouched for by the user
            (explicit mode for those partitions: no quorum needed).

    Returns:
        One :class:`CommittedPartition` per partition held by at least one directory; a new
        partition of a split starts at the genesis its directories' log starts with
        (``first_transaction_id``, docs/design/splits.md "Spark across a split").

    Raises:
        ConfigurationError: no directory, directories of different clusters, unknown partitions,
            ``replicas`` missing (or fewer than the directories holding a partition) for a
            partition without an explicit high-water mark; marks that read a new partition from
            its genesis on while its parent, planned too, is read below its barrier (not a
            consistent cut of the log across the split).
        StorageNotInitializedError, CorruptDataError, OSError: a control file is unusable.
    """
    if not directories:
        raise ConfigurationError("give at least one storage directory")
    if replicas is not None and replicas < 1:
        raise ConfigurationError(f"replicas must be at least 1, not {replicas}")
    dumps = [inspect.read_control_file(Path(d)) for d in directories]
    keys = {cluster_key_fingerprint(d.header.cluster_key) for d in dumps}
    if len(keys) != 1:
        raise ConfigurationError(
            f"the storage directories belong to different clusters (cluster key fingerprints {sorted(keys)})"
        )
    num_partitions = dumps[0].header.num_partitions
    ids = _partition_ids(partitions, num_partitions)
    explicit = dict(high_water_marks or {})
    plans: list[CommittedPartition] = []
    geneses: dict[int, SplitGenesis] = {}
    for pid in ids:
        holders: list[OfflineReplica] = []
        for directory, dump in zip(directories, dumps, strict=True):
            partition_dir = Path(directory) / str(pid)
            if not partition_dir.is_dir() or fmt.kept_unassigned(partition_dir):
                continue  # absent, or kept files of a partition unassigned from that node
            info = dump.partitions[pid].info if pid < len(dump.partitions) else None
            session, low = (info.session_id, info.low_water_mark) if info is not None else (-1, -1)
            top = last_transaction_id(partition_dir)
            holders.append(OfflineReplica(str(directory), session, min(low, top), top))
        if not holders:
            if pid in explicit and explicit[pid] >= 0:
                raise ConfigurationError(
                    f"partition {pid}: no directory holds it, yet its high-water mark is {explicit[pid]}"
                )
            continue
        holders.sort(key=lambda r: (-r.session_id, -r.max_transaction_id, r.directory))
        genesis = next(
            (g for r in holders if (g := split_genesis(Path(r.directory) / str(pid))) is not None), None
        )
        if genesis is not None:
            geneses[pid] = genesis
        if pid in explicit:
            mark = explicit[pid]
            plans.append(
                CommittedPartition(
                    pid, mark, OfflineSource(tuple(holders), None), f"high-water mark {mark} given"
                )
            )
            continue
        if replicas is None:
            raise ConfigurationError(
                f"partition {pid}: say how many replicas each partition has in the cluster (replicas / "
                "--replicas N): the quorum that proves a record committed is a majority of all of them, "
                "not of the directories given; or give a high-water mark you vouch for"
            )
        if len(holders) > replicas:
            raise ConfigurationError(
                f"partition {pid}: {len(holders)} directories hold it, but replicas is {replicas}: "
                "give the cluster's replication factor"
            )
        count = replicas
        quorum = quorum_of(count)
        low = max(r.low_water_mark for r in holders)
        maxima = sorted((r.max_transaction_id for r in holders), reverse=True)
        if len(holders) < quorum:
            mark = low
            proof = (
                f"{len(holders)} of {count} replica directories, fewer than a quorum ({quorum}): only up to "
                f"the low-water mark {low} (give more directories or a high-water mark to read further)"
            )
            log.warning("partition %d: %s", pid, proof)
        else:
            mark = max(low, maxima[quorum - 1])
            proof = (
                f"{len(holders)} of {count} replica directories: low-water mark {low}, "
                f"quorum {quorum} up to {maxima[quorum - 1]}"
            )
        plans.append(CommittedPartition(pid, mark, OfflineSource(tuple(holders), quorum), proof))
    plans = [
        dataclasses.replace(plan, first_transaction_id=geneses[plan.partition_id].barrier + 1)
        if plan.partition_id in geneses
        else plan
        for plan in plans
    ]
    _check_offline_cut(plans, geneses)
    return plans


def _check_offline_cut(plans: Sequence[CommittedPartition], geneses: Mapping[int, SplitGenesis]) -> None:
    """Refuse marks that are no consistent cut across a split: a new partition read from its
    genesis, ``B(p) + 1``, on while its parent, planned too, is read below its barrier
    (docs/design/splits.md "Why no update is lost": a key's changes before the barrier are the
    parent's).

    Raises:
        ConfigurationError: naming each such pair.
    """
    marks = {plan.partition_id: plan.high_water_mark for plan in plans}
    problems = []
    for child, genesis in sorted(geneses.items()):
        parent, barrier = genesis.parent, genesis.barrier
        if parent in marks and marks[child] > barrier and marks[parent] < barrier:
            problems.append(
                f"partition {child} is read up to {marks[child]}, from its genesis at {barrier + 1}, "
                f"but its parent {parent} only up to {marks[parent]}, below its barrier {barrier}"
            )
    if problems:
        raise ConfigurationError(
            "the marks are not a consistent cut of the log across its split: "
            + "; ".join(problems)
            + " (give more of the parent's directories, or high-water marks that stop the new "
            "partition before its genesis)"
        )
