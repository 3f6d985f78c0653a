"""The partition epochs of a cluster's splits: the ``<root>/partitions/epochs`` znode.

Design: docs/design/splits.md "Terms" (epochs, parents and children, barrier, genesis), "What
ZooKeeper holds", "The epochs znode's record form" (every field, the steps and their refusals),
"The handover" (the steps in a split);
docs/design/zookeeper.md "Compare-and-set everywhere", "Roles" (servers and operators write it,
clients read it).

Epoch 0 is the partition count the cluster was created with (``initial_count``); each split adds
the next epoch, ``count = k * previous_count`` for a whole ``k >= 2``, which runs
``preparing -> sealing -> complete``. Per parent ``p < previous_count`` an epoch records ``H(p)``
(the parent's high-water mark when the split started), whether the parent is sealing and its
barrier ``B(p)``; per new child ``c`` (``previous_count <= c < count``) whether it is opened and
its genesis ``B(c mod previous_count) + 1``.

:class:`PartitionEpochs` is the znode's value (``encode``/``decode`` with ``format_version`` 1);
its transition methods (:meth:`PartitionEpochs.prepare`, :meth:`~PartitionEpochs.mark_sealing`...)
return the value after one step of a split, or the same value when the step was taken already,
and raise :class:`~waltz.errors.SplitStateError` when the split's state refuses it.
:class:`PartitionEpochsZk` applies them to the znode by compare-and-set, re-reading and trying
again when another writer was first, so that every step can be called again by a split that
resumes.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Self

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from waltz.errors import MetadataError, SplitStateError, StaleMetadataError
from waltz.metadata.paths import ClusterPaths
from waltz.metadata.values import _dump, _field, _load
from waltz.metadata.zk import ClusterZk, Versioned
from waltz.metadata.zk_access import ClusterAccess
from waltz.metadata.zk_session import ZooKeeperUnavailableError, zookeeper_access

__all__ = [
    "MAX_CAS_ATTEMPTS",
    "ChildProgress",
    "Epoch",
    "EpochState",
    "ParentProgress",
    "PartitionEpochs",
    "PartitionEpochsZk",
]

log = logging.getLogger(__name__)

#: Attempts of a compare-and-set loop of :class:`PartitionEpochsZk` (each re-reads the znode).
MAX_CAS_ATTEMPTS = 50


class EpochState(enum.Enum):
    """Where a split stands (docs/design/splits.md "What ZooKeeper holds")."""

    PREPARING = "preparing"
    """The epoch is written with each parent's ``H(p)``; no parent is sealing: it may be aborted."""
    SEALING = "sealing"
    """At least one parent is sealing: the split only goes forward."""
    COMPLETE = "complete"
    """Every new child has its genesis."""


@dataclass(frozen=True, slots=True)
class ParentProgress:
    """A parent's progress in an epoch.

    Attributes:
        high_water_mark: ``H(p)``, the parent's high-water mark when the split started (-1: empty).
        sealing: the parent is marked sealing: its owner refuses appends routed by an older epoch.
        barrier: ``B(p)``, the transaction ID of the parent's first barrier of the epoch, above
            ``high_water_mark``; None until known.
    """

    high_water_mark: int
    sealing: bool = False
    barrier: int | None = None


@dataclass(frozen=True, slots=True)
class ChildProgress:
    """A new child's progress in an epoch.

    Attributes:
        opened: its replicas and ``store/partition/<id>`` are created (docs/design/splits.md
            "The handover", step 4).
        genesis: the transaction ID of its genesis, ``B(parent) + 1``; None until committed.
    """

    opened: bool = False
    genesis: int | None = None


