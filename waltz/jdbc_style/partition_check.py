"""A check that entity transactions keep to one partition, for a test suite or a start-up.

Source: docs/design/sql.md "Entity transactions" (one partition per transaction; the partition of
an entity is its model's ``partition_by`` or the default mapping). ``submit`` refuses a context
whose entities map to different partitions (``CrossPartitionError``), but only for the keys a
request happens to carry: a mapping that splits some transactions passes a one-row smoke test and
fails in production. :func:`check_partition_mapping` runs a context factory over many sample
inputs and partition counts and names the first input whose entities are split::

    def test_every_order_stays_with_its_customer():
        samples = [(customer, order) for customer in range(200) for order in (1, 77)]
        check_partition_mapping(lambda s: PlaceOrder(callbacks, *s), samples, num_partitions=range(1, 33))
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from waltz.errors import CrossPartitionError
from waltz.jdbc_style.entities import EntityInfo
from waltz.jdbc_style.entity_context import EntityTransactionContext

__all__ = ["check_partition_mapping"]

S = TypeVar("S")


def check_partition_mapping(
    context: Callable[[S], EntityTransactionContext],
    samples: Iterable[S],
    *,
    num_partitions: int | Iterable[int],
) -> int:
    """Check that every entity a context is about maps to one partition, for each sample input
    and partition count (docs/design/sql.md "Entity transactions": one partition per
    transaction).

    For each sample, ``context(sample)`` makes the context (nothing is submitted or read); its
    declared entities (the constructor's ``(model, key)`` pairs) must map to one partition, and
    the entities it expects :meth:`~EntityTransactionContext.run` to read
    (:meth:`~EntityTransactionContext.prefetch_entities`: those of ``expected_models`` with the
    declared keys, and any it adds) to that partition too: ``run`` would fail reading one of
    another partition. A hint whose key does not fit its model is left out, as the framework
    leaves it out. Give samples of the inputs real requests carry (a context that legitimately
    refuses some inputs, e.g. two customers of different partitions, should get only those it
    accepts), and the partition counts the log has or may have.

    Args:
        context: makes an entity transaction context from one sample, e.g.
            ``lambda s: ReleaseOrder(callbacks, *s)``.
        samples: sample inputs, at least one (a list, a generator, or one example a hypothesis
            test draws).
        num_partitions: a partition count, or several (e.g. ``range(1, 33)``), each at least 1.

    Returns:
        The number of (sample, partition count) pairs checked.

    Raises:
        CrossPartitionError: naming the first counter-example: the context class, the sample, the
            partition count, and each entity with its key and partition.
        ValueError: no samples or no partition count, a count below 1, a key with the wrong
            number of values, or a ``partition_by`` that gave a partition outside the range (its
            notes name the sample).
        UnknownEntityError: a model is not declared (its notes name the sample).
    """
    counts = [num_partitions] if isinstance(num_partitions, int) else list(num_partitions)
    if not counts or min(counts) < 1:
        raise ValueError(f"num_partitions must name partition counts of at least 1, got {num_partitions!r}")
    checked = 0
    for sample in samples:
        try:
            made = context(sample)
            declared, expected = _entities_of(made)
            for count in counts:
                _check(made, sample, count, declared, expected)
        except CrossPartitionError:
            raise
        except Exception as exc:  # raised again, with the sample that raised it
            exc.add_note(f"check_partition_mapping: while checking the sample {sample!r}")
            raise
        checked += len(counts)
    if not checked:
        raise ValueError("check_partition_mapping got no samples: a check of nothing would pass")
    return checked


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
