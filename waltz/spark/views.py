"""Replaying row changes into tables with Spark: the last write per key in log order wins.

Source: docs/design/spark.md "Computing views" (the database is derived from the log);
``docs/spark.md`` ("Views"). An application describes its views with :class:`AppViews` (its
module's ``VIEWS``); entity tables come from :func:`entity_table`, anything else (audit rows from
``meta``, derived columns) from the application's own transformations.

Replay rules (those of :class:`waltz.jdbc_style.ChangeSetCallbacks`): changes apply in log order
``(partition_id, transaction_id, op_index)``; ``insert`` and ``update`` carry the whole row, so the
last one per ``(entity, key)`` is the row, unless a later ``delete`` removed it; a change-set whose
idempotency key appeared in an earlier transaction is not applied (first in ``(partition_id,
transaction_id)`` order). An entity key lives in one partition (the framework partitions by key),
so log order per key is well defined.
"""

from __future__ import annotations

import decimal
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, Table, types

from waltz.jdbc_style.changeset import Operation, RowChange
from waltz.jdbc_style.changeset_callbacks import partial_row_problem
from waltz.jdbc_style.entities import EntityRegistry
from waltz.spark.decoders import DecoderRegistry
from waltz.spark.errors import RebuildError

__all__ = [
    "SNAPSHOT_TRANSACTION_ID",
    "AppViews",
    "apply_idempotency",
    "caching_replays",
    "carries_decimal_text",
    "change_check",
    "change_problems",
    "checked_problems",
    "compared_decimal",
    "entity_table",
    "idempotency_key_rows",
    "partial_row_problem",
    "replay",
    "require_writable_columns",
    "spark_type",
    "unwritable_columns",
]

#: The ``partition_id`` and ``transaction_id`` of a snapshot's row entering the row changes of a
#: rebuild from a snapshot (docs/design/spark.md "Snapshots"): before every change of the log.
SNAPSHOT_TRANSACTION_ID = -1


@dataclass(frozen=True)
class AppViews:
    """An application's views of the log, as the rebuild job computes them.

    Attributes:
        cluster_name: the default name of the log in the database's mark rows.
        tables: the tables the rebuild replaces (SQLAlchemy tables of the application schema).
        prepare: creates or upgrades the application's and the framework's tables (idempotent).
        build: ``build(changes, log) -> {table name: DataFrame}`` from the decoded row changes
            (:func:`waltz.spark.decoders.decode_changes`) and the raw log; one DataFrame per
            table of ``tables``, with its columns.
        decoders: decoders of command-style transactions.
        entities: the application's entities: given, the rebuild refuses a log whose row changes
            of these entities do not fit their models (:func:`change_problems`), as the live
            apply does, before it writes anything; row changes of other entity names are left to
            ``build`` (which usually ignores them).
    """

    cluster_name: str
    tables: Sequence[Table]
    prepare: Callable[[Engine], None]
    build: Callable[[Any, Any], Mapping[str, Any]]
    decoders: DecoderRegistry = field(default_factory=DecoderRegistry)
    entities: EntityRegistry | None = None


def spark_type(column_type: types.TypeEngine[Any]) -> str:
    """The Spark SQL type of a SQLAlchemy column type (for casting rendered values).

    A ``Numeric`` without a scale (SQLAlchemy's ``Numeric()``, what ``Mapped[Decimal]`` maps to)
    is carried as its exact decimal text (``string``): no Spark decimal holds every value such a
    column takes, and the database converts the text as it converts the live apply's value
    (docs/design/spark.md, "Computing views"); see :func:`carries_decimal_text`.

    Raises:
        TypeError: a type the rebuild cannot cast to (override the table's DataFrame yourself).
    """
    checks: list[tuple[type[Any], str]] = [
        (types.Boolean, "boolean"),
        (types.BigInteger, "bigint"),
        (types.SmallInteger, "smallint"),
        (types.Integer, "int"),
        (types.Float, "double"),
        (types.DateTime, "timestamp"),
        (types.Date, "date"),
        (types.LargeBinary, "binary"),
        (types.String, "string"),
        (types.Uuid, "string"),
    ]
    if carries_decimal_text(column_type):
        return "string"
    if isinstance(column_type, types.Numeric) and not isinstance(column_type, types.Float):
        return f"decimal({column_type.precision},{column_type.scale})"
    for kind, name in checks:
        if isinstance(column_type, kind):
            return name
    raise TypeError(f"no Spark type for the SQL type {column_type!r}")


