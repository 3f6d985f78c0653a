"""``waltz cluster verify``: check ZooKeeper's view of the cluster against the storage nodes.

Design: docs/design/zookeeper.md "Partition metadata" (replica states), "Replica assignments and
groups"; docs/design/storage.md "Admin port". Two steps, so the checks are pure and testable:

1. :func:`probe_storage_nodes` asks every storage node, through its admin port, for its identity
   (the admin open checks the cluster key and number of partitions) and the state of its
   partitions (``partition_status``).
2. :func:`verify_cluster` turns a :class:`~waltz.admin.description.ClusterDescription`
   and the probes into :class:`CheckResult` lines, in three groups: ZooKeeper metadata, storage
   nodes, partitions. Server checks (membership, partition ownership) become a fourth group,
   ``server_checks``, once the cluster manager exists; :class:`VerifyReport` does not care where a
   check comes from.

A WARNING never fails the verification; a FAILED does.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from waltz.admin.description import ClusterDescription, replica_states
from waltz.admin.storage_nodes import (
    DEFAULT_STORAGE_TIMEOUT,
    StorageUnreachableError,
    call_admin_on_nodes,
    describe_failure,
)
from waltz.errors import StorageRpcError
from waltz.metadata.replicas import quorum_of
from waltz.protocol.channels import TlsConfig
from waltz.protocol.cluster_key import cluster_key_fingerprint
from waltz.protocol.storage_client import StorageAdminClient
from waltz.protocol.storage_pb2 import PartitionStatus

__all__ = [
    "CheckResult",
    "CheckStatus",
    "ReplicaStatus",
    "StorageProbe",
    "VerifyReport",
    "metadata_checks",
    "partition_checks",
    "probe_storage_nodes",
    "status_of",
    "storage_checks",
    "verify_cluster",
]


class CheckStatus(enum.Enum):
    """The outcome of one check."""

    PASSED = "PASSED"
    WARNING = "WARNING"
    FAILED = "FAILED"


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One line of the verification.

    Attributes:
        name: what was checked, stable across runs (``storage 10.0.0.1:55280: reachable``).
        status: PASSED, WARNING or FAILED.
        detail: the values behind the outcome, and what to do about a failure.
    """

    name: str
    status: CheckStatus
    detail: str = ""


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """Every check of a verification, in order."""

    checks: tuple[CheckResult, ...]

    @property
    def passed(self) -> bool:
        """True when no check FAILED (warnings allowed)."""
        return all(c.status is not CheckStatus.FAILED for c in self.checks)

    def count(self, status: CheckStatus) -> int:
        """The number of checks with ``status``."""
        return sum(1 for c in self.checks if c.status is status)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``waltz cluster verify --json``)."""
        return {
            "passed": self.passed,
            "checks": [{"name": c.name, "status": c.status.value, "detail": c.detail} for c in self.checks],
        }


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    """A partition's state on one storage node (admin ``partition_status``).

    Attributes:
        partition_id: the partition.
        last_session_id: the session ID of the node's last session info (-1: none).
        session_id: the node's current (fencing) store session ID.
        max_transaction_id: the highest transaction ID stored (-1: empty).
        corrupt_transaction_id: the first corrupt record's transaction ID, -1 if none was found.
        readable, writable: the admin availability switches.
        error: why the node could not report the partition (e.g. it failed to open), or None.
        local_start: the first transaction ID on the node's disk (docs/design/archive.md,
            "Terms"; 0 from a node that does not report it).
        archived_through: what the archiver last told the node is archived (-1: nothing).
    """

    partition_id: int
    last_session_id: int = -1
    session_id: int = -1
    max_transaction_id: int = -1
    corrupt_transaction_id: int = -1
    readable: bool = True
    writable: bool = True
    error: str | None = None
    local_start: int = 0
    archived_through: int = -1

    @classmethod
    def from_proto(cls, status: PartitionStatus) -> ReplicaStatus:
        """Convert the admin protocol's ``PartitionStatus``."""
        return cls(
            partition_id=status.partition_id,
            last_session_id=status.last_session_id,
            session_id=status.session_id,
            max_transaction_id=status.max_transaction_id,
            corrupt_transaction_id=status.corrupt_transaction_id,
            readable=status.readable,
            writable=status.writable,
            local_start=status.local_start,
            archived_through=status.archived_through,
        )


