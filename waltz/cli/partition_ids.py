"""Partition IDs on the command line: ``--partition`` values in, compact ranges out.

Only typer here: every command module may import it without slowing ``waltz --help``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import typer

__all__ = ["format_partitions", "parse_partitions"]


def parse_partitions(values: Iterable[str]) -> list[int]:
    """Parse ``--partition`` values: integers, comma lists and ``a-b`` ranges, sorted and unique.

    Raises:
        typer.BadParameter: a value is not of that form.
    """
    ids: set[int] = set()
    for value in values:
        for item in value.split(","):
            match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", item)
            if match is None:
                raise typer.BadParameter(f"{item!r} is not a partition ID or range (e.g. 3 or 0-7)")
            first = int(match[1])
            last = int(match[2]) if match[2] is not None else first
            if last < first:
                raise typer.BadParameter(f"range {item!r} is empty")
            ids.update(range(first, last + 1))
    return sorted(ids)


def format_partitions(ids: Iterable[int]) -> str:
    """Format partition IDs compactly: ``0-3,7``; ``(none)`` when empty."""
    ordered = sorted(set(ids))
    runs: list[str] = []
    start = 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or ordered[i] != ordered[i - 1] + 1:
            first, last = ordered[start], ordered[i - 1]
            runs.append(str(first) if first == last else f"{first}-{last}")
            start = i
    return ",".join(runs) or "(none)"
