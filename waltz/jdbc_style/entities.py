"""Declarative Waltz identity for SQLAlchemy models: lock name, lock ID, partition.

Source: docs/design/locks.md "Locks and their scope" (a lock is a partition-local name and 64-bit
ID); docs/design/client.md "Transaction contexts and callbacks" (the application chooses the
partition); docs/design/sql.md "Entity transactions". A model declares::

    class Account(Base):
        __tablename__ = "accounts"
        __waltz__ = WaltzEntity("account")                      # key: the primary key
        account_id: Mapped[int] = mapped_column(primary_key=True)
        balance: Mapped[int]

    class Membership(Base):
        __tablename__ = "memberships"
        __waltz__ = WaltzEntity("membership", key=("group_id", "user_id"),
                                partition_by=lambda key, n: key[0] % n)   # by group

The **lock ID** of an entity is its key when the key is one integer attribute, otherwise BLAKE2b
with an 8-byte digest (``digest_size=8``) of the key's canonical JSON, read as a signed big-endian
int64. The default **partition** is ``crc32(lock_id as 8 bytes big-endian) mod num_partitions``
(:func:`default_partition`): stable
across processes, Python versions and machines. ``partition_by(key, num_partitions)`` overrides it
per model (e.g. all the accounts of one customer in one partition, so transfers between them are
one transaction). :func:`partition_of` gives an entity's partition, by its model's mapping.
"""

from __future__ import annotations

import functools
import hashlib
import json
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Column, Select, and_, bindparam, inspect, select, tuple_
from sqlalchemy.engine import Connection
from sqlalchemy.exc import MultipleResultsFound
from sqlalchemy.orm import DeclarativeBase, Mapper, Session, make_transient_to_detached
from sqlalchemy.orm.attributes import instance_dict

from waltz.client.locks import PartitionLocalLock
from waltz.client.routing import PartitionRouter
from waltz.errors import ApplyPausedError, SqlFrameworkError
from waltz.jdbc_style.upcasting import SchemaChain, SchemaChains, Upcaster

__all__ = [
    "EntityInfo",
    "EntityRegistry",
    "UnknownEntityError",
    "WaltzEntity",
    "default_partition",
    "lock_id_of",
    "partition_of",
    "rows_by_model",
]

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1

#: ``partition_by(key, num_partitions) -> partition_id``: ``key`` is the tuple of key values.
Partitioner = Callable[[tuple[Any, ...], int], int]

_MAX_INFOS = 256
_INFOS: dict[type[Any], EntityInfo] = {}  # partition_of's entity infos, by model


class UnknownEntityError(SqlFrameworkError):
    """A model without ``__waltz__``, or an entity name no registered model has."""


class EntityNotDeclaredError(UnknownEntityError, ApplyPausedError):
    """The live apply met a row change of an entity this instance's registry neither declares nor
    retires: a newer release may declare it (a rolling deploy under way), or an older one dropped
    it without retiring it. The partition waits, as for a newer schema version, and is never
    skipped (docs/design/sql.md "Retiring an entity")."""


@dataclass(frozen=True)
class WaltzEntity:
    """A model's Waltz identity; set it as the model's ``__waltz__`` class attribute.

    Args:
        lock_name: the lock name, also the entity's name in change-sets; unique per registry.
        key: attribute names forming the lock ID, in order (default: the primary key columns).
            They must identify a row (the framework updates and deletes rows by them).
        partition_by: ``(key values, num_partitions) -> partition``, overriding the default
            stable hash of the lock ID.
        schema_version: the version of the model's attributes that its row changes carry into
            the log (1 until the model first changes; docs/design/sql.md "Schema versions and
            upcasting").
        upcasters: what changed from each older version to the next
            (:mod:`waltz.jdbc_style.upcasting`): at least one upcaster reading each version from 1
            to ``schema_version - 1``.

    Raises:
        SchemaDeclarationError: (when the model is registered) the upcasters do not lead from
            version 1 to ``schema_version``.
    """

    lock_name: str
    key: tuple[str, ...] | str = ()
    partition_by: Partitioner | None = None
    schema_version: int = 1
    upcasters: Sequence[Upcaster] = ()

    def __post_init__(self) -> None:
        # A single key attribute may be given as a string; a list of upcasters as any sequence.
        if isinstance(self.key, str):
            object.__setattr__(self, "key", (self.key,))
        else:
            object.__setattr__(self, "key", tuple(self.key))
        object.__setattr__(self, "upcasters", tuple(self.upcasters))


