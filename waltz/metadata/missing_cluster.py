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
        "no cluster under <root>", the clusters beside it ("clusters beside it: ..." or "no
        cluster beside it in <parent>"), where the root is set and how to create a cluster.
        Nothing is said of the znodes beside the root when they cannot all be looked at (more
        than :data:`NEARBY_LIMIT`, a parent that does not exist or this session may not read).
    """
    parent = paths.root.rsplit("/", 1)[0] or "/"
    beside = ""
    try:
        children = sorted(zk.get_children(parent))
        if len(children) <= NEARBY_LIMIT:
            nearby = [
                root
                for root in (f"{parent.rstrip('/')}/{child}" for child in children)
                if root != paths.root and zk.exists(ClusterPaths.of(root).cluster) is not None
            ]
            beside = (
                f" (clusters beside it: {', '.join(nearby)})"
                if nearby
                else f" (no cluster beside it in {parent})"
            )
    except Exception:  # only a hint: a parent this session may not read
        beside = ""
    return (
        f"no cluster under {paths.root}{beside}: check the cluster root (--root, "
        "WALTZ_CLUSTER_ROOT, cluster.root), or create a cluster there with `waltz cluster create`"
    )
