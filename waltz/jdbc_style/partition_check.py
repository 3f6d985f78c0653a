"""A check that entity transactions keep to one partition, for a test suite or a start-up.

Source: docs/design/sql.md "Entity transactions" (one partition per transaction; the partition of
an entity is its model's ``partition_by`` or the default mapping). ``submit`` refuses a context
whose entities map to different partitions (``CrossPartitionError``), but only for the keys a
request happens to carry: a mapping that splits some transactions passes a one-row smoke test and
fails in production. :func:`check_partition_mapping` runs a context factory over many sample
inputs and partition counts and names the first input whose entities are split::

    def test_every_order_stays_with_its_customer():
        samples = [(customer, order) for customer in range(200) for order in (1, 77)]
        check = check_partition_mapping(
            lambda s: PlaceOrder(callbacks, *s), samples, num_partitions=range(1, 33), split_factors=(2, 4)
        )
        assert check.split_findings == ()

It also checks the same samples against a split of the log to ``k`` times its partitions
(docs/design/splits.md, "The routing rule" and "Why no update is lost"): whether each entity's
mapping is divisible, and whether each context's entities stay together. What a split would break
is no error at today's count, so it is reported in the result (:class:`SplitFinding`), not raised.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from waltz.errors import CrossPartitionError
from waltz.jdbc_style.entities import EntityInfo
from waltz.jdbc_style.entity_context import EntityTransactionContext

__all__ = [
    "PartitionMappingCheck",
    "SplitEntity",
    "SplitFinding",
    "SplitFindingKind",
    "check_partition_mapping",
]

logger = logging.getLogger(__name__)

S = TypeVar("S")


class SplitFindingKind(enum.Enum):
    """What a split of the log would break (docs/design/splits.md, "The routing rule")."""

    NOT_DIVISIBLE = "not divisible"
    """An entity's partition after the split is not one of its partition's children: the
    mapping gives ``f(key, k * C) mod C != f(key, C)``, so the log cannot be split at all."""

    CONTEXT_PARTS = "context parts"
    """A context's entities share a partition at ``C`` but not at ``k * C``: after the split,
    ``submit`` would refuse the context with ``CrossPartitionError``."""


@dataclass(frozen=True, slots=True)
class SplitEntity:
    """One entity of a :class:`SplitFinding`, with its partition before and after the split.

    Attributes:
        model: the model's class name, e.g. ``"Order"``.
        key: the entity's key values in declared order, e.g. ``(5, 1001)``.
        role: ``"declared"`` (given to the context's constructor) or ``"expected"`` (one the
            context expects ``run`` to read, from ``prefetch_entities``).
        partition: its partition at the count checked, ``C``.
        split_partition: its partition at ``k * C``.
    """

    model: str
    key: tuple[Any, ...]
    role: str
    partition: int
    split_partition: int


@dataclass(frozen=True, slots=True)
class SplitFinding:
    """A sample whose context would not survive a split of the log from ``C`` to ``k * C``
    partitions (docs/design/splits.md, "The routing rule" and "Why no update is lost").

    Attributes:
        kind: what the split breaks.
        context: the context's class name.
        sample: the sample input the context was made from.
        num_partitions: the count checked, ``C``.
        split_to: the count after the split, ``k * C``.
        entities: for :attr:`SplitFindingKind.NOT_DIVISIBLE`, the one entity whose partitions
            disagree; for :attr:`SplitFindingKind.CONTEXT_PARTS`, every entity of the context.
    """

    kind: SplitFindingKind
    context: str
    sample: Any
    num_partitions: int
    split_to: int
    entities: tuple[SplitEntity, ...]

    @property
    def message(self) -> str:
        """One line that says what the split would break and what to do."""
        where = f"a split from {self.num_partitions} to {self.split_to} partitions"
        if self.kind is SplitFindingKind.NOT_DIVISIBLE:
            (entity,) = self.entities
            return (
                f"{self.context} from the sample {self.sample!r}: {entity.model}{entity.key!r} is in "
                f"partition {entity.partition} of {self.num_partitions} but in partition "
                f"{entity.split_partition} of {self.split_to}, not one of partition {entity.partition}'s "
                f"children ({entity.split_partition} mod {self.num_partitions} = "
                f"{entity.split_partition % self.num_partitions}): {entity.model}'s mapping is not "
                f"divisible, so a log that uses it cannot be split from {self.num_partitions} to "
                f"{self.split_to} partitions. Only a divisible mapping "
                "can be split (default_partition, or a partition_by that applies it to part of "
                "the key), and a mapping is fixed once the log holds entities"
            )
        partitions = len({entity.split_partition for entity in self.entities})
        return (
            f"{self.context} from the sample {self.sample!r} would be refused after {where}: its "
            f"entities span {partitions} of {self.split_to} partitions: "
            + "; ".join(
                f"{e.model}{e.key!r} ({e.role}) -> partition {e.split_partition} "
                f"({e.partition} of {self.num_partitions})"
                for e in self.entities
            )
            + ". Map them together (e.g. a partition_by that gives default_partition of the shared "
            "part of their keys) before splitting, or split the transaction"
        )

    def __str__(self) -> str:
        """The finding's :attr:`message`."""
        return self.message


