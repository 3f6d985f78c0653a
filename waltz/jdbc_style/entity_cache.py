"""The entity cache: rows an instance knows as of a partition's position, so that an entity
transaction's attempt can run without a database snapshot.

Source: docs/design/sql.md "The entity cache" (and "Entity transactions" for the snapshot it
stands in for); docs/design/locks.md "Optimistic locking in Waltz" (why an attempt built from
rows of an earlier state is never committed wrongly).

Per partition the cache keeps a *position* P and rows ``{(entity info, key values): row or
None}``, each exactly the entity's row in the database at P (None: no row at P). An attempt whose
entities are all cached reads them at P and sends P as its client high-water mark, which is what a
snapshot at mark P would have given: the server's lock check then refuses it if a transaction
after P wrote one of its locks, exactly as for a snapshot.

How the rows stay exact:

- The cache moves by the committed transactions of the partition, in order, starting right after
  P (:meth:`EntityCache.absorb`): the client hands each apply batch to the callbacks before it
  applies it (``absorb_transactions``), and an apply without the client moves it after its
  database transaction commits. A change-set's insert or update carries the whole row; a row is
  kept only when every value is of a type the database stores as given (:func:`column_kinds`)
  and the model's table is no other declared model's, else the entry is dropped (read from the
  database next time).
- Keys are kept only as values of their columns' kinds (``int`` for an integer column, ``str``
  for a string column where strings are keys at all): a key given as another type (``"5"`` for
  5) names the same row in the database but not in the cache (nor in the lock table), so such a
  read goes to the database and such a change empties the cache.
- String key columns are kept only on a database that compares them exactly
  (``exact_string_keys``: PostgreSQL and SQLite, whose default collations tell ``'abc'``,
  ``'ABC'`` and ``'abc '`` apart), and only without a collation of the column's own; elsewhere
  (MariaDB's default collations equate them) such models are never kept.
- Anything the cache cannot follow exactly resets it to an empty cache at the new mark: a group
  that does not start at P + 1, a floor (transactions found applied at a mount), a transaction
  that is not a change-set, a change the cache cannot place by its entity key. A split's barrier
  changes no row and is followed as a transaction without change-sets; its genesis starts a new
  child's log and resets the child (docs/design/splits.md "The SQL framework across a split").
- A change-set with an idempotency key is followed too, but its apply may skip its changes (an
  earlier transaction carried the key): each entry it leaves is *pending* on the change-set (its
  transaction, and its member in a batch: docs/design/sql.md "Batched change-sets"), unknown to
  attempts, until the apply of that change-set tells whether it recorded the key
  first (:meth:`EntityCache.settle`): then the entry is the row it carried, else "changed, row
  unknown". A later change of the same key replaces the entry as usual (a whole row does not
  depend on whether the keyed change before it was applied). An attempt whose entities are all
  cached but for pending entries waits (bounded) for this instance's applies to reach the
  position, which settles them, and then reads the cache (:meth:`EntityCache.pending`).
- What the database may not hold as absorbed drops the rows: an apply that failed (an operator
  may skip the transaction; P stays), a group another instance applied, whole or in part (P
  moves up to the database's mark when that is ahead, :meth:`EntityCache.floor`).
- P may be ahead of the database (absorbed, not yet applied). Since the rows were last emptied
  (at position S), every change the cache absorbed left an entry: the row, None, or "changed,
  row unknown" (a change that did not carry the whole row, or a value not kept). So a row read
  from the database at a mark M with S <= M <= P, of a key the cache has no entry for, is still
  the row at P: no transaction after M changed it (:meth:`EntityCache.overlay`). An attempt
  that must read the database takes its rows that way; when it cannot (M below S, an entry
  "changed, row unknown"), it waits, for a bounded time, until this instance's applies reach P.
- Rows read from the database are added only when they are known to be the rows at P: read at a
  mark equal to P (:meth:`EntityCache.fill`), or by :meth:`EntityCache.overlay`.

Bounded: at most ``max_entries`` rows per partition; past that the partition's rows are dropped
(the position stays).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Boolean, Enum, Integer, String
from sqlalchemy.types import CHAR

from waltz.jdbc_style.changeset import ChangeSet, Operation
from waltz.jdbc_style.entities import EntityInfo, EntityRegistry
from waltz.jdbc_style.schema import ExactText

__all__ = ["DEFAULT_MAX_ENTRIES", "MISSING", "EntityCache", "column_kinds"]

#: Rows kept per partition before its rows are dropped.
DEFAULT_MAX_ENTRIES = 100_000

Key = tuple[EntityInfo, tuple[Any, ...]]
Kinds = tuple[tuple[type, int | None, bool], ...]
KeyKinds = tuple[tuple[type, int | None], ...]


def column_kinds(info: EntityInfo, exact_string_keys: bool = False) -> Kinds | None:
    """What each column of the model holds, ``(Python type, string length or None, nullable)``,
    when its rows can be kept exactly, else None: rows read by one plain statement
    (``EntityInfo.row_statement``), keyed by integer columns, or also by string columns without
    a collation of their own when ``exact_string_keys`` (the database compares strings exactly:
    otherwise two spellings of one key, e.g. by case or trailing spaces under a database's
    collation, could name one row), or by :class:`~waltz.jdbc_style.schema.ExactText` columns on
    any database, every column SQLAlchemy's own integer, string (not
    fixed-width ``CHAR``, not ``Enum``) or boolean type, and no update default (a value the
    database or SQLAlchemy sets on update would not be in the change-set)."""
    if info.row_statement is None:
        return None
    kinds: list[tuple[type, int | None, bool]] = []
    for name, column in zip(info.attributes, info.columns, strict=True):
        sql_type = column.type
        if column.onupdate is not None or column.server_onupdate is not None:
            return None
        exact_text = isinstance(sql_type, ExactText)  # compared byte for byte on every backend
        if type(sql_type).__module__.split(".")[0] != "sqlalchemy" and not exact_text:
            return None  # a TypeDecorator or an application's own type: its values may change
        if isinstance(sql_type, Boolean):
            kind: type = bool
        elif isinstance(sql_type, Integer):
            kind = int
        elif isinstance(sql_type, String) and not isinstance(sql_type, (CHAR, Enum)):
            kind = str
        else:
            return None
        exact_key = kind is int or (
            kind is str
            and (exact_text or (exact_string_keys and getattr(sql_type, "collation", None) is None))
        )
        if name in info.key and not exact_key:
            return None
        length = getattr(sql_type, "length", None) if kind is str else None
        kinds.append((kind, length, bool(column.nullable)))
    return tuple(kinds)


def exact_row(info: EntityInfo, kinds: Kinds, row: tuple[Any, ...]) -> bool:
    """Whether a whole row (values in ``info.attributes`` order) is of its columns' kinds
    (:func:`column_kinds`), its key values too: a row the database stores as given, so the row it
    gives back (what a batch's later members may read before the database has it,
    docs/design/sql.md "Batched entity transactions")."""
    if len(row) != len(kinds) or not _exact(kinds, row):
        return False
    positions = [info.attributes.index(name) for name in info.key]
    key_kinds = tuple((kinds[i][0], kinds[i][1]) for i in positions)
    return _exact_key(key_kinds, tuple(row[i] for i in positions))


def _exact_key(key_kinds: KeyKinds, values: tuple[Any, ...]) -> bool:
    """Whether every key value is of its column's kind: an ``int`` (not a ``bool``, not a string
    of digits) for an integer column, a ``str`` within the length (not a number) for a string
    column."""
    if len(values) != len(key_kinds):
        return False
    for value, (kind, length) in zip(values, key_kinds, strict=True):
        if type(value) is not kind:
            return False
        if length is not None and isinstance(value, str) and len(value) > length:
            return False
    return True


def _exact(kinds: Kinds, row: tuple[Any, ...]) -> bool:
    """Whether each value of ``row`` is of its column's kind (so the database stores it as
    given): ``int`` (not ``bool``) for integers, ``str`` within the length for strings, ``bool``
    for booleans, None only in a nullable column."""
    for value, (kind, length, nullable) in zip(row, kinds, strict=True):
        if value is None:
            if not nullable:
                return False
        elif kind is int:
            if type(value) is not int:
                return False
        elif kind is str:
            if type(value) is not str or (length is not None and len(value) > length):
                return False
        elif type(value) is not bool:
            return False
    return True


class _Changed:
    __slots__ = ()

    def __repr__(self) -> str:
        return "CHANGED"


#: The entry of a key that an absorbed change changed without leaving its whole row.
_CHANGED: Any = _Changed()


#: A change-set of the log: its transaction ID and its place among the transaction's members (0
#: for a transaction of one change-set).
Member = tuple[int, int]


class _Pending:
    """The entry of a key last changed by a change-set with an idempotency key whose apply has
    not said yet whether it recorded the key first: ``row`` (a row or None) if it did."""

    __slots__ = ("member", "row")

    def __init__(self, member: Member, row: tuple[Any, ...] | None) -> None:
        self.member = member
        self.row = row

    def __repr__(self) -> str:
        return f"PENDING({self.member}, {self.row!r})"


def _unknown(entry: Any) -> bool:
    """Whether an entry gives no row to an attempt: changed without a whole row, or pending."""
    return entry is _CHANGED or type(entry) is _Pending


class _Partition:
    __slots__ = ("complete_from", "hits", "keys", "lock", "misses", "pending", "position", "resets", "rows")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.position: int | None = None  # None: not started (nothing absorbed yet)
        # The position where the rows were last emptied (S in the module docstring): every change
        # absorbed after it left an entry in ``rows``. None while not started.
        self.complete_from: int | None = None
        self.rows: dict[Key, tuple[Any, ...] | None] = {}
        # Change-set -> the keys it left pending (a change-set with an idempotency key).
        self.pending: dict[Member, list[Key]] = {}
        # Idempotency key -> the first transaction since ``complete_from`` that carried it.
        self.keys: dict[str, int] = {}
        self.hits = self.misses = self.resets = 0  # counted under the lock

    def empty(self, position: int | None) -> None:
        """Drop the rows at ``position`` (where the partition is, or starts again), counted as a
        reset when there were any (under the lock)."""
        self.complete_from = position
        self.pending = {}
        self.keys = {}
        if self.rows:
            self.resets += 1
            self.rows = {}


class EntityCache:
    """Rows of cacheable entities as of each partition's position (see the module docstring).

    Thread-safe: the apply threads absorb, attempts read and fill, each under the partition's lock.

    Args:
        registry: the application's declared models (change-sets name entities by name).
        max_entries: rows kept per partition before its rows are dropped.
        exact_string_keys: the database compares strings exactly (PostgreSQL, SQLite), so models
            keyed by string columns may be kept (see :func:`column_kinds`).

    Raises:
        ValueError: ``max_entries`` below 1.
    """

    def __init__(
        self,
        registry: EntityRegistry,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        *,
        exact_string_keys: bool = False,
    ) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        self.registry = registry
        self.max_entries = max_entries
        self.exact_string_keys = exact_string_keys
        self._partitions: dict[int, _Partition] = {}
        self._create = threading.Lock()
        # Per model: (models registered when decided, column kinds or None: not cacheable, the
        # key columns' kinds in key order).
        self._kinds: dict[EntityInfo, tuple[int, Kinds | None, KeyKinds]] = {}

    @property
    def hits(self) -> int:
        """Attempts whose entities were all read from the cache."""
        return sum(p.hits for p in list(self._partitions.values()))

    @property
    def misses(self) -> int:
        """Attempts that read the database (an entity not cached, or no position yet)."""
        return sum(p.misses for p in list(self._partitions.values()))

    @property
    def resets(self) -> int:
        """Times a partition's rows were dropped (see the module docstring)."""
        return sum(p.resets for p in list(self._partitions.values()))

    def _partition(self, partition_id: int) -> _Partition:
        partition = self._partitions.get(partition_id)
        if partition is None:
            with self._create:
                partition = self._partitions.setdefault(partition_id, _Partition())
        return partition

    def _decide(self, info: EntityInfo) -> tuple[int, Kinds | None, KeyKinds]:
        """``(models registered when decided, the model's column kinds when its rows are kept
        (see :func:`column_kinds`; a table that another declared model maps too is never kept)
        else None, its key columns' kinds in key order)``, decided again when models were
        registered since."""
        registered = len(self.registry)
        decided = self._kinds.get(info)
        if decided is not None and decided[0] == registered:
            return decided
        kinds = column_kinds(info, self.exact_string_keys)
        if kinds is not None:
            table = info.mapper.local_table
            if any(other is not info and other.mapper.local_table is table for other in self.registry):
                kinds = None
        key_kinds: KeyKinds = ()
        if kinds is not None:
            by_name = dict(zip(info.attributes, kinds, strict=True))
            key_kinds = tuple((by_name[name][0], by_name[name][1]) for name in info.key)
        decided = (registered, kinds, key_kinds)
        self._kinds[info] = decided
        return decided

    def _kept_key(self, info: EntityInfo, values: tuple[Any, ...]) -> bool:
        """Whether the model's rows are kept and ``values`` is a key of its columns' kinds."""
        _, kinds, key_kinds = self._decide(info)
        return kinds is not None and _exact_key(key_kinds, values)

    def position(self, partition_id: int) -> int | None:
        """The partition's position (None: the cache has not started on it)."""
        return self._partition(partition_id).position

    # --- attempts ---------------------------------------------------------------------------------

    def view(self, partition_id: int, entities: Sequence[Key]) -> tuple[int, dict[Key, Any]] | None:
        """``(position, {key: row or None})`` when every one of ``entities`` whose model is kept
        is cached (and there is one), else None (the attempt reads the database; :meth:`fill`
        then keeps what it read). Entities of models never kept are left out of the answer.
        Counted as an attempt's hit or miss."""
        partition = self._partition(partition_id)
        with partition.lock:
            found = self._cached(partition, entities)
            if found is None:
                partition.misses += 1
                return None
            partition.hits += 1
            return found

    def pending(self, partition_id: int, entities: Sequence[Key]) -> bool:
        """Whether :meth:`view` would answer but for entries pending on the apply of a
        change-set with an idempotency key (every one of ``entities`` whose model is kept is
        cached or pending, and one is pending): an attempt may wait for this instance's applies
        to reach the position, and then find them settled (see the module docstring)."""
        partition = self._partition(partition_id)
        with partition.lock:
            if partition.position is None or not partition.pending:
                return False
            rows = partition.rows
            waiting = False
            for key in entities:
                if not self._kept_key(key[0], key[1]):
                    continue
                row = rows.get(key, MISSING)
                if row is MISSING or row is _CHANGED:
                    return False
                waiting = waiting or type(row) is _Pending
            return waiting

    def read(self, partition_id: int, entities: Sequence[Key]) -> tuple[int, dict[Key, Any]] | None:
        """:meth:`view` for a read outside a transaction (not counted as an attempt's hit or
        miss; see :mod:`waltz.jdbc_style.entity_reads`)."""
        partition = self._partition(partition_id)
        with partition.lock:
            return self._cached(partition, entities)

    def _cached(self, partition: _Partition, entities: Sequence[Key]) -> tuple[int, dict[Key, Any]] | None:
        """What :meth:`view` answers, under the partition's lock."""
        position = partition.position
        if position is None or not entities:
            return None
        rows = partition.rows
        found: dict[Key, Any] = {}
        for key in entities:
            if not self._kept_key(key[0], key[1]):
                continue  # never kept: read from the database if the attempt reads it
            row = rows.get(key, MISSING)
            if row is MISSING or _unknown(row):
                return None
            found[key] = row
        if not found:
            return None
        return position, found

    def lookup(self, partition_id: int, key: Key, position: int) -> Any:
        """The cached row of ``key`` while the partition is still at ``position``: a row, None (no
        row), or :data:`MISSING` (not cached, or the position moved on)."""
        partition = self._partition(partition_id)
        with partition.lock:
            if partition.position != position:
                return MISSING
            row = partition.rows.get(key, MISSING)
            return MISSING if _unknown(row) else row

    def fill(self, partition_id: int, mark: int, rows: Iterable[tuple[Key, Any]]) -> None:
        """Keep rows read from the database in a snapshot at ``mark``, if the partition is at that
        position (rows of any other state are not kept); rows of models that are not cacheable,
        or whose values are not exact, are left out."""
        partition = self._partition(partition_id)
        with partition.lock:
            if partition.position != mark:
                return
            self._keep(partition, rows)

    def _keep(self, partition: _Partition, rows: Iterable[tuple[Key, Any]]) -> None:
        """Keep rows known to be the rows at the partition's position (under its lock)."""
        kept = partition.rows
        for key, row in rows:
            _, kinds, key_kinds = self._decide(key[0])
            if kinds is None or not _exact_key(key_kinds, key[1]):
                continue
            if row is not None and not _exact(kinds, tuple(row)):
                continue
            entry = kept.get(key, MISSING)
            if entry is MISSING or _unknown(entry):  # the database's row at the position
                kept[key] = None if row is None else tuple(row)
        if len(kept) > self.max_entries:
            partition.empty(partition.position)

    def kept(self, entities: Sequence[Key]) -> bool:
        """Whether every one of ``entities`` (at least one) is of a model whose rows are kept and
        given by a key of its columns' kinds: the entities :meth:`overlay` can answer for."""
        return bool(entities) and all(self._kept_key(info, values) for info, values in entities)

    def overlay(
        self, partition_id: int, mark: int, rows: Iterable[tuple[Key, Any]], *, at: int | None = None
    ) -> tuple[int, dict[Key, Any]] | None:
        """The rows of an attempt that read the database at ``mark`` while the cache is at a
        position P ahead of it: ``(P, {key: row or None})``, the cache's row where it has one and
        the row read from the database (the row at P too: nothing absorbed since changed it)
        where it has none; those rows are kept. None when the cache cannot vouch for the rows
        read: ``mark`` is below where its rows were last emptied or not below P, P is not ``at``
        (when given), a key read is not of a kept model (see :meth:`kept`), or an absorbed change
        left a row read unknown. Source: docs/design/sql.md "The entity cache"."""
        partition = self._partition(partition_id)
        with partition.lock:
            position, since = partition.position, partition.complete_from
            if position is None or since is None or not since <= mark < position:
                return None
            if at is not None and position != at:
                return None
            held = partition.rows
            found: dict[Key, Any] = {}
            read: list[tuple[Key, Any]] = []
            for key, row in rows:
                if not self._kept_key(key[0], key[1]):
                    return None
                entry = held.get(key, MISSING)
                if _unknown(entry):
                    return None
                if entry is MISSING:
                    read.append((key, row))
                    found[key] = row
                else:
                    found[key] = entry
            self._keep(partition, read)
        return position, found

    # --- applies ----------------------------------------------------------------------------------

    def drop_rows(self, partition_id: int) -> None:
        """Drop the partition's rows, keeping its position (an apply failed, or another instance
        applied what this one absorbed: the database may not hold what the rows say, e.g. after
        an operator's skip); rows come back from database reads at that position."""
        partition = self._partition(partition_id)
        with partition.lock:
            partition.empty(partition.position)

    def stop(self, partition_id: int) -> None:
        """The partition is no longer followed (its client unmounted it or closed): drop its rows
        and its position, so that nothing is answered from a state that would fall behind the
        log; a mount starts it again (:meth:`floor`, or the first group absorbed)."""
        partition = self._partition(partition_id)
        with partition.lock:
            partition.empty(None)
            partition.position = None

    def floor(self, partition_id: int, mark: int) -> None:
        """Everything up to ``mark`` is applied already and will not be absorbed: a partition
        behind it starts again, empty, at ``mark``."""
        partition = self._partition(partition_id)
        with partition.lock:
            if partition.position is not None and partition.position >= mark:
                return
            partition.empty(mark)
            partition.position = mark

    def absorb(
        self, partition_id: int, first: int, change_sets: Sequence[ChangeSet | Sequence[ChangeSet] | None]
    ) -> None:
        """Move the partition on by the committed transactions ``first``, ``first + 1``, ...: the
        decoded change-sets of each, in order (one change-set, or a batch's members; empty: a
        transaction that changes no row, a split's barrier; None: a transaction the cache cannot
        follow, one that is not a change-set). Those at or below the position are absorbed
        already and passed over. Resets it when they do not follow its position or hold
        something the cache cannot follow (see the module docstring)."""
        last = first + len(change_sets) - 1
        partition = self._partition(partition_id)
        with partition.lock:
            position = partition.position
            if position is not None and first <= position:  # absorbed already (before the apply)
                if last <= position:
                    return
                change_sets = change_sets[position + 1 - first :]
                first = position + 1
            followed = partition.position == first - 1 and all(cs is not None for cs in change_sets)
            if not (
                followed
                and all(
                    cs is not None and self._follow_members(partition, cs, first + offset)
                    for offset, cs in enumerate(change_sets)
                )
            ):
                partition.empty(last)
            partition.position = last
            if len(partition.rows) > self.max_entries or len(partition.keys) > self.max_entries:
                partition.empty(last)

    def keys_carried(self, partition_id: int, keys: Iterable[str], after: int) -> dict[str, int] | None:
        """The idempotency keys among ``keys`` that a change-set absorbed after transaction
        ``after`` carried: key -> the first such transaction. None when the cache cannot say (it
        has not followed every change-set after ``after``: not started, or emptied since).

        A read of ``waltz_idempotency_keys`` at the partition's mark ``after`` and these keys
        together tell which keys are recorded as of the cache's position, without waiting for
        this instance's applies to reach it (docs/design/sql.md "The entity cache")."""
        partition = self._partition(partition_id)
        with partition.lock:
            since = partition.complete_from
            if partition.position is None or since is None or after < since:
                return None
            carried = partition.keys
            found: dict[str, int] = {}
            for key in keys:
                transaction_id = carried.get(key)
                if transaction_id is not None and transaction_id > after:
                    found[key] = transaction_id
            return found

    def settle(self, partition_id: int, outcomes: Mapping[Member, bool]) -> None:
        """The applies of change-sets with an idempotency key committed: ``outcomes`` maps each
        change-set (transaction ID, member) to whether its apply recorded the key first (its
        changes applied) or not (skipped, or not known). The entries each left pending become the
        rows it carried, or "changed, row unknown" (see the module docstring)."""
        partition = self._partition(partition_id)
        with partition.lock:
            rows, pending = partition.rows, partition.pending
            for member, applied in outcomes.items():
                for key in pending.pop(member, ()):
                    entry = rows.get(key, MISSING)
                    if type(entry) is _Pending and entry.member == member:
                        rows[key] = entry.row if applied else _CHANGED

    def _follow_members(
        self, partition: _Partition, change_sets: ChangeSet | Sequence[ChangeSet], transaction_id: int
    ) -> bool:
        """Apply one transaction's change-sets, in order (see :meth:`_follow`)."""
        if isinstance(change_sets, ChangeSet):
            return self._follow(partition, change_sets, (transaction_id, 0))
        return all(self._follow(partition, cs, (transaction_id, i)) for i, cs in enumerate(change_sets))

    def _follow(self, partition: _Partition, change_set: ChangeSet, member: Member) -> bool:
        """Apply one change-set's row changes to the partition's rows (pending on ``member`` when
        it carries an idempotency key); False when one cannot be placed."""
        rows: dict[Key, Any] = partition.rows
        if change_set.idempotency_key is not None:
            partition.keys.setdefault(change_set.idempotency_key, member[0])
            touched: list[Key] = []
            placed = self._follow_rows(rows, change_set, touched)
            keys = list(dict.fromkeys(touched))  # a key changed twice is pending once
            partition.pending[member] = keys
            for key in keys:
                entry = rows[key]
                if entry is not _CHANGED:
                    rows[key] = _Pending(member, entry)
            return placed
        return self._follow_rows(rows, change_set, None)

    def _follow_rows(self, rows: dict[Key, Any], change_set: ChangeSet, touched: list[Key] | None) -> bool:
        """Apply one change-set's row changes to ``rows``, noting the keys changed in
        ``touched`` (when given); False when one cannot be placed."""
        by_name = self.registry.by_name
        for change in change_set.changes:
            try:
                info = by_name(change.entity)
            except Exception:  # an entity this registry does not declare: its apply decides
                return False
            _, kinds, key_kinds = self._decide(info)
            if kinds is None:
                # Its rows are never kept, and its changes cannot touch a kept row of another model.
                continue
            try:
                named = tuple(change.key[name] for name in info.key)
            except KeyError:  # named by a primary key that is not the entity key
                named = None
            if named is not None and not _exact_key(key_kinds, named):
                return False  # the row may be cached under its key of the column's kind
            if change.operation is Operation.DELETE:
                if named is None:
                    return False
                rows[(info, named)] = None
                if touched is not None:
                    touched.append((info, named))
                continue
            values = change.values
            try:
                row = tuple(values[name] for name in info.attributes)
            except KeyError:  # not the whole row: the database has values the cache does not
                if named is None:
                    return False
                rows[(info, named)] = _CHANGED
                continue
            key = tuple(values[name] for name in info.key)
            if not _exact_key(key_kinds, key):
                return False  # the row may be cached under its key of the column's kind
            if change.operation is Operation.UPDATE and named != key:
                return False  # the row it changed may have been cached under another key
            rows[(info, key)] = row if _exact(kinds, row) else _CHANGED
            if touched is not None:
                touched.append((info, key))
        return True


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
"""What :meth:`EntityCache.lookup` returns for a key it does not hold at that position."""
