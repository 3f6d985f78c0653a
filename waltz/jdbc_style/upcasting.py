"""Schema versions and upcasters: old row changes become row changes of the current models.

Source: docs/design/sql.md "Schema versions and upcasting". A model declares its schema version
and the upcasters that take a row change of each older version to the next::

    class Counter(Base):
        __tablename__ = "counters"
        __waltz__ = WaltzEntity(
            "counter",
            schema_version=3,
            upcasters=(
                AddAttribute(1, "label", ""),            # version 1 -> 2
                RenameAttribute(2, "value", "amount"),   # version 2 -> 3
            ),
        )

Every row change carries the schema version its attributes follow (:class:`RowChange`). One step
turns old changes into current ones, :meth:`SchemaChains.upcast`, and every reader of the log goes
through it: the live apply, the entity cache (which holds what the apply applied), the Spark
decoders (and so the rebuild and the drift check). After it, a consumer sees row changes of the
current models only. A change of a newer schema version than the models know raises
:class:`SchemaVersionAheadError`: its partition waits for an upgrade, nothing is skipped.

The upcasters are plain values or module-level functions, so that Spark ships them to its
executors (cloudpickle).
"""

from __future__ import annotations

import dataclasses
import decimal
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Protocol, runtime_checkable

from waltz.errors import ApplyPausedError, SqlFrameworkError
from waltz.jdbc_style.changeset import ChangeSet, ChangeSetFormatError, Operation, RowChange

__all__ = [
    "AddAttribute",
    "DropAttribute",
    "RenameAttribute",
    "RowUpcaster",
    "ScaleAttribute",
    "SchemaChain",
    "SchemaChains",
    "SchemaDeclarationError",
    "SchemaVersionAheadError",
    "StoredRows",
    "UpcastError",
    "Upcaster",
    "upcaster",
]


class SchemaDeclarationError(SqlFrameworkError):
    """A model's ``schema_version`` and ``upcasters`` do not form a chain from version 1."""


class UpcastError(ChangeSetFormatError):
    """An upcaster failed on a row change, or returned something that is not its next version.

    The transaction is not applied and not skipped (like any change-set that does not fit): fix
    the upcaster and restart the instance.
    """


class SchemaVersionAheadError(UpcastError, ApplyPausedError):
    """A row change of a schema version newer than this instance's model: wait for an upgrade.

    Attributes:
        entity: the entity's name.
        version: the schema version of the change.
        known: the schema version of this instance's model.
        where: where the change is when a reader names it (``"partition 1 transaction 8"``), or
            None; it begins the message.
    """

    def __init__(self, entity: str, version: int, known: int, where: str | None = None) -> None:
        super().__init__(
            ("" if where is None else f"{where}: ")
            + f"{entity} row change of schema version {version}, but this instance's model of {entity} "
            f"is version {known}: the partition waits until this instance runs the newer model "
            "(a rolling deploy under way; nothing is applied or skipped meanwhile)"
        )
        self.entity = entity
        self.version = version
        self.known = known
        self.where = where


#: What to do about an upcaster that fails, said after what it did.
_FIX_THE_UPCASTER = (
    "fix the upcaster and run the fixed code (nothing of this change is applied or skipped until it upcasts)"
)


@runtime_checkable
class Upcaster(Protocol):
    """Turns a row change of schema version ``from_version`` into one of the next version.

    Attributes:
        from_version: the version it reads (1 for the first change of a model).
    """

    @property
    def from_version(self) -> int:
        """The version it reads."""
        ...

    def upcast(self, change: RowChange) -> RowChange:
        """The row change as the next schema version has it (same operation and entity)."""
        ...

    def describe(self) -> str:
        """One line for messages and ``waltz rebuild --check``."""
        ...


class _Mutating(Protocol):
    def mutate(self, change: RowChange, key: dict[str, Any], values: dict[str, Any]) -> None: ...


def _by_mutation(upcaster: _Mutating, change: RowChange) -> RowChange:
    key, values = dict(change.key), dict(change.values)
    upcaster.mutate(change, key, values)
    return RowChange(change.operation, change.entity, key, values, change.schema_version)


