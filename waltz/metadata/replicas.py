"""Replica placement and the safety rules of replica changes (``docs/zookeeper.md``).

Design: docs/design/zookeeper.md "Partition metadata" (replica states, closing high-water marks),
"Replica assignments and groups". Pure functions: they read values, never ZooKeeper, so the rules
are tested on their own.

The rules, for one partition:

- A replica is **caught up** when the partition's metadata holds a replica state for it whose
  session ID equals the partition's current store session ID and whose closing high-water mark is
  unresolved (it took part in the current session and is being written to), or when the partition
  never had a store session (session ID -1: a fresh cluster, every replica is empty).
- **One replica at a time**: a new replica may be assigned only while every other assigned replica
  is caught up. A new replica starts empty and catches up from the others; adding a second one
  before the first has caught up could leave a quorum of replicas that do not hold the log.
- **Keep a quorum**: a replica may be unassigned only if the caught-up replicas among those that
  remain are at least a quorum (majority) of the remaining ones, and at least one remains.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from waltz.errors import WaltzError
from waltz.metadata.values import PartitionMetadata

__all__ = [
    "FORCE_HINT",
    "ReplicaChangeRefusedError",
    "assign_refusal",
    "is_caught_up",
    "quorum_of",
    "spread_replicas",
    "unassign_refusal",
]


#: What to do about a refusal of ``assign``, ``unassign`` or ``auto-assign``, which take ``--force``.
FORCE_HINT = (
    "wait until the servers have caught the replicas up (waltz cluster list shows the replica "
    "states), or pass --force if you accept the risk of losing committed transactions"
)


class ReplicaChangeRefusedError(WaltzError):
    """A replica change was refused by the safety rules; nothing was changed.

    Args:
        reasons: one line per refused partition.
        hint: what to do next, the message's last line: :data:`FORCE_HINT` (the replica commands,
            which take ``--force``) unless the refusing command says otherwise.

    Attributes:
        reasons: one line per refused partition.
    """

    def __init__(self, reasons: Sequence[str], hint: str = FORCE_HINT) -> None:
        super().__init__("replica change refused:\n  " + "\n  ".join(reasons) + "\n" + hint)
        self.reasons = tuple(reasons)


def quorum_of(replicas: int) -> int:
    """The quorum (majority) of ``replicas`` replicas: ``replicas // 2 + 1``."""
    return replicas // 2 + 1


def is_caught_up(metadata: PartitionMetadata, storage: str) -> bool:
    """Whether the replica of a partition on ``storage`` holds the partition's log.

    Args:
        metadata: the partition's metadata (``store/partition/<id>``).
        storage: the storage node's connect string.

    Returns:
        True when the partition never had a store session, or when the replica's state is in the
        current session with an unresolved closing high-water mark.
    """
    if metadata.session_id == -1:
        return True
    state = metadata.replicas.get(storage)
    return state is not None and state.session_id == metadata.session_id and state.unresolved


def _describe_lagging(metadata: PartitionMetadata, storages: Collection[str]) -> str:
    parts = []
    for storage in sorted(storages):
        state = metadata.replicas.get(storage)
        if state is None:
            parts.append(f"{storage} (no replica state yet)")
        elif state.unresolved:
            parts.append(f"{storage} (in session {state.session_id}, current {metadata.session_id})")
        else:
            parts.append(
                f"{storage} (session {state.session_id} closed at high-water mark "
                f"{state.closing_high_water_mark}, current {metadata.session_id})"
            )
    return ", ".join(parts)


def assign_refusal(
    partition_id: int, storage: str, assigned: Collection[str], metadata: PartitionMetadata
) -> str | None:
    """Why a new replica of a partition must not be assigned to ``storage`` now, or None if it may.

    Args:
        partition_id: the partition.
        storage: the storage node that would get the new replica.
        assigned: the storage nodes currently assigned a replica of the partition.
        metadata: the partition's metadata.

    Returns:
        A one-line reason (one replica at a time: another replica has not caught up), or None.
    """
    lagging = [s for s in assigned if s != storage and not is_caught_up(metadata, s)]
    if not lagging:
        return None
    return (
        f"partition {partition_id}: cannot add a replica on {storage} while the replica(s) on "
        f"{_describe_lagging(metadata, lagging)} have not caught up (one new replica at a time)"
    )


def unassign_refusal(
    partition_id: int, storage: str, assigned: Collection[str], metadata: PartitionMetadata
) -> str | None:
    """Why the replica of a partition on ``storage`` must not be unassigned now, or None if it may.

    Args:
        partition_id: the partition.
        storage: the storage node whose replica would be removed.
        assigned: the storage nodes currently assigned a replica of the partition.
        metadata: the partition's metadata.

    Returns:
        A one-line reason (no replica would remain, or the caught-up replicas among the remaining
        ones would be fewer than their quorum), or None.
    """
    if storage not in assigned:
        return None
    remaining = [s for s in assigned if s != storage]
    if not remaining:
        return f"partition {partition_id}: {storage} holds its only replica; the partition would have none"
    caught_up = [s for s in remaining if is_caught_up(metadata, s)]
    needed = quorum_of(len(remaining))
    if len(caught_up) >= needed:
        return None
    lagging = [s for s in remaining if s not in caught_up]
    return (
        f"partition {partition_id}: removing {storage} would leave {len(caught_up)} caught-up "
        f"replica(s) of {len(remaining)}, fewer than their quorum {needed}; not caught up: "
        f"{_describe_lagging(metadata, lagging)}"
    )


def spread_replicas(
    storages: Sequence[str], num_partitions: int, replicas: int | None = None
) -> dict[str, tuple[int, ...]]:
    """Place the replicas of every partition on storage nodes (for a new cluster).

    Args:
        storages: storage connect strings, in the order given by the user.
        num_partitions: the number of partitions (at least 1).
        replicas: replicas per partition (1..len(storages)); None puts every partition on every
            node. Partition ``p`` goes to nodes ``p, p+1, ..., p+replicas-1`` (modulo the number of
            nodes): round-robin, so every node holds about the same number of replicas.

    Returns:
        Connect string -> sorted partition IDs, with an entry (maybe empty) for every node.

    Raises:
        ValueError: ``replicas`` is out of range, or there is no storage node.
    """
    if not storages:
        raise ValueError("a cluster needs at least one storage node")
    count = len(storages) if replicas is None else replicas
    if not 1 <= count <= len(storages):
        raise ValueError(
            f"--replicas {count} must be between 1 and the number of storage nodes ({len(storages)})"
        )
    placed: dict[str, list[int]] = {s: [] for s in storages}
    for partition_id in range(num_partitions):
        for i in range(count):
            placed[storages[(partition_id + i) % len(storages)]].append(partition_id)
    return {s: tuple(sorted(p)) for s, p in placed.items()}