@dataclass(frozen=True, slots=True)
class StorageProbe:
    """What one storage node answered.

    Attributes:
        storage: the node's connect string.
        admin_address: ``host:admin_port`` asked, or None when ZooKeeper has no admin port for it.
        reachable: the admin port answered.
        error: why the node could not be asked (unreachable, or refused the admin open), or None.
        partitions: partition ID -> state, as the node reports it.
        complete: ``partitions`` lists every partition on the node; False when the node could only
            be asked partition by partition (then extra partitions are not detected).
    """

    storage: str
    admin_address: str | None
    reachable: bool
    error: str | None = None
    partitions: Mapping[int, ReplicaStatus] = field(default_factory=dict)
    complete: bool = True

    @property
    def opened(self) -> bool:
        """True when the node accepted the admin open (cluster key and partition count match)."""
        return self.reachable and self.error is None

    def available(self, partition_id: int) -> bool:
        """True when the node answered and reports the partition without error."""
        status = self.partitions.get(partition_id)
        return self.opened and status is not None and status.error is None


async def probe_storage_nodes(
    description: ClusterDescription,
    *,
    timeout: float = DEFAULT_STORAGE_TIMEOUT,
    tls: TlsConfig | None = None,
) -> dict[str, StorageProbe]:
    """Ask every storage node of the cluster for its identity and partitions, concurrently.

    Args:
        description: the cluster's metadata.
        timeout: seconds for each node.
        tls: client TLS files, or None.

    Returns:
        Connect string -> probe, for every storage node in ``description``.
    """
    assigned = {n.connect_string: n.partitions for n in description.storage_nodes}

    async def status(storage: str, admin: StorageAdminClient) -> tuple[dict[int, ReplicaStatus], bool]:
        try:
            response = await admin.partition_status(-1)
        except StorageRpcError:
            # A partition that fails to open (corrupt files) fails the whole list: ask one by one.
            statuses: dict[int, ReplicaStatus] = {}
            for pid in assigned[storage]:
                try:
                    one = await admin.partition_status(pid)
                except StorageRpcError as exc:
                    if exc.code != "PARTITION_NOT_ASSIGNED":
                        statuses[pid] = ReplicaStatus(pid, error=describe_failure(exc))
                    continue
                statuses.update({p.partition_id: ReplicaStatus.from_proto(p) for p in one.partitions})
            return statuses, False
        return {p.partition_id: ReplicaStatus.from_proto(p) for p in response.partitions}, True

    addresses = {
        n.connect_string: n.admin_address for n in description.storage_nodes if n.admin_address is not None
    }
    outcomes = await call_admin_on_nodes(
        addresses,
        str(description.params.cluster_key),
        description.params.num_partitions,
        status,
        timeout=timeout,
        tls=tls,
        initialise=False,  # a node on a mistyped directory is reported, never initialised
    )
    probes: dict[str, StorageProbe] = {}
    for node in description.storage_nodes:
        name = node.connect_string
        outcome = outcomes.get(name)
        if outcome is None:
            probes[name] = StorageProbe(name, None, False, "no admin port in store/connection")
        elif outcome.error is not None:
            probes[name] = StorageProbe(
                name,
                node.admin_address,
                not isinstance(outcome.error, StorageUnreachableError),
                describe_failure(outcome.error),
            )
        else:
            assert outcome.value is not None
            partitions, complete = outcome.value
            probes[name] = StorageProbe(name, node.admin_address, True, None, partitions, complete)
    return probes