@dataclass(frozen=True, slots=True)
class Epoch:
    """One split: epoch ``number`` with ``count`` partitions, after ``previous_count``.

    Attributes:
        number: the epoch, 1 or more (epoch 0 is the count at creation).
        count: ``C(n+1)``, the partition count of the epoch.
        previous_count: ``C(n)``, the count before; ``count`` is a whole multiple of it, at least 2.
        state: where the split stands.
        parents: parent ``p`` (``0 <= p < previous_count``) -> its progress.
        children: new child ``c`` (``previous_count <= c < count``) -> its progress.
    """

    number: int
    count: int
    previous_count: int
    state: EpochState
    parents: Mapping[int, ParentProgress] = field(default_factory=dict)
    children: Mapping[int, ChildProgress] = field(default_factory=dict)

    @property
    def factor(self) -> int:
        """``k``: the number of partitions each parent becomes (itself included)."""
        return self.count // self.previous_count

    @property
    def unfinished(self) -> bool:
        """True until the epoch is complete."""
        return self.state is not EpochState.COMPLETE

    @property
    def new_partitions(self) -> range:
        """The new children, ``previous_count .. count - 1``."""
        return range(self.previous_count, self.count)

    def children_of(self, parent: int) -> tuple[int, ...]:
        """The new children of ``parent``: ``parent + j * previous_count`` for ``j = 1 .. k-1``.

        Raises:
            SplitStateError: ``parent`` is not a partition of the count before the epoch.
        """
        self._parent(parent)
        return tuple(parent + j * self.previous_count for j in range(1, self.factor))

    def parent_of(self, child: int) -> int:
        """The parent of a new child, ``child mod previous_count``.

        Raises:
            SplitStateError: ``child`` is not a new partition of the epoch.
        """
        self._child(child)
        return child % self.previous_count

    def parent_barrier(self, child: int) -> tuple[int, int | None]:
        """A new child's parent and the parent's ``B(p)`` (None while not known).

        Raises:
            SplitStateError: ``child`` is not a new partition of the epoch.
        """
        parent = self.parent_of(child)
        return parent, self.parents[parent].barrier

    def _parent(self, parent: int) -> ParentProgress:
        progress = self.parents.get(parent)
        if progress is None:
            raise SplitStateError(
                f"partition {parent} is not a parent of epoch {self.number} "
                f"(parents 0..{self.previous_count - 1})"
            )
        return progress

    def _child(self, child: int) -> ChildProgress:
        progress = self.children.get(child)
        if progress is None:
            raise SplitStateError(
                f"partition {child} is not a new child of epoch {self.number} "
                f"(children {self.previous_count}..{self.count - 1})"
            )
        return progress

    def _with_parent(self, parent: int, progress: ParentProgress, state: EpochState | None = None) -> Epoch:
        return replace(self, parents={**self.parents, parent: progress}, state=state or self.state)

    def _with_child(self, child: int, progress: ChildProgress) -> Epoch:
        return replace(self, children={**self.children, child: progress})


