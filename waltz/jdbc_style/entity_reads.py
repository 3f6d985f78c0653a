"""Reading entities outside a transaction: from the entity cache, else the database at its mark.

Source: docs/design/sql.md "Reading entities outside a transaction". A read-only request of an
application (a balance, a status page) needs no log transaction: it reads entities as of one
position of their partition. :func:`read_entities` (``callbacks.read_entities``) answers from
the entity cache when it holds every entity asked for (their rows at the cache's position:
absorbed commits included, no database round trip), and otherwise from a database snapshot
that reads the partition's mark and the rows in one statement. When that snapshot is older than
the cache's position, the rows read are taken at the position if the cache can vouch for them
(as an attempt's read behind the cache does), or read again once this instance's applies
reached the position (a bounded wait: 5 s, none on an apply thread or while the partition's apply
is failing); so that a read does not go back behind an earlier read of the same entities from the
cache unless the applies are that far behind.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, NamedTuple, Protocol

from waltz.client.apply_worker import on_apply_thread
from waltz.client.routing import PartitionRouter
from waltz.errors import CrossPartitionError
from waltz.jdbc_style.entities import EntityInfo, EntityRegistry, rows_by_model
from waltz.jdbc_style.entity_cache import EntityCache
from waltz.jdbc_style.mark_snapshot import MarkSnapshot

__all__ = ["EntityRead", "EntityReadSource", "read_entities", "read_entities_from_cache"]

#: Seconds a read waits for ``after`` to be applied by default.
DEFAULT_TIMEOUT = 30.0

_Key = tuple[EntityInfo, tuple[Any, ...]]


class EntityReadSource(Protocol):
    """What :func:`read_entities` reads through: an instance's declared models, its entity cache,
    its snapshots at the mark and its waits for applies (``ChangeSetCallbacks`` is one).

    Attributes:
        registry: the declared models.
        entity_cache: the entity cache, or None (off).
    """

    @property
    def registry(self) -> EntityRegistry: ...

    @property
    def entity_cache(self) -> EntityCache | None: ...

    def snapshot(
        self, partition_id: int, *, entities: Sequence[tuple[EntityInfo, tuple[Any, ...]]] = ...
    ) -> AbstractContextManager[MarkSnapshot]:
        """A read transaction that read the partition's mark first, and ``entities`` with it."""

    def wait_for(self, partition_id: int, transaction_id: int, timeout: float | None = None) -> bool:
        """Wait until the database applied ``transaction_id`` of the partition; False on timeout."""

    def catch_up_to_cache(self, partition_id: int) -> None:
        """Before a database read: wait (bounded) for this instance's applies to reach the entity
        cache's position."""


class EntityRead(NamedTuple):
    """What :func:`read_entities` read.

    Attributes:
        partition_id: the entities' partition.
        high_water_mark: the partition's position the entities are at: every transaction of the
            partition up to it is in them, none after it (-1: none applied yet).
        entities: one detached instance per requested entity, in the order asked, or None where
            the entity has no row.
        from_cache: True when the entity cache answered without a database round trip.
    """

    partition_id: int
    high_water_mark: int
    entities: list[Any]
    from_cache: bool