#: The largest precision of a decimal the rebuild and snapshots hold as a number (Spark's
#: ``DecimalType`` and Parquet's ``decimal128``).
DECIMAL_PRECISION = 38


def carries_decimal_text(column_type: types.TypeEngine[Any]) -> bool:
    """Whether the rebuild and snapshots carry a column's values as exact decimal text: a
    ``Numeric`` (not a ``Float``) without both a precision and a scale (SQLAlchemy's
    ``Numeric()``, what ``Mapped[Decimal]`` maps to), or whose precision or scale no
    :data:`DECIMAL_PRECISION`-digit decimal holds. Such a column holds any number of digits (an
    unbounded PostgreSQL ``NUMERIC``, any SQLite column). Its values are written as that text,
    which the database converts as it converts the live apply's ``Decimal``, and the drift check
    compares them as numbers at the live column's own precision (docs/design/spark.md,
    "Computing views", "Drift check" and "Snapshots")."""
    if not isinstance(column_type, types.Numeric) or isinstance(column_type, types.Float):
        return False
    precision, scale = column_type.precision, column_type.scale
    return (
        precision is None
        or scale is None
        or not 1 <= precision <= DECIMAL_PRECISION
        or not 0 <= scale <= precision
    )


def compared_decimal(value: str | None, precision: str) -> str | None:
    """A decimal's text as the drift check compares it (docs/design/spark.md, "Drift check"): the
    number at a live column's precision, in plain notation without trailing zeros.

    Args:
        value: the decimal's text (``1.50``, ``1E-7``); text that is no finite number is kept.
        precision: ``"exact"``, ``"double"`` (rounded to the nearest binary float, as SQLite keeps
            it) or a scale as digits (rounded half away from zero to that many decimals, as
            PostgreSQL and MariaDB round a value into their ``NUMERIC(p, s)``); see
            :meth:`waltz.spark.live_tables.LiveSnapshot.decimal_precision`.

    Returns:
        ``"1.5"``, ``"0.0000001"``, ``"0"``; None for None.
    """
    if value is None:
        return None
    try:
        number = decimal.Decimal(value)
    except decimal.InvalidOperation:
        return value
    if not number.is_finite():
        return value
    with decimal.localcontext() as context:
        # Enough digits for the number and the scale: the default 28 would round a long value.
        scale = int(precision) if precision.isdigit() else 0
        context.prec = max(28, len(value) + 2 * abs(int(number.as_tuple().exponent)) + scale + 40)
        if precision == "double":
            number = decimal.Decimal(repr(float(number)))
        elif precision.isdigit():
            step = decimal.Decimal(1).scaleb(-scale)
            number = number.quantize(step, rounding=decimal.ROUND_HALF_UP)
        if number.is_zero():
            return "0"
        return format(number.normalize(), "f")


def unwritable_columns(app: AppViews) -> list[str]:
    """The columns of the application's entity tables whose type the rebuild cannot cast the
    log's values to (:func:`spark_type`), each as ``table.column (TYPE)``; empty when there are
    none. The rebuild refuses such an application before it reads the log
    (:func:`require_writable_columns`)."""
    found = []
    for info in app.entities or ():
        table: Table = info.model.__table__
        for column in table.columns:
            try:
                spark_type(column.type)
            except TypeError:
                found.append(f"{table.name}.{column.name} ({column.type})")
    return found


def require_writable_columns(app: AppViews) -> None:
    """Refuse, before the log is read, an application whose entity tables have a column of a type
    the rebuild cannot write (a ``Time``, a ``JSON``, an ``Interval``, ...), where the rebuild
    failed once it had read the whole log (docs/design/spark.md, "Computing views").

    Raises:
        RebuildError: naming each such column and its type, and what to do.
    """
    found = unwritable_columns(app)
    if found:
        raise RebuildError(
            f"the application {app.cluster_name!r} has entity columns whose type the rebuild cannot "
            f"write: {', '.join(found)} (it writes booleans, integers, floats, decimals, dates, "
            "datetimes, text, UUIDs and bytes); nothing was read or written: rebuild the table with a "
            "view of your own (AppViews.build, not entity_table), or keep such a value in a column of "
            "one of those types"
        )


def apply_idempotency(changes: Any) -> Any:
    """Drop the changes of change-sets whose idempotency key appeared in an earlier transaction."""
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

    first = (
        changes.where(F.col("idempotency_key").isNotNull())
        .groupBy("idempotency_key")
        .agg(F.min(F.struct("partition_id", "transaction_id")).alias("first"))
    )
    joined = changes.join(first, on="idempotency_key", how="left")
    keep = F.col("first").isNull() | (
        (F.col("first.partition_id") == F.col("partition_id"))
        & (F.col("first.transaction_id") == F.col("transaction_id"))
    )
    return joined.where(keep).drop("first")