@dataclass(frozen=True, slots=True)
class PartitionEpochs:
    """The value of ``<root>/partitions/epochs`` (docs/design/splits.md "What ZooKeeper holds").

    Attributes:
        initial_count: the partition count at creation (epoch 0).
        epochs: the splits, epochs 1, 2, ... in order; only the last may be unfinished.
    """

    initial_count: int
    epochs: tuple[Epoch, ...] = ()

    @property
    def current(self) -> Epoch | None:
        """The newest epoch, finished or not (None: the cluster never split)."""
        return self.epochs[-1] if self.epochs else None

    @property
    def current_number(self) -> int:
        """The newest epoch's number, finished or not (0: never split)."""
        return len(self.epochs)

    @property
    def current_count(self) -> int:
        """The newest epoch's partition count, finished or not (``initial_count`` if never split)."""
        return self.epochs[-1].count if self.epochs else self.initial_count

    @property
    def unfinished(self) -> Epoch | None:
        """The epoch of a split under way (not complete), or None."""
        current = self.current
        return current if current is not None and current.unfinished else None

    @property
    def partition_ids(self) -> tuple[int, ...]:
        """The partitions that exist, in order: those of the count at creation, and every new
        child marked opened (its replicas and ``store/partition/<id>`` are made,
        docs/design/splits.md "The handover", step 4). These are the partitions servers are
        assigned (docs/design/server.md "Cluster manager"); a child not opened yet is none's."""
        ids = list(range(self.initial_count))
        for epoch in self.epochs:
            ids += [child for child, progress in sorted(epoch.children.items()) if progress.opened]
        return tuple(ids)

    def epoch(self, number: int) -> Epoch:
        """Epoch ``number`` (1 or more).

        Raises:
            SplitStateError: there is no such epoch.
        """
        if not 1 <= number <= len(self.epochs):
            raise SplitStateError(f"there is no epoch {number}: the newest is epoch {len(self.epochs)}")
        return self.epochs[number - 1]

    def count_of(self, number: int) -> int:
        """The partition count of epoch ``number`` (0: the count at creation).

        Raises:
            SplitStateError: there is no such epoch.
        """
        return self.initial_count if number == 0 else self.epoch(number).count

    def _with_epoch(self, epoch: Epoch) -> PartitionEpochs:
        epochs = list(self.epochs)
        epochs[epoch.number - 1] = epoch
        return replace(self, epochs=tuple(epochs))

    # ---- the steps of a split (docs/design/splits.md "The handover") ----

    def prepare(self, count: int, high_water_marks: Mapping[int, int]) -> PartitionEpochs:
        """Add the next epoch with ``count`` partitions, state ``preparing``.

        Args:
            count: the new partition count, a whole multiple ``k >= 2`` of the current count.
            high_water_marks: ``H(p)`` of every parent ``p`` (every partition of the current
                count), each -1 or more.

        Returns:
            The value with the new epoch; the same value when the newest epoch already has
            ``count`` (a resumed split: its ``H(p)`` stay those first written).

        Raises:
            SplitStateError: another split, to a different count, is unfinished; ``count`` is
                not a whole multiple of at least 2 of the current count; ``high_water_marks``
                does not name exactly the parents, or holds a mark below -1.
        """
        current = self.current
        if current is not None and current.count == count:
            return self
        if current is not None and current.unfinished:
            raise SplitStateError(
                f"the split to epoch {current.number} ({current.count} partitions) is unfinished "
                f"({current.state.value}): finish it, or abort it while no parent is sealing, "
                f"before splitting to {count}"
            )
        before = self.current_count
        if type(count) is not int or count < 2 * before or count % before:
            raise SplitStateError(
                f"a split goes from {before} partitions to a whole multiple of at least 2 of it, "
                f"not {count!r}"
            )
        if set(high_water_marks) != set(range(before)):
            missing = sorted(set(range(before)) - set(high_water_marks))
            extra = sorted(set(high_water_marks) - set(range(before)))
            raise SplitStateError(
                f"a split from {before} partitions needs the high-water mark of each of 0..{before - 1}: "
                f"missing {missing}, not parents {extra}"
            )
        for parent, mark in sorted(high_water_marks.items()):
            if type(mark) is not int or mark < -1:
                raise SplitStateError(f"the high-water mark of parent {parent} is {mark!r}, not -1 or more")
        epoch = Epoch(
            number=self.current_number + 1,
            count=count,
            previous_count=before,
            state=EpochState.PREPARING,
            parents={p: ParentProgress(high_water_marks[p]) for p in range(before)},
            children={c: ChildProgress() for c in range(before, count)},
        )
        return replace(self, epochs=(*self.epochs, epoch))

    def mark_sealing(self, number: int, parent: int) -> PartitionEpochs:
        """Mark ``parent`` sealing in epoch ``number``; the epoch moves to ``sealing``.

        Raises:
            SplitStateError: no such epoch, or ``parent`` is not one of its parents.
        """
        epoch = self.epoch(number)
        progress = epoch._parent(parent)
        if progress.sealing:
            return self
        state = EpochState.SEALING if epoch.state is EpochState.PREPARING else epoch.state
        return self._with_epoch(epoch._with_parent(parent, replace(progress, sealing=True), state))

    def set_barrier(self, number: int, parent: int, transaction_id: int) -> PartitionEpochs:
        """Write ``B(p)``: only ever from None, and the same value again changes nothing.

        Raises:
            SplitStateError: no such epoch or parent; the parent is not sealing; the ID is not
                above the parent's ``H(p)``; another barrier is written already.
        """
        epoch = self.epoch(number)
        progress = epoch._parent(parent)
        if progress.barrier == transaction_id:
            return self
        if progress.barrier is not None:
            raise SplitStateError(
                f"epoch {number}: parent {parent}'s barrier is {progress.barrier}, not {transaction_id}: "
                "only the first barrier of the epoch in the parent's log counts"
            )
        if not progress.sealing:
            raise SplitStateError(f"epoch {number}: parent {parent} is not sealing: it can have no barrier")
        if type(transaction_id) is not int or transaction_id <= progress.high_water_mark:
            raise SplitStateError(
                f"epoch {number}: parent {parent}'s barrier {transaction_id!r} is not above its "
                f"high-water mark {progress.high_water_mark} when the split started"
            )
        return self._with_epoch(epoch._with_parent(parent, replace(progress, barrier=transaction_id)))

    def mark_opened(self, number: int, child: int) -> PartitionEpochs:
        """Mark a new child opened (its replicas and partition metadata created).

        Raises:
            SplitStateError: no such epoch or child; its parent has no barrier yet.
        """
        epoch = self.epoch(number)
        progress = epoch._child(child)
        if progress.opened:
            return self
        parent, barrier = epoch.parent_barrier(child)
        if barrier is None:
            raise SplitStateError(
                f"epoch {number}: child {child} opens after its parent {parent}'s barrier, "
                "which is not known yet"
            )
        return self._with_epoch(epoch._with_child(child, replace(progress, opened=True)))

    def set_genesis(self, number: int, child: int, transaction_id: int) -> PartitionEpochs:
        """Write a new child's genesis, which must be ``B(parent) + 1``.

        Raises:
            SplitStateError: no such epoch or child; its parent has no barrier yet; the child is
                not opened; the ID is not ``B(parent) + 1``.
        """
        epoch = self.epoch(number)
        progress = epoch._child(child)
        if progress.genesis == transaction_id:
            return self
        parent, barrier = epoch.parent_barrier(child)
        if barrier is None:
            raise SplitStateError(
                f"epoch {number}: child {child}'s genesis follows its parent {parent}'s barrier, "
                "which is not known yet"
            )
        if not progress.opened:
            raise SplitStateError(f"epoch {number}: child {child} is not opened: it can have no genesis")
        if transaction_id != barrier + 1:
            raise SplitStateError(
                f"epoch {number}: child {child}'s genesis is at {barrier + 1}, its parent {parent}'s "
                f"barrier plus one, not {transaction_id!r}"
            )
        return self._with_epoch(epoch._with_child(child, replace(progress, genesis=transaction_id)))

    def complete(self, number: int) -> PartitionEpochs:
        """Move epoch ``number`` to ``complete``.

        Raises:
            SplitStateError: no such epoch, or a new child has no genesis yet.
        """
        epoch = self.epoch(number)
        if epoch.state is EpochState.COMPLETE:
            return self
        waiting = [c for c, progress in sorted(epoch.children.items()) if progress.genesis is None]
        if waiting:
            raise SplitStateError(f"epoch {number} cannot complete: children {waiting} have no genesis yet")
        return self._with_epoch(replace(epoch, state=EpochState.COMPLETE))

    def abort(self, number: int) -> PartitionEpochs:
        """Delete epoch ``number``, the newest, while none of its parents is sealing.

        Returns:
            The value without the epoch; the same value when there is no epoch ``number`` (it
            was aborted already, or never prepared).

        Raises:
            SplitStateError: a parent of the epoch is sealing (the split only goes forward), or
                the epoch is not the newest.
        """
        if number > len(self.epochs):
            return self
        epoch = self.epoch(number)
        sealing = [p for p, progress in sorted(epoch.parents.items()) if progress.sealing]
        if sealing:
            raise SplitStateError(
                f"epoch {number} cannot be aborted: parents {sealing} are sealing, so the split only "
                "goes forward (run it again to resume it)"
            )
        if number != len(self.epochs):
            raise SplitStateError(f"epoch {number} is not the newest (epoch {len(self.epochs)})")
        return replace(self, epochs=self.epochs[:-1])

    # ---- the record form ----

    @property
    def first_transaction_ids(self) -> dict[int, int]:
        """Each new child's first transaction ID, its genesis ``B(p) + 1``, once its parent has
        ``B(p)``: its log starts there (docs/design/splits.md "The handover", step 4). A
        partition not named starts at 0."""
        firsts = {}
        for epoch in self.epochs:
            for child in epoch.children:
                _, barrier = epoch.parent_barrier(child)
                if barrier is not None:
                    firsts[child] = barrier + 1
        return firsts

    def cut_problems(self, marks: Mapping[int, int]) -> list[str]:
        """Why ``marks`` (partition -> the transaction ID read up to, -1: nothing) is not a
        consistent cut of the log across its splits, or nothing: a new child read beyond its
        genesis (``B(p) + 1`` or more) needs its parent read at least to ``B(p)``
        (docs/design/splits.md "Spark across a split"). A partition not in ``marks`` is not read.
        """
        problems = []
        for epoch in self.epochs:
            for child in sorted(epoch.children):
                parent, barrier = epoch.parent_barrier(child)
                if barrier is None or marks.get(child, -1) <= barrier:
                    continue
                if marks.get(parent, -1) < barrier:
                    problems.append(
                        f"partition {child} is read up to {marks[child]}, beyond its genesis at "
                        f"{barrier + 1}, but its parent {parent} only up to {marks.get(parent, -1)}, "
                        f"below its barrier {barrier}"
                    )
        return problems

    def encode(self) -> bytes:
        """The znode's JSON (docs/design/splits.md "The epochs znode's record form")."""
        return _dump(
            {
                "initial_count": self.initial_count,
                "epochs": [
                    {
                        "epoch": e.number,
                        "count": e.count,
                        "previous_count": e.previous_count,
                        "state": e.state.value,
                        "parents": {
                            str(p): {
                                "high_water_mark": progress.high_water_mark,
                                "sealing": progress.sealing,
                                "barrier": progress.barrier,
                            }
                            for p, progress in sorted(e.parents.items())
                        },
                        "children": {
                            str(c): {"opened": progress.opened, "genesis": progress.genesis}
                            for c, progress in sorted(e.children.items())
                        },
                    }
                    for e in self.epochs
                ],
            }
        )

    @classmethod
    def decode(cls, data: bytes, path: str) -> Self:
        """Read the znode's JSON, refusing what no split writes.

        Raises:
            MetadataError: not JSON, a format version other than 1, a field missing or of the
                wrong type, or values no sequence of steps writes (epochs out of order, a count
                not a multiple of the one before, parents or children other than the epoch's,
                a barrier not above ``H(p)``, a genesis other than ``B(p) + 1``, a state that
                disagrees with the progress); the message names the znode, the place in it and
                the field.
        """
        value = _load(data, path)
        initial = _field(value, "initial_count", int, path)
        if initial < 1:
            raise MetadataError(f"znode {path}: field 'initial_count' is {initial}, expected 1 or more")
        epochs: list[Epoch] = []
        before = initial
        raw_epochs = _field(value, "epochs", list, path)
        for index, raw in enumerate(raw_epochs):
            where = f"{path} (epochs[{index}])"
            if not isinstance(raw, dict):
                raise MetadataError(f"znode {where} is {raw!r}, expected an object")
            epoch = _decode_epoch(raw, where, index + 1, before)
            if epoch.unfinished and index != len(raw_epochs) - 1:
                raise MetadataError(
                    f"znode {where}: field 'state' is {epoch.state.value!r}, but a later epoch follows"
                )
            epochs.append(epoch)
            before = epoch.count
        return cls(initial, tuple(epochs))


