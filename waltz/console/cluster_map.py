"""The cluster map the console shows: servers, partitions, owners, replicas and their lag.

Design: docs/design/console.md "Cluster map", "The archive". Nothing here is gathered anew: the metadata is
:func:`~waltz.admin.description.describe_cluster` (``waltz cluster list``), the storage nodes'
answers are :func:`~waltz.admin.verify.probe_storage_nodes` and the servers' are
:func:`~waltz.admin.verify_servers.probe_servers` (both of ``waltz cluster verify``), and the
problems are that command's checks, ACLs included (:func:`~waltz.admin.verify_all.cluster_checks`);
the archive's summary is ``<root>/archive`` (:meth:`~waltz.metadata.zk.ClusterZk.archive_summary`).
:func:`build_map` only joins them, per partition, and works out each replica's lag behind its
partition's committed high-water mark.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from waltz.admin.description import ClusterDescription, replica_states
from waltz.admin.verify import CheckResult, CheckStatus, StorageProbe
from waltz.admin.verify_servers import ServerProbe
from waltz.console.zookeeper_health import ZooKeeperHealth
from waltz.metadata.assignment import PartitionAssignment
from waltz.metadata.values import ArchiveSummary

__all__ = [
    "ClusterMap",
    "LastSeen",
    "PartitionView",
    "ReplicaView",
    "ServerView",
    "StorageView",
    "build_map",
]

#: Storage connect string -> partition ID -> (max transaction ID, wall-clock time it was read).
LastSeen = dict[str, dict[int, tuple[int, float]]]


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """One replica of a partition.

    Attributes:
        storage: the storage node's connect string.
        reachable: the node answered and reports the partition without error.
        max_transaction_id: the highest transaction ID the node stores (-1: empty); when the node
            does not answer, the last value read from it (``stale``), or None if never read.
        stale: ``max_transaction_id`` is the last value seen, not a current one.
        seen_at: wall-clock time (seconds) ``max_transaction_id`` was read, or None.
        lag: transactions the replica lacks below the partition's high-water mark (0 when caught
            up; from the last value seen when stale), or None when either side is unknown.
        state: the replica's state in the partition metadata, in words.
        in_session: the replica is a caught-up writer of the current store session (ZooKeeper).
        readable, writable: the node's availability switches for the partition.
        error: why the node could not report the partition, or None.
        local_start: the first transaction ID on the node's disk (its local range is
            ``local_start..max_transaction_id``), or None when the node did not answer.
        archived_through: what the archiver last told the node is archived (-1: nothing), or None
            when the node did not answer.
    """

    storage: str
    reachable: bool
    max_transaction_id: int | None
    stale: bool
    seen_at: float | None
    lag: int | None
    state: str
    in_session: bool
    readable: bool = True
    writable: bool = True
    error: str | None = None
    local_start: int | None = None
    archived_through: int | None = None


@dataclass(frozen=True, slots=True)
class PartitionView:
    """One partition: its owner, generation, store session and replicas.

    Attributes:
        partition_id: the partition.
        owner: the member znode name of the server the assignment places it on, or None.
        owner_endpoint: that server's client endpoint, or None.
        owner_name: that server's name (``server.name``) when it is live and has one, else None.
        generation: the assignment's generation of the partition (-1: never placed).
        store_generation: the generation in the partition metadata (-1: unknown).
        session_id: the current store session ID (-1: none yet or unknown).
        high_water_mark: the committed high-water mark its owner reports, or None.
        writable: its owner reports it writable under the assigned generation.
        replicas: every replica assigned, by storage connect string.
        error: why the partition metadata could not be read, or None.
        archived_through: what the archive holds of it (``<root>/archive``: every transaction up to
            it; -1: nothing yet), or None when the cluster has no archive.
        archive_chunks: its chunks in the archive (0 without one).
        archive_bytes: their bytes.
    """

    partition_id: int
    owner: str | None
    owner_endpoint: str | None
    generation: int
    store_generation: int
    session_id: int
    high_water_mark: int | None
    writable: bool
    replicas: tuple[ReplicaView, ...]
    error: str | None = None
    archived_through: int | None = None
    archive_chunks: int = 0
    archive_bytes: int = 0
    owner_name: str | None = None

    @property
    def archive_lag(self) -> int | None:
        """Committed transactions not yet archived (None: no archive, or no high-water mark)."""
        if self.archived_through is None or self.high_water_mark is None:
            return None
        return max(0, self.high_water_mark - self.archived_through)

    @property
    def max_lag(self) -> int | None:
        """The largest known lag of its replicas, or None when none is known."""
        lags = [r.lag for r in self.replicas if r.lag is not None]
        return max(lags) if lags else None


@dataclass(frozen=True, slots=True)
class ServerView:
    """A live server (a member znode).

    Attributes:
        member: the member znode name.
        name: what tools call the server: its ``server.name``, else its endpoint
            (:attr:`~waltz.metadata.assignment.Member.display_name`).
        server_name: its ``server.name``, or None when it has none.
        server_id: the member's sequence number.
        endpoint: its client endpoint.
        reachable: it answered the status request.
        cluster_manager: it says it is the elected cluster manager.
        partitions: the partitions the assignment places on it, sorted.
        error: why it did not answer, or None.
    """

    member: str
    server_id: int
    endpoint: str
    reachable: bool
    cluster_manager: bool
    partitions: tuple[int, ...]
    error: str | None = None
    name: str = ""
    server_name: str | None = None


@dataclass(frozen=True, slots=True)
class StorageView:
    """A storage node of the cluster.

    Attributes:
        connect_string: its storage port, ``host:port`` (its name in ZooKeeper).
        admin_address: ``host:admin_port``, or None when ZooKeeper has no admin port for it.
        group: its replica group, or None.
        partitions: the partitions assigned to it.
        reachable: its admin port answered.
        error: why it could not be asked, or None.
    """

    connect_string: str
    admin_address: str | None
    group: int | None
    partitions: tuple[int, ...]
    reachable: bool
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ClusterMap:
    """Everything the console shows of the cluster at one moment.

    Attributes:
        taken_at: wall-clock time (seconds since the epoch) the look began.
        took: seconds the look took.
        root: the cluster root znode.
        name: the cluster's name.
        num_partitions: its number of partitions.
        zookeeper: the health of ZooKeeper.
        servers: the live servers, by member name.
        storage_nodes: the storage nodes, by connect string.
        partitions: every partition, in order.
        problems: the WARNING and FAILED checks of ``waltz cluster verify``, in its order.
        checks_passed: how many of those checks passed.
        archive_location: the archive ``<root>/archive`` names, or None (no archive yet).
    """

    taken_at: float
    took: float
    root: str
    name: str
    num_partitions: int
    zookeeper: ZooKeeperHealth
    servers: tuple[ServerView, ...]
    storage_nodes: tuple[StorageView, ...]
    partitions: tuple[PartitionView, ...]
    problems: tuple[CheckResult, ...] = field(default=())
    checks_passed: int = 0
    archive_location: str | None = None

    def partition(self, partition_id: int) -> PartitionView:
        """The partition ``partition_id``.

        Raises:
            KeyError: no such partition.
        """
        for partition in self.partitions:
            if partition.partition_id == partition_id:
                return partition
        raise KeyError(partition_id)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``/api/map.json``)."""
        return {
            "taken_at": self.taken_at,
            "took": self.took,
            "root": self.root,
            "name": self.name,
            "num_partitions": self.num_partitions,
            "archive_location": self.archive_location,
            "zookeeper": self.zookeeper.to_json(),
            "servers": [
                {
                    "member": s.member,
                    "name": s.name,
                    "server_name": s.server_name,
                    "server_id": s.server_id,
                    "endpoint": s.endpoint,
                    "reachable": s.reachable,
                    "cluster_manager": s.cluster_manager,
                    "partitions": list(s.partitions),
                    "error": s.error,
                }
                for s in self.servers
            ],
            "storage_nodes": [
                {
                    "connect_string": n.connect_string,
                    "admin_address": n.admin_address,
                    "group": n.group,
                    "partitions": list(n.partitions),
                    "reachable": n.reachable,
                    "error": n.error,
                }
                for n in self.storage_nodes
            ],
            "partitions": [
                {
                    "partition_id": p.partition_id,
                    "owner": p.owner,
                    "owner_endpoint": p.owner_endpoint,
                    "owner_name": p.owner_name,
                    "generation": p.generation,
                    "store_generation": p.store_generation,
                    "session_id": p.session_id,
                    "high_water_mark": p.high_water_mark,
                    "writable": p.writable,
                    "error": p.error,
                    "archived_through": p.archived_through,
                    "archive_chunks": p.archive_chunks,
                    "archive_bytes": p.archive_bytes,
                    "archive_lag": p.archive_lag,
                    "replicas": [
                        {
                            "storage": r.storage,
                            "reachable": r.reachable,
                            "max_transaction_id": r.max_transaction_id,
                            "stale": r.stale,
                            "lag": r.lag,
                            "state": r.state,
                            "in_session": r.in_session,
                            "readable": r.readable,
                            "writable": r.writable,
                            "error": r.error,
                            "local_start": r.local_start,
                            "archived_through": r.archived_through,
                        }
                        for r in p.replicas
                    ],
                }
                for p in self.partitions
            ],
            "problems": [
                {"name": c.name, "status": c.status.value, "detail": c.detail} for c in self.problems
            ],
            "checks_passed": self.checks_passed,
        }