def read_entities(
    source: EntityReadSource,
    entities: Sequence[tuple[type[Any], Any]],
    *,
    num_partitions: int | PartitionRouter,
    after: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> EntityRead:
    """Read declared entities of one partition as of one position, without a log transaction:
    what ``ChangeSetCallbacks.read_entities`` does, through ``source`` (the instance's callbacks;
    their entity cache, when on, answers first). Its docstring gives the other arguments, the
    result and the errors raised (and ``sqlalchemy.exc.DBAPIError`` when the database fails
    beyond the callbacks' retries).
    """
    partition_id, keys, cacheable = _locate(source, entities, num_partitions)
    after = _after_genesis(num_partitions, partition_id, after)
    cached = _from_cache(source, partition_id, keys, cacheable, after)
    if cached is not None:
        return cached
    read = _from_database(source, partition_id, keys, cacheable)
    if after is not None and read.high_water_mark < after:
        if on_apply_thread(partition_id):
            raise RuntimeError(
                f"read_entities(after={after}) on partition {partition_id}'s apply thread, which would "
                f"wait for its own apply (the read is at {read.high_water_mark}): read without after there"
            )
        if not source.wait_for(partition_id, after, timeout):
            raise TimeoutError(
                f"transaction {after} of partition {partition_id} was not applied within {timeout:g}s"
            )
        read = _from_database(source, partition_id, keys, cacheable)
    return read


def read_entities_from_cache(
    source: EntityReadSource,
    entities: Sequence[tuple[type[Any], Any]],
    *,
    num_partitions: int | PartitionRouter,
    after: int | None = None,
) -> EntityRead | None:
    """What :func:`read_entities` answers from the entity cache alone (no database, no wait: fit
    for an event loop), or None when it would read the database (docs/design/sql.md "The SQL
    framework on asyncio"). Raises what :func:`read_entities` raises for the arguments."""
    partition_id, keys, cacheable = _locate(source, entities, num_partitions)
    return _from_cache(
        source, partition_id, keys, cacheable, _after_genesis(num_partitions, partition_id, after)
    )


def _after_genesis(num_partitions: int | PartitionRouter, partition_id: int, after: int | None) -> int | None:
    """``after``, raised to a new partition's genesis when the partition was routed by the client:
    a new partition of a split is read once its genesis is applied, since before it its parent may
    not be applied up to the barrier and the keys' rows miss their last changes there
    (docs/design/splits.md "The SQL framework across a split")."""
    if isinstance(num_partitions, int):
        return after
    start = num_partitions.first_transaction_id(partition_id)
    return start if start > 0 and (after is None or after < start) else after


def _locate(
    source: EntityReadSource,
    entities: Sequence[tuple[type[Any], Any]],
    num_partitions: int | PartitionRouter,
) -> tuple[int, list[_Key], bool]:
    """The entities' partition (at a count, or routed by the client's view of the partition
    epochs, docs/design/splits.md "Clients across a split"), their keys, and whether the entity
    cache may hold them all."""
    if not entities:
        raise ValueError("read_entities needs at least one (model, key) pair")
    registry = source.registry
    keys: list[_Key] = []
    for model, key in entities:
        info = registry.info(model)
        keys.append((info, info.normalize_key(key)))
    choose = functools.partial(_shared_partition, keys)
    if isinstance(num_partitions, int):
        partition_id = choose(num_partitions)
    else:
        partition_id = num_partitions.partition_for(choose)
    cache = source.entity_cache
    return partition_id, keys, cache is not None and cache.kept(keys)


def _shared_partition(keys: list[_Key], num_partitions: int) -> int:
    """The one partition of ``keys`` at ``num_partitions``.

    Raises:
        CrossPartitionError: they are on more than one.
    """
    partitions = {info.partition_of(values, num_partitions) for info, values in keys}
    if len(partitions) > 1:
        raise CrossPartitionError(
            f"entities read together must share a partition; these are on partitions {sorted(partitions)} "
            "(read each partition's on its own)"
        )
    return partitions.pop()


def _from_cache(
    source: EntityReadSource, partition_id: int, keys: list[_Key], cacheable: bool, after: int | None
) -> EntityRead | None:
    """The entities from the entity cache when it holds them all (at ``after`` at least)."""
    cache = source.entity_cache
    if cache is None or not cacheable:
        return None
    cached = cache.read(partition_id, keys)
    if cached is None or (after is not None and cached[0] < after):
        return None
    return EntityRead(partition_id, cached[0], _instances(keys, cached[1], {}), True)


def _from_database(
    source: EntityReadSource, partition_id: int, keys: list[_Key], cacheable: bool
) -> EntityRead:
    """The entities read from a database snapshot, at the cache's position when it is ahead of
    the snapshot and can vouch for the rows read (``cacheable``: every entity is of a kept model,
    by a key of its columns' kinds)."""
    cache = source.entity_cache
    if cache is not None and not cacheable:
        source.catch_up_to_cache(partition_id)  # as an attempt with an entity it does not keep
    mark, rows, loaded = _read_database(source, partition_id, keys)
    if cache is not None and cacheable:
        position = cache.position(partition_id)
        if position is not None and mark < position:
            overlaid = None if loaded else cache.overlay(partition_id, mark, rows.items())
            if overlaid is not None:
                return EntityRead(partition_id, overlaid[0], _instances(keys, overlaid[1], {}), False)
            # Rows the cache cannot vouch for at its position: read them once this instance's
            # applies got there (a bounded wait: the read may still find the database behind).
            source.catch_up_to_cache(partition_id)
            mark, rows, loaded = _read_database(source, partition_id, keys)
        cache.fill(partition_id, mark, rows.items())
    return EntityRead(partition_id, mark, _instances(keys, rows, loaded), False)


def _hashable(key: _Key) -> bool:
    try:
        hash(key)
    except TypeError:
        return False
    return True


def _read_database(
    source: EntityReadSource, partition_id: int, keys: list[_Key]
) -> tuple[int, dict[_Key, Any], dict[int, Any]]:
    """The partition's mark and the entities of ``keys`` in one snapshot: ``(mark, {key: row or
    None}, {index in keys: instance or None})``. Rows are read with the mark (one statement) and,
    for the entities beyond what that statement joins, by key per model (``IN`` statements);
    entities of models the ORM must load, or by unhashable key values, are loaded as instances."""
    hashable = [key for key in keys if _hashable(key)]
    with source.snapshot(partition_id, entities=hashable) as snapshot:
        rows: dict[_Key, Any] = dict(snapshot.prefetched)
        rows.update(rows_by_model(snapshot.connection, [key for key in hashable if key not in rows])[0])
        loaded = {
            index: key[0].load(snapshot.connection, key[1])
            for index, key in enumerate(keys)
            if not (_hashable(key) and key in rows)
        }
        return snapshot.high_water_mark, rows, loaded


def _instances(keys: list[_Key], rows: dict[_Key, Any], loaded: dict[int, Any]) -> list[Any]:
    """The instance (or None) of each key, from its row or as loaded."""
    found: list[Any] = []
    for index, key in enumerate(keys):
        if index in loaded:
            found.append(loaded[index])
        else:
            row = rows[key]
            found.append(None if row is None else key[0].entity_from_row(row))
    return found