def _optional_int(value: Mapping[str, Any], key: str, path: str) -> int | None:
    if key not in value:
        raise MetadataError(f"znode {path} lacks the field {key!r}")
    return None if value[key] is None else int(_field(value, key, int, path))


def _numbered(raw: Mapping[str, Any], key: str, expected: range, path: str) -> dict[int, dict[str, Any]]:
    """The object ``raw[key]`` keyed by partition number, holding exactly the ``expected`` ones."""
    items = _field(raw, key, dict, path)
    numbered: dict[int, dict[str, Any]] = {}
    for name, item in items.items():
        if not name.isdigit() or not isinstance(item, dict):
            raise MetadataError(f"znode {path}: field {key!r} holds {name!r}: {item!r}")
        numbered[int(name)] = item
    if set(numbered) != set(expected):
        raise MetadataError(
            f"znode {path}: field {key!r} holds partitions {sorted(numbered)}, "
            f"expected {expected.start}..{expected.stop - 1}"
        )
    return numbered


def _decode_epoch(raw: Mapping[str, Any], path: str, number: int, before: int) -> Epoch:
    found = _field(raw, "epoch", int, path)
    if found != number:
        raise MetadataError(f"znode {path}: field 'epoch' is {found}, expected {number}")
    count = _field(raw, "count", int, path)
    previous = _field(raw, "previous_count", int, path)
    if previous != before:
        raise MetadataError(f"znode {path}: field 'previous_count' is {previous}, expected {before}")
    if count < 2 * previous or count % previous:
        raise MetadataError(
            f"znode {path}: field 'count' is {count}, not a whole multiple of at least 2 of {previous}"
        )
    state_name = _field(raw, "state", str, path)
    try:
        state = EpochState(state_name)
    except ValueError:
        raise MetadataError(
            f"znode {path}: field 'state' is {state_name!r}, expected one of "
            f"{', '.join(s.value for s in EpochState)}"
        ) from None
    parents: dict[int, ParentProgress] = {}
    for p, item in sorted(_numbered(raw, "parents", range(previous), path).items()):
        where = f"{path} (parent {p})"
        progress = ParentProgress(
            _field(item, "high_water_mark", int, where),
            _field(item, "sealing", bool, where),
            _optional_int(item, "barrier", where),
        )
        if progress.high_water_mark < -1:
            raise MetadataError(f"znode {where}: field 'high_water_mark' is {progress.high_water_mark}")
        if progress.barrier is not None and not progress.sealing:
            raise MetadataError(f"znode {where}: field 'barrier' is set but the parent is not sealing")
        if progress.barrier is not None and progress.barrier <= progress.high_water_mark:
            raise MetadataError(
                f"znode {where}: field 'barrier' is {progress.barrier}, not above its high_water_mark "
                f"{progress.high_water_mark}"
            )
        parents[p] = progress
    children: dict[int, ChildProgress] = {}
    for c, item in sorted(_numbered(raw, "children", range(previous, count), path).items()):
        where = f"{path} (child {c})"
        child = ChildProgress(_field(item, "opened", bool, where), _optional_int(item, "genesis", where))
        barrier = parents[c % previous].barrier
        if child.opened and barrier is None:
            raise MetadataError(f"znode {where}: field 'opened' is true before its parent has a barrier")
        if child.genesis is not None and (
            not child.opened or barrier is None or child.genesis != barrier + 1
        ):
            raise MetadataError(
                f"znode {where}: field 'genesis' is {child.genesis}, expected an opened child's genesis at "
                f"its parent's barrier plus one ({barrier})"
            )
        children[c] = child
    sealing = any(progress.sealing for progress in parents.values())
    if (state is EpochState.PREPARING) == sealing:
        raise MetadataError(
            f"znode {path}: field 'state' is {state.value!r} while "
            f"{'a parent is' if sealing else 'no parent is'} sealing"
        )
    if state is EpochState.COMPLETE and any(child.genesis is None for child in children.values()):
        raise MetadataError(f"znode {path}: field 'state' is 'complete' while a child has no genesis")
    return Epoch(number, count, previous, state, parents, children)


