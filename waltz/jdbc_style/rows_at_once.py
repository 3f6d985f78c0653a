"""A staged row-change statement's parameter sets as one statement over arrays (PostgreSQL).

Source: docs/design/sql.md "Rows of one shape in one statement".

``ChangeSetCallbacks`` stages each row change of a group with a statement built once per shape
(model, operation, key and value attributes), so a group's changes of one shape share a statement
and its parameter sets. On PostgreSQL with psycopg the direct path (``direct.py``) runs them in
rounds that each write a row at most once (:meth:`RowsForm.rounds`), and a round of
:data:`MIN_ROWS` parameter sets or more as one statement whose rows come from arrays, one array
per attribute::

    UPDATE t SET c = waltz_rows.v_c FROM unnest(CAST(%(k_id)s AS BIGINT[]), CAST(%(v_c)s AS TEXT[]))
        AS waltz_rows(k_id, v_c) WHERE t.id = waltz_rows.k_id

instead of one execution per parameter set: the database plans and runs one statement, and the
driver sends one. Every row change still runs, and each row's changes in their order:

- the rounds run one after the other, the first write of each row in the first, its second in the
  second, and so on; no write is left out, so each one fails as it would alone (a row count one
  short, a unique key, a value too long) and fires its row-level triggers;
- each array is cast to the column's type without its length, precision or scale (``TEXT[]`` for
  a ``VARCHAR(8)``), so that the assignment to the column refuses an over-long value as a
  single-row statement does (an explicit cast to ``VARCHAR(8)`` would cut it silently);
- an insert must carry every primary key column (no key is generated, so the order rows are
  inserted in changes nothing).

Within a round the rows are written by one statement, so what the database checks once per
statement sees them together, and it visits them in its plan's order: a table with a foreign key
to itself goes one by one, as do the inserts and updates of a table with a key checked across
rows besides its primary key (unique, exclusion; as its model declares them: constraints only the
database knows are not seen). A statement goes this way only where each of its attributes is a
plain column of the model's one table of a type listed in :func:`array_element_type`, and, per
round, only when each attribute's values (None aside) are of one Python type (psycopg dumps a
list of one type); otherwise the parameter sets run one by one, as before. The single-row
statements cast their parameters to the column's type too (SQLAlchemy renders the casts for
psycopg), so the arrays' casts read each value as they do.
A statement-level trigger fires once per statement over arrays, where it fired once per
parameter set, and ``AFTER`` row triggers at the end of that statement.
"""

from __future__ import annotations

import datetime as dt
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, CITEXT
from sqlalchemy.sql.base import Executable
from sqlalchemy.types import TypeEngine

from waltz.jdbc_style.changeset import Operation

__all__ = [
    "MIN_ROWS",
    "RowsForm",
    "RowsShape",
    "array_element_type",
    "describe_rows",
    "rows_form",
]

#: The derived table the arrays are unnested as.
ROWS_ALIAS = "waltz_rows"
#: The fewest parameter sets a statement runs over arrays with: below it the statement over arrays
#: costs the database more than it saves the driver (``benchmarks/framework_writes.py``,
#: docs/decisions/0079-rows-of-one-shape-in-one-statement.md).
MIN_ROWS = 5


@dataclass(frozen=True)
class RowsShape:
    """What a staged statement does, as ``ChangeSetCallbacks`` built it (and the key it keeps the
    statement under): ``operation`` on ``model``, its rows named by the ``keys`` attributes
    (bound as ``k_<name>``; none for an insert) and written with the ``values`` attributes
    (bound as ``v_<name>``; none for a delete)."""

    model: type[Any]
    operation: Operation
    keys: tuple[str, ...]
    values: tuple[str, ...]


# Statement -> its shape, for the statements described (kept while the statement lives).
_SHAPES: weakref.WeakKeyDictionary[Executable, RowsShape] = weakref.WeakKeyDictionary()


def describe_rows(statement: Executable, shape: RowsShape) -> None:
    """Say what ``statement`` does, so that its parameter sets may run as one statement over
    arrays where the driver allows (:func:`rows_form`)."""
    _SHAPES[statement] = shape


