"""What the error of a missing cluster says, wherever a cluster's znodes are read
(:class:`~waltz.metadata.zk.ClusterZk`, :class:`~waltz.metadata.zk_access.ClusterAccess`).

A typo in the root is the common cause: the message names the roots beside the one given that
hold a cluster, then where the root is set, before suggesting to create a cluster there.
"""

from __future__ import annotations

from kazoo.client import KazooClient

from waltz.metadata.paths import ClusterPaths

__all__ = ["NEARBY_LIMIT", "missing_cluster_message"]

#: At most this many znodes beside the root are asked whether they hold a cluster.
NEARBY_LIMIT = 20


def missing_cluster_message(zk: KazooClient, paths: ClusterPaths) -> str:
    """The text of the :class:`~waltz.errors.ClusterNotFoundError` of a root with no cluster.

    Args:
        zk: a started kazoo client, to look at the znodes beside the root.
        paths: the cluster's znodes (the root given).

    Returns:
        "no cluster under <root>", the clusters directly under it (the root given is their
        parent: "clusters under it: ..."), else those beside it ("clusters beside it: ..." or "no
        cluster beside it in <parent>"), where the root is set and how to create a cluster.
        Nothing is said of the znodes under or beside the root when they cannot all be looked at
        (more than :data:`NEARBY_LIMIT`, a znode that does not exist or this session may not read).
    """
    parent = paths.root.rsplit("/", 1)[0] or "/"
    where = "check the cluster root (--root, WALTZ_CLUSTER_ROOT, cluster.root)"
    under = _clusters_in(zk, paths.root, paths.root)
    if under:
        return (
            f"no cluster under {paths.root} (clusters under it: {', '.join(under)}): {where}; it is "
            f"the parent of other clusters, so a new cluster takes a root of its own, such as "
            f"{paths.root}/<name>"
        )
    nearby = _clusters_in(zk, parent, paths.root)
    if nearby is None:
        beside = ""
    elif nearby:
        beside = f" (clusters beside it: {', '.join(nearby)})"
    else:
        beside = f" (no cluster beside it in {parent})"
    create = "or create a cluster there with `waltz cluster create`"
    return f"no cluster under {paths.root}{beside}: {where}, {create}"


def _clusters_in(zk: KazooClient, parent: str, given: str) -> list[str] | None:
    """The roots directly under ``parent`` (``given`` aside) that hold a cluster; None when they
    cannot all be looked at (more than :data:`NEARBY_LIMIT`, or ``parent`` unreadable)."""
    try:
        children = sorted(zk.get_children(parent))
        if len(children) > NEARBY_LIMIT:
            return None
        return [
            root
            for root in (f"{parent.rstrip('/')}/{child}" for child in children)
            if root != given and zk.exists(ClusterPaths.of(root).cluster) is not None
        ]
    except Exception:  # only a hint: a znode this session may not read, or none at all
        return None