@dataclass(frozen=True, slots=True)
class PartitionMappingCheck:
    """What :func:`check_partition_mapping` checked and what a split would break.

    Attributes:
        checked: the number of (sample, partition count) pairs checked; none of them spans two
            partitions (the check raises otherwise).
        split_factors: the split factors ``k`` checked, each at least 2 (empty: no split check).
        split_findings: for each split factor and each :class:`SplitFindingKind`, the first
            sample that breaks, in the order found (sample by sample, each at every count given);
            empty when every context checked survives every split checked.
    """

    checked: int
    split_factors: tuple[int, ...]
    split_findings: tuple[SplitFinding, ...]

    @property
    def splittable(self) -> bool:
        """True when no split finding was made: the samples survive every split checked."""
        return not self.split_findings


def check_partition_mapping(
    context: Callable[[S], EntityTransactionContext],
    samples: Iterable[S],
    *,
    num_partitions: int | Iterable[int],
    split_factors: int | Iterable[int] = (2,),
) -> PartitionMappingCheck:
    """Check that every entity a context is about maps to one partition, for each sample input
    and partition count, and whether that survives a split of the log (docs/design/sql.md
    "Entity transactions": one partition per transaction; docs/design/splits.md "The routing
    rule").

    For each sample, ``context(sample)`` makes the context (nothing is submitted or read); its
    declared entities (the constructor's ``(model, key)`` pairs) must map to one partition, and
    the entities it expects :meth:`~EntityTransactionContext.run` to read
    (:meth:`~EntityTransactionContext.prefetch_entities`: those of ``expected_models`` with the
    declared keys, and any it adds) to that partition too: ``run`` would fail reading one of
    another partition. A hint whose key does not fit its model is left out, as the framework
    leaves it out. Give samples of the inputs real requests carry (a context that legitimately
    refuses some inputs, e.g. two customers of different partitions, should get only those it
    accepts), and the partition counts the log has or may have.

    The same entities are then checked at ``k * C`` for each split factor ``k`` and count ``C``:
    each entity's partition there must be one of its partition's children (``f(key, k * C) mod C
    == f(key, C)``), and the context's entities must still share a partition. A failure of either
    is no error at ``C``; it is reported in the result's ``split_findings`` (the first sample of
    each kind for each factor) and logged as a warning.

    Args:
        context: makes an entity transaction context from one sample, e.g.
            ``lambda s: ReleaseOrder(callbacks, *s)``.
        samples: sample inputs, at least one (a list, a generator, or one example a hypothesis
            test draws).
        num_partitions: a partition count, or several (e.g. ``range(1, 33)``), each at least 1.
        split_factors: the split factors ``k`` to check, each at least 2 (a split multiplies the
            count by a whole ``k``); ``()`` checks no split.

    Returns:
        The number of (sample, partition count) pairs checked and the split findings.

    Raises:
        CrossPartitionError: naming the first counter-example at a count given: the context
            class, the sample, the partition count, and each entity with its key and partition.
        ValueError: no samples, no partition count, a count below 1, a split factor below 2, a
            key with the wrong number of values, or a ``partition_by`` that gave a partition
            outside the range (its notes name the sample).
        UnknownEntityError: a model is not declared (its notes name the sample).
    """
    counts = [num_partitions] if isinstance(num_partitions, int) else list(num_partitions)
    if not counts or min(counts) < 1:
        raise ValueError(f"num_partitions must name partition counts of at least 1, got {num_partitions!r}")
    factors = tuple(dict.fromkeys([split_factors] if isinstance(split_factors, int) else split_factors))
    if factors and min(factors) < 2:
        raise ValueError(
            f"split_factors must be whole factors of at least 2 (a split multiplies the partition count), "
            f"got {split_factors!r}"
        )
    findings: dict[tuple[int, SplitFindingKind], SplitFinding] = {}
    checked = 0
    for sample in samples:
        try:
            made = context(sample)
            declared, expected = _entities_of(made)
            for count in counts:
                _check(made, sample, count, declared, expected)
                for factor in factors:
                    for finding in _split_findings(made, sample, count, factor, declared, expected):
                        findings.setdefault((factor, finding.kind), finding)
        except CrossPartitionError:
            raise
        except Exception as exc:  # raised again, with the sample that raised it
            exc.add_note(f"check_partition_mapping: while checking the sample {sample!r}")
            raise
        checked += len(counts)
    if not checked:
        raise ValueError("check_partition_mapping got no samples: a check of nothing would pass")
    ordered = tuple(findings.values())
    for finding in ordered:
        logger.warning("check_partition_mapping: %s", finding.message)
    return PartitionMappingCheck(checked, factors, ordered)


