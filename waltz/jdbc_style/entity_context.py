"""Transaction contexts for read-modify-write of declared entities.

Source: docs/design/locks.md "Optimistic locking in Waltz" (the client high-water mark sent with
an append must be the state the transaction was built from), "Locks and their scope";
docs/design/client.md "Transaction contexts and callbacks" (``TransactionContext.execute``);
docs/design/sql.md "Entity transactions".

For each attempt the framework opens one snapshot transaction (REPEATABLE READ; SQLite: a WAL
snapshot), reads the partition's high-water mark **first**, then lets :meth:`run` read entities
through :class:`EntityTransaction`, and hands that mark to the builder. Everything the
transaction read is therefore exactly the state at the mark, even if other instances apply
transactions between the two reads, so the server's lock check is exact: an attempt built on
stale rows fails with a lock failure and is retried, never committed. When the entity cache
(:mod:`waltz.jdbc_style.entity_cache`) holds the entities, the attempt reads them there instead,
at the cache's position, and sends that position (docs/design/sql.md "The entity cache"). Each
read registers a READ lock, each change a WRITE lock; the changes become a change-set transaction
(:mod:`waltz.jdbc_style.changeset`) that :class:`~waltz.jdbc_style.changeset_callbacks.ChangeSetCallbacks`
applies on every instance::

    class Withdraw(EntityTransactionContext):
        def __init__(self, callbacks, account_id, amount):
            super().__init__(callbacks, (Account, account_id))
            self.account_id, self.amount = account_id, amount

        def run(self, tx: EntityTransaction) -> bool:
            account = tx.get(Account, self.account_id)
            if account is None or account.balance < self.amount:
                return tx.drop("insufficient funds")   # dropped: Outcome.reason
            tx.update(account, balance=account.balance - self.amount)
            return True
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar, overload

from sqlalchemy import Connection
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import instance_state, set_committed_value

from waltz.client.context import TransactionBuilder, TransactionContext, refuse_awaitable
from waltz.client.locks import PartitionLocalLock
from waltz.errors import CrossPartitionError
from waltz.jdbc_style.changeset import CHANGE_SET_HEADER, ChangeSet, Operation, RowChange
from waltz.jdbc_style.changeset_callbacks import ChangeSetCallbacks
from waltz.jdbc_style.entities import EntityInfo, rows_by_model
from waltz.jdbc_style.entity_cache import MISSING, EntityCache
from waltz.jdbc_style.idempotency import (
    AppliedRequest,
    check_idempotency_key,
    find_idempotency_key,
    find_idempotency_keys,
)
from waltz.jdbc_style.mark_snapshot import MarkSnapshot, read_only_session_error
from waltz.jdbc_style.prefetch import Prefetched

__all__ = ["CachedSnapshot", "EntityTransaction", "EntityTransactionContext", "NotBatchableError"]

E = TypeVar("E")

_NOT_READ = object()  # a key the snapshot did not read with the mark

#: In a batch's overlay: an entity an earlier member changed without leaving its whole row.
CHANGED_IN_BATCH: Any = object()


class NotBatchableError(BaseException):
    """A member of a batch read what the batch cannot show it as the members before it left it
    (a query on :attr:`EntityTransaction.session`, a row an earlier member changed only in part):
    the batch leaves it out, and it runs on its own after the batch (docs/design/sql.md
    "Batched entity transactions"). A ``BaseException``, so that a ``run`` that catches
    ``Exception`` to drop its transaction does not turn "run me alone" into a drop."""


class EntityTransaction:
    """What :meth:`EntityTransactionContext.run` reads and changes, for one attempt.

    Attributes:
        partition_id: the transaction's partition.
        high_water_mark: the partition's mark in the snapshot (what the lock check uses).
        session: an ORM session on the snapshot, for reads the framework does not lock (queries
            over many rows); lock what they depend on with :meth:`lock_read`.
        idempotency_key: set it to the request's key: the change-set then carries it and is
            applied at most once per key (see :mod:`waltz.jdbc_style.idempotency`).
        meta: JSON-able application data carried in the change-set, never interpreted.
    """

    def __init__(
        self,
        callbacks: ChangeSetCallbacks,
        snapshot: MarkSnapshot | CachedSnapshot,
        num_partitions: int,
        *,
        overlay: dict[tuple[EntityInfo, tuple[Any, ...]], Any] | None = None,
    ) -> None:
        self._callbacks = callbacks
        self._snapshot = snapshot
        # In a batch after its first member: the rows the members before this one left
        # (row, None for a delete, or CHANGED_IN_BATCH), read before the snapshot's.
        self._overlay = overlay
        self._num_partitions = num_partitions
        self.partition_id = snapshot.partition_id
        self.idempotency_key: str | None = None
        self.meta: dict[str, Any] = {}
        self._changes: list[RowChange] = []
        self._read_locks: dict[PartitionLocalLock, None] = {}
        self._write_locks: dict[PartitionLocalLock, None] = {}
        self.drop_reason: str | None = None
        """The reason given to :meth:`drop` (None: none given)."""

    @property
    def high_water_mark(self) -> int:
        """The state this attempt read: the snapshot's mark, or the entity cache's position (the
        lower of the two when it read both); what the lock check uses."""
        return self._snapshot.high_water_mark

    # --- reads -------------------------------------------------------------------------------------

    def get(self, model: type[E], key: Any) -> E | None:
        """Read one entity by key (READ lock on it, also when it does not exist).

        Args:
            model: a declared model.
            key: its key: a scalar for a one-attribute key, a tuple in declared order, or a
                mapping of attribute names.

        Returns:
            A detached instance holding the row at the snapshot's mark, or None.

        Raises:
            CrossPartitionError: the entity belongs to another partition.
            UnknownEntityError: the model has no ``__waltz__``.
        """
        info, values = self._locate(model, key)
        self._lock_read(info.lock(values))
        row = self._known_row(info, values)
        if row is _NOT_READ:
            entity: E | None = self._read_by_key(info, [values])[values]
            return entity
        return None if row is None else info.entity_from_row(row)

    def _read_by_key(self, info: EntityInfo, keys: list[tuple[Any, ...]]) -> dict[tuple[Any, ...], Any]:
        """Entities not read yet, ``{key: instance or None}``: at the entity cache's position
        without waiting for the applies when it can vouch for them
        (:meth:`CachedSnapshot.rows_at_position`), else through the snapshot's connection."""
        snapshot = self._snapshot
        rows = (
            snapshot.rows_at_position([(info, values) for values in keys])
            if isinstance(snapshot, CachedSnapshot)
            else None
        )
        if rows is None:
            return info.load_many(snapshot.connection, keys)
        return {
            values: None if (row := rows[(info, values)]) is None else info.entity_from_row(row)
            for values in keys
        }

    def _known_row(self, info: EntityInfo, values: tuple[Any, ...]) -> Any:
        """An entity's row read with the mark or held by the entity cache at the snapshot's
        position: the row, None (no row), or ``_NOT_READ`` (read it by key); in a batch, the
        row an earlier member left first."""
        overlay = self._overlay
        if overlay:
            try:
                row = overlay.get((info, values), _NOT_READ)
            except TypeError:  # an unhashable key value: no member changed it
                row = _NOT_READ
            if row is CHANGED_IN_BATCH:
                raise NotBatchableError(
                    f"{info.model.__name__} {values!r} was changed in part by an earlier member"
                )
            if row is not _NOT_READ:
                return row
        snapshot = self._snapshot
        prefetched = snapshot.prefetched
        if prefetched:
            try:
                row = prefetched.get((info, values), _NOT_READ)
            except TypeError:  # an unhashable key value: never read with the mark
                row = _NOT_READ
            if row is not _NOT_READ:  # read with the mark, in the same statement (or cached)
                return row
        if isinstance(snapshot, CachedSnapshot):
            row = snapshot.cached(info, values)
            if row is not MISSING:
                return row
        return _NOT_READ

    @property
    def session(self) -> Session:
        """An ORM session on the snapshot (see the class docstring).

        Raises:
            NotBatchableError: in a batch after its first member (the session shows the state
                before the batch, not what the members before this one left): the batch runs
                this context on its own instead.
        """
        if self._overlay is not None:
            raise NotBatchableError("a query on tx.session does not see the earlier members' changes")
        return self._snapshot.session

    def take_session_writes(self) -> str | None:
        """What :attr:`session` holds that a flush would write (objects added, deleted or
        changed), in a few words, or None; the session is emptied of them (a batch's next member
        shares it). Checked when :meth:`EntityTransactionContext.run` returns."""
        return self._snapshot.take_writes()

    def get_many(self, model: type[E], keys: Iterable[Any]) -> dict[tuple[Any, ...], E | None]:
        """:meth:`get` for several keys: ``{key tuple: entity or None}``, in the order given. The
        entities read with the mark or held by the entity cache are taken from there, the others
        read in one statement.

        Raises:
            CrossPartitionError: an entity belongs to another partition.
        """
        info = self._callbacks.registry.info(model)
        located = [self._locate(model, key)[1] for key in keys]
        found: dict[tuple[Any, ...], Any] = {}
        unread: list[tuple[Any, ...]] = []
        for values in located:
            self._lock_read(info.lock(values))
            row = self._known_row(info, values)
            if row is _NOT_READ:
                unread.append(values)
            else:
                found[values] = None if row is None else info.entity_from_row(row)
        if unread:
            found.update(self._read_by_key(info, unread))
        return {values: found[values] for values in located}

    def lock_read(self, model: type[Any], key: Any) -> None:
        """Register a READ lock on an entity without reading it (e.g. rows a query depended on).

        Raises:
            CrossPartitionError: the entity belongs to another partition.
        """
        info, values = self._locate(model, key)
        self._lock_read(info.lock(values))

    def _lock_read(self, lock: PartitionLocalLock) -> None:
        if lock not in self._write_locks:
            self._read_locks[lock] = None

    def lock_write(self, model: type[Any], key: Any) -> None:
        """Register a WRITE lock on an entity without changing it.

        Raises:
            CrossPartitionError: the entity belongs to another partition.
        """
        info, values = self._locate(model, key)
        lock = info.lock(values)
        self._read_locks.pop(lock, None)
        self._write_locks[lock] = None

    def already_applied(self, idempotency_key: str) -> AppliedRequest | None:
        """Where a request key was applied, as of the snapshot (None: not applied at the mark).

        A request may still be in flight (submitted, not yet applied): setting
        :attr:`idempotency_key` covers that case at apply time. Read from the entity cache's
        state, it needs no wait for this instance's applies (:meth:`CachedSnapshot.applied_keys`).
        """
        snapshot = self._snapshot
        if isinstance(snapshot, CachedSnapshot):
            return snapshot.applied_keys([idempotency_key]).get(idempotency_key)
        return find_idempotency_key(
            self._snapshot.connection, cluster_name=self._callbacks.cluster_name, key=idempotency_key
        )

    def drop(self, reason: str) -> bool:
        """Drop the transaction with a reason the submitter's ``Outcome`` carries:
        ``return tx.drop("insufficient funds")`` in :meth:`EntityTransactionContext.run`
        (docs/design/client.md "Outcomes").

        Returns:
            False, what ``run`` returns to drop the transaction.
        """
        self.drop_reason = reason
        return False

    # --- changes -----------------------------------------------------------------------------------

    @overload
    def insert(self, model: type[E], **values: Any) -> E: ...

    @overload
    def insert(self, model: E) -> E: ...

    def insert(self, model: Any, **values: Any) -> Any:
        """Insert a new entity (WRITE lock on its key); scalar column defaults are filled in.

        Either ``tx.insert(Account, id=7, balance=0)`` or, as with a SQLAlchemy session,
        ``tx.insert(Account(id=7, balance=0))``: an instance gives the attributes it was made
        with (those never set take their column defaults).

        Returns:
            A transient instance with the row's values (not attached to any session).

        Raises:
            ValueError: a key attribute is missing, an unknown attribute is given, both an
                instance and attribute values are given, or an attribute whose column has a
                server or callable default is left out (the log must carry every value a rebuild
                needs).
            CrossPartitionError: the entity belongs to another partition.
        """
        if not isinstance(model, type):  # an instance, the SQLAlchemy habit
            if values:
                raise ValueError(
                    f"insert takes an instance or a model with attribute values, not both: "
                    f"tx.insert({type(model).__name__}(...)) or tx.insert({type(model).__name__}, **values)"
                )
            entity, model = model, type(model)
            attributes = self._callbacks.registry.info(model).attributes
            values = {name: value for name, value in vars(entity).items() if name in attributes}
        info = self._callbacks.registry.info(model)
        unknown = sorted(set(values) - set(info.attributes))
        if unknown:
            raise ValueError(f"{model.__name__} has no column attributes {unknown}")
        row = {**info.defaults, **values}
        missing = [name for name in info.key if row.get(name) is None]
        if missing:
            raise ValueError(f"insert of {model.__name__} needs its key attributes {missing}")
        unknowable = [name for name in info.defaulted if name not in row]
        if unknowable:
            # The database would fill them and the log would not say with what: a rebuild from the
            # log could not give them the same value (docs/design/spark.md, "Computing views").
            raise ValueError(
                f"insert of {model.__name__} leaves out {unknowable}, whose columns have a default the "
                "log cannot carry (a server default, or a callable): give them values, or declare a "
                'scalar default= in the model beside the server default (docs/sql.md, "Changing a model")'
            )
        key = tuple(row[name] for name in info.key)
        self.lock_write(model, key)
        self._changes.append(
            RowChange(
                Operation.INSERT, info.name, dict(zip(info.key, key, strict=True)), row, info.schema_version
            )
        )
        return model(**row)

    def update(self, entity: E, **changes: Any) -> E:
        """Change attributes of an entity read with :meth:`get` (WRITE lock); the change-set carries
        the whole new row. The instance is updated in place and returned.

        Raises:
            ValueError: an unknown attribute, or a change of a key attribute.
            CrossPartitionError: the entity belongs to another partition.
        """
        info = self._callbacks.registry.info(type(entity))
        unknown = sorted(set(changes) - set(info.attributes))
        if unknown:
            raise ValueError(f"{type(entity).__name__} has no column attributes {unknown}")
        key = info.key_of(entity)
        touched = [name for name in info.key if name in changes and changes[name] != getattr(entity, name)]
        if touched:
            raise ValueError(
                f"update cannot change the key attributes {touched} of {type(entity).__name__}; "
                "delete it and insert a new one"
            )
        self.lock_write(type(entity), key)
        if instance_state(entity).session_id is None:
            for name, value in changes.items():
                setattr(entity, name, value)
        else:  # loaded through tx.session: changed there as read, not as a write to flush
            for name, value in changes.items():
                set_committed_value(entity, name, value)
        self._changes.append(
            RowChange(
                Operation.UPDATE,
                info.name,
                dict(zip(info.key, key, strict=True)),
                info.row_of(entity),
                info.schema_version,
            )
        )
        return entity

    def delete(self, entity: Any) -> None:
        """Delete an entity read with :meth:`get` (WRITE lock).

        Raises:
            CrossPartitionError: the entity belongs to another partition.
        """
        info = self._callbacks.registry.info(type(entity))
        key = info.key_of(entity)
        self.lock_write(type(entity), key)
        self._changes.append(
            RowChange(
                Operation.DELETE, info.name, dict(zip(info.key, key, strict=True)), {}, info.schema_version
            )
        )

    # --- results -----------------------------------------------------------------------------------

    @property
    def changes(self) -> list[RowChange]:
        """The row changes so far, in order."""
        return list(self._changes)

    @property
    def read_locks(self) -> list[PartitionLocalLock]:
        """READ locks (entities read, not changed)."""
        return list(self._read_locks)

    @property
    def write_locks(self) -> list[PartitionLocalLock]:
        """WRITE locks (entities changed)."""
        return list(self._write_locks)

    def change_set(self) -> ChangeSet:
        """The change-set of this attempt."""
        return ChangeSet(list(self._changes), self.idempotency_key, dict(self.meta))

    def _locate(self, model: type[Any], key: Any) -> tuple[EntityInfo, tuple[Any, ...]]:
        info = self._callbacks.registry.info(model)
        values = info.normalize_key(key)
        partition = info.partition_of(values, self._num_partitions)
        if partition != self.partition_id:
            raise CrossPartitionError(
                f"{model.__name__} {values!r} belongs to partition {partition}, but this transaction "
                f"is on partition {self.partition_id}; a transaction's entities must share a partition "
                "(split it, e.g. into a two-step transfer, or map them together with partition_by)"
            )
        return info, values