def idempotency_key_rows(changes: Any, cluster_name: str) -> Any:
    """The ``waltz_idempotency_keys`` rows of the log: each key where it first appears.

    As the SQL callbacks record them (``docs/sql.md``, "Idempotency keys"): one row per key, the
    first transaction in ``(partition_id, transaction_id)`` order that carried it; ``applied_at``
    is unknown (NULL).

    Args:
        changes: row changes (:data:`~waltz.spark.decoders.CHANGES_SCHEMA`).
        cluster_name: the log's name in the rows.

    Returns:
        A DataFrame with the columns of ``waltz_idempotency_keys``.
    """
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

    first = (
        changes.where(F.col("idempotency_key").isNotNull())
        .groupBy("idempotency_key")
        .agg(F.min(F.struct("partition_id", "transaction_id")).alias("first"))
    )
    return first.select(
        F.lit(cluster_name).alias("cluster_name"),
        F.col("idempotency_key"),
        F.col("first.partition_id").cast("int").alias("partition_id"),
        F.col("first.transaction_id").cast("bigint").alias("transaction_id"),
        F.lit(None).cast("timestamp").alias("applied_at"),
    )


def change_problems(changes: Any, registry: EntityRegistry, limit: int = 5) -> list[str]:
    """The first row changes of registered entities that do not fit their models or the replay.

    The checks of the live apply (:func:`waltz.jdbc_style.changeset_callbacks.row_change_problem`:
    the key names the entity's key or primary key, the values only column attributes, the key
    values unchanged), and the replay's own (:func:`partial_row_problem`: an insert or update
    carries the whole row), run in the executors on the decoded changes (docs/design/spark.md
    "Computing views": data from the log is checked against the model before it reaches a
    database).

    Args:
        changes: decoded row changes (:func:`~waltz.spark.decoders.decode_changes`).
        registry: the application's entities.
        limit: how many problems to return at most.

    Returns:
        Up to ``limit`` sentences, each naming the partition, the transaction and the problem;
        empty when every change fits.
    """
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

    check_change = change_check(registry)

    def problem(
        entity: str | None, operation: str | None, key: dict[str, str] | None, values: dict[str, str] | None
    ) -> str | None:
        if entity is None or operation is None:
            return None
        return check_change(RowChange(Operation(operation), entity, key or {}, values or {}))

    check = F.udf(problem, "STRING", useArrow=False)
    found = (
        changes.select(
            "partition_id",
            "transaction_id",
            check("entity", "operation", "key_values", "values").alias("problem"),
        )
        .where(F.col("problem").isNotNull())
        .orderBy("partition_id", "transaction_id")
        .limit(limit)
        .collect()
    )
    return [f"partition {r.partition_id} transaction {r.transaction_id}: {r.problem}" for r in found]


def change_check(registry: EntityRegistry) -> Callable[[RowChange], str | None]:
    """The check of :func:`change_problems` for one row change, as a function the executors run
    (it holds plain values only: names, never SQLAlchemy objects).

    :func:`waltz.spark.decoders.decode_changes` runs it in the decoding pass (its ``check``), so
    that the rebuild finds the problems in the decoded changes without another pass through
    Python (:func:`checked_problems`; docs/design/spark.md "Computing views").

    Args:
        registry: the application's entities.

    Returns:
        A function of a row change (values as decoded, or rendered as text) that gives the
        sentence naming its problem, or None when it fits (or is not of a registered entity).
    """
    from waltz.jdbc_style.changeset_callbacks import row_change_problem

    shapes = {  # plain values: key, primary key, attributes, model name, attributes with defaults
        info.spec.lock_name: (
            tuple(info.key),
            tuple(info.primary_key),
            tuple(info.attributes),
            info.model.__name__,
            info.defaulted,
        )
        for info in registry
    }

    def check(change: RowChange) -> str | None:
        shape = shapes.get(change.entity)
        if shape is None:
            return None
        key_names, primary_key, attributes, model_name, defaulted = shape
        return row_change_problem(
            change, key=key_names, primary_key=primary_key, attributes=attributes, model_name=model_name
        ) or partial_row_problem(change, attributes, defaulted)

    return check


