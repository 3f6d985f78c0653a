"""Every check of ``waltz cluster verify``, from what was read and probed: one function for the
command and the console, so that the two cannot report different checks.

Design: docs/design/zookeeper.md "Checking the root" (the ACL checks); docs/design/console.md
"Cluster map" (the console's problems are these checks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from waltz.admin.description import ClusterDescription
from waltz.admin.verify import StorageProbe, VerifyReport, verify_cluster
from waltz.admin.verify_acls import acl_checks
from waltz.admin.verify_servers import ServerProbe, server_checks
from waltz.metadata.assignment import PartitionAssignment
from waltz.metadata.zk import ClusterZk

__all__ = ["cluster_checks"]


def cluster_checks(
    cluster: ClusterZk,
    description: ClusterDescription,
    storage_probes: Mapping[str, StorageProbe],
    assignment: PartitionAssignment,
    server_probes: Sequence[ServerProbe],
) -> VerifyReport:
    """The checks of ``waltz cluster verify``, in its order: the storage nodes against ZooKeeper
    (:func:`~waltz.admin.verify.verify_cluster`), the servers
    (:func:`~waltz.admin.verify_servers.server_checks`) and the ACLs of the root, its children and
    its parents (:func:`~waltz.admin.verify_acls.acl_checks`).

    Blocking: the ACL checks read ZooKeeper through ``cluster``'s session (call it from a worker
    thread on an event loop).

    Args:
        cluster: the cluster's znodes, through the verifying session.
        description: the cluster's metadata (``describe_cluster``).
        storage_probes: every storage node's answers (``probe_storage_nodes``).
        assignment: ``server/assignment``.
        server_probes: every live server's status (``probe_servers``).

    Returns:
        The report, every check PASSED, WARNING or FAILED.

    Raises:
        kazoo.exceptions.KazooException: ZooKeeper failed while the ACLs were read.
    """
    checks = verify_cluster(description, storage_probes).checks
    checks += tuple(server_checks(description, assignment, server_probes))
    return VerifyReport(checks + tuple(acl_checks(cluster)))