def status_of(failed: bool) -> CheckStatus:
    """FAILED when ``failed``, else PASSED."""
    return CheckStatus.FAILED if failed else CheckStatus.PASSED


def _ids(ids: Iterable[int]) -> str:
    return ",".join(str(i) for i in sorted(ids))


def metadata_checks(description: ClusterDescription) -> list[CheckResult]:
    """Checks of ZooKeeper alone: storage nodes fully described, every partition replicated."""
    params = description.params
    known = [p.partition_id for p in description.partitions]
    split = f" at creation, {len(known)} now" if len(known) != params.num_partitions else ""
    checks = [
        CheckResult(
            "zookeeper: cluster metadata",
            CheckStatus.PASSED,
            f"cluster {params.name!r} under {description.root}: {params.num_partitions} partitions{split}, "
            f"key {cluster_key_fingerprint(params.cluster_key)}, {len(description.storage_nodes)} "
            "storage node(s)",
        )
    ]
    incomplete = []
    for node in description.storage_nodes:
        lacks = [
            what for what, value in (("admin port", node.admin_port), ("group", node.group)) if value is None
        ]
        out_of_range = [p for p in node.partitions if p not in known]
        if lacks:
            incomplete.append(f"{node.connect_string} has no {' and no '.join(lacks)}")
        if out_of_range:
            incomplete.append(f"{node.connect_string} is assigned unknown partitions {_ids(out_of_range)}")
    checks.append(
        CheckResult(
            "zookeeper: storage nodes",
            status_of(bool(incomplete)),
            "; ".join(incomplete) + ("; fix with waltz cluster storage add/remove" if incomplete else "")
            or "every storage node has an admin port and a group",
        )
    )
    bad = [p for p in description.partitions if p.metadata is None]
    checks.append(
        CheckResult(
            "zookeeper: partition metadata",
            status_of(bool(bad)),
            "; ".join(f"partition {p.partition_id}: {p.error}" for p in bad)
            or (
                f"store/partition/0..{params.num_partitions - 1} all decode"
                if known == list(range(params.num_partitions))
                else f"store/partition/<id> of partitions {_ids(known)} all decode"
            ),
        )
    )
    counts = [len(p.assigned) for p in description.partitions]
    unassigned = [p.partition_id for p in description.partitions if not p.assigned]
    checks.append(
        CheckResult(
            "zookeeper: replica assignment",
            status_of(bool(unassigned)),
            f"partitions without any replica: {_ids(unassigned)}; assign them with "
            "waltz cluster storage assign"
            if unassigned
            else f"{min(counts, default=0)} to {max(counts, default=0)} replicas per partition",
        )
    )
    return checks


def storage_checks(description: ClusterDescription, probes: Mapping[str, StorageProbe]) -> list[CheckResult]:
    """Per storage node: reachable, same cluster, exactly the assigned partitions.

    A node that is unreachable gets only its reachability line; a node that refused the admin open
    gets no partition line.
    """
    checks = []
    for node in description.storage_nodes:
        probe = probes[node.connect_string]
        prefix = f"storage {node.connect_string}"
        if not probe.reachable:
            checks.append(CheckResult(f"{prefix}: reachable", CheckStatus.FAILED, probe.error or ""))
            continue
        checks.append(
            CheckResult(f"{prefix}: reachable", CheckStatus.PASSED, f"admin port {probe.admin_address}")
        )
        if not probe.opened:
            checks.append(
                CheckResult(
                    f"{prefix}: cluster key and partition count", CheckStatus.FAILED, probe.error or ""
                )
            )
            continue
        checks.append(
            CheckResult(
                f"{prefix}: cluster key and partition count",
                CheckStatus.PASSED,
                f"key {cluster_key_fingerprint(description.params.cluster_key)}, "
                f"{description.params.num_partitions} partitions",
            )
        )
        expected = set(node.partitions)
        actual = set(probe.partitions)
        missing = expected - actual
        extra = actual - expected if probe.complete else set()
        problems = []
        if missing:
            problems.append(
                f"assigned in ZooKeeper but not on the node: {_ids(missing)} "
                f"(waltz cluster storage assign {node.connect_string} --partition {_ids(missing)})"
            )
        if extra:
            problems.append(
                f"on the node but not assigned in ZooKeeper: {_ids(extra)} "
                f"(waltz cluster storage unassign {node.connect_string} --partition {_ids(extra)})"
            )
        checks.append(
            CheckResult(
                f"{prefix}: partitions match the assignment",
                status_of(bool(problems)),
                "; ".join(problems) or f"partitions {_ids(expected) or '(none)'}",
            )
        )
    return checks