_Entity = tuple[EntityInfo, tuple[Any, ...]]


def _entities_of(context: EntityTransactionContext) -> tuple[list[_Entity], list[_Entity]]:
    """A context's declared entities and the other entities it expects to read."""
    registry = context.callbacks.registry
    declared = [(registry.info(model), key) for model, key in context.declared_entities]
    expected: list[_Entity] = []
    for model, key in context.prefetch_entities():
        info = registry.info(model)
        try:
            values = info.normalize_key(key)
        except ValueError:  # a hint of another shape: the framework leaves it out too
            continue
        if (info, values) not in declared and (info, values) not in expected:
            expected.append((info, values))
    return declared, expected


def _check(
    context: EntityTransactionContext,
    sample: object,
    num_partitions: int,
    declared: list[_Entity],
    expected: list[_Entity],
) -> None:
    """Raise :class:`CrossPartitionError` when the entities map to more than one partition."""
    placed = [(info, key, info.partition_of(key, num_partitions), "declared") for info, key in declared]
    placed += [(info, key, info.partition_of(key, num_partitions), "expected") for info, key in expected]
    partitions = {partition for _, _, partition, _ in placed}
    if len(partitions) < 2:
        return
    entities = "; ".join(
        f"{info.model.__name__}{key!r} ({kind}) -> partition {partition}"
        for info, key, partition, kind in placed
    )
    raise CrossPartitionError(
        f"{type(context).__name__} from the sample {sample!r} spans {len(partitions)} of "
        f"{num_partitions} partitions: {entities}. A transaction's entities must share a partition: "
        "map them together (e.g. a partition_by that gives default_partition(key[:1], "
        "num_partitions) of the shared part of their keys), or split the transaction"
    )


def _split_findings(
    context: EntityTransactionContext,
    sample: object,
    num_partitions: int,
    factor: int,
    declared: list[_Entity],
    expected: list[_Entity],
) -> list[SplitFinding]:
    """What a split from ``num_partitions`` to ``factor`` times as many would break for a context
    whose entities share a partition at ``num_partitions``: the first entity whose mapping is not
    divisible, and the context itself if its entities part."""
    split_to = factor * num_partitions
    entities = tuple(
        SplitEntity(
            info.model.__name__,
            key,
            role,
            info.partition_of(key, num_partitions),
            info.partition_of(key, split_to),
        )
        for role, placed in (("declared", declared), ("expected", expected))
        for info, key in placed
    )

    def finding(kind: SplitFindingKind, of: tuple[SplitEntity, ...]) -> SplitFinding:
        return SplitFinding(kind, type(context).__name__, sample, num_partitions, split_to, of)

    findings = []
    stray = next((e for e in entities if e.split_partition % num_partitions != e.partition), None)
    if stray is not None:
        findings.append(finding(SplitFindingKind.NOT_DIVISIBLE, (stray,)))
    if len({entity.split_partition for entity in entities}) > 1:
        findings.append(finding(SplitFindingKind.CONTEXT_PARTS, entities))
    return findings