class PartitionEpochsZk:
    """Read and change ``<root>/partitions/epochs`` by compare-and-set.

    Every change re-reads the znode, applies one step of :class:`PartitionEpochs` and writes the
    result with the version it read; when another writer was first, it reads again and decides
    again, at most :data:`MAX_CAS_ATTEMPTS` times (docs/design/zookeeper.md "Compare-and-set
    everywhere"). A step already taken writes nothing, so a split that stopped calls every step
    again (docs/design/splits.md "The handover").

    The znode and its parent ``<root>/partitions`` are created by the first :meth:`prepare`, with
    the ACL of the role table in a cluster made with roles (docs/design/zookeeper.md, "Roles"),
    else the session's default ACL; the session must then hold the operator's credential.

    Args:
        zk: a started kazoo client (the caller owns it).
        paths: the cluster's znode paths.
        timeout: seconds each ZooKeeper call waits for an answer; None waits as long as kazoo does.
    """

    def __init__(self, zk: KazooClient, paths: ClusterPaths, *, timeout: float | None = None) -> None:
        self.zk = zk
        self.paths = paths
        self.timeout = timeout

    def _wait(self, result: Any, what: str) -> Any:
        if self.timeout is None:
            return result.get()
        try:
            return result.get(timeout=self.timeout)
        except self.zk.handler.timeout_exception:
            raise ZooKeeperUnavailableError(
                f"ZooKeeper did not answer {what} within {self.timeout:g}s"
            ) from None

    def read(self, watch: Callable[..., None] | None = None) -> Versioned[PartitionEpochs]:
        """The epochs and the znode's version (-1: no split ever started; the value then holds
        no epoch and the count of ``discovery``).

        Args:
            watch: a one-shot kazoo watch, set on the znode (also when it does not exist yet).

        Raises:
            ClusterNotFoundError: no cluster exists under the root.
            MetadataError: the znode does not decode.
            ZooKeeperAuthError: the session may not read it.
            ZooKeeperUnavailableError: ZooKeeper did not answer within ``timeout``.
        """
        path = self.paths.epochs
        with zookeeper_access(self.zk, f"reading {path}"):
            try:
                data, stat = self._wait(self.zk.get_async(path, watch=watch), f"a read of {path}")
            except NoNodeError:
                if watch is not None:
                    self._wait(self.zk.exists_async(path, watch=watch), f"whether {path} exists")
                discovery = ClusterZk(self.zk, self.paths.root, timeout=self.timeout).discovery()
                return Versioned(PartitionEpochs(discovery.num_partitions), -1)
        return Versioned(PartitionEpochs.decode(data, path), stat.version)

    def _write(self, value: PartitionEpochs, version: int) -> int:
        """Create (``version`` -1) or compare-and-set the znode; returns its new version.

        Raises:
            StaleMetadataError: the znode was created, changed or deleted since ``version``.
        """
        path = self.paths.epochs
        if version >= 0:
            try:
                with zookeeper_access(self.zk, f"writing {path}"):
                    stat = self._wait(
                        self.zk.set_async(path, value.encode(), version=version), f"a write of {path}"
                    )
            except (BadVersionError, NoNodeError):
                raise StaleMetadataError(f"znode {path} changed since version {version}") from None
            return int(stat.version)
        with zookeeper_access(self.zk, f"creating {path}"):
            roles = ClusterAccess(self.zk, self.paths, timeout=self.timeout).roles()
            for target, data in ((self.paths.partitions_parent, b""), (path, value.encode())):
                acl = roles.acl_for(self.paths.relative(target)) if roles is not None else None
                try:
                    self._wait(self.zk.create_async(target, data, acl=acl), f"a create of {target}")
                except NodeExistsError:
                    if target == path:
                        raise StaleMetadataError(f"znode {path} was created by another writer") from None
        return 0

    def _update(
        self, what: str, step: Callable[[PartitionEpochs], PartitionEpochs]
    ) -> Versioned[PartitionEpochs]:
        for _ in range(MAX_CAS_ATTEMPTS):
            current = self.read()
            new = step(current.value)
            if new == current.value:
                return current
            try:
                version = self._write(new, current.version)
            except StaleMetadataError:
                continue
            log.info("%s: %s", self.paths.epochs, what)
            return Versioned(new, version)
        raise StaleMetadataError(
            f"znode {self.paths.epochs} kept changing: gave up after {MAX_CAS_ATTEMPTS} attempts"
        )

    def prepare(self, count: int, high_water_marks: Mapping[int, int]) -> Versioned[PartitionEpochs]:
        """Add the next epoch with ``count`` partitions (:meth:`PartitionEpochs.prepare`).

        Returns:
            The znode's value and version after the step (unchanged when the newest epoch
            already has ``count``).

        Raises:
            SplitStateError: as :meth:`PartitionEpochs.prepare`.
            StaleMetadataError: the znode kept changing under the update.
            ClusterNotFoundError: no cluster exists under the root.
            ZooKeeperAuthError: the session may not write it (servers and clients do not create it).
        """
        return self._update(f"prepare a split to {count}", lambda v: v.prepare(count, high_water_marks))

    def mark_sealing(self, epoch: int, parent: int) -> Versioned[PartitionEpochs]:
        """Mark a parent sealing (:meth:`PartitionEpochs.mark_sealing`); raises as :meth:`prepare`."""
        return self._update(
            f"epoch {epoch}: parent {parent} sealing", lambda v: v.mark_sealing(epoch, parent)
        )

    def set_barrier(self, epoch: int, parent: int, transaction_id: int) -> Versioned[PartitionEpochs]:
        """Write a parent's barrier ``B(p)`` once (:meth:`PartitionEpochs.set_barrier`); raises as
        :meth:`prepare`, with :class:`SplitStateError` when another barrier was written first."""
        return self._update(
            f"epoch {epoch}: parent {parent}'s barrier at {transaction_id}",
            lambda v: v.set_barrier(epoch, parent, transaction_id),
        )

    def mark_opened(self, epoch: int, child: int) -> Versioned[PartitionEpochs]:
        """Mark a new child opened (:meth:`PartitionEpochs.mark_opened`); raises as :meth:`prepare`."""
        return self._update(f"epoch {epoch}: child {child} opened", lambda v: v.mark_opened(epoch, child))

    def set_genesis(self, epoch: int, child: int, transaction_id: int) -> Versioned[PartitionEpochs]:
        """Write a new child's genesis (:meth:`PartitionEpochs.set_genesis`); raises as :meth:`prepare`."""
        return self._update(
            f"epoch {epoch}: child {child}'s genesis at {transaction_id}",
            lambda v: v.set_genesis(epoch, child, transaction_id),
        )

    def complete(self, epoch: int) -> Versioned[PartitionEpochs]:
        """Move an epoch to ``complete`` (:meth:`PartitionEpochs.complete`); raises as :meth:`prepare`."""
        return self._update(f"epoch {epoch} complete", lambda v: v.complete(epoch))

    def abort(self, epoch: int) -> Versioned[PartitionEpochs]:
        """Delete an epoch no parent of which is sealing (:meth:`PartitionEpochs.abort`); raises as
        :meth:`prepare`."""
        return self._update(f"epoch {epoch} aborted", lambda v: v.abort(epoch))