def _replica(
    storage: str,
    pid: int,
    description_state: tuple[int, int | None] | None,
    session_id: int,
    probe: StorageProbe | None,
    high_water_mark: int | None,
    last_seen: LastSeen,
    now: float,
) -> ReplicaView:
    if description_state is None:
        state, in_session = "not in the partition metadata", False
    else:
        replica_session, closing = description_state
        in_session = replica_session == session_id >= 0 and closing is None
        if in_session:
            state = f"writer of session {replica_session}"
        elif closing is None:
            state = f"session {replica_session}, unresolved"
        else:
            state = f"session {replica_session}, closed at {closing}"
    status = probe.partitions.get(pid) if probe is not None and probe.opened else None
    if status is not None and status.error is None:
        last_seen.setdefault(storage, {})[pid] = (status.max_transaction_id, now)
        max_id: int | None = status.max_transaction_id
        seen_at: float | None = now
        stale = False
    else:
        seen = last_seen.get(storage, {}).get(pid)
        max_id, seen_at = (seen[0], seen[1]) if seen else (None, None)
        stale = True
    lag = None if max_id is None or high_water_mark is None else max(0, high_water_mark - max_id)
    if status is not None:
        error = status.error
    elif probe is None:
        error = "not probed"
    elif probe.error is not None:
        error = probe.error
    else:
        error = "the node does not report the partition"
    return ReplicaView(
        storage=storage,
        reachable=status is not None and status.error is None,
        max_transaction_id=max_id,
        stale=stale,
        seen_at=seen_at,
        lag=lag,
        state=state,
        in_session=in_session,
        readable=status.readable if status is not None else True,
        writable=status.writable if status is not None else True,
        error=error,
        local_start=status.local_start if status is not None and status.error is None else None,
        archived_through=status.archived_through if status is not None and status.error is None else None,
    )