def lock_id_of(key: tuple[Any, ...]) -> int:
    """The 64-bit lock ID of an entity key (see the module docstring).

    Args:
        key: the key's values in declared order.
    """
    first = key[0] if len(key) == 1 else None
    if isinstance(first, int) and not isinstance(first, bool) and _INT64_MIN <= first <= _INT64_MAX:
        return first
    canonical = json.dumps([_canonical(v) for v in key], separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.blake2b(canonical.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def default_partition(key: tuple[Any, ...], num_partitions: int) -> int:
    """The default partition of an entity key: ``crc32(lock ID as 8 bytes big-endian) mod
    num_partitions`` (docs/design/sql.md "Entity transactions"). A model without ``partition_by``
    maps its entities so; a ``partition_by`` may call it with part of its key, to put an entity
    where the entity of that part is (an order where its customer is: ``default_partition(key[:1],
    num_partitions)``).

    Args:
        key: key values in declared order, as ``partition_by`` receives them (e.g. ``(7,)``).
        num_partitions: the log's partitions (``client.num_partitions``), at least 1.

    Returns:
        The partition, ``0 .. num_partitions - 1``.

    Raises:
        ValueError: ``num_partitions`` is below 1.
    """
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be at least 1, got {num_partitions}")
    return zlib.crc32(lock_id_of(key).to_bytes(8, "big", signed=True)) % num_partitions


def partition_of(model: type[Any], key: Any, num_partitions: int | PartitionRouter) -> int:
    """The partition of a declared entity, as a transaction's is chosen: the model's
    ``partition_by``, or :func:`default_partition` (docs/design/sql.md "Entity transactions").
    Use it to route a request to the instance that mounts the entity's partition, or to name the
    partition for ``wait_for``.

    Args:
        model: a model with ``__waltz__``.
        key: the entity's key as ``tx.get`` takes it: a scalar, a tuple or a mapping of the key
            attributes.
        num_partitions: the client (a :class:`~waltz.client.routing.PartitionRouter`): the
            partition the entity's transactions go to now, by the client's view of the
            partition epochs, during a split too (docs/design/splits.md "Clients across a
            split"); or a count, at least 1: the entity's partition at that count.

    Returns:
        The partition, ``0 .. num_partitions - 1``.

    Raises:
        UnknownEntityError: the model has no ``__waltz__``, or its key names no column attribute.
        ValueError: the key has the wrong number of values, ``num_partitions`` is below 1, or
            ``partition_by`` gave a partition outside ``0 .. num_partitions - 1``.
    """
    info = _info_of(model)
    values = info.normalize_key(key)
    if not isinstance(num_partitions, int):
        return num_partitions.partition_for(functools.partial(info.partition_of, values))
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be at least 1, got {num_partitions}")
    return info.partition_of(values, num_partitions)


def _info_of(model: type[Any]) -> EntityInfo:
    """The entity info of a model for :func:`partition_of` (as a registry makes it, without the
    registry's check of lock names across models), made once (the last 256 models are kept).

    Raises:
        UnknownEntityError: the model has no ``__waltz__``.
    """
    info = _INFOS.get(model)
    if info is None:  # two threads may both make it: the same info, kept once
        if len(_INFOS) >= _MAX_INFOS:
            _INFOS.clear()
        info = _INFOS[model] = EntityInfo(model, _spec_of(model))
    return info


def _spec_of(model: type[Any]) -> WaltzEntity:
    """A model's ``__waltz__``.

    Raises:
        UnknownEntityError: it has none.
    """
    spec = getattr(model, "__waltz__", None)
    if not isinstance(spec, WaltzEntity):
        raise UnknownEntityError(
            f"{model.__name__} has no __waltz__ = WaltzEntity(...) declaration; add one to use it "
            "as a Waltz entity"
        )
    return spec


def _canonical(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str | float):
        return value
    return str(value)


class EntityInfo:
    """What the framework knows of one declared model (made by :class:`EntityRegistry`).

    Attributes:
        model: the mapped class.
        spec: its ``__waltz__``.
        key: the key attribute names.
        primary_key: the attribute names of the model's primary key columns.
        attributes: every column attribute name (what change-sets carry).
    """

    def __init__(self, model: type[Any], spec: WaltzEntity) -> None:
        mapper: Mapper[Any] = inspect(model)
        self.model = model
        self.spec = spec
        self.mapper = mapper
        self._new_instance = mapper.class_manager.new_instance
        self.attributes: tuple[str, ...] = tuple(prop.key for prop in mapper.column_attrs)
        self.columns: tuple[Any, ...] = tuple(prop.columns[0] for prop in mapper.column_attrs)
        """The column of each attribute, in :attr:`attributes`' order (a row's columns)."""
        self.primary_key: tuple[str, ...] = tuple(
            mapper.get_property_by_column(col).key for col in mapper.primary_key
        )
        if spec.key:
            missing = [name for name in spec.key if name not in self.attributes]
            if missing:
                raise UnknownEntityError(
                    f"{model.__name__}.__waltz__ key names {missing}, which are not column attributes "
                    f"of the model (it has {list(self.attributes)})"
                )
            self.key: tuple[str, ...] = spec.key if isinstance(spec.key, tuple) else (spec.key,)
        else:
            self.key = self.primary_key
        self.key_position = self.attributes.index(self.key[0])
        """Where the first key attribute is in :attr:`attributes` (and in a row)."""
        self.key_types: tuple[type, ...] | None = _python_types(
            self.columns[self.attributes.index(name)] for name in self.key
        )
        """The Python type of each key column's values, or None when a column's type has none."""
        self.defaults: dict[str, Any] = {}
        """Scalar column defaults by attribute (an entity insert fills them in)."""
        defaulted: list[str] = []
        for prop in mapper.column_attrs:
            column = prop.columns[0]
            default = getattr(column, "default", None)
            if default is not None and getattr(default, "is_scalar", False):
                self.defaults[prop.key] = default.arg
            if default is not None or getattr(column, "server_default", None) is not None:
                defaulted.append(prop.key)
        self.defaulted: tuple[str, ...] = tuple(defaulted)
        """The attributes whose columns have any default (SQLAlchemy's, scalar or not, or the
        server's): what an insert that leaves them out gets is not NULL."""
        self.schema = SchemaChain(spec.lock_name, spec.schema_version, spec.upcasters)
        """The model's schema version and the upcasters from each older one."""

    @property
    def schema_version(self) -> int:
        """The schema version its row changes are written with (``WaltzEntity.schema_version``)."""
        return self.schema.version

    @property
    def name(self) -> str:
        """The entity's name (its lock name)."""
        return self.spec.lock_name

    def key_of(self, entity: Any) -> tuple[Any, ...]:
        """The key values of an instance."""
        return tuple(getattr(entity, name) for name in self.key)

    def key_fits_types(self, values: tuple[Any, ...]) -> bool:
        """Whether each key value is an instance of its key column's Python type (False when a
        column's type declares none): a key that surely compares with the key columns."""
        types = self.key_types
        return types is not None and all(isinstance(v, t) for v, t in zip(values, types, strict=True))

    def normalize_key(self, key: Any) -> tuple[Any, ...]:
        """A key given as a scalar, tuple or mapping, as the tuple of key values.

        Raises:
            ValueError: wrong number of values or missing names.
        """
        if isinstance(key, Mapping):
            try:
                return tuple(key[name] for name in self.key)
            except KeyError as exc:
                raise ValueError(
                    f"{self.model.__name__} key needs {list(self.key)}, got {dict(key)}"
                ) from exc
        values = key if isinstance(key, tuple) else (key,)
        if len(values) != len(self.key):
            raise ValueError(
                f"{self.model.__name__} key is {list(self.key)}: expected {len(self.key)} value(s), "
                f"got {values!r}"
            )
        return values

    def lock(self, key: tuple[Any, ...]) -> PartitionLocalLock:
        """The lock of the entity with these key values."""
        return PartitionLocalLock(self.spec.lock_name, lock_id_of(key))

    def partition_of(self, key: tuple[Any, ...], num_partitions: int) -> int:
        """The partition of the entity with these key values.

        Raises:
            ValueError: ``partition_by`` returned a partition outside ``0 .. num_partitions - 1``.
        """
        if self.spec.partition_by is not None:
            partition = self.spec.partition_by(key, num_partitions)
        else:
            partition = default_partition(key, num_partitions)
        if not 0 <= partition < num_partitions:
            raise ValueError(
                f"{self.model.__name__}: partition_by{key!r} returned {partition}, "
                f"outside 0..{num_partitions - 1}"
            )
        return partition

    def row_of(self, entity: Any) -> dict[str, Any]:
        """Every column attribute of an instance (the whole row, as change-sets carry it)."""
        return {name: getattr(entity, name) for name in self.attributes}

    def load(self, conn: Connection, key: tuple[Any, ...]) -> Any | None:
        """Read the entity with these key values through ``conn``, or None when it has no row.

        Returns:
            A detached instance (attached to no session) holding the row, or None.

        Raises:
            MultipleResultsFound: the key matches more than one row (it must identify one).
        """
        by_key = self._by_key
        if by_key is None:  # several tables or computed columns: the ORM knows how to load it
            where = and_(*(getattr(self.model, n) == v for n, v in zip(self.key, key, strict=True)))
            with Session(bind=conn) as session:
                entity = session.execute(select(self.model).where(where)).scalar_one_or_none()
                if entity is not None:
                    session.expunge(entity)
                return entity
        row = conn.execute(by_key, {f"key_{i}": value for i, value in enumerate(key)}).one_or_none()
        return None if row is None else self.entity_from_row(row)

    @property
    def row_statement(self) -> Select[Any] | None:
        """The statement that reads one row by key (bound parameters ``key_0``, ``key_1``, ...),
        its columns :attr:`columns`; None when the model needs the ORM to load (several tables,
        inheritance, computed columns or load hooks)."""
        return self._by_key

    def entity_from_row(self, row: Sequence[Any]) -> Any:
        """An instance of the model from a row of :attr:`columns`, as the ORM would leave it after
        loading and expunging it: detached, its attributes committed values.

        Args:
            row: the values of :attr:`columns`, in order (a row of :attr:`row_statement`).
        """
        entity = self._new_instance()
        # The ORM's own loading writes the instance's dict too; make_transient_to_detached then
        # commits every attribute (what set_committed_value did one attribute at a time).
        instance_dict(entity).update(zip(self.attributes, row, strict=True))
        make_transient_to_detached(entity)
        return entity

    def load_many(
        self, conn: Connection, keys: Sequence[tuple[Any, ...]]
    ) -> dict[tuple[Any, ...], Any | None]:
        """:meth:`load` for several keys in one ``IN`` statement (of the key's values, or of
        tuples of them for a key of several attributes). Returns ``{key tuple: instance or None}``
        in the order given."""
        rows = None if self._by_key is None or len(keys) < 2 else self.rows_by_keys(conn, keys)
        if rows is None:
            return {key: self.load(conn, key) for key in keys}
        return {key: None if row is None else self.entity_from_row(row) for key, row in rows.items()}

    def rows_by_keys(
        self, conn: Connection, keys: Sequence[tuple[Any, ...]]
    ) -> dict[tuple[Any, ...], Any | None] | None:
        """The rows (of :attr:`columns`) of these keys in one ``IN`` statement: ``{key tuple: row
        or None}`` in the order given; None when the model needs the ORM to load, or when the
        database converted a key value (e.g. ``"7"`` for 7): read them key by key then.

        Raises:
            MultipleResultsFound: a key matches more than one row.
        """
        if self._by_key is None:
            return None
        found: dict[tuple[Any, ...], Any | None] = dict.fromkeys(keys)
        key_indexes = [self.attributes.index(name) for name in self.key]
        single = len(key_indexes) == 1
        values = [key[0] for key in found] if single else list(found)
        for row in conn.execute(self._by_keys, {"keys": values}):
            key = tuple(row[i] for i in key_indexes)
            if key not in found:
                return None
            if found[key] is not None:
                raise MultipleResultsFound(f"{self.model.__name__}: more than one row with the key {key!r}")
            found[key] = row
        return found

    @property
    def _by_keys(self) -> Select[Any]:
        """The statement that reads rows by a list of keys (``keys``, expanding: values for a
        one-attribute key, tuples for a key of several)."""
        if not hasattr(self, "_by_keys_statement"):
            columns = [self.mapper.get_property(name).columns[0] for name in self.key]
            target = columns[0] if len(columns) == 1 else tuple_(*columns)
            self._by_keys_statement = select(*self.columns).where(
                target.in_(bindparam("keys", expanding=True))
            )
        return self._by_keys_statement

    @property
    def _by_key(self) -> Select[Any] | None:
        """The statement that reads one row by key, built once (None: the model needs the ORM)."""
        if not hasattr(self, "_by_key_statement"):
            columns = self.columns
            mapper = self.mapper
            simple = (  # else the ORM: inheritance, several tables, computed columns, load hooks
                len(mapper.tables) == 1
                and mapper.inherits is None
                and mapper.polymorphic_on is None
                and not mapper.class_manager.dispatch.load
                and all(len(prop.columns) == 1 for prop in mapper.column_attrs)
                and all(isinstance(column, Column) for column in columns)
            )
            statement: Select[Any] | None = None
            if simple:
                by_name = dict(zip(self.attributes, columns, strict=True))
                statement = select(*columns).where(
                    and_(*(by_name[name] == bindparam(f"key_{i}") for i, name in enumerate(self.key)))
                )
            self._by_key_statement = statement
        return self._by_key_statement


class EntityRegistry:
    """The declared models of an application, by class and by entity name.

    Args:
        models: mapped classes with a ``__waltz__`` attribute.
        retired: entity names (lock names) of models the application dropped: the log keeps their
            row changes, and every reader (the live apply, the entity cache, a rebuild's views)
            passes over them (docs/design/sql.md "Retiring an entity").

    Raises:
        UnknownEntityError: a model lacks ``__waltz__``, two share a lock name, or a model has a
            retired name.
    """

    def __init__(self, models: Iterable[type[Any]] = (), retired: Iterable[str] = ()) -> None:
        self._by_model: dict[type[Any], EntityInfo] = {}
        self._by_name: dict[str, EntityInfo] = {}
        self._chains: SchemaChains | None = None
        self._retired = frozenset(retired)
        for model in models:
            self.register(model)

    @classmethod
    def from_base(cls, base: type[DeclarativeBase], retired: Iterable[str] = ()) -> EntityRegistry:
        """Every model of a declarative base that has ``__waltz__`` (and the ``retired`` names)."""
        models = [
            m.class_
            for m in base.registry.mappers
            if isinstance(getattr(m.class_, "__waltz__", None), WaltzEntity)
        ]
        return cls(sorted(models, key=lambda m: m.__name__), retired)

    @property
    def retired(self) -> frozenset[str]:
        """The entity names every reader passes over."""
        return self._retired

    def register(self, model: type[Any]) -> EntityInfo:
        """Add a model.

        Raises:
            UnknownEntityError: no ``__waltz__``, or its lock name is taken by another model.
        """
        spec = _spec_of(model)
        if spec.lock_name in self._retired:
            raise UnknownEntityError(
                f"{model.__name__} declares the lock name {spec.lock_name!r}, which this registry retires: "
                "a retired entity's changes are passed over by every reader; give the new model another name"
            )
        existing = self._by_name.get(spec.lock_name)
        if existing is not None and existing.model is not model:
            raise UnknownEntityError(
                f"{model.__name__} and {existing.model.__name__} both declare the lock name "
                f"{spec.lock_name!r}"
            )
        info = EntityInfo(model, spec)
        self._by_model[model] = info
        self._by_name[spec.lock_name] = info
        self._chains = None
        return info

    def info(self, model: type[Any]) -> EntityInfo:
        """The entity info of a model (registers it on first use).

        Raises:
            UnknownEntityError: the model has no ``__waltz__``.
        """
        info = self._by_model.get(model)
        return info if info is not None else self.register(model)

    def by_name(self, name: str) -> EntityInfo:
        """The entity info of an entity name (as in change-sets).

        Raises:
            UnknownEntityError: no registered model has that lock name.
        """
        info = self._by_name.get(name)
        if info is None:
            raise UnknownEntityError(
                f"no registered model has the entity name {name!r} (registered: {sorted(self._by_name)}); "
                "register its model with the callbacks' EntityRegistry"
            )
        return info

    def schema_chains(self) -> SchemaChains:
        """The schema chains of the registered models: the upcasting step of every reader of the
        log (:class:`~waltz.jdbc_style.upcasting.SchemaChains`; plain values, picklable)."""
        chains = self._chains
        if chains is None:
            chains = self._chains = SchemaChains(
                (info.schema for info in self._by_model.values()), self._retired
            )
        return chains

    def __iter__(self) -> Any:
        return iter(self._by_model.values())

    def __len__(self) -> int:
        return len(self._by_model)


def rows_by_model(
    conn: Connection, entities: Iterable[tuple[EntityInfo, tuple[Any, ...]]]
) -> tuple[dict[tuple[EntityInfo, tuple[Any, ...]], Any], list[tuple[EntityInfo, tuple[Any, ...]]]]:
    """The rows of entities read by key through ``conn``, one ``IN`` statement per model
    (:meth:`EntityInfo.rows_by_keys`): ``({(entity info, key values): row or None}, the entities
    not read so)``, those of models the ORM must load or whose key values the database converted.

    Raises:
        MultipleResultsFound: a key matches more than one row.
    """
    by_model: dict[EntityInfo, list[tuple[Any, ...]]] = {}
    for info, values in entities:
        by_model.setdefault(info, []).append(values)
    rows: dict[tuple[EntityInfo, tuple[Any, ...]], Any] = {}
    unread: list[tuple[EntityInfo, tuple[Any, ...]]] = []
    for info, keys in by_model.items():
        read = info.rows_by_keys(conn, keys)
        if read is None:
            unread.extend((info, values) for values in keys)
        else:
            rows.update(((info, values), row) for values, row in read.items())
    return rows, unread


def _python_types(columns: Iterable[Any]) -> tuple[type, ...] | None:
    """Each column's ``type.python_type``, or None when a column's type has none."""
    try:
        return tuple(column.type.python_type for column in columns)
    except NotImplementedError:
        return None