class CachedSnapshot:
    """What an attempt reads when the entity cache holds its entities: their rows at the cache's
    position (:attr:`high_water_mark`). Other entities read by key are read with the mark at that
    position when the cache can vouch for them (:meth:`rows_at_position`). A read the cache
    cannot answer otherwise (an entity it cannot vouch for, a query on :attr:`session`, an
    idempotency key) opens a database snapshot then, and the mark becomes the lower of the
    position and that snapshot's mark (a row of either state that a later transaction changed
    carries a lock the server then finds written after the mark).

    Attributes:
        partition_id: the partition.
        high_water_mark: the state the attempt read (see above).
        prefetched: the rows the attempt read, ``{(entity info, key values): row or None}``:
            cached, or read from the database (see :meth:`rows_at_position`).
    """

    def __init__(
        self,
        callbacks: ChangeSetCallbacks,
        cache: EntityCache,
        partition_id: int,
        position: int,
        rows: Prefetched,
    ) -> None:
        self.partition_id = partition_id
        self.high_water_mark = position
        self.prefetched: Prefetched = rows
        self._callbacks = callbacks
        self._cache = cache
        self._position = position
        self._stack: contextlib.ExitStack | None = None
        self._snapshot: MarkSnapshot | None = None

    def cached(self, info: EntityInfo, key: tuple[Any, ...]) -> Any:
        """The cached row of an entity at the same position, None (no row), or ``MISSING``."""
        try:
            return self._cache.lookup(self.partition_id, (info, key), self._position)
        except TypeError:  # an unhashable key value
            return MISSING

    @property
    def connection(self) -> Connection:
        """A database snapshot's connection (opened when first used; see the class docstring)."""
        return self._database().connection

    @property
    def session(self) -> Session:
        """An ORM session on the database snapshot (opened when first used)."""
        return self._database().session

    def take_writes(self) -> str | None:
        """What the database snapshot's session holds that a flush would write, or None; the
        session is emptied of them (:meth:`MarkSnapshot.take_writes`)."""
        return None if self._snapshot is None else self._snapshot.take_writes()

    def rows_at_position(self, entities: list[tuple[EntityInfo, tuple[Any, ...]]]) -> Prefetched | None:
        """Rows of ``entities`` (none of them cached) as of :attr:`high_water_mark`, read from
        the database without waiting for the applies: ``{(entity info, key): row or None}``.
        Read in a snapshot of their own, the partition's mark first, then one ``IN`` statement
        per model; taken when that mark is not below the position, or when the entity cache can
        vouch for them (see ``EntityCache.overlay``; then they are kept), and added to
        :attr:`prefetched`. None when the attempt opened its database snapshot already, or the
        rows cannot be taken so: then they are read through :attr:`connection`.

        Raises:
            MultipleResultsFound: a key matches more than one row.
        """
        if self._snapshot is not None or not self._cache.kept(entities):
            return None  # (kept first: it also turns away unhashable key values)
        with self._callbacks.snapshot(self.partition_id) as database:
            mark = database.high_water_mark
            rows, unread = rows_by_model(database.connection, entities)
        if unread:
            return None
        if mark >= self._position:
            self._cache.fill(self.partition_id, mark, rows.items())
        else:
            overlaid = self._cache.overlay(self.partition_id, mark, rows.items(), at=self._position)
            if overlaid is None:
                return None
            rows = overlaid[1]
        self.prefetched.update(rows)
        return rows

    def applied_keys(self, keys: Sequence[str]) -> dict[str, AppliedRequest]:
        """Where each of ``keys`` was applied, as of :attr:`high_water_mark` (the keys not
        applied are absent), without waiting for this instance's applies to reach it when the
        entity cache can say which keys the change-sets it absorbed since the database's mark
        carried (``EntityCache.keys_carried``): one snapshot reads the partition's mark and the
        keys, and a key carried after that mark was applied by its carrier, or before it
        (docs/design/sql.md "Idempotency keys"). Otherwise, through :attr:`connection`.

        Raises:
            ValueError: a key is empty or longer than the column allows.
        """
        cluster = self._callbacks.cluster_name
        if self._snapshot is None:
            with self._callbacks.snapshot(self.partition_id) as database:
                mark = database.high_water_mark
                found = find_idempotency_keys(database.connection, cluster_name=cluster, keys=keys)
            carried = self._cache.keys_carried(self.partition_id, keys, mark)
            if carried is not None:
                for key, transaction_id in carried.items():
                    found.setdefault(key, AppliedRequest(self.partition_id, transaction_id))
                return found
        return find_idempotency_keys(self.connection, cluster_name=cluster, keys=keys)

    def _database(self) -> MarkSnapshot:
        if self._snapshot is None:
            self._callbacks.catch_up_to_cache(self.partition_id)
            stack = contextlib.ExitStack()
            self._snapshot = stack.enter_context(self._callbacks.snapshot(self.partition_id))
            self._stack = stack
            self.high_water_mark = min(self.high_water_mark, self._snapshot.high_water_mark)
        return self._snapshot

    def __enter__(self) -> CachedSnapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stack is not None:
            stack, self._stack = self._stack, None
            stack.close()


