"""Manage a cluster's storage nodes and replica assignments (``waltz cluster storage ...``).

Design: docs/design/zookeeper.md "Replica assignments and groups", "Partition metadata";
docs/design/storage.md "Admin port". ``docs/zookeeper.md`` documents the znodes and the rules
enforced here.

Every change to ``store/assignment``, ``store/group`` and ``store/connection`` is a
compare-and-set in one ZooKeeper transaction, retried from a fresh read when someone else wrote
first. A replica change checks the safety rules of :mod:`waltz.metadata.replicas`, and its
transaction also checks the versions of the partition metadata the decision was based on: a store
session that starts meanwhile makes the change retry with fresh replica states.

The two sides of a replica change are ordered so that a failure half-way is harmless:

- assign: the partition is created on the storage node first, then added to ``store/assignment``
  (a server never sees a replica that does not exist; an interrupted assign leaves an empty,
  unused partition on the node, which ``waltz cluster verify`` reports);
- unassign: ``store/assignment`` first, then the storage node (servers stop using the replica
  before it disappears; an unreachable node keeps the files until the command is rerun).

Every change (add, remove, assign, unassign, auto-assign) checks, before it contacts a node or
writes ZooKeeper (assign and unassign after their safety rules' read-only check), that the caller's
certificate names the admin role (:func:`~waltz.admin.admin_role.require_admin_role`): operators
hold the admins' ZooKeeper credential, so ZooKeeper would take an operator's write that the node
then refuses (docs/design/overview.md "Roles").
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from kazoo.exceptions import BadVersionError, NoAuthError, RolledBackError

from waltz.admin.admin_role import require_admin_role
from waltz.admin.description import describe_cluster, unknown_partitions
from waltz.admin.description import partition_ids as existing_partitions
from waltz.admin.storage_nodes import (
    DEFAULT_STORAGE_TIMEOUT,
    StorageAccessDeniedError,
    describe_failure,
    run_admin,
)
from waltz.errors import ConfigurationError, MetadataError, StaleMetadataError, StorageRpcError, WaltzError
from waltz.metadata.replicas import ReplicaChangeRefusedError, assign_refusal, unassign_refusal
from waltz.metadata.values import (
    ClusterParams,
    ConnectionMetadata,
    GroupDescriptor,
    ReplicaAssignments,
    check_connect_string,
)
from waltz.metadata.zk import ClusterZk
from waltz.metadata.zk_session import ZooKeeperUnavailableError, auth_error, zookeeper_errors
from waltz.protocol.channels import TlsConfig
from waltz.protocol.storage_client import StorageAdminClient

__all__ = ["AutoAssignResult", "ReplicaChangeResult", "StorageNodeAdmin"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Attempts of a compare-and-set before giving up (each attempt re-reads and re-checks).
MAX_CAS_ATTEMPTS = 20


@dataclass(frozen=True, slots=True)
class ReplicaChangeResult:
    """The outcome of an assign or unassign on one storage node.

    Attributes:
        storage: the node's connect string.
        changed: partitions whose assignment changed in ZooKeeper.
        unchanged: partitions that already were so in ZooKeeper (the node was updated anyway).
        warnings: safety rules overridden with ``force``, one line each.
        storage_error: for an unassign, why the node could not be updated after ZooKeeper was
            (rerun the command once it is back), or None.
        storage_refused: ``storage_error`` is the node's own refusal (it answered: a role it does
            not grant, a failure code), not a node that could not be reached.
    """

    storage: str
    changed: tuple[int, ...]
    unchanged: tuple[int, ...]
    warnings: tuple[str, ...] = ()
    storage_error: str | None = None
    storage_refused: bool = False


@dataclass(frozen=True, slots=True)
class AutoAssignResult:
    """The outcome of an auto-assign.

    Attributes:
        assigned: storage connect string -> partitions newly assigned to it.
        pending: replicas not assigned yet by the one-replica-at-a-time rule (rerun later).
        failures: storage connect string -> why it could not be assigned its partitions.
        warnings: safety rules overridden with ``force``.
    """

    assigned: dict[str, tuple[int, ...]]
    pending: tuple[str, ...]
    failures: dict[str, str]
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Write:
    """One compare-and-set write of a ZooKeeper transaction."""

    path: str
    data: bytes
    version: int


def _ids(ids: Iterable[int]) -> str:
    return ",".join(str(i) for i in ids)


class StorageNodeAdmin:
    """Add and remove storage nodes, and change which partitions they hold.

    Args:
        cluster: the cluster's znodes (its kazoo client is owned by the caller).
        storage_timeout: seconds allowed for each storage node's admin call.
        tls: client TLS files for the storage admin ports, or None.
    """

    def __init__(
        self,
        cluster: ClusterZk,
        *,
        storage_timeout: float = DEFAULT_STORAGE_TIMEOUT,
        tls: TlsConfig | None = None,
    ) -> None:
        self.cluster = cluster
        self.storage_timeout = storage_timeout
        self.tls = tls

    # ---- helpers ----

    def _on_node(
        self,
        admin_address: str,
        params: ClusterParams,
        work: Callable[[StorageAdminClient], Awaitable[T]],
        *,
        initialise: bool = True,
    ) -> T:
        """Run ``work`` on a node's admin stream (``initialise`` False: a node without a control
        file answers ``NOT_INITIALIZED`` instead of being initialised)."""
        return run_admin(
            admin_address, params, work, timeout=self.storage_timeout, tls=self.tls, initialise=initialise
        )

    def _commit(self, writes: Sequence[_Write], checks: Sequence[tuple[str, int]] = ()) -> bool:
        """Commit version checks and writes in one ZooKeeper transaction.

        Returns:
            True when committed; False when a version no longer matched (re-read and retry).
        """
        transaction = self.cluster.zk.transaction()
        for path, version in checks:
            transaction.check(path, version)
        for write in writes:
            transaction.set_data(write.path, write.data, write.version)
        failures = [r for r in transaction.commit() if isinstance(r, Exception)]
        if not failures:
            return True
        if all(isinstance(r, BadVersionError | RolledBackError) for r in failures):
            return False
        refused = next((r for r in failures if isinstance(r, NoAuthError)), None)
        if refused is not None:
            raise auth_error(self.cluster.zk, f"writing under {self.cluster.paths.root}", refused)
        raise MetadataError(f"a ZooKeeper transaction under {self.cluster.paths.root} failed: {failures!r}")

    def _admin_address(self, storage: str, *, adding: bool = True) -> str:
        """The admin address of ``storage`` from ``store/connection``.

        Args:
            storage: the node's connect string.
            adding: the command may be meant for a node not added yet (assign): the message says
                how to add it; else (unassign) it says to check the connect string.

        Raises:
            MetadataError: the node is not in the cluster (naming the nodes that are).
        """
        connection = self.cluster.connection().value
        if storage not in connection.admin_ports:
            known = ", ".join(sorted(connection.admin_ports)) or "none"
            then = (
                f"add it with waltz cluster storage add {storage} --admin-port PORT"
                if adding
                else "check the connect string (waltz cluster list); nothing was changed"
            )
            raise MetadataError(
                f"storage node {storage} is not in the cluster under {self.cluster.paths.root} (no "
                f"admin port in store/connection; its storage nodes: {known}): {then}"
            )
        return connection.admin_address(storage)

    def _check_partitions(self, params: ClusterParams, partitions: Iterable[int]) -> list[int]:
        """The partitions sorted, each one of the cluster's: those at creation and those a split
        opened (docs/design/splits.md, "What ZooKeeper holds").

        Raises:
            ConfigurationError: none given, or one that does not exist.
        """
        ids = sorted(set(partitions))
        if not ids:
            raise ConfigurationError("give at least one partition (--partition)")
        unknown = unknown_partitions(self.cluster, params, ids)
        if unknown is not None:
            raise ConfigurationError(unknown)
        return ids

    # ---- membership ----

    @zookeeper_errors
    def add(self, storage: str, admin_port: int, group: int = 0) -> None:
        """Add a storage node to ``store/connection``, ``store/group`` and ``store/assignment``.

        The node is admin-opened first, which initialises a new node with the cluster key and
        refuses a node of another cluster before ZooKeeper changes. It gets no partition: assign
        them with :meth:`assign` or :meth:`auto_assign`.

        Args:
            storage: ``host:port`` of the node's storage port.
            admin_port: the node's admin port.
            group: the node's replica group.

        Raises:
            ConfigurationError: bad connect string or admin port.
            MetadataError: the node is already in the cluster.
            StorageUnreachableError, StorageRpcError: the node did not answer, or refused.
            AdminRoleRequiredError: the certificate lacks the admin role (nothing contacted or
                written).
        """
        require_admin_role(self.tls, f"adding storage node {storage}")
        try:
            check_connect_string(storage)
        except MetadataError as exc:
            raise ConfigurationError(str(exc)) from None
        if not 0 < admin_port < 65536:
            raise ConfigurationError(f"--admin-port {admin_port} is not a port number")
        params = self.cluster.params()
        already = MetadataError(
            f"storage node {storage} is already in the cluster under {self.cluster.paths.root}"
        )
        if storage in self.cluster.connection().value.admin_ports:
            raise already

        async def noop(admin: StorageAdminClient) -> None:
            return None

        self._on_node(f"{storage.rpartition(':')[0]}:{admin_port}", params, noop)
        paths = self.cluster.paths
        for _ in range(MAX_CAS_ATTEMPTS):
            connection = self.cluster.connection()
            groups = self.cluster.groups()
            assignments = self.cluster.assignments()
            if storage in connection.value.admin_ports:
                raise already
            replicas = {storage: (), **assignments.value.replicas}
            writes = [
                _Write(
                    paths.connection,
                    ConnectionMetadata({**connection.value.admin_ports, storage: admin_port}).encode(),
                    connection.version,
                ),
                _Write(
                    paths.group,
                    GroupDescriptor({**groups.value.groups, storage: group}).encode(),
                    groups.version,
                ),
                _Write(paths.assignment, ReplicaAssignments(replicas).encode(), assignments.version),
            ]
            if self._commit(writes):
                log.info("added storage node %s (admin port %d, group %d)", storage, admin_port, group)
                return
        raise StaleMetadataError(f"gave up adding {storage} after {MAX_CAS_ATTEMPTS} concurrent changes")

    @zookeeper_errors
    def remove(self, storage: str) -> None:
        """Remove a storage node from the cluster's znodes; refused while it holds any replica.

        The node itself is not contacted (it may be gone for good).

        Raises:
            MetadataError: the node is not in the cluster, or still holds replicas (unassign them
                first).
            AdminRoleRequiredError: the certificate lacks the admin role (nothing written).
        """
        require_admin_role(self.tls, f"removing storage node {storage}")
        paths = self.cluster.paths
        for _ in range(MAX_CAS_ATTEMPTS):
            connection = self.cluster.connection()
            groups = self.cluster.groups()
            assignments = self.cluster.assignments()
            if not (
                storage in connection.value.admin_ports
                or storage in groups.value.groups
                or storage in assignments.value.replicas
            ):
                raise MetadataError(f"storage node {storage} is not in the cluster under {paths.root}")
            held = assignments.value.replicas.get(storage, ())
            if held:
                raise MetadataError(
                    f"storage node {storage} still holds replicas of partitions {_ids(held)}: unassign "
                    f"them first (waltz cluster storage unassign {storage} --partition {_ids(held)})"
                )
            writes = [
                _Write(
                    paths.connection,
                    ConnectionMetadata(
                        {k: v for k, v in connection.value.admin_ports.items() if k != storage}
                    ).encode(),
                    connection.version,
                ),
                _Write(
                    paths.group,
                    GroupDescriptor({k: v for k, v in groups.value.groups.items() if k != storage}).encode(),
                    groups.version,
                ),
                _Write(
                    paths.assignment,
                    ReplicaAssignments(
                        {k: v for k, v in assignments.value.replicas.items() if k != storage}
                    ).encode(),
                    assignments.version,
                ),
            ]
            if self._commit(writes):
                log.info("removed storage node %s", storage)
                return
        raise StaleMetadataError(f"gave up removing {storage} after {MAX_CAS_ATTEMPTS} concurrent changes")

    # ---- replicas ----

    def _refusals(self, storage: str, partitions: Iterable[int], assigned: bool) -> list[str]:
        """The safety rules' reasons to refuse changing ``storage``'s replicas (fresh reads)."""
        rule = assign_refusal if assigned else unassign_refusal
        current = self.cluster.assignments().value
        reasons = []
        for partition_id in partitions:
            holders = current.storages_of(partition_id)
            if (storage in holders) != assigned:
                reason = rule(
                    partition_id, storage, holders, self.cluster.partition_metadata(partition_id).value
                )
                if reason is not None:
                    reasons.append(reason)
        return reasons

    def _change_assignment(
        self, storage: str, partitions: Sequence[int], assigned: bool, force: bool
    ) -> tuple[list[int], list[int], list[str]]:
        """Compare-and-set ``storage``'s replicas of ``partitions`` in ``store/assignment``.

        Returns:
            (partitions changed, partitions already so, warnings of rules overridden by force).

        Raises:
            ReplicaChangeRefusedError: a rule refused a partition and ``force`` is false (nothing
                changed).
        """
        rule = assign_refusal if assigned else unassign_refusal
        paths = self.cluster.paths
        for _ in range(MAX_CAS_ATTEMPTS):
            current = self.cluster.assignments()
            changed: list[int] = []
            unchanged: list[int] = []
            reasons: list[str] = []
            checks: list[tuple[str, int]] = []
            for partition_id in partitions:
                holders = current.value.storages_of(partition_id)
                if (storage in holders) == assigned:
                    unchanged.append(partition_id)
                    continue
                metadata = self.cluster.partition_metadata(partition_id)
                checks.append((paths.partition(partition_id), metadata.version))
                reason = rule(partition_id, storage, holders, metadata.value)
                if reason is not None:
                    reasons.append(reason)
                changed.append(partition_id)
            if reasons and not force:
                raise ReplicaChangeRefusedError(reasons)
            if not changed:
                return changed, unchanged, []
            value = current.value
            for partition_id in changed:
                value = value.with_replica(storage, partition_id, assigned)
            if self._commit([_Write(paths.assignment, value.encode(), current.version)], checks):
                for reason in reasons:
                    log.warning("FORCED replica change against the safety rules: %s", reason)
                return changed, unchanged, [f"FORCED against the safety rules: {r}" for r in reasons]
        raise StaleMetadataError(
            f"gave up changing the replicas of {storage} after {MAX_CAS_ATTEMPTS} concurrent changes"
        )

    @zookeeper_errors
    def assign(self, storage: str, partitions: Iterable[int], *, force: bool = False) -> ReplicaChangeResult:
        """Assign replicas of ``partitions`` to a storage node: on the node, then in ZooKeeper.

        Idempotent: partitions already assigned in ZooKeeper are created on the node again, which
        also finishes a ``create`` that failed on this node.

        Args:
            storage: the node's connect string (it must be in the cluster: :meth:`add`).
            partitions: partition IDs.
            force: override the one-replica-at-a-time rule (the result carries a warning).

        Raises:
            ReplicaChangeRefusedError: the rule refused a partition (nothing changed).
            StorageUnreachableError, StorageRpcError: the node did not answer or refused (ZooKeeper
                unchanged).
            ConfigurationError: unknown partitions.
            MetadataError: the node is not in the cluster.
            AdminRoleRequiredError: the certificate lacks the admin role (nothing contacted or
                written).
        """
        params = self.cluster.params()
        ids = self._check_partitions(params, partitions)
        address = self._admin_address(storage)
        if not force:  # refuse before touching the node; checked again in the compare-and-set
            reasons = self._refusals(storage, ids, True)
            if reasons:
                raise ReplicaChangeRefusedError(reasons)
        require_admin_role(self.tls, f"assigning replicas to storage node {storage}")

        count = len(existing_partitions(self.cluster, params))
        opened = count > params.num_partitions and ids[-1] >= params.num_partitions

        async def create(admin: StorageAdminClient) -> None:
            if opened:  # a node added after a split holds the count at creation: grow it first
                await admin.grow_partitions(count, operator="waltz cluster storage assign")
            for partition_id in ids:
                await admin.assign_partition(partition_id, True)

        self._on_node(address, params, create)
        changed, unchanged, warnings = self._change_assignment(storage, ids, True, force)
        log.info("storage node %s: assigned partitions %s", storage, changed)
        return ReplicaChangeResult(storage, tuple(changed), tuple(unchanged), tuple(warnings))

    @zookeeper_errors
    def unassign(
        self,
        storage: str,
        partitions: Iterable[int],
        *,
        force: bool = False,
        delete_storage_files: bool = False,
    ) -> ReplicaChangeResult:
        """Unassign replicas of ``partitions`` from a storage node: in ZooKeeper, then on the node.

        Idempotent: partitions no longer assigned in ZooKeeper are still removed from the node.
        When the node cannot be updated after ZooKeeper was, the result's ``storage_error`` says
        why (the node keeps the partitions until the command is rerun).

        Args:
            storage: the node's connect string.
            partitions: partition IDs.
            force: override the keep-a-quorum rule (the result carries a warning).
            delete_storage_files: also delete the partitions' files on the node.

        Raises:
            ReplicaChangeRefusedError: the rule refused a partition (nothing changed).
            ConfigurationError: unknown partitions.
            MetadataError: the node is not in the cluster (no admin port in ``store/connection``:
                a mistyped connect string); nothing changed.
            AdminRoleRequiredError: the certificate lacks the admin role, which the node's side
                needs (nothing written: ZooKeeper would take the operators' credential).
        """
        params = self.cluster.params()
        ids = self._check_partitions(params, partitions)
        address = self._admin_address(storage, adding=False)  # a node not in the cluster: nothing to do
        if not force:  # refuse before the role check, as assign does; checked again in the compare-and-set
            reasons = self._refusals(storage, ids, False)
            if reasons:
                raise ReplicaChangeRefusedError(reasons)
        require_admin_role(self.tls, f"unassigning replicas from storage node {storage}")
        changed, unchanged, warnings = self._change_assignment(storage, ids, False, force)
        log.info("storage node %s: unassigned partitions %s", storage, changed)

        async def remove(admin: StorageAdminClient) -> None:
            for partition_id in ids:
                await admin.assign_partition(partition_id, False, delete_storage_files=delete_storage_files)

        storage_error = None
        refused = False
        try:
            self._on_node(address, params, remove, initialise=False)
        except WaltzError as exc:
            storage_error = describe_failure(exc)
            refused = isinstance(exc, StorageRpcError | StorageAccessDeniedError)
            log.warning("storage node %s: partitions %s stay on the node: %s", storage, ids, storage_error)
        return ReplicaChangeResult(
            storage, tuple(changed), tuple(unchanged), tuple(warnings), storage_error, refused
        )

    @zookeeper_errors
    def auto_assign(self, group: int, *, force: bool = False) -> AutoAssignResult:
        """Assign every partition to every storage node of a group, one new replica at a time.

        A partition gets a new replica on the first node of the group (by connect string) that
        lacks it; the next nodes wait until that replica has caught up (rerun the command later),
        except when the partition never had a store session (a fresh cluster: all at once).

        Args:
            group: the replica group (``store/group``).
            force: assign every missing replica now, against the rule (warnings in the result).

        Raises:
            MetadataError: no storage node is in the group.
            AdminRoleRequiredError: the certificate lacks the admin role (nothing contacted or
                written).
        """
        require_admin_role(self.tls, f"assigning the replicas of group {group}")
        description = describe_cluster(self.cluster)
        nodes = sorted(n.connect_string for n in description.storage_nodes if n.group == group)
        if not nodes:
            raise MetadataError(
                f"no storage node of the cluster under {self.cluster.paths.root} is in group {group}"
            )
        plan: dict[str, list[int]] = {n: [] for n in nodes}
        pending: list[str] = []
        for partition in description.partitions:
            holders = set(partition.assigned)
            missing = [n for n in nodes if n not in holders]
            metadata = partition.metadata
            if metadata is None:
                if missing:
                    pending.append(f"partition {partition.partition_id}: {partition.error}")
                continue
            for storage in missing:
                reason = assign_refusal(partition.partition_id, storage, holders, metadata)
                if reason is not None and not force:
                    pending.append(reason)
                    continue
                plan[storage].append(partition.partition_id)
                holders.add(storage)
        assigned: dict[str, tuple[int, ...]] = {}
        failures: dict[str, str] = {}
        warnings: list[str] = []
        for storage, partition_ids in plan.items():
            if not partition_ids:
                continue
            try:
                result = self.assign(storage, partition_ids, force=force)
            except ReplicaChangeRefusedError as exc:  # a store session started meanwhile
                pending.extend(exc.reasons)
                continue
            except ZooKeeperUnavailableError:
                raise
            except WaltzError as exc:
                failures[storage] = describe_failure(exc)
                continue
            assigned[storage] = result.changed
            warnings.extend(result.warnings)
        return AutoAssignResult(assigned, tuple(pending), failures, tuple(warnings))

    # ---- partitions on one node ----

    @zookeeper_errors
    def set_availability(
        self, storage: str, partitions: Iterable[int], *, readable: bool | None, writable: bool | None
    ) -> None:
        """Switch reads and/or writes of partitions on a storage node (admin port).

        Args:
            storage: the node's connect string.
            partitions: partition IDs.
            readable: switch reads on or off; None leaves them.
            writable: switch writes on or off; None leaves them.

        Raises:
            ConfigurationError: neither switch given, or unknown partitions.
            StorageUnreachableError, StorageRpcError: the node did not answer or refused
                (``PARTITION_NOT_ASSIGNED`` when it does not hold a partition).
        """
        if readable is None and writable is None:
            raise ConfigurationError("give --readable/--no-readable and/or --writable/--no-writable")
        params = self.cluster.params()
        ids = self._check_partitions(params, partitions)

        async def toggle(admin: StorageAdminClient) -> None:
            for partition_id in ids:
                if readable is not None:
                    await admin.set_readable(partition_id, readable)
                if writable is not None:
                    await admin.set_writable(partition_id, writable)

        self._on_node(self._admin_address(storage), params, toggle, initialise=False)
        log.info("storage node %s: partitions %s readable=%s writable=%s", storage, ids, readable, writable)

    @zookeeper_errors
    def max_transaction_ids(self, storage: str, partitions: Iterable[int]) -> dict[int, int]:
        """The max transaction ID (-1: empty) of each partition on a storage node (admin port).

        Raises:
            ConfigurationError: unknown partitions.
            StorageUnreachableError, StorageRpcError: the node did not answer or refused
                (``PARTITION_NOT_ASSIGNED`` when it does not hold a partition).
        """
        params = self.cluster.params()
        ids = self._check_partitions(params, partitions)

        async def read(admin: StorageAdminClient) -> dict[int, int]:
            return {p: await admin.max_transaction_id(p) for p in ids}

        return self._on_node(self._admin_address(storage), params, read, initialise=False)
