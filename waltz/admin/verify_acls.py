"""``waltz cluster verify``: the ACLs of the cluster's root and its children, and unknown children.

Design: docs/design/zookeeper.md, "Checking the root". A root or child znode open to anyone, or
granted to an identity that is none of the cluster's (``<root>/roles``, or the session's own
credential in a cluster made with one), lets someone else replace the cluster parameters (the
cluster key, the partition count) or read the key: FAILED when the session holds a credential
(the cluster is meant to be protected), WARNING when it holds none (a cluster made open on
purpose, still worth a line). A child of the root that no cluster makes is a WARNING: a squatter's
znode, or a wrong ``--root``.
"""

from __future__ import annotations

from waltz.admin.verify import CheckResult, CheckStatus
from waltz.metadata.zk import ClusterZk
from waltz.metadata.zk_roles import ClusterRoles, session_identities
from waltz.metadata.zk_session import ZooKeeperAuthError

__all__ = ["acl_checks"]


def acl_checks(cluster: ClusterZk) -> list[CheckResult]:
    """The ACL checks of ``waltz cluster verify`` (see the module's docstring).

    Args:
        cluster: the cluster's znodes, through the verifying session.

    Returns:
        ``zookeeper: root and children ACLs`` and ``zookeeper: root children`` results.
    """
    own = session_identities(cluster.zk)
    roles: ClusterRoles | None = None
    if own:
        try:
            roles = cluster.access.roles()
        except ZooKeeperAuthError:
            roles = None
    known = roles.all() if roles is not None else (own or None)
    problems = cluster.access.acl_problems(known, empty_root_ok=False)
    if not problems:
        who = "the cluster's roles" if roles is not None else "the session's credential"
        acl = CheckResult(
            "zookeeper: root and children ACLs",
            CheckStatus.PASSED if own else CheckStatus.WARNING,
            f"granted to {who} only" if own else "no credential: could not tell whose they are",
        )
    else:
        detail = "; ".join(f"{p.path} {p.detail}" for p in problems)
        fix = (
            "if nobody else should have made them, delete the root and create the cluster again with "
            'a credential (docs/deploy.md, "ZooKeeper credentials"); a cluster made open on purpose '
            "is protected with `waltz cluster secure`"
        )
        status = CheckStatus.FAILED if own else CheckStatus.WARNING
        acl = CheckResult("zookeeper: root and children ACLs", status, f"{detail}: {fix}")
    unknown = cluster.access.unknown_children()
    children = CheckResult(
        "zookeeper: root children",
        CheckStatus.WARNING if unknown else CheckStatus.PASSED,
        f"znodes no cluster makes: {', '.join(unknown)} (a squatter's, or a wrong --root)"
        if unknown
        else "only the cluster's own znodes",
    )
    return [acl, children]