@dataclass(frozen=True, slots=True)
class AddAttribute:
    """A new attribute: inserts and updates of the older version get it with a constant value.

    An alembic migration that adds the column with a server default gives the rows already in the
    database the same value (``op.add_column(..., server_default=...)``), and the model's scalar
    ``default=`` gives it to new inserts (an entity insert refuses to leave out an attribute whose
    column has only a server default): give all three the same value, so that the live database
    and a rebuild agree.

    Args:
        from_version: the version without the attribute.
        name: the attribute's name.
        value: its value in the older changes (a change-set value: None, bool, int, float, str,
            Decimal, date, datetime, time, bytes, UUID).
    """

    from_version: int
    name: str
    value: Any = None

    def upcast(self, change: RowChange) -> RowChange:
        return _by_mutation(self, change)

    def mutate(self, change: RowChange, key: dict[str, Any], values: dict[str, Any]) -> None:
        """:meth:`upcast` on a change's key and values, in place (the chain's fast path)."""
        if change.operation is not Operation.DELETE and self.name not in values:
            values[self.name] = self.value

    def describe(self) -> str:
        return f"add {self.name} = {self.value!r}"


@dataclass(frozen=True, slots=True)
class RenameAttribute:
    """An attribute renamed (in the key too when it is a key attribute).

    Args:
        from_version: the version with the old name.
        old: the old name.
        new: the new name.
    """

    from_version: int
    old: str
    new: str

    def upcast(self, change: RowChange) -> RowChange:
        return _by_mutation(self, change)

    def mutate(self, change: RowChange, key: dict[str, Any], values: dict[str, Any]) -> None:
        """:meth:`upcast` on a change's key and values, in place (the chain's fast path)."""
        old, new = self.old, self.new
        if old in values:
            values[new] = values.pop(old)
        if old in key:
            key[new] = key.pop(old)

    def describe(self) -> str:
        return f"rename {self.old} to {self.new}"


@dataclass(frozen=True, slots=True)
class DropAttribute:
    """An attribute the model no longer has: older changes lose it.

    Args:
        from_version: the last version with the attribute.
        name: the attribute's name (not a key attribute).
    """

    from_version: int
    name: str

    def upcast(self, change: RowChange) -> RowChange:
        if self.name in change.key:
            raise UpcastError(f"{change.entity}: {self.describe()} would drop a key attribute")
        if self.name not in change.values:
            return change
        return dataclasses.replace(change, values={k: v for k, v in change.values.items() if k != self.name})

    def describe(self) -> str:
        return f"drop {self.name}"


@dataclass(frozen=True, slots=True)
class ScaleAttribute:
    """A unit change: the attribute's older values multiplied by ``factor`` (None stays None).

    Integers stay integers when the product is whole (cents to tenths of a cent: factor 10);
    Decimals stay exact (``Decimal("0.01")`` turns cents into currency units); a product that an
    integer attribute cannot hold exactly fails the upcast rather than round.

    Args:
        from_version: the version in the old unit.
        name: the attribute's name (not a key attribute).
        factor: an int, a Decimal or a Fraction (not a float: a unit change must be exact).
    """

    from_version: int
    name: str
    factor: int | decimal.Decimal | Fraction

    def __post_init__(self) -> None:
        if isinstance(self.factor, bool) or not isinstance(self.factor, int | decimal.Decimal | Fraction):
            raise SchemaDeclarationError(
                f"ScaleAttribute({self.name!r}): factor {self.factor!r} must be an int, Decimal or "
                "Fraction (a unit change must be exact)"
            )

    def upcast(self, change: RowChange) -> RowChange:
        return _by_mutation(self, change)

    def mutate(self, change: RowChange, key: dict[str, Any], values: dict[str, Any]) -> None:
        """:meth:`upcast` on a change's key and values, in place (the chain's fast path)."""
        if self.name in key:
            raise UpcastError(f"{change.entity}: {self.describe()} would change a key attribute")
        value = values.get(self.name)
        if value is not None:
            values[self.name] = self._scaled(change, value)

    def _scaled(self, change: RowChange, value: Any) -> Any:
        factor = self.factor
        if isinstance(value, bool) or not isinstance(value, int | decimal.Decimal | float):
            raise UpcastError(
                f"{change.entity} {dict(change.key)}: {self.describe()} met {value!r}, not a number"
            )
        if isinstance(value, float):
            return value * float(factor)
        if isinstance(value, decimal.Decimal):
            if isinstance(factor, Fraction):
                return value * factor.numerator / factor.denominator
            return value * factor
        # An int: exact, and an int when the product is whole.
        if isinstance(factor, int):
            return value * factor
        product = Fraction(value) * Fraction(factor)
        if product.denominator == 1:
            return int(product)
        if isinstance(factor, decimal.Decimal):
            return value * factor
        raise UpcastError(
            f"{change.entity} {dict(change.key)}: {self.describe()} of {value} is {product}, which an "
            "integer cannot hold; use a Decimal factor for a decimal attribute"
        )

    def describe(self) -> str:
        return f"scale {self.name} by {self.factor}"


