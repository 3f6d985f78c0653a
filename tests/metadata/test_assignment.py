"""Partition placement: one live member per partition, fair shares, stable, generations."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from waltz.metadata.assignment import Member, PartitionAssignment, Placement, compute_assignment


def member(i: int, preferred: tuple[int, ...] = ()) -> Member:
    return Member(f"member-{i:010d}", f"127.0.0.1:{7000 + i}", preferred)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[int, list[Member], PartitionAssignment]:
    partitions = draw(st.integers(min_value=1, max_value=12))
    ids = draw(st.lists(st.integers(min_value=0, max_value=8), unique=True, max_size=5))
    members = [member(i, tuple(draw(st.lists(st.integers(0, partitions - 1), max_size=3)))) for i in ids]
    names = [f"member-{i:010d}" for i in range(9)] + [None]
    current = PartitionAssignment(
        {
            pid: Placement(name, None, draw(st.integers(min_value=0, max_value=5)))
            for pid in range(partitions)
            for name in [draw(st.sampled_from(names))]
        }
    )
    return partitions, members, current


@given(scenarios())
def test_every_partition_on_one_live_member_with_fair_shares(
    scenario: tuple[int, list[Member], PartitionAssignment],
) -> None:
    partitions, members, current = scenario
    new = compute_assignment(partitions, members, current)
    assert set(new.placements) == set(range(partitions))
    live = {m.name for m in members}
    for pid, placement in new.placements.items():
        old = current.placements[pid]
        if not members:
            assert placement.member is None and placement.generation == old.generation
            continue
        assert placement.member in live
        # The generation goes up exactly when the partition moves.
        assert placement.generation == old.generation + (placement.member != old.member)
    if members:
        loads = [len(new.partitions_of(m.name)) for m in members]
        assert max(loads) <= math.ceil(partitions / len(members))
        # Partitions whose member is alive stay unless that member was over its fair share.
        share = math.ceil(partitions / len(members))
        for m in members:
            kept_before = [pid for pid, p in current.placements.items() if p.member == m.name]
            if len(kept_before) <= share:
                assert all(new.placements[pid].member == m.name for pid in kept_before)
    # Recomputing changes nothing.
    assert compute_assignment(partitions, members, new) == new


def test_preferred_partitions_and_failover() -> None:
    a, b = member(1, preferred=(3,)), member(2)
    first = compute_assignment(4, [a, b], PartitionAssignment())
    assert first.placements[3].member == a.name
    assert sorted(len(first.partitions_of(m.name)) for m in (a, b)) == [2, 2]
    assert all(p.generation == 1 for p in first.placements.values())
    # a dies: everything moves to b with a new generation for a's partitions only.
    second = compute_assignment(4, [b], first)
    assert all(p.member == b.name for p in second.placements.values())
    for pid, placement in second.placements.items():
        assert placement.generation == first.placements[pid].generation + (
            first.placements[pid].member == a.name
        )


def test_codecs_round_trip() -> None:
    m = member(7, (1, 2))
    assert Member.decode(m.name, m.encode(), "/x") == m
    assert m.server_id == 7
    assignment = compute_assignment(3, [m], PartitionAssignment())
    assert PartitionAssignment.decode(assignment.encode(), "/x") == assignment
