"""Quorum voting on the closing high-water mark of a store session.

Design: docs/design/recovery.md "Voting the high-water mark". A replica with high-water mark X
votes for every high-water mark H <= X. The closing high-water mark is the highest H that a quorum
(a majority of the last session's replicas) votes for. With replicas offline it can be
undecidable: examining the voted high-water marks in descending order, one whose votes do not
reach the quorum but whose votes plus the offline replicas do could still be the answer once those
replicas return, so the recovery must wait (docs/design/recovery.md "Quorum checking with offline
replicas", "Undecidable high-water mark").
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["resolve_high_water_mark"]


def resolve_high_water_mark(votes: Sequence[int], offline: int, quorum: int) -> int | None:
    """Resolve the closing high-water mark from the voting replicas' high-water marks.

    Args:
        votes: the high-water mark of each reachable replica of the last session (-1: empty).
        offline: how many replicas of the last session could not be reached.
        quorum: the number of votes needed (a majority of ``len(votes) + offline``).

    Returns:
        The highest high-water mark a quorum votes for, or None while it is undecidable
        (offline replicas could still change the answer, or too few replicas vote).
    """
    ordered = sorted(votes, reverse=True)
    for index, value in enumerate(ordered):
        if index + 1 < len(ordered) and ordered[index + 1] == value:
            continue  # count every vote for this value first
        supports = index + 1  # replicas whose high-water mark is >= value
        if supports >= quorum:
            return value
        if supports + offline >= quorum:
            return None
    return None
