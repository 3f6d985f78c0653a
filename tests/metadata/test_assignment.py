"""Partition placement: one live member per partition, fair shares, stable, generations."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz.errors import MetadataError
from waltz.metadata.assignment import (
    SERVER_FEATURES,
    Member,
    PartitionAssignment,
    Placement,
    compute_assignment,
)


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


@given(scenarios(), st.data())
def test_every_partition_on_one_live_member_with_fair_shares(
    scenario: tuple[int, list[Member], PartitionAssignment], data: st.DataObject
) -> None:
    partitions, members, current = scenario
    settled = data.draw(st.sets(st.sampled_from([m.name for m in members])) if members else st.just(set()))
    new = compute_assignment(partitions, members, current, settled)
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
        share = math.ceil(partitions / len(members))
        for m in members:
            owned = new.partitions_of(m.name)
            # Only preferred partitions take a member past its fair share.
            assert len([pid for pid in owned if pid not in m.preferred_partitions]) <= share
            if len(owned) > share:
                assert all(pid in m.preferred_partitions for pid in owned)
            # A preferred partition on a preferring member never moves.
            for pid, p in current.placements.items():
                if p.member == m.name and pid in m.preferred_partitions:
                    assert new.placements[pid].member == m.name
            # A settled member gets every partition it prefers, unless another preferring member
            # holds it.
            prefers = {x.name: x.preferred_partitions for x in members}
            for pid in m.preferred_partitions if m.name in settled else ():
                holder = new.placements[pid].member
                assert holder is not None and pid in prefers[holder]
        # Without preferences, partitions whose member is alive stay unless it was over its share,
        # or a settled member below the floor took them, leaving it at the floor or above.
        floor = partitions // len(members)
        for m in members:
            kept_before = [pid for pid, p in current.placements.items() if p.member == m.name]
            if not any(x.preferred_partitions for x in members) and len(kept_before) <= share:
                for pid in kept_before:
                    if new.placements[pid].member != m.name:
                        assert new.placements[pid].member in settled
                        assert len(new.partitions_of(m.name)) >= floor
        # Balanced: no settled member under the floor while another holds more than the floor
        # with a partition it does not prefer.
        for m in members:
            if m.name in settled and len(new.partitions_of(m.name)) < floor:
                for x in members:
                    owned = new.partitions_of(x.name)
                    assert len(owned) <= floor or all(pid in x.preferred_partitions for pid in owned)
    # Recomputing changes nothing.
    assert compute_assignment(partitions, members, new, settled) == new


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


def test_a_settled_preferred_member_reclaims_its_partitions_and_nothing_flaps() -> None:
    a, b = member(1, preferred=(0, 1)), member(2)
    # a was away: b holds everything.
    current = compute_assignment(4, [b], PartitionAssignment())
    # a is back but not settled: nothing that b holds within its share moves to it.
    back = compute_assignment(4, [a, b], current)
    assert back.placements[0].member == b.name and back.placements[1].member == b.name
    # Settled, a takes 0 and 1 back (new generations), and b keeps the rest.
    settled = compute_assignment(4, [a, b], back, {a.name, b.name})
    assert [settled.placements[p].member for p in range(4)] == [a.name, a.name, b.name, b.name]
    assert settled.placements[0].generation == back.placements[0].generation + 1
    assert compute_assignment(4, [a, b], settled, {a.name, b.name}) == settled


def test_a_member_that_joined_within_the_others_share_takes_its_share_once_settled() -> None:
    a, b, c = member(1), member(2), member(3)
    # The last server of a rolling restart comes back: a and b hold two each, within the share.
    current = compute_assignment(4, [a, b], PartitionAssignment())
    assert sorted(len(current.partitions_of(m.name)) for m in (a, b)) == [2, 2]
    back = compute_assignment(4, [a, b, c], current)
    assert back == current  # not settled yet: nothing moves
    settled = compute_assignment(4, [a, b, c], back, {a.name, b.name, c.name})
    assert sorted(len(settled.partitions_of(m.name)) for m in (a, b, c)) == [1, 1, 2]
    moved = [pid for pid in range(4) if settled.placements[pid].member != back.placements[pid].member]
    assert len(moved) == 1 and settled.placements[moved[0]].member == c.name
    assert settled.placements[moved[0]].generation == back.placements[moved[0]].generation + 1
    assert compute_assignment(4, [a, b, c], settled, {a.name, b.name, c.name}) == settled
    # Nine partitions, two members holding 5 and 4: the newcomer takes 2 and 1, to 3 each.
    nine = compute_assignment(9, [a, b], PartitionAssignment())
    grown = compute_assignment(9, [a, b, c], nine, {c.name})
    assert sorted(len(grown.partitions_of(m.name)) for m in (a, b, c)) == [3, 3, 3]


def test_two_members_preferring_a_partition_do_not_take_it_from_each_other() -> None:
    a, b = member(1, preferred=(0,)), member(2, preferred=(0,))
    on_b = PartitionAssignment({0: Placement(b.name, None, 3), 1: Placement(a.name, None, 1)})
    new = compute_assignment(2, [a, b], on_b, {a.name, b.name})
    assert new.placements[0].member == b.name and new.placements[0].generation == 3


def test_preferred_partitions_beyond_the_fair_share_stay() -> None:
    a, b = member(1, preferred=(0, 1, 2)), member(2)
    new = compute_assignment(4, [a, b], PartitionAssignment(), {a.name})
    assert sorted(new.partitions_of(a.name)) == [0, 1, 2]
    assert compute_assignment(4, [a, b], new, {a.name, b.name}) == new


@given(
    st.integers(min_value=1, max_value=6),
    st.sampled_from([2, 3, 4]),
    st.lists(st.integers(min_value=0, max_value=8), unique=True, min_size=1, max_size=5),
)
def test_a_split_s_children_are_placed_and_every_partition_there_keeps_its_owner(
    count: int, factor: int, ids: list[int]
) -> None:
    # docs/design/server.md "Cluster manager": the partitions that exist grow by a split's opened
    # children; the ones placed before keep their member and generation.
    members = [member(i) for i in ids]
    first = compute_assignment(range(count), members, PartitionAssignment())
    assert compute_assignment(count, members, first) == first  # a count is 0 .. count - 1
    opened = [count + c for c in range(0, (factor - 1) * count, 2)]  # some children opened, not all
    grown = compute_assignment([*range(count), *opened], members, first)
    assert set(grown.placements) == {*range(count), *opened}
    for pid in range(count):
        assert grown.placements[pid] == first.placements[pid]
    share = math.ceil((count + len(opened)) / len(members))
    assert all(len(grown.partitions_of(m.name)) <= share for m in members)
    assert all(grown.placements[c].generation == 1 for c in opened)
    assert compute_assignment([*opened, *range(count)], members, grown) == grown


def test_codecs_round_trip() -> None:
    m = member(7, (1, 2))
    assert Member.decode(m.name, m.encode(), "/x") == m
    with_health = Member(m.name, m.endpoint, (), "http://127.0.0.1:9/health")
    assert Member.decode(m.name, with_health.encode(), "/x") == with_health
    assert m.server_id == 7
    # A member's features: absent (a release before them) reads as none; a wrong type is refused.
    featured = Member(m.name, m.endpoint, (), None, "s1", SERVER_FEATURES)
    assert Member.decode(m.name, featured.encode(), "/x") == featured
    assert b'"features":["partition-epochs"]' in featured.encode().replace(b" ", b"")
    assert Member.decode(m.name, m.encode(), "/x").features == ()
    with pytest.raises(MetadataError, match="features is"):
        Member.decode(
            m.name, b'{"endpoint": "127.0.0.1:1", "features": "partition-epochs", "format_version": 1}', "/x"
        )
    assignment = compute_assignment(3, [m], PartitionAssignment())
    assert PartitionAssignment.decode(assignment.encode(), "/x") == assignment
