"""What a run of ``waltz cluster split`` reports: where a split stands, per parent and per child.

Design: docs/design/splits.md "The handover" (the steps and what each child waits for), "The
epochs znode's record form" (the fields each status is read from). :mod:`waltz.admin.split_run`
makes these values; ``waltz cluster split`` prints them, as lines or as JSON
(:meth:`SplitReport.to_json`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from waltz.metadata.epochs import Epoch

__all__ = [
    "DRY_RUN",
    "OPEN",
    "WAITING_FOR_BARRIER",
    "WAITING_FOR_GENESIS",
    "WAITING_TO_BE_OPENED",
    "ChildStatus",
    "ParentStatus",
    "SplitPhase",
    "SplitReport",
    "child_status",
    "waiting_reason",
]

#: What a child waits for, by its state in the znode (docs/design/splits.md "The handover", step 4).
WAITING_FOR_BARRIER = "waiting for its parent's barrier"
WAITING_TO_BE_OPENED = "waiting to be opened"
WAITING_FOR_GENESIS = "opened, waiting for its genesis"
OPEN = "open"
#: The report's ``waiting`` of a dry run.
DRY_RUN = "a dry run: nothing was written"


class SplitPhase(enum.Enum):
    """Where a run left the split (the report's ``state``)."""

    PLANNED = "planned"
    """A dry run: nothing written."""
    PREPARING = "preparing"
    SEALING = "sealing"
    COMPLETE = "complete"
    ABORTED = "aborted"
    """The epoch was deleted (or was not there) and ``discovery`` written back."""


@dataclass(frozen=True, slots=True)
class ParentStatus:
    """A parent's part of a split, as the run left it.

    Attributes:
        parent: the parent partition.
        high_water_mark: ``H(p)`` (-1: empty).
        sealing: marked sealing in the znode.
        barrier: ``B(p)``, or None while its owner has not written it.
        owner: the endpoint of the server that owns it (None: none, or not read).
        children: its new children.
    """

    parent: int
    high_water_mark: int
    sealing: bool
    barrier: int | None
    owner: str | None
    children: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ChildStatus:
    """A new child's part of a split, from the znode (docs/design/splits.md "The handover", step 4).

    Attributes:
        child: the new partition.
        parent: its parent.
        opened: its replicas and ``store/partition/<child>`` exist.
        genesis: its genesis ID, or None.
        state: what it waits for: :data:`WAITING_FOR_BARRIER`, :data:`WAITING_TO_BE_OPENED`,
            :data:`WAITING_FOR_GENESIS`, or :data:`OPEN`.
    """

    child: int
    parent: int
    opened: bool
    genesis: int | None
    state: str


@dataclass(frozen=True, slots=True)
class SplitReport:
    """Where a run (or a dry run, or an abort) left a split.

    Attributes:
        epoch: the epoch ``n+1``.
        count: ``M``.
        previous_count: ``C(n)``.
        state: where the split stands.
        parents: per parent, ``H(p)``, its sealing mark, ``B(p)``, its owner and children.
        children: per new child, its state.
        resumed: the split was started by an earlier run.
        dry_run: nothing was written (``--dry-run``).
        waiting: why the split is not complete (None once it is, or after an abort).
        notes: what the run could not check, or warnings, one line each.
    """

    epoch: int
    count: int
    previous_count: int
    state: SplitPhase
    parents: tuple[ParentStatus, ...]
    children: tuple[ChildStatus, ...] = ()
    resumed: bool = False
    dry_run: bool = False
    waiting: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        """True once every child has its genesis and the epoch is complete."""
        return self.state is SplitPhase.COMPLETE

    def to_json(self) -> dict[str, Any]:
        """The report as ``waltz cluster split --json`` prints it."""
        return {
            "epoch": self.epoch,
            "count": self.count,
            "previous_count": self.previous_count,
            "state": self.state.value,
            "complete": self.complete,
            "resumed": self.resumed,
            "dry_run": self.dry_run,
            "waiting": self.waiting,
            "notes": list(self.notes),
            "parents": [
                {
                    "parent": p.parent,
                    "high_water_mark": p.high_water_mark,
                    "sealing": p.sealing,
                    "barrier": p.barrier,
                    "owner": p.owner,
                    "children": list(p.children),
                }
                for p in self.parents
            ],
            "children": [
                {
                    "child": c.child,
                    "parent": c.parent,
                    "opened": c.opened,
                    "genesis": c.genesis,
                    "state": c.state,
                }
                for c in self.children
            ],
        }


def child_status(epoch: Epoch, child: int) -> ChildStatus:
    """A new child's status, read from its epoch (docs/design/splits.md "The handover", step 4)."""
    parent, barrier = epoch.parent_barrier(child)
    progress = epoch.children[child]
    if progress.genesis is not None:
        state = OPEN
    elif progress.opened:
        state = WAITING_FOR_GENESIS
    elif barrier is None:
        state = WAITING_FOR_BARRIER
    else:
        state = WAITING_TO_BE_OPENED
    return ChildStatus(child, parent, progress.opened, progress.genesis, state)


def waiting_reason(epoch: Epoch) -> str:
    """Why ``epoch`` is not complete yet, in one line: its parents without a barrier, else its
    children not opened, else its children without their genesis."""
    unsealed = [p for p, progress in sorted(epoch.parents.items()) if progress.barrier is None]
    if unsealed:
        return (
            f"parents {unsealed} have no barrier yet (a parent's owner writes it once the parent is "
            "marked sealing)"
        )
    unopened = [c for c, progress in sorted(epoch.children.items()) if not progress.opened]
    if unopened:
        return (
            f"children {unopened} are waiting to be opened (a storage node of their parent did not "
            "answer, or the run stopped before): run the same command again"
        )
    waiting = [c for c, progress in sorted(epoch.children.items()) if progress.genesis is None]
    return f"children {waiting} are waiting for their genesis"