def array_element_type(column_type: TypeEngine[Any]) -> TypeEngine[Any] | None:
    """The type an array of a column's values is cast to: the column's type without length,
    precision or scale, so that the assignment to the column checks and rounds a value as it
    does for a single row; None for a type not listed (enums, JSON, arrays, decorated types,
    ``CITEXT``, fixed-length or collated strings, and any other), whose statements run one
    parameter set at a time."""
    if isinstance(column_type, sa.types.TypeDecorator | sa.Enum | sa.Interval | CITEXT):
        return None  # CITEXT compared as TEXT would tell apart keys that differ in case
    if isinstance(column_type, sa.BigInteger):
        return sa.BigInteger()
    if isinstance(column_type, sa.SmallInteger):
        return sa.SmallInteger()
    if isinstance(column_type, sa.Integer):
        return sa.Integer()
    if isinstance(column_type, sa.Float):
        return None  # REAL or DOUBLE PRECISION by precision: not worth guessing
    if isinstance(column_type, sa.Numeric):
        return sa.Numeric()
    if isinstance(column_type, sa.CHAR | sa.NCHAR) or (
        isinstance(column_type, sa.String) and column_type.collation
    ):
        return None  # compared as TEXT a CHAR key would miss its index; a collation its rules
    if isinstance(column_type, sa.String):
        return sa.Text()
    if isinstance(column_type, sa.DateTime):
        return sa.DateTime(timezone=bool(column_type.timezone))
    if isinstance(column_type, sa.Date):
        return sa.Date()
    if isinstance(column_type, sa.LargeBinary):
        return sa.LargeBinary()
    return None


class RowsForm:
    """A described statement as one statement over arrays, and how to take a group's parameter
    sets to it: in rounds that each write a row at most once (:meth:`rounds`), each round's sets
    as arrays (:meth:`arrays`).

    Attributes:
        statement: the statement over arrays (its bind parameters named as the original's).
        shape: what the original statement does.
    """

    __slots__ = ("_key_names", "_names", "shape", "statement")

    def __init__(self, statement: Executable, shape: RowsShape) -> None:
        self.statement = statement
        self.shape = shape
        self._key_names = tuple(f"k_{name}" for name in shape.keys)
        self._names = (*self._key_names, *(f"v_{name}" for name in shape.values))

    def rounds(self, parameters: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]] | None:
        """``parameters`` (the original's parameter sets, in order) in rounds that each write a
        row at most once: the first write of each row in the first round, its second in the
        second, and so on, each round's sets in their order (the database then visits a round's
        rows in its plan's order). Run one after the other, the
        rounds write each row in the order of its writes, and every write runs (none is left out,
        so each one's errors and row-level triggers are its own). None when a key value cannot
        be told apart from another in Python (unhashable)."""
        key_names = self._key_names
        if not key_names:  # an insert: its rows are told apart by the database (a unique key)
            return [list(parameters)]
        rounds: list[list[Mapping[str, Any]]] = []
        seen: dict[tuple[Any, ...], int] = {}
        try:
            for parameter_set in parameters:
                key = tuple(parameter_set[name] for name in key_names)
                index = seen.get(key, 0)
                seen[key] = index + 1
                if index == len(rounds):
                    rounds.append([])
                rounds[index].append(parameter_set)
        except (KeyError, TypeError):  # other names, an unhashable key
            return None
        return rounds

    def arrays(self, parameters: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]] | None:
        """The arrays to run :attr:`statement` with in place of ``parameters`` (parameter sets of
        the original that write each row at most once, see :meth:`rounds`); None when they cannot
        go as arrays (a set with other names, an attribute whose values are of several types)."""
        names = self._names
        arrays: dict[str, list[Any]] = {name: [] for name in names}
        try:
            for parameter_set in parameters:
                if len(parameter_set) != len(names):
                    return None
                for name in names:
                    arrays[name].append(parameter_set[name])
        except KeyError:
            return None
        for values in arrays.values():
            kinds = {_kind(value) for value in values if value is not None}
            if len(kinds) > 1:
                return None
        return arrays