@dataclass(frozen=True, slots=True)
class RowUpcaster:
    """Any other change from one version to the next, as a function of the whole row change
    (split an attribute in two, derive one from others, change a type).

    The function gets a change of ``from_version`` and returns the change as the next version has
    it (``dataclasses.replace(change, values=...)``): same operation and entity; the schema
    version is set by the chain. Define it at a module's top level so that Spark can ship it.

    Args:
        from_version: the version it reads.
        function: ``function(change) -> change``.
        description: one line for messages (default: the function's name).
    """

    from_version: int
    function: Callable[[RowChange], RowChange]
    description: str = ""

    def upcast(self, change: RowChange) -> RowChange:
        return self.function(change)

    def describe(self) -> str:
        return self.description or getattr(self.function, "__qualname__", repr(self.function))


def upcaster(
    from_version: int, description: str = ""
) -> Callable[[Callable[[RowChange], RowChange]], RowUpcaster]:
    """Decorate a module-level function as a :class:`RowUpcaster`::

    @upcaster(from_version=2)
    def split_name(change: RowChange) -> RowChange:
        values = dict(change.values)
        if "name" in values:
            values["first_name"], _, values["last_name"] = values.pop("name").partition(" ")
        return dataclasses.replace(change, values=values)
    """

    def wrap(function: Callable[[RowChange], RowChange]) -> RowUpcaster:
        return RowUpcaster(from_version, function, description)

    return wrap


