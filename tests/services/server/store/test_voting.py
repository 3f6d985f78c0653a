"""Quorum voting against a brute-force oracle that tries every high-water mark for offline replicas."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from waltz.metadata.replicas import quorum_of
from waltz.services.server.store.voting import resolve_high_water_mark


def committed_high_water_mark(high_water_marks: list[int], quorum: int) -> int | None:
    """The highest transaction ID that at least ``quorum`` replicas hold (None: none)."""
    candidates = [h for h in set(high_water_marks) if sum(1 for x in high_water_marks if x >= h) >= quorum]
    return max(candidates) if candidates else None


def oracle(votes: list[int], offline: int, quorum: int) -> int | None:
    """Try every relevant high-water mark for each offline replica; decidable only if all agree.

    Offline values only matter by where they fall among the known values, so -1, each known
    value, the value just above each, and one above the maximum cover every case.
    """
    points = {-1, max(votes, default=-1) + 1} | set(votes) | {v + 1 for v in votes}
    answers = {
        committed_high_water_mark(votes + list(hidden), quorum)
        for hidden in itertools.product(sorted(points), repeat=offline)
    }
    if len(answers) != 1:
        return None
    return answers.pop()


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[int], int, int]:
    replicas = draw(st.sampled_from([1, 3, 5]))
    offline = draw(st.integers(min_value=0, max_value=replicas))
    votes = draw(
        st.lists(
            st.integers(min_value=-1, max_value=6), min_size=replicas - offline, max_size=replicas - offline
        )
    )
    return votes, offline, quorum_of(replicas)


@given(scenarios())
def test_resolution_matches_the_oracle(scenario: tuple[list[int], int, int]) -> None:
    votes, offline, quorum = scenario
    assert resolve_high_water_mark(votes, offline, quorum) == oracle(votes, offline, quorum)


def test_seed_examples() -> None:
    # Seed 003: H_A = 10, H_B = 12, H_C = 8: H_A is the highest a majority votes for.
    assert resolve_high_water_mark([10, 12, 8], 0, 2) == 10
    # Replica B inaccessible: H_A has one vote, plus one offline reaches the quorum: undecidable.
    assert resolve_high_water_mark([10, 8], 1, 2) is None
    # Replica C caught up with A: decidable again.
    assert resolve_high_water_mark([10, 10], 1, 2) == 10
    assert resolve_high_water_mark([], 3, 2) is None
    assert resolve_high_water_mark([-1, -1, -1], 0, 2) == -1
    assert resolve_high_water_mark([7, 7, 3, 9, 9], 0, 3) == 7