def _kind(value: Any) -> Any:
    """What psycopg dumps a list element as: its type, and for a date-time (of any subclass)
    whether it has a time zone (naive and aware values are different types to the database)."""
    if isinstance(value, dt.datetime):
        return dt.datetime, value.tzinfo is None
    if isinstance(value, dt.time):
        return dt.time, value.tzinfo is None
    return type(value)


# Shape -> its form (None: the shape cannot go as arrays), built once per shape.
_FORMS: dict[RowsShape, RowsForm | None] = {}


def rows_form(statement: Executable) -> RowsForm | None:
    """The form over arrays of a statement :func:`describe_rows` described, or None (not
    described, or its shape cannot go as arrays: see the module's description)."""
    shape = _SHAPES.get(statement)
    if shape is None:
        return None
    if shape not in _FORMS:
        _FORMS[shape] = _build(shape)
    return _FORMS[shape]


def _unique_besides_primary_key(table: sa.Table) -> bool:
    """Whether the model's table declares a key checked across rows other than its primary key
    (a unique column, constraint or index, an exclusion constraint, any constraint but a check
    or a foreign key)."""
    if any(column.unique for column in table.columns):
        return True
    row_by_row = (sa.PrimaryKeyConstraint, sa.ForeignKeyConstraint, sa.CheckConstraint)
    if any(not isinstance(c, row_by_row) for c in table.constraints):
        return True
    return any(index.unique for index in table.indexes)


def _build(shape: RowsShape) -> RowsForm | None:
    mapper = sa.inspect(shape.model, raiseerr=False)
    if mapper is None:
        return None
    table = mapper.local_table
    if mapper.persist_selectable is not table or not isinstance(table, sa.Table):
        return None  # inheritance across tables: one statement would not do
    try:
        if any(key.references(table) for key in table.foreign_keys):
            return None  # a reference to the table itself is checked once per statement
    except sa.exc.SQLAlchemyError:  # a reference SQLAlchemy cannot resolve: go one by one
        return None
    if shape.operation is not Operation.DELETE and _unique_besides_primary_key(table):
        return None  # a unique key is checked row by row in the plan's order, not the log's
    names: list[str] = []
    elements: list[TypeEngine[Any]] = []
    for prefix, attributes in (("k_", shape.keys), ("v_", shape.values)):
        for attribute in attributes:
            prop = mapper.column_attrs.get(attribute)
            if prop is None or len(prop.columns) != 1:
                return None
            column = prop.columns[0]
            if not isinstance(column, sa.Column) or column.table is not table:
                return None
            element = array_element_type(column.type)
            if element is None:
                return None
            names.append(prefix + attribute)
            elements.append(element)
    if not names:
        return None
    typed = zip(names, elements, strict=True)
    arrays = (sa.cast(sa.bindparam(name), ARRAY(element)) for name, element in typed)
    rows = (
        sa.func.unnest(*arrays)
        .table_valued(*(sa.column(name) for name in names))
        .render_derived(name=ROWS_ALIAS)
    )
    model = shape.model
    where = [getattr(model, name) == rows.c[f"k_{name}"] for name in shape.keys]
    statement: Executable
    if shape.operation is Operation.UPDATE:
        if not where or not shape.values:
            return None
        written = {name: rows.c[f"v_{name}"] for name in shape.values}
        statement = sa.update(model).where(*where).values(written)
    elif shape.operation is Operation.DELETE:
        if not where:
            return None
        statement = sa.delete(model).where(*where)
    else:
        key_attributes = {mapper.get_property_by_column(column).key for column in mapper.primary_key}
        if not key_attributes <= set(shape.values):
            return None  # a generated key: the order of the inserts would matter
        statement = sa.insert(model).from_select(
            [getattr(model, name) for name in shape.values],
            sa.select(*(rows.c[f"v_{name}"] for name in shape.values)),
        )
    return RowsForm(statement, shape)