class SchemaChain:
    """One entity's schema version and the steps from each older version to the next.

    Args:
        entity: the entity's name.
        version: its current schema version (at least 1).
        upcasters: the upcasters; each version from 1 below ``version`` needs at least one (a
            step of several runs them in the order given).

    Raises:
        SchemaDeclarationError: a version without a step, an upcaster of a version at or above
            ``version`` or below 1, or a value that is not an upcaster.
    """

    __slots__ = ("_plans", "entity", "steps", "version")

    def __init__(self, entity: str, version: int, upcasters: Iterable[Upcaster] = ()) -> None:
        if type(version) is not int or version < 1:
            raise SchemaDeclarationError(
                f"{entity}: schema_version {version!r} must be an integer of at least 1"
            )
        steps: list[list[Upcaster]] = [[] for _ in range(version - 1)]
        for item in upcasters:
            if not isinstance(item, Upcaster):
                raise SchemaDeclarationError(
                    f"{entity}: {item!r} is not an upcaster (AddAttribute, RenameAttribute, DropAttribute, "
                    "ScaleAttribute, RowUpcaster)"
                )
            if type(item.from_version) is not int or not 1 <= item.from_version < version:
                raise SchemaDeclarationError(
                    f"{entity}: the upcaster '{item.describe()}' reads version {item.from_version!r}, but "
                    f"the model is version {version}: an upcaster reads a version from 1 to {version - 1}"
                )
            steps[item.from_version - 1].append(item)
        missing = [str(v) for v, step in enumerate(steps, start=1) if not step]
        if missing:
            raise SchemaDeclarationError(
                f"{entity} is schema version {version}, but no upcaster reads version(s) "
                f"{', '.join(missing)}: a log holding changes of those versions could not be read "
                "(declare what changed from each version to the next)"
            )
        self.entity = entity
        self.version = version
        self.steps: tuple[tuple[Upcaster, ...], ...] = tuple(tuple(step) for step in steps)
        # From each version: every upcaster to run, with the version it reads and its in-place
        # form (the built-in kinds), flat, so that a change is upcast in one loop.
        flat = [
            (v, getattr(u, "mutate", None), u) for v, step in enumerate(self.steps, start=1) for u in step
        ]
        self._plans = tuple(tuple(s for s in flat if s[0] >= v) for v in range(1, version))

    def upcast(self, change: RowChange) -> RowChange:
        """The change as the current version has it.

        Raises:
            SchemaVersionAheadError: the change is of a newer version than :attr:`version`.
            UpcastError: an upcaster failed or returned a change of another operation or entity.
        """
        from_version = change.schema_version
        if from_version == self.version:
            return change
        if from_version > self.version:
            raise SchemaVersionAheadError(self.entity, from_version, self.version)
        if from_version < 1:
            raise UpcastError(f"{self.entity}: a change of schema version {from_version}, below 1")
        # The built-in upcasters change one copy of the key and values in place; a row upcaster
        # is given a change and its result checked.
        key, values = dict(change.key), dict(change.values)
        for version, mutate, step in self._plans[from_version - 1]:
            try:
                if mutate is not None:
                    mutate(change, key, values)
                    continue
                result = step.upcast(RowChange(change.operation, change.entity, key, values, version))
            except UpcastError:
                raise
            except Exception as exc:
                raise UpcastError(
                    f"{change.entity} {dict(change.key)}: the upcaster '{step.describe()}' from version "
                    f"{version} failed: {exc!r}; {_FIX_THE_UPCASTER}"
                ) from exc
            if (
                not isinstance(result, RowChange)
                or result.operation is not change.operation
                or result.entity != change.entity
            ):
                raise UpcastError(
                    f"{change.entity} {dict(change.key)}: the upcaster '{step.describe()}' from version "
                    f"{version} returned {result!r}, not a {change.operation.value} of {change.entity}; "
                    f"{_FIX_THE_UPCASTER}"
                )
            key, values = dict(result.key), dict(result.values)
        return RowChange(change.operation, change.entity, key, values, self.version)

    def names_at(self, version: int, names: Iterable[str]) -> tuple[str, ...]:
        """The names that the current version's attributes ``names`` had at ``version``: the
        renames (:class:`RenameAttribute`) from that version on, undone in reverse order. The other
        upcasters keep a name (a row upcaster that renames one is not seen).

        Raises:
            SchemaVersionAheadError: ``version`` is newer than :attr:`version`.
        """
        if version > self.version:
            raise SchemaVersionAheadError(self.entity, version, self.version)
        if version < 1:
            raise ValueError(f"{self.entity}: schema version {version} is below 1")
        result = list(names)
        for step in reversed(self.steps[version - 1 :]):
            for item in reversed(step):
                if isinstance(item, RenameAttribute):
                    result = [item.old if name == item.new else name for name in result]
        return tuple(result)

    def describe(self) -> list[str]:
        """One line per step: ``"1 -> 2: add label = ''"``."""
        return [
            f"{version} -> {version + 1}: {'; '.join(u.describe() for u in step)}"
            for version, step in enumerate(self.steps, start=1)
        ]


class SchemaChains:
    """The schema chains of an application's entities: the one upcasting step of every reader.

    Args:
        chains: one per entity of the application (an entity of version 1 has an empty chain).
        retired: entity names the application retired (docs/design/sql.md "Retiring an entity"):
            every reader passes over their row changes.
    """

    __slots__ = ("_chains", "_retired", "_upcasts")

    def __init__(self, chains: Iterable[SchemaChain] = (), retired: Iterable[str] = ()) -> None:
        self._chains: dict[str, SchemaChain] = {chain.entity: chain for chain in chains}
        self._retired = frozenset(retired)
        self._upcasts = any(chain.version > 1 for chain in self._chains.values())

    def __getstate__(self) -> dict[str, Any]:
        return {"chains": list(self._chains.values()), "retired": sorted(self._retired)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["chains"], state.get("retired", ()))  # type: ignore[misc]

    @property
    def retired(self) -> frozenset[str]:
        """The entity names every reader passes over."""
        return self._retired

    @property
    def upcasts(self) -> bool:
        """True when some entity is above version 1 (its older changes get upcast)."""
        return self._upcasts

    def version_of(self, entity: str) -> int | None:
        """The current schema version of an entity; None for an entity the application lacks."""
        chain = self._chains.get(entity)
        return None if chain is None else chain.version

    def chain(self, entity: str) -> SchemaChain | None:
        """The chain of an entity, or None for an entity the application lacks."""
        return self._chains.get(entity)

    def upcast_change(self, change: RowChange) -> RowChange:
        """One row change as the current model of its entity has it; a change of an entity the
        application lacks is left as it is (the apply refuses an unknown entity by itself).

        Raises:
            SchemaVersionAheadError: the change is of a newer version than the model.
            UpcastError: an upcaster failed.
        """
        chain = self._chains.get(change.entity)
        return change if chain is None else chain.upcast(change)

    def upcast(self, change_set: ChangeSet) -> ChangeSet:
        """A decoded change-set with every row change as the current models have it, without
        the row changes of retired entities (the same object when nothing is older or newer than
        the models, nor retired).

        Raises:
            SchemaVersionAheadError: a change is of a newer version than its model.
            UpcastError: an upcaster failed.
        """
        changes = change_set.changes
        retired = self._retired
        if retired and any(c.entity in retired for c in changes):
            changes = tuple(c for c in changes if c.entity not in retired)
            change_set = dataclasses.replace(change_set, changes=changes)
        if not self._upcasts and all(c.schema_version == 1 for c in changes):
            return change_set
        upcast = [self.upcast_change(c) for c in changes]
        if all(new is old for new, old in zip(upcast, changes, strict=True)):
            return change_set
        return dataclasses.replace(change_set, changes=tuple(upcast))