def partition_checks(
    description: ClusterDescription, probes: Mapping[str, StorageProbe]
) -> list[CheckResult]:
    """Per partition: a quorum of replicas available, replica sessions consistent, no corruption."""
    checks = []
    for partition in description.partitions:
        pid = partition.partition_id
        prefix = f"partition {pid}"
        assigned = partition.assigned
        available = [s for s in assigned if s in probes and probes[s].available(pid)]
        needed = quorum_of(len(assigned))
        down = [s for s in assigned if s not in available]
        checks.append(
            CheckResult(
                f"{prefix}: quorum of replicas available",
                status_of(len(available) < needed),
                f"{len(available)} of {len(assigned)} replicas available, quorum {needed}"
                + (f"; unavailable: {', '.join(down)}" if down else ""),
            )
        )
        states = replica_states(partition)
        behind = []
        for storage in available:
            state = states.get(storage)
            status = probes[storage].partitions[pid]
            if state is not None and status.last_session_id < state.session_id:
                behind.append(
                    f"{storage} reports last session {status.last_session_id} but ZooKeeper has "
                    f"session {state.session_id} for it: restored from a backup? recovery will "
                    "truncate it to its low-water mark and catch it up"
                )
            current = partition.metadata.session_id if partition.metadata is not None else None
            if current is not None and status.session_id > current:
                behind.append(
                    f"{storage} fences the partition at session {status.session_id}, above ZooKeeper's "
                    f"store session ID {current}: the server's next sessions are refused there until "
                    "ZooKeeper passes it; if no server took that session, set the fence back with "
                    f"waltz cluster storage set-fence {storage} --partition {pid}"
                )
        checks.append(
            CheckResult(
                f"{prefix}: replica sessions consistent with ZooKeeper",
                CheckStatus.WARNING if behind else CheckStatus.PASSED,
                "; ".join(behind)
                or (
                    f"{len(available)} available replica(s) at or after their ZooKeeper session"
                    if available
                    else "no replica available to compare"
                ),
            )
        )
        corrupt = []
        for storage in assigned:
            status_or_none = probes[storage].partitions.get(pid) if storage in probes else None
            if status_or_none is None:
                continue
            if status_or_none.error is not None:
                corrupt.append(f"{storage}: {status_or_none.error}")
            elif status_or_none.corrupt_transaction_id >= 0:
                corrupt.append(
                    f"{storage}: corrupt record at transaction {status_or_none.corrupt_transaction_id} "
                    "(waltz disk verify on the node's directory says more)"
                )
        checks.append(
            CheckResult(
                f"{prefix}: no corrupt records",
                status_of(bool(corrupt)),
                "; ".join(corrupt) or "no replica reports a corrupt record",
            )
        )
    return checks


def verify_cluster(description: ClusterDescription, probes: Mapping[str, StorageProbe]) -> VerifyReport:
    """Every check of the cluster, from its metadata and its storage nodes' answers.

    Args:
        description: the cluster's metadata in ZooKeeper.
        probes: every storage node's answers (:func:`probe_storage_nodes`).

    Returns:
        The report: ZooKeeper checks, then one group per storage node, then one per partition.
    """
    return VerifyReport(
        tuple(
            metadata_checks(description)
            + storage_checks(description, probes)
            + partition_checks(description, probes)
        )
    )
