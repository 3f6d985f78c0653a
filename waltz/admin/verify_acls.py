"""``waltz cluster verify``: the ACLs of the cluster's root and its children, and unknown children.

Design: docs/design/zookeeper.md, "Checking the root". A root or child znode open to anyone, or
granted to an identity that is none of the cluster's (``<root>/roles``, or the session's own
credential in a cluster made with one), lets someone else replace the cluster parameters (the
cluster key, the partition count) or read the key: FAILED when the session holds a credential
(the cluster is meant to be protected), WARNING when it holds none (a cluster made open on
purpose, still worth a line). A child of the root that no cluster makes is a WARNING: a squatter's
znode, or a wrong ``--root``. A parent of the root that anyone may write or change the ACL of
(ZooKeeper's default, ``world:anyone:cdrwa``, as older versions made them), or whose ACL another
identity holds, is a WARNING: anyone could take it over, after which no root under it can be
deleted (docs/design/zookeeper.md, "Security").
"""

from __future__ import annotations

from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.security import Permissions

from waltz.admin.verify import CheckResult, CheckStatus
from waltz.metadata.zk import ClusterZk
from waltz.metadata.zk_access import digest_user
from waltz.metadata.zk_roles import (
    TABLE_ZNODES,
    ClusterRoles,
    Role,
    grants_for,
    rights_letters,
    session_identities,
)
from waltz.metadata.zk_session import ZooKeeperAuthError

__all__ = ["acl_checks"]


def acl_checks(cluster: ClusterZk) -> list[CheckResult]:
    """The ACL checks of ``waltz cluster verify`` (see the module's docstring).

    Args:
        cluster: the cluster's znodes, through the verifying session.

    Returns:
        ``zookeeper: root and children ACLs``, ``zookeeper: root children`` and ``zookeeper:
        root's parents`` results.
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
    checks = [acl, children, _parent_check(cluster, known)]
    if roles is not None and roles.operator in own:
        checks.append(_role_table_check(cluster, roles))
    return checks


def _role_table_check(cluster: ClusterZk, roles: ClusterRoles) -> CheckResult:
    """Whether each znode of the role table grants each role what the table says
    (docs/design/zookeeper.md, "Roles"): a role granted more is FAILED (a server that can delete
    ``server/preferred`` could lock the operators out of it), a role granted less, or
    ``server/preferred`` missing (a server could create it, with its own ACL), a WARNING; `waltz
    cluster secure` sets the table's ACLs and makes the missing znode. Checked by the operator's
    session only, which may read every ACL."""
    name = "zookeeper: role ACLs"
    role_of_user = {digest_user(roles.identity(role)): role for role in Role}
    more: list[str] = []
    less: list[str] = []
    for relative in TABLE_ZNODES:
        path = f"{cluster.paths.root}/{relative}" if relative else cluster.paths.root
        try:
            entries, _ = cluster.zk.get_acls(path)
        except NoNodeError:
            if path == cluster.paths.server_preferred:
                less.append(f"{path} is missing (a server could create it, with its own ACL)")
            continue
        except NoAuthError:
            more.append(f"{path} refuses the operator (another identity holds it)")
            continue
        held: dict[Role, int] = {}
        for entry in entries:
            role = role_of_user.get(digest_user(entry.id.id)) if entry.id.scheme == "digest" else None
            if role is not None:
                held[role] = held.get(role, 0) | entry.perms
        for role in Role:
            want, got = grants_for(relative).get(role, 0), held.get(role, 0)
            if got & ~want:
                more.append(f"{path} grants {role.value} {_rights(got)} (the table: {_rights(want)})")
            elif want & ~got:
                less.append(f"{path} grants {role.value} {_rights(got)} (the table: {_rights(want)})")
    fix = "run `waltz cluster secure` with the operator's credential to set the table's ACLs"
    if more:
        return CheckResult(name, CheckStatus.FAILED, f"{'; '.join(more + less)}: {fix}")
    if less:
        return CheckResult(name, CheckStatus.WARNING, f"{'; '.join(less)}: {fix}")
    return CheckResult(name, CheckStatus.PASSED, f"{len(TABLE_ZNODES)} znodes of the role table as it says")


def _rights(perms: int) -> str:
    """Permissions as ``zkCli.sh`` letters (``cdrwa``), or ``none``."""
    return rights_letters(perms) or "none"


def _parent_check(cluster: ClusterZk, known: set[str] | None) -> CheckResult:
    """Whether anyone could take over a parent of the root (change its ACL or data)."""
    name = "zookeeper: root's parents"
    parents = cluster.paths.parents
    problems = []
    for path in parents:
        try:
            acl, _ = cluster.zk.get_acls(path)
        except NoNodeError:
            continue
        except NoAuthError:
            problems.append(f"{path}: this session may not even read its ACL (another identity holds it)")
            continue
        for entry in acl:
            taking = entry.perms & (Permissions.WRITE | Permissions.ADMIN)
            if not taking:
                continue
            identity = f"{entry.id.scheme}:{entry.id.id}"
            if entry.id.scheme == "world":
                problems.append(f"{path}: anyone may change it ({identity}:{','.join(entry.acl_list)})")
            elif known is None or digest_user(entry.id.id) not in {digest_user(k) for k in known}:
                problems.append(f"{path}: {identity}, none of the cluster's identities, may change it")
    if not problems:
        listed = ", ".join(parents) or "none"
        return CheckResult(name, CheckStatus.PASSED, f"{listed}: nobody else may change them")
    fix = (
        "whoever takes a parent over (sets its ACL) can keep every root under it from being "
        "deleted and others from being created; give each parent world:anyone:crd (ZooKeeper's "
        "zkCli.sh: setAcl <parent> world:anyone:crd) or the operators' credential"
    )
    return CheckResult(name, CheckStatus.WARNING, f"{'; '.join(problems)}: {fix}")