@dataclass(frozen=True, slots=True)
class StoredRows:
    """Whole rows of one entity stored at an older schema version, such as a snapshot's, made rows
    of the current model by the entity's chain: each row is upcast as an insert of the whole row
    at its version (docs/design/spark.md "Snapshots of an older model"). A plain value, so that
    Spark ships it to its executors.

    Attributes:
        chain: the entity's chain (its current version and upcasters).
        version: the schema version the rows were stored at (at most ``chain.version``; at it, the
            rows are only read by ``attributes``).
        attributes: ``(attribute at that version, stored column)`` of every stored column.
        key: the key attributes at that version (a subset of the attributes).
        current: the current model's attributes, every one of which the upcast rows must give.
        uuids: the stored columns of UUIDs (kept as text): the upcasters get ``uuid.UUID`` values,
            as the log's changes give them.
        decimals: the stored decimal columns kept as their exact text: the upcasters get
            ``decimal.Decimal`` values, as the log's changes give them.
    """

    chain: SchemaChain
    version: int
    attributes: tuple[tuple[str, str], ...]
    key: tuple[str, ...]
    current: tuple[str, ...]
    uuids: tuple[str, ...] = ()
    decimals: tuple[str, ...] = ()

    def upcast(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """One stored row (column -> value) as the current model's attribute -> value. The
        upcasters get values as a change-set of the log gives them: UUIDs as ``uuid.UUID``,
        decimals as ``decimal.Decimal``, binary values as ``bytes``.

        Raises:
            UpcastError: an upcaster failed, or the upcast row lacks an attribute of the current
                model or has one it does not know (the upcasters do not lead to the model).
        """
        values = {
            attribute: _as_logged(row[column], column in self.uuids, column in self.decimals)
            for attribute, column in self.attributes
        }
        key = {name: values[name] for name in self.key}
        entity = self.chain.entity
        change = self.chain.upcast(RowChange(Operation.INSERT, entity, key, values, self.version))
        result = change.values
        if len(result) != len(self.current) or any(name not in result for name in self.current):
            missing = sorted(set(self.current) - set(result))
            unknown = sorted(set(result) - set(self.current))
            problems = [f"lacks the model's attributes {missing}"] if missing else []
            problems += [f"has attributes {unknown} the model does not know"] if unknown else []
            steps = "; ".join(self.chain.describe()) or "none"
            raise UpcastError(
                f"{entity} {key}: a row stored at schema version {self.version}, upcast to version "
                f"{self.chain.version}, {' and '.join(problems)}: the upcasters ({steps}) do not lead "
                "from the stored columns to the model"
            )
        return dict(result)


def _as_logged(value: Any, is_uuid: bool, is_decimal: bool = False) -> Any:
    """A stored value as a change-set of the log carries it (``StoredRows.upcast``)."""
    if is_uuid and isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError as exc:
            raise UpcastError(f"{value!r} stored in a UUID column is not a UUID") from exc
    if is_decimal and isinstance(value, str):
        try:
            return decimal.Decimal(value)
        except decimal.InvalidOperation as exc:
            raise UpcastError(f"{value!r} stored in a decimal column is not a number") from exc
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return value