def checked_problems(changes: Any, limit: int = 5) -> list[str]:
    """The first problems found by the decoding pass's check (:func:`change_check`).

    Args:
        changes: decoded row changes with the ``problem`` column that
            :func:`~waltz.spark.decoders.decode_changes` adds when given a ``check``.
        limit: how many problems to return at most.

    Returns:
        Up to ``limit`` sentences, each naming the partition, the transaction and the problem, in
        the order of :func:`change_problems`; empty when every change fits.
    """
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

    found = (
        changes.where(F.col("problem").isNotNull())
        .select("partition_id", "transaction_id", "problem")
        .orderBy("partition_id", "transaction_id")
        .limit(limit)
        .collect()
    )
    return [f"partition {r.partition_id} transaction {r.transaction_id}: {r.problem}" for r in found]


#: The replays to persist while views are built (:func:`caching_replays`), or None.
_replays: ContextVar[list[Any] | None] = ContextVar("waltz_spark_replays", default=None)


@contextmanager
def caching_replays() -> Iterator[list[Any]]:
    """Within the block, :func:`replay` persists what it returns and adds it to the list yielded.

    An application's entity tables usually share one replay (``entity_table(rows, ...)`` for each
    model): persisted, it is computed once, by the first table's write, instead of once per table
    (docs/design/spark.md "Computing views"). The caller unpersists the list's DataFrames when the
    views are written (:meth:`waltz.spark.rebuild.ComputedViews.release`).

    Yields:
        The list of the DataFrames persisted so far (it grows as ``replay`` is called).
    """
    persisted: list[Any] = []
    token = _replays.set(persisted)
    try:
        yield persisted
    finally:
        _replays.reset(token)


def replay(changes: Any) -> Any:
    """The surviving row per ``(entity, key)``: its last insert/update, none when last deleted.

    Args:
        changes: row changes (:data:`~waltz.spark.decoders.CHANGES_SCHEMA`), idempotency applied.

    Returns:
        The rows of the last change per key that is not a delete, with the change's columns
        (``transaction_id`` is the transaction that last wrote the row); persisted within
        :func:`caching_replays`.
    """
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention
    from pyspark.sql.window import Window

    window = Window.partitionBy("entity", "key").orderBy(
        F.col("partition_id").desc(), F.col("transaction_id").desc(), F.col("op_index").desc()
    )
    last = (
        changes.where(F.col("entity").isNotNull())
        .withColumn("_rank", F.row_number().over(window))
        .where(F.col("_rank") == 1)
        .drop("_rank")
    )
    rows = last.where(F.col("operation") != "delete")
    persisted = _replays.get()
    if persisted is not None:
        rows = rows.persist()
        persisted.append(rows)
    return rows


def entity_table(
    rows: Any,
    registry: EntityRegistry,
    model: type[Any],
    overrides: Mapping[str, Any] | None = None,
) -> Any:
    """One entity's table from replayed rows: every column cast to its type.

    Args:
        rows: :func:`replay`'s result.
        registry: the application's entities.
        model: the entity's mapped class.
        overrides: column name -> a Spark Column expression replacing the logged value (e.g.
            ``updated_tx`` from ``transaction_id``).

    Returns:
        A DataFrame with the table's columns, in table order. A row whose last change is a
        snapshot's row (``transaction_id`` :data:`SNAPSHOT_TRANSACTION_ID`, docs/design/spark.md
        "Snapshots") keeps the snapshot's values in the overridden columns too: they are what
        the overrides gave when the rows were applied, and a snapshot row has no position of
        its own in the log.
    """
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

    info = next(i for i in registry if i.model is model)
    table: Table = model.__table__
    by_column = {prop.columns[0].name: prop.key for prop in info.mapper.column_attrs}
    chosen = overrides or {}
    selected = []
    for column in table.columns:
        target = spark_type(column.type)
        raw = F.col("values").getItem(by_column.get(column.name, column.name))
        logged = F.unbase64(raw) if target == "binary" else raw
        if column.name in chosen and column.name in by_column:
            from_snapshot = F.col("transaction_id") == F.lit(SNAPSHOT_TRANSACTION_ID)
            overridden = chosen[column.name].cast(target)
            expression = F.when(from_snapshot, logged.cast(target)).otherwise(overridden)
        elif column.name in chosen:  # not an attribute: a snapshot's rows do not carry it
            expression = chosen[column.name]
        else:
            expression = logged
        selected.append(expression.cast(target).alias(column.name))
    return rows.where(F.col("entity") == info.spec.lock_name).select(*selected)