class EntityTransactionContext(TransactionContext):
    """A transaction context over declared entities; subclass it and implement :meth:`run`.

    Args:
        callbacks: the application's :class:`ChangeSetCallbacks` (database, registry, log name).
        entities: ``(model, key)`` pairs the transaction is about; they choose the partition and
            must all map to the same one. Entities read or changed in :meth:`run` are checked too.
        timeout: seconds until the context expires (see :class:`TransactionContext`).

    Raises:
        ValueError: no entity given.
        CrossPartitionError: from :meth:`partition_id` (so from ``submit``) when the declared
            entities map to different partitions.
    """

    #: The mark comes from the snapshot :meth:`execute` opens, not from a separate read.
    sets_client_high_water_mark = True

    #: :meth:`execute` may read the database: ``AsyncWaltzClient`` runs it on the client's
    #: attempt threads, never on the event loop (docs/design/sql.md "The SQL framework on asyncio").
    execute_blocks = True

    #: Before appending a change-set with an :attr:`EntityTransaction.idempotency_key`, read the
    #: key as of the attempt's state: applied before, the transaction is dropped as already applied
    #: (``Outcome.already_applied``). False spares that read (with the entity cache, a database
    #: snapshot): a repeated request then commits again, and its apply changes nothing.
    checks_idempotency_key = True

    #: Models whose entities, with the keys of the declared entities, :meth:`run` is expected to
    #: lock besides the declared entities (e.g. ``(Checking,)`` for a context declared by
    #: ``(Account, custid)`` that changes the customer's checking row); None: only the declared
    #: entities. A hint only (:meth:`expected_locks`, :meth:`prefetch_entities`): what :meth:`run`
    #: really reads and changes is what is locked.
    expected_models: tuple[type[Any], ...] | None = None

    #: Read the entities of :meth:`prefetch_entities` in the statement that reads the mark (one
    #: statement instead of one per entity; :mod:`waltz.jdbc_style.prefetch`). They are locked
    #: only when :meth:`run` reads them; turn it off for a context whose :meth:`run` seldom reads
    #: its declared entities.
    prefetch: bool = True

    def __init__(
        self, callbacks: ChangeSetCallbacks, *entities: tuple[type[Any], Any], timeout: float | None = None
    ) -> None:
        super().__init__(timeout=timeout)
        if not entities:
            raise ValueError(
                "an entity transaction context needs at least one (model, key) to choose its partition"
            )
        self.callbacks = callbacks
        self._entities = [
            (info, info.normalize_key(key))
            for info, key in ((callbacks.registry.info(model), key) for model, key in entities)
        ]
        self._num_partitions = 0
        self._partition_id = -1
        # With the entity cache, a next attempt may run once the transaction it waits for is
        # absorbed: what it reads is the cache's, or the database once it reached the position.
        self.reads_absorbed_state = callbacks.entity_cache is not None
        self.last_transaction: EntityTransaction | None = None
        """The last attempt's :class:`EntityTransaction` (what was read and changed)."""

    @property
    def declared_entities(self) -> list[tuple[type[Any], tuple[Any, ...]]]:
        """The ``(model, key values)`` pairs given to the constructor, keys as tuples in the
        models' key order: what chooses the partition (:meth:`partition_id`)."""
        return [(info.model, key) for info, key in self._entities]

    @property
    def chosen_partition(self) -> int:
        """The partition :meth:`partition_id` chose (-1 before the context was submitted)."""
        return self._partition_id

    @abc.abstractmethod
    def run(self, tx: EntityTransaction) -> bool:
        """Read entities and declare changes through ``tx``; called once per attempt.

        Returns:
            True to append the change-set, False to drop the transaction (``on_completion(False)``).
        """

    def partition_id(self, num_partitions: int) -> int:
        """The partition of the declared entities.

        Raises:
            CrossPartitionError: they map to more than one partition.
        """
        partitions: dict[int, list[str]] = {}
        for info, key in self._entities:
            partitions.setdefault(info.partition_of(key, num_partitions), []).append(
                f"{info.model.__name__}{key!r}"
            )
        if len(partitions) > 1:
            detail = "; ".join(
                f"partition {p}: {', '.join(names)}" for p, names in sorted(partitions.items())
            )
            raise CrossPartitionError(
                f"{type(self).__name__} spans {len(partitions)} partitions ({detail}); a transaction's "
                "entities must share a partition (split it, e.g. into a two-step transfer, or map them "
                "together with partition_by)"
            )
        self._num_partitions = num_partitions
        self._partition_id = next(iter(partitions))
        return self._partition_id

    def routed(self, partition_id: int, num_partitions: int) -> None:
        """The client routed the context to ``partition_id`` at ``num_partitions``: during a split
        the key's partition at the count before while its parent is not sealing yet
        (docs/design/splits.md "Clients across a split"). Its attempts read that partition's mark
        and state, and check their entities at that count."""
        self._num_partitions = num_partitions
        self._partition_id = partition_id

    def expected_locks(self) -> list[PartitionLocalLock]:
        """The locks of the entities :meth:`prefetch_entities` names (by default the declared
        entities and those of :attr:`expected_models` with the declared keys): while an append of
        this client holds one, the client queues this context behind it rather than run an
        attempt that would be held back behind it anyway (``TransactionContext.expected_locks``;
        docs/design/sql.md "Entity transactions"). A key of another shape is left out.
        """
        # In order, once each.
        return list(dict.fromkeys(info.lock(values) for info, values in self._prefetch_keys()))

    def _prefetch_keys(self) -> Iterator[tuple[EntityInfo, tuple[Any, ...]]]:
        """:meth:`prefetch_entities` with their key values normalized; a key of another shape, or
        unhashable, is left out (read by key, if :meth:`run` reads it)."""
        registry = self.callbacks.registry
        for model, key in self.prefetch_entities():
            info = registry.info(model)
            try:
                values = info.normalize_key(key)
                hash(values)
            except (ValueError, TypeError):
                continue
            yield info, values

    def prefetch_entities(self) -> list[tuple[type[Any], Any]]:
        """The entities each attempt reads with the partition's mark (:attr:`prefetch`): the
        declared entities and, with :attr:`expected_models`, those models' entities of the
        declared keys. Override it to add the other entities :meth:`run` reads by a key known
        before it runs (each is locked only when :meth:`run` reads it). An entity not declared
        is read with the mark only when its key values are instances of its key columns' Python
        types (a hint of another type is read by key, if :meth:`run` reads it).

        Returns:
            ``(model, key)`` pairs, keys as :meth:`EntityTransaction.get` takes them.
        """
        entities = [(info.model, key) for info, key in self._entities]
        models = self.expected_models
        if models is not None:
            entities.extend((model, key) for _, key in self._entities for model in models)
        return entities

    def execute(self, builder: TransactionBuilder) -> bool:
        """Open the snapshot, read the mark, call :meth:`run`, and build the change-set append.

        A transaction whose :attr:`EntityTransaction.idempotency_key` was applied before, as of
        the state the attempt read, is dropped as already applied (the submitter's ``Outcome``
        names the earlier transaction); a copy still in flight is not seen here, and its apply
        changes nothing (docs/design/sql.md "Idempotency keys").

        Raises:
            ValueError: the idempotency key is empty or longer than 190 characters (refused
                before the append, whether or not :attr:`checks_idempotency_key` is on).
        """
        if self._num_partitions == 0:
            raise RuntimeError("partition_id() must be called before execute()")
        with contextlib.ExitStack() as stack:
            snapshot = self.open_attempt_state(stack, self.attempt_entities())
            tx = EntityTransaction(self.callbacks, snapshot, self._num_partitions)
            self.last_transaction = tx
            dropped = self.run_attempt(tx, builder)
            if dropped is not None:
                return dropped
        if tx.idempotency_key is not None:
            # Checked here too: without the key's read (checks_idempotency_key off), a key the
            # table cannot hold would reach the log and fail its apply on every try.
            check_idempotency_key(tx.idempotency_key)
        builder.set_client_high_water_mark(snapshot.high_water_mark)
        builder.set_header(CHANGE_SET_HEADER)
        builder.set_raw_data(tx.change_set().encode())
        builder.set_write_locks(tx.write_locks)
        builder.set_read_locks(tx.read_locks)
        return True

    def run_attempt(
        self, tx: EntityTransaction, builder: TransactionBuilder, *, check_key: bool = True
    ) -> bool | None:
        """Call :meth:`run` on ``tx``, then (with ``check_key``) check its idempotency key as of
        the state read: None when the change-set is to be appended, else what :meth:`execute`
        returns to drop it (the reason or the earlier transaction noted on ``builder``). A batch
        checks its members' keys together, after running them all. A ``run`` that drops with its
        key set has the key checked here, batch or not: a retry dropped on what its first copy
        left (a withdrawal that emptied the account) is answered as that copy's
        (docs/design/sql.md "Idempotency keys")."""
        ran = self.run(tx)
        refuse_awaitable(ran, f"{type(self).__name__}.run", "True, or tx.drop(reason),")
        pending = tx.take_session_writes()
        if pending is not None:  # never flushed: they would be lost without a word
            raise read_only_session_error(f"objects never flushed: {pending}")
        key = tx.idempotency_key
        if key is not None and self.checks_idempotency_key and (check_key or not ran):
            earlier = tx.already_applied(key)  # applied before, as of the state read
            if earlier is not None:
                return builder.drop_as_applied(earlier.partition_id, earlier.transaction_id)
        if not ran:
            return False if tx.drop_reason is None else builder.drop(tx.drop_reason)
        return None

    def attempt_entities(self) -> list[tuple[EntityInfo, tuple[Any, ...]]]:
        """The entities an attempt reads with the mark (:meth:`prefetch_entities`, when
        :attr:`prefetch` is on), normalized."""
        entities: list[tuple[EntityInfo, tuple[Any, ...]]] = []
        if self.prefetch:
            for info, values in self._prefetch_keys():
                if not info.key_fits_types(values) and (info, values) not in self._entities:
                    # A hint (expected_models) whose key values are not of its key columns' types:
                    # in the mark's statement it could fail every attempt (PostgreSQL refuses to
                    # compare an integer column with text); left to a read by key, if run reads it.
                    continue
                entities.append((info, values))
        return entities

    def open_attempt_state(
        self, stack: contextlib.ExitStack, entities: list[tuple[EntityInfo, tuple[Any, ...]]]
    ) -> MarkSnapshot | CachedSnapshot:
        """The state an attempt reads, closed with ``stack``: the entity cache's rows at its
        position when it holds ``entities``, else a snapshot (:meth:`_read_database`)."""
        cache = self.callbacks.entity_cache
        if cache is not None and cache.pending(self._partition_id, entities):
            # Rows of a keyed change-set not yet applied here: its apply settles them.
            self.callbacks.catch_up_to_cache(self._partition_id)
        view = None if cache is None else cache.view(self._partition_id, entities)
        if view is not None and cache is not None:
            return stack.enter_context(
                CachedSnapshot(self.callbacks, cache, self._partition_id, view[0], view[1])
            )
        return self._read_database(stack, cache, entities)

    def _read_database(
        self,
        stack: contextlib.ExitStack,
        cache: EntityCache | None,
        entities: list[tuple[EntityInfo, tuple[Any, ...]]],
    ) -> MarkSnapshot | CachedSnapshot:
        """The snapshot of an attempt the entity cache cannot answer alone: a database snapshot
        (the mark and ``entities`` read in one statement) when it is as new as the cache's
        position; else, when the cache can vouch for the rows read (:meth:`EntityCache.overlay`),
        the rows at its position, with no wait for this instance's applies; else a database
        snapshot read once the applies reached that position (docs/design/sql.md "The entity
        cache")."""
        pid = self._partition_id
        may_overlay = cache is not None and cache.kept(entities)
        if cache is not None and not may_overlay:
            self.callbacks.catch_up_to_cache(pid)
        database = stack.enter_context(contextlib.ExitStack())
        snapshot = database.enter_context(self.callbacks.snapshot(pid, entities=entities))
        self._after_mark_read(snapshot)
        if cache is None:
            return snapshot
        position = cache.position(pid)
        if may_overlay and position is not None and snapshot.high_water_mark < position:
            rows = cache.overlay(pid, snapshot.high_water_mark, snapshot.prefetched.items())
            database.close()
            if rows is not None:
                return stack.enter_context(CachedSnapshot(self.callbacks, cache, pid, *rows))
            self.callbacks.catch_up_to_cache(pid)
            snapshot = stack.enter_context(self.callbacks.snapshot(pid, entities=entities))
        if snapshot.prefetched:
            cache.fill(pid, snapshot.high_water_mark, snapshot.prefetched.items())
        return snapshot

    def _after_mark_read(self, snapshot: MarkSnapshot) -> None:
        """Hook between the mark read and the entity reads (tests put a concurrent apply here)."""
