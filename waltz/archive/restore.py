"""``waltz archive restore``: a new cluster made from an archive, its log starting where the archive ends.

Source: docs/design/archive.md "Restoring a cluster from the archive". In order, so that nothing
is written while anything can still be refused:

1. the arguments are checked against ``archive.json`` (the partition count, the replicas), the
   target root must hold no cluster, and the ACLs must let the session create it;
2. the archive is verified as ``waltz archive verify`` does (every chunk against its manifest); a
   problem refuses the restore, named by file and range; every storage node must answer;
3. every storage node is opened with the new cluster key (an empty node takes it) and must hold no
   partition: a node of another cluster, or with partitions, refuses the restore;
4. ZooKeeper: every znode of the cluster in one transaction, with each partition's replica states
   closed at the archive's end (``archived_through``) and ``<root>/archive`` naming the archive;
5. the new key's fingerprint is added to ``archive.json`` (so that the archiver accepts the new
   cluster), only now that the cluster exists;
6. each node: its partitions created to start at ``archived_through + 1``, and told their
   archived-through.

A failure once nodes took the key (step 4 or 5) raises :class:`RestoreRefusedError` with the key,
which a restore again must give.

The first store session's recovery then finds each replica closed at ``archived_through``
(docs/design/recovery.md, "Cleaning each replica"): it votes it, and the committed high-water
mark is ``archived_through``. New appends get the IDs after it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import KazooException

from waltz.admin.cluster_admin import StorageSpec
from waltz.admin.storage_nodes import (
    DEFAULT_STORAGE_TIMEOUT,
    StorageAccessDeniedError,
    call_admin_on_nodes,
    probe_tcp,
)
from waltz.archive.errors import ArchiveError, ArchiveRefusedError
from waltz.archive.layout import ARCHIVE_MANIFEST, ArchiveFiles
from waltz.archive.manifests import (
    PartitionManifest,
    cluster_key_fingerprint,
    read_archive_manifest,
    write_archive_manifest,
)
from waltz.archive.summary import entry_of
from waltz.archive.verify import VerifyReport, verify_archive
from waltz.errors import ConfigurationError, WaltzError
from waltz.metadata.replicas import spread_replicas
from waltz.metadata.values import (
    ArchiveSummary,
    ClusterParams,
    ConnectionMetadata,
    GroupDescriptor,
    PartitionMetadata,
    ReplicaAssignments,
    ReplicaState,
)
from waltz.metadata.zk import ClusterZk
from waltz.metadata.zk_access import ClusterAccess
from waltz.metadata.zk_roles import RoleCredentials
from waltz.metadata.zk_session import ZooKeeperAuthError, zookeeper_access
from waltz.protocol.channels import TlsConfig
from waltz.protocol.event_loop import run_on_shared_loop
from waltz.protocol.storage_client import StorageAdminClient

__all__ = ["RestoreRefusedError", "RestoreResult", "RestoredPartition", "restore_cluster"]

log = logging.getLogger(__name__)


class RestoreRefusedError(ArchiveRefusedError):
    """The restore cannot start or go on: the archive fails verification, the target root holds a
    cluster, a storage node is unreachable or not empty, or ZooKeeper (or the archive's location)
    refused the write after the storage nodes took the new key. The message says what was written,
    if anything, and what to do (docs/design/archive.md, "Restoring a cluster from the archive").

    Attributes:
        cluster_key: the new cluster key when some storage nodes took it before the refusal (a
            restore again must give it); None otherwise. The message names it by its fingerprint
            only (docs/design/overview.md, "The cluster key").
    """

    def __init__(self, message: str, *, cluster_key: uuid.UUID | None = None) -> None:
        super().__init__(message)
        self.cluster_key = cluster_key


@dataclass(frozen=True, slots=True)
class RestoredPartition:
    """One partition of the restored cluster.

    Attributes:
        partition_id: the partition.
        archived_through: the archive's last transaction of it (-1: none); the committed high-water
            mark the new cluster starts with.
        chunks: its chunks in the archive.
        storages: the storage nodes holding its replicas, each started at ``archived_through + 1``.
    """

    partition_id: int
    archived_through: int
    chunks: int
    storages: tuple[str, ...]

    @property
    def start(self) -> int:
        """The first transaction ID the new cluster's log holds: ``archived_through + 1``."""
        return self.archived_through + 1

    def to_json(self) -> dict[str, Any]:
        """The partition in ``--json`` output."""
        return {
            "partition_id": self.partition_id,
            "archived_through": self.archived_through,
            "start": self.start,
            "chunks": self.chunks,
            "storages": list(self.storages),
        }


@dataclass(frozen=True, slots=True)
class RestoreResult:
    """What ``restore_cluster`` made.

    Attributes:
        params: the new cluster's parameters (its new key among them).
        location: the archive.
        fingerprint: the new key's fingerprint, added to ``archive.json``.
        partitions: each partition, in order.
        failures: storage connect string -> why creating its partitions failed (after ZooKeeper
            was written: ``waltz cluster storage assign`` cannot start a partition past 0, so
            delete the cluster and restore again with that node fixed).
    """

    params: ClusterParams
    location: str
    fingerprint: str
    partitions: tuple[RestoredPartition, ...]
    failures: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when every storage node created its partitions."""
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        """The result in ``--json`` output."""
        return {
            "ok": self.ok,
            "name": self.params.name,
            "num_partitions": self.params.num_partitions,
            "cluster_key_fingerprint": self.fingerprint,
            "archive": self.location,
            "partitions": [p.to_json() for p in self.partitions],
            "failures": dict(self.failures),
        }


def restore_cluster(
    cluster: ClusterZk,
    files: ArchiveFiles,
    name: str,
    storages: Sequence[StorageSpec],
    replicas: int | None = None,
    *,
    storage_timeout: float = DEFAULT_STORAGE_TIMEOUT,
    tls: TlsConfig | None = None,
    operator: str = "",
    cluster_key: uuid.UUID | None = None,
    progress: Callable[[str], None] | None = None,
    credentials: RoleCredentials | None = None,
) -> RestoreResult:
    """Make a new cluster under ``cluster``'s root from the archive ``files`` (module docstring).

    Args:
        cluster: the new cluster's znodes (the root must hold no cluster).
        files: the archive.
        name: the new cluster's name.
        storages: its storage nodes, empty (at least 1, distinct).
        replicas: replicas per partition, spread round-robin; None: every partition on every node.
        storage_timeout: seconds for each storage node's admin call.
        tls: client TLS files for the admin ports.
        operator: who restores, as told to the storage nodes.
        cluster_key: the new cluster's key (None: a new one); a restore refused after some nodes
            took a key gives it again, since those nodes now carry it.
        progress: called with a line per step.
        credentials: the ZooKeeper credential of each role: the session authenticates as the
            operator and every znode gets its role's ACL (docs/design/zookeeper.md, "Roles");
            None: the session's own credential, if any.

    Returns:
        The new cluster.

    Raises:
        RestoreRefusedError: nothing written: the archive fails verification (each problem named
            by file and range), the root holds a cluster, a node is unreachable, belongs to another
            cluster or holds partitions; or, with ``cluster_key`` set, creating the cluster in
            ZooKeeper failed after the nodes took the key (no cluster znode nor fingerprint
            written), or adding the fingerprint to ``archive.json`` failed after ZooKeeper was
            written (the message says to delete the cluster first).
        ZooKeeperAuthError: the ACLs do not let the session create the root; nothing written.
        ArchiveFormError: ``archive.json`` or a manifest is not one this code reads.
        ConfigurationError: bad arguments (name, storage nodes, replicas).
        LocationError, OSError: the archive's location cannot be read or written.
    """
    say = progress or (lambda _: None)
    if not name:
        raise ConfigurationError("the restored cluster needs a name (--name)")
    top = read_archive_manifest(files)
    if top is None:
        raise RestoreRefusedError(
            f"{files.name(ARCHIVE_MANIFEST)} is missing: {files.location} holds no archive; give the "
            "archive's location"
        )
    names = [s.connect_string for s in storages]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigurationError(f"storage nodes given more than once: {', '.join(duplicates)}")
    try:
        placement = spread_replicas(names, top.num_partitions, replicas)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    root = cluster.paths.root
    with zookeeper_access(cluster.zk, f"reading {root}"):
        held = cluster.zk.get_children(root) if cluster.zk.exists(root) is not None else []
    if held:
        raise RestoreRefusedError(
            f"{root} exists already and holds znodes ({', '.join(sorted(held))}): a restore makes a new "
            "cluster; give another --root, or delete the old cluster first (waltz cluster delete)"
        )
    if credentials is not None:
        cluster.zk.add_auth("digest", credentials.operator)
    try:
        ClusterAccess(cluster.zk, cluster.paths).check_root_creatable()
    except ZooKeeperAuthError as exc:
        raise ZooKeeperAuthError(
            f"{exc}; nothing was written to ZooKeeper, the storage nodes or the archive"
        ) from exc
    say(f"verifying the archive at {files.location} ({top.num_partitions} partitions)")
    report = verify_archive(files, None, top.num_partitions, progress=say)
    if not report.passed:
        raise RestoreRefusedError(_refusal(report))
    # What was verified is what is restored: the manifests as verify read them.
    manifests = {c.partition_id: c.good or PartitionManifest(c.partition_id) for c in report.partitions}
    params = ClusterParams(name, top.num_partitions, cluster_key or uuid.uuid4())
    addresses = {s.connect_string: s.admin_address for s in storages}
    _check_storage_nodes(addresses, params, storage_timeout, tls)
    say(f"storage nodes {', '.join(names)} are empty and took the new cluster key")

    holders: dict[int, list[str]] = {p: [] for p in range(top.num_partitions)}
    for storage, pids in placement.items():
        for pid in pids:
            holders[pid].append(storage)
    metadata = {
        pid: PartitionMetadata(0, -1, {s: ReplicaState(-1, manifest.archived_through) for s in holders[pid]})
        for pid, manifest in manifests.items()
        if manifest.archived_through >= 0
    }
    summary = ArchiveSummary(files.location, {pid: entry_of(m) for pid, m in manifests.items()})
    try:
        cluster.create(
            params,
            ReplicaAssignments(placement),
            GroupDescriptor({s.connect_string: s.group for s in storages}),
            ConnectionMetadata({s.connect_string: s.admin_port for s in storages}),
            partitions=metadata,
            archive=summary,
            roles=credentials.identities() if credentials is not None else None,
        )
    except (WaltzError, KazooException) as exc:
        # The nodes took the key: a restore again must give it (the CLI keeps it in a file).
        raise RestoreRefusedError(
            f"creating the cluster under {root} in ZooKeeper failed: {exc}; none of its znodes was "
            f"written (at most an empty {root}), nor the archive, but storage nodes {', '.join(names)} "
            "took the new cluster key "
            f"(fingerprint {cluster_key_fingerprint(str(params.cluster_key))}): fix what ZooKeeper "
            "says, then restore again with that key",
            cluster_key=params.cluster_key,
        ) from exc
    say(f"created the cluster {name!r} under {root}, its archive {files.location}")

    fingerprint = cluster_key_fingerprint(str(params.cluster_key))
    if fingerprint not in top.cluster_key_fingerprints:
        try:
            write_archive_manifest(
                files,
                dataclasses.replace(
                    top, cluster_key_fingerprints=(*top.cluster_key_fingerprints, fingerprint)
                ),
            )
        except (ArchiveError, OSError) as exc:
            raise RestoreRefusedError(
                f"the cluster was created under {root}, but adding its key's fingerprint {fingerprint} to "
                f"{files.name(ARCHIVE_MANIFEST)} failed: {exc}; no partition was created on the storage "
                f"nodes: delete the cluster (waltz cluster delete -r {root}), make the archive's location "
                "writable, then restore again with the key",
                cluster_key=params.cluster_key,
            ) from exc
    say(f"added the new cluster key's fingerprint {fingerprint} to {files.name(ARCHIVE_MANIFEST)}")
    say(
        "one cluster archives to an archive: if the cluster this archive came from still runs (a "
        "restore to try the backup), archive the restored one to a copy (copy the location, then "
        "waltz archive run --relocate --to COPY with the new root); a second cluster's chunks stop "
        "the other's archiver"
    )

    async def setup(storage: str, admin: StorageAdminClient) -> None:
        for pid in placement[storage]:
            through = manifests[pid].archived_through
            await admin.assign_partition(pid, True, first_transaction_id=through + 1)
            await admin.set_archived_through(pid, through, archive=files.location, operator=operator)

    outcomes = run_on_shared_loop(
        call_admin_on_nodes(
            addresses, str(params.cluster_key), top.num_partitions, setup, timeout=storage_timeout, tls=tls
        )
    )
    failures = {s: o.failure for s, o in outcomes.items() if o.failure is not None}
    for storage, why in failures.items():
        log.error("storage node %s: creating its partitions failed: %s", storage, why)
    partitions = tuple(
        RestoredPartition(pid, m.archived_through, len(m.chunks), tuple(sorted(holders[pid])))
        for pid, m in manifests.items()
    )
    for partition in partitions:
        say(
            f"partition {partition.partition_id}: starts at transaction {partition.start} on "
            f"{', '.join(partition.storages)}"
        )
    return RestoreResult(params, files.location, fingerprint, partitions, failures)


def _refusal(report: VerifyReport) -> str:
    problems = [p.message for p in report.problems]
    problems += [p.message for check in report.partitions for p in check.problems]
    lines = "\n".join(f"  {m}" for m in problems)
    return (
        f"the archive at {report.location} fails verification; nothing was restored:\n{lines}\n"
        "repair the archive (waltz archive verify names the same problems), or restore from a good copy"
    )


def _check_storage_nodes(
    addresses: dict[str, str], params: ClusterParams, timeout: float, tls: TlsConfig | None
) -> None:
    """Every node answers, takes the new key (an empty node does) and holds no partition.

    Raises:
        RestoreRefusedError: naming each node that did not, and what to do.
    """

    async def probe_all() -> list[str | None]:
        return await asyncio.gather(*(probe_tcp(a, timeout) for a in addresses.values()))

    unreachable = {
        s: why for s, why in zip(addresses, run_on_shared_loop(probe_all()), strict=True) if why is not None
    }
    if unreachable:
        raise RestoreRefusedError(
            "storage nodes do not answer: "
            + "; ".join(f"{s} (admin {addresses[s]}): {why}" for s, why in unreachable.items())
            + "; nothing was written: start them or fix --storage, then restore again"
        )

    async def held(storage: str, admin: StorageAdminClient) -> list[int]:
        status = await admin.partition_status(-1)
        return sorted(p.partition_id for p in status.partitions)

    outcomes = run_on_shared_loop(
        call_admin_on_nodes(
            addresses, str(params.cluster_key), params.num_partitions, held, timeout=timeout, tls=tls
        )
    )
    denied = [s for s, o in outcomes.items() if isinstance(o.error, StorageAccessDeniedError)]
    if denied:
        # Before "not empty": an empty node that refuses this certificate's role is not the
        # operator's to empty; the restore needs an admin certificate (docs/design/overview.md "Roles").
        raise RestoreRefusedError(
            f"storage nodes {', '.join(denied)} refused this certificate: a restore initialises the "
            "storage nodes with the new cluster key, which needs a certificate of the admin role "
            f"({outcomes[denied[0]].failure}); nothing was written to ZooKeeper or the archive: set "
            "cluster.ssl.certFile and cluster.ssl.keyFile (WALTZ_CLUSTER_SSL_CERT_FILE, "
            "WALTZ_CLUSTER_SSL_KEY_FILE) to the admin's certificate and key, then restore again"
        )
    problems = []
    took = []
    for storage, outcome in outcomes.items():
        if outcome.failure is not None:
            problems.append(f"{storage}: {outcome.failure}")
        elif outcome.value:
            problems.append(f"{storage}: holds partitions {outcome.value}")
        else:
            took.append(storage)
    if problems:
        again = (
            f"; {', '.join(took)} took the new cluster key (fingerprint "
            f"{cluster_key_fingerprint(params.cluster_key)}): restore again with that key"
            if took
            else ""
        )
        raise RestoreRefusedError(
            "storage nodes are not empty (a restore needs nodes with fresh, empty directories): "
            + "; ".join(problems)
            + "; nothing was written to ZooKeeper or the archive: give those nodes empty directories"
            + again,
            cluster_key=params.cluster_key if took else None,
        )