def build_map(
    description: ClusterDescription,
    assignment: PartitionAssignment,
    storage_probes: Mapping[str, StorageProbe],
    server_probes: Sequence[ServerProbe],
    zookeeper: ZooKeeperHealth,
    *,
    checks: Sequence[CheckResult],
    last_seen: LastSeen,
    taken_at: float,
    took: float | None = None,
    archive: ArchiveSummary | None = None,
) -> ClusterMap:
    """Join what was gathered into the cluster map (pure but for ``last_seen``).

    Args:
        description: the cluster's metadata (``waltz cluster list``).
        assignment: ``server/assignment``: the owner and generation of each partition.
        storage_probes: every storage node's answers.
        server_probes: every live server's status.
        zookeeper: the health of ZooKeeper.
        checks: every check of ``waltz cluster verify`` on what was gathered
            (:func:`~waltz.admin.verify_all.cluster_checks`).
        last_seen: each replica's last max transaction ID read, updated here with the new ones;
            kept by the caller from one look to the next, so that a node that stopped still shows
            how far behind it was.
        taken_at: wall-clock time the look began.
        took: seconds the look took (default: until now).
        archive: ``<root>/archive`` (None: the cluster has no archive yet).

    Returns:
        The map; its problems are the WARNING and FAILED checks of ``waltz cluster verify``.
    """
    now = time.time()
    server_names = {p.member.name: p.member.server_name for p in server_probes}
    statuses = {
        p.member.name: {s.partition_id: s for s in p.status.partitions}
        for p in server_probes
        if p.status is not None
    }
    partitions = []
    for info in description.partitions:
        pid = info.partition_id
        placement = assignment.placements.get(pid)
        owner = placement.member if placement else None
        generation = placement.generation if placement else -1
        state = statuses.get(owner, {}).get(pid) if owner else None
        high_water_mark = state.high_water_mark if state is not None else None
        writable = state is not None and state.writable and state.generation == generation
        session_id = info.metadata.session_id if info.metadata else -1
        states = replica_states(info)
        names = list(info.assigned) + sorted(set(states) - set(info.assigned))
        replicas = tuple(
            _replica(
                storage,
                pid,
                (states[storage].session_id, states[storage].closing_high_water_mark)
                if storage in states
                else None,
                session_id,
                storage_probes.get(storage),
                high_water_mark,
                last_seen,
                now,
            )
            for storage in names
        )
        partitions.append(
            PartitionView(
                partition_id=pid,
                owner=owner,
                owner_endpoint=placement.endpoint if placement else None,
                owner_name=server_names.get(owner) if owner else None,
                generation=generation,
                store_generation=info.metadata.generation if info.metadata else -1,
                session_id=session_id,
                high_water_mark=high_water_mark,
                writable=writable,
                replicas=replicas,
                error=info.error,
                archived_through=None if archive is None else archive.of(pid).archived_through,
                archive_chunks=0 if archive is None else archive.of(pid).chunks,
                archive_bytes=0 if archive is None else archive.of(pid).size_bytes,
            )
        )
    servers = tuple(
        ServerView(
            member=p.member.name,
            server_id=p.member.server_id,
            endpoint=p.member.endpoint,
            reachable=p.status is not None,
            cluster_manager=p.status is not None and p.status.cluster_manager,
            partitions=tuple(sorted(assignment.partitions_of(p.member.name))),
            error=p.error,
            name=p.member.display_name,
            server_name=p.member.server_name,
        )
        for p in server_probes
    )
    storage_nodes = tuple(
        StorageView(
            connect_string=n.connect_string,
            admin_address=n.admin_address,
            group=n.group,
            partitions=n.partitions,
            reachable=storage_probes[n.connect_string].reachable
            if n.connect_string in storage_probes
            else False,
            error=storage_probes[n.connect_string].error if n.connect_string in storage_probes else None,
        )
        for n in description.storage_nodes
    )
    params = description.params
    return ClusterMap(
        taken_at=taken_at,
        took=(now - taken_at) if took is None else took,
        root=description.root,
        name=params.name,
        num_partitions=params.num_partitions,
        zookeeper=zookeeper,
        servers=servers,
        storage_nodes=storage_nodes,
        partitions=tuple(partitions),
        problems=tuple(c for c in checks if c.status is not CheckStatus.PASSED),
        checks_passed=sum(1 for c in checks if c.status is CheckStatus.PASSED),
        archive_location=None if archive is None else archive.location,
    )
