"""The replica-change safety rules and replica placement (waltz.metadata.replicas;
docs/zookeeper.md "Replica changes and their safety rules")."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz.metadata.replicas import (
    assign_refusal,
    is_caught_up,
    quorum_of,
    spread_replicas,
    unassign_refusal,
)
from waltz.metadata.values import PartitionMetadata, ReplicaState

NODES = [f"10.0.0.{i}:55280" for i in range(1, 6)]
A, B, C, D, _ = NODES


def test_quorum_is_a_majority() -> None:
    assert [quorum_of(n) for n in range(1, 7)] == [1, 2, 2, 3, 3, 4]


def test_caught_up_means_in_the_current_session_and_unresolved() -> None:
    metadata = PartitionMetadata(
        2,
        7,
        {A: ReplicaState(7), B: ReplicaState(6), C: ReplicaState(7, 120), D: ReplicaState(8)},
    )
    assert is_caught_up(metadata, A)
    assert not is_caught_up(metadata, B)  # an older session
    assert not is_caught_up(metadata, C)  # its session's closing mark is resolved: it stopped
    assert not is_caught_up(metadata, D)  # not the current session either
    assert not is_caught_up(metadata, "10.9.9.9:1")  # no state: a new replica
    fresh = PartitionMetadata(0, -1, {})
    assert is_caught_up(fresh, A) and is_caught_up(fresh, "10.9.9.9:1")


def test_one_new_replica_at_a_time() -> None:
    metadata = PartitionMetadata(1, 4, {A: ReplicaState(4), B: ReplicaState(4)})
    assert assign_refusal(0, C, [A, B], metadata) is None
    reason = assign_refusal(0, D, [A, B, C], metadata)  # C was just added: no state yet
    assert reason is not None and C in reason and "no replica state yet" in reason
    # Re-assigning a replica that is already assigned is not a new one: only the others count.
    assert assign_refusal(0, C, [A, B, C], metadata) is None
    # A fresh partition takes any number at once.
    assert assign_refusal(0, D, [A, B, C], PartitionMetadata(0, -1, {})) is None


def test_unassign_keeps_a_quorum_of_caught_up_replicas() -> None:
    metadata = PartitionMetadata(1, 4, {A: ReplicaState(4), B: ReplicaState(4), C: ReplicaState(3, 50)})
    # Without A: B (caught up) and C (behind): 1 < quorum 2.
    reason = unassign_refusal(0, A, [A, B, C], metadata)
    assert reason is not None and "fewer than their quorum 2" in reason and C in reason
    # Without C: A and B, both caught up.
    assert unassign_refusal(0, C, [A, B, C], metadata) is None
    assert unassign_refusal(0, D, [A, B, C], metadata) is None  # not assigned: nothing to refuse
    only = unassign_refusal(0, A, [A], PartitionMetadata(0, -1, {}))
    assert only is not None and "only replica" in only


@given(
    assigned=st.sets(st.sampled_from(NODES), min_size=1),
    session_id=st.integers(-1, 3),
    states=st.dictionaries(
        st.sampled_from(NODES),
        st.builds(ReplicaState, st.integers(-1, 3), st.one_of(st.none(), st.integers(0, 100))),
    ),
    victim=st.sampled_from(NODES),
)
def test_an_allowed_unassign_leaves_a_caught_up_quorum(
    assigned: set[str], session_id: int, states: dict[str, ReplicaState], victim: str
) -> None:
    metadata = PartitionMetadata(1, session_id, states)
    reason = unassign_refusal(0, victim, sorted(assigned), metadata)
    remaining = assigned - {victim}
    caught_up = [s for s in remaining if is_caught_up(metadata, s)]
    if victim not in assigned:
        assert reason is None
    elif reason is None:
        assert remaining and len(caught_up) >= quorum_of(len(remaining))
    else:
        assert not remaining or len(caught_up) < quorum_of(len(remaining))


@given(
    assigned=st.sets(st.sampled_from(NODES)),
    session_id=st.integers(-1, 3),
    states=st.dictionaries(
        st.sampled_from(NODES),
        st.builds(ReplicaState, st.integers(-1, 3), st.one_of(st.none(), st.integers(0, 100))),
    ),
    newcomer=st.sampled_from(NODES),
)
def test_an_allowed_assign_has_every_other_replica_caught_up(
    assigned: set[str], session_id: int, states: dict[str, ReplicaState], newcomer: str
) -> None:
    metadata = PartitionMetadata(1, session_id, states)
    allowed = assign_refusal(0, newcomer, sorted(assigned), metadata) is None
    assert allowed == all(is_caught_up(metadata, s) for s in assigned - {newcomer})


@given(
    nodes=st.integers(1, 6),
    partitions=st.integers(1, 40),
    data=st.data(),
)
def test_spread_places_distinct_replicas_evenly(nodes: int, partitions: int, data: st.DataObject) -> None:
    storages = [f"h{i}:1" for i in range(nodes)]
    replicas = data.draw(st.one_of(st.none(), st.integers(1, nodes)), label="replicas")
    placed = spread_replicas(storages, partitions, replicas)
    count = nodes if replicas is None else replicas
    assert set(placed) == set(storages)
    for partition_id in range(partitions):
        assert sum(partition_id in p for p in placed.values()) == count
    full_cycles, rest = divmod(partitions, nodes)
    for held in placed.values():
        assert list(held) == sorted(set(held))
        assert full_cycles * count <= len(held) <= full_cycles * count + min(rest, count)


def test_spread_rejects_impossible_replica_counts() -> None:
    for replicas in (0, 4):
        with pytest.raises(ValueError, match=r"between 1 and the number of storage nodes \(3\)"):
            spread_replicas(["a:1", "b:1", "c:1"], 2, replicas)
    with pytest.raises(ValueError, match="at least one storage node"):
        spread_replicas([], 2)
