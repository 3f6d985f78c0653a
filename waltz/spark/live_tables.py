"""A live database's tables as Spark DataFrames, all at the point of its high-water marks.

Source: docs/design/spark.md "Drift check" (the live tables are read over JDBC by the executors,
at one consistent point, and compared with the rebuilt ones in Spark);
``docs/decisions/0032-drift-check-through-spark.md``.

:func:`live_snapshot` gives the live database's marks and, per table, a DataFrame of its rows at
exactly those marks, without bringing the rows to the driver (except on SQLite):

- **PostgreSQL**: the driver opens a ``REPEATABLE READ`` transaction, reads the marks and exports
  its snapshot (``pg_export_snapshot()``); every JDBC read of an executor starts its own
  transaction with ``SET TRANSACTION SNAPSHOT`` on it (the ``sessionInitStatement`` option), so
  every table, read in parallel and as often as Spark needs, sees what the marks cover. The
  driver's transaction stays open until the comparison is done.
- **MariaDB** has no snapshot to share: the marks are read, every table is read over JDBC and
  kept by Spark (``persist``, on the executors), and the marks are read again. The framework
  applies a transaction's rows and its mark in one database transaction, so equal marks before
  and after mean the tables were read at those marks. When the marks moved (instances applying),
  it reads again, a few times, then fails saying so.
- **SQLite** is a file on the driver's machine (and Spark has no JDBC driver for it here): the
  rows are read in one deferred transaction on the driver and handed to Spark, as before.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import String, Table, cast, inspect, select, text, type_coerce, types
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.types import NullType

from waltz.jdbc_style import create_framework_engine
from waltz.jdbc_style.marks import HighWaterMarks
from waltz.spark.errors import RebuildError
from waltz.spark.target import backend_of, jdbc_target, marks_text
from waltz.spark.views import carries_decimal_text

__all__ = [
    "DECIMAL_DOUBLE",
    "DECIMAL_EXACT",
    "JDBC_FETCH_SIZE",
    "MARIADB_ATTEMPTS",
    "LiveSnapshot",
    "live_query",
    "live_snapshot",
]

log = logging.getLogger(__name__)

#: Rows per JDBC fetch of a live table (PostgreSQL streams with a cursor only when it is set).
JDBC_FETCH_SIZE = 10_000
#: Reads of a MariaDB live database before giving up when its marks keep moving.
MARIADB_ATTEMPTS = 3

#: The precision of a live column that keeps any decimal exactly (PostgreSQL's ``numeric``).
DECIMAL_EXACT = "exact"
#: The precision of a live column that keeps a decimal as a binary float (SQLite's ``REAL``).
DECIMAL_DOUBLE = "double"


@dataclass
class LiveSnapshot:
    """The live database at its marks: the marks, and each table's rows for Spark.

    Attributes:
        marks: partition -> the live database's high-water mark (the rows cover exactly these).
        backend: ``postgresql``, ``mariadb`` or ``sqlite``.
    """

    marks: dict[int, int]
    backend: str
    _frames: dict[str, Any] = field(default_factory=dict)
    _rows: dict[str, list[tuple[Any, ...]]] = field(default_factory=dict)
    _precisions: dict[str, dict[str, str]] = field(default_factory=dict)

    def decimal_precision(self, table: Table) -> dict[str, str]:
        """How the live database keeps each column of ``table`` whose values the rebuild carries
        as decimal text (:func:`waltz.spark.views.carries_decimal_text`): :data:`DECIMAL_EXACT`,
        :data:`DECIMAL_DOUBLE`, or the column's scale as digits (MariaDB's ``NUMERIC`` is
        ``DECIMAL(10,0)``: ``"0"``). The drift check compares such a column at that precision
        (docs/design/spark.md, "Drift check").

        Returns:
            Column name -> precision; empty when the table has no such column or is missing.
        """
        return dict(self._precisions.get(table.name, {}))

    def frame(self, spark: Any, table: Table, schema: Any) -> Any:
        """The live rows of ``table`` as a DataFrame with ``schema`` (the rebuilt table's).

        Args:
            spark: the Spark session.
            table: the table (its columns are selected, in order).
            schema: a ``StructType`` with those columns: live values are cast to its types.

        Returns:
            A DataFrame; empty when the live database has no such table.
        """
        from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

        frame = self._frames.get(table.name)
        if frame is None:
            convert = [_spark_value(f.dataType) for f in schema.fields]
            rows = [
                tuple(v if c is None or v is None else c(v) for v, c in zip(row, convert, strict=True))
                for row in self._rows.get(table.name, [])
            ]
            return spark.createDataFrame(rows, schema=schema)
        return frame.select(*[F.col(f.name).cast(f.dataType).alias(f.name) for f in schema.fields])

    def release(self) -> None:
        """Drop what Spark keeps of the live tables (MariaDB)."""
        for frame in self._frames.values():
            frame.unpersist()


def _spark_value(data_type: Any) -> Callable[[Any], Any] | None:
    """What turns a value SQLAlchemy read from SQLite into one of a Spark field of ``data_type``,
    or None when it is one already: a naive datetime (SQLite keeps UTC) into an aware one, which
    Spark takes whatever the driver's zone (a naive one it would take as the driver's local
    time); a UUID, a number or a time into its text (a decimal column the rebuild carries as
    text, read as the float SQLite keeps)."""
    from pyspark.sql.types import StringType, TimestampType

    if isinstance(data_type, TimestampType):
        return _utc
    if isinstance(data_type, StringType):
        return str
    return None


def _utc(value: Any) -> Any:
    """A naive datetime as the UTC time it is; anything else as it is."""
    if isinstance(value, dt.datetime) and value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value


def _selected(table: Table) -> list[Any]:
    """The columns of ``table`` as a live read selects them: a column the rebuild carries as
    decimal text (:func:`waltz.spark.views.carries_decimal_text`) as the database's own text of
    its value, exact, where a JDBC read would round it to Spark's ``decimal(38,18)``."""
    return [cast(c, String).label(c.name) if carries_decimal_text(c.type) else c for c in table.columns]


def live_query(engine: Engine, table: Table, cluster_name: str, *, only_log: bool) -> str:
    """The ``SELECT`` of ``table``'s columns in the live database's SQL, as a JDBC ``dbtable``;
    a column the rebuild carries as decimal text is selected as text.

    Args:
        engine: the live database (its dialect quotes the names).
        table: the table.
        cluster_name: the log's name.
        only_log: keep the rows of this log only (a ``cluster_name`` column equal to it).
    """
    query = select(*_selected(table))
    if only_log:
        query = query.where(table.c.cluster_name == cluster_name)
    sql = str(query.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}))
    return f"({sql}) live_rows"


def _among(table: Table, tables: Sequence[Table]) -> bool:
    return any(table is t for t in tables)


def _existing(conn: Connection, tables: Sequence[Table]) -> list[Table]:
    names = set(inspect(conn).get_table_names())
    return [t for t in tables if t.name in names]


def _precisions(conn: Connection, backend: str, tables: Sequence[Table]) -> dict[str, dict[str, str]]:
    """Per table, the precision the live database keeps each decimal-text column at (see
    :meth:`LiveSnapshot.decimal_precision`), from its own column types."""
    inspector = inspect(conn)
    found: dict[str, dict[str, str]] = {}
    for table in tables:
        wanted = {c.name for c in table.columns if carries_decimal_text(c.type)}
        if not wanted:
            continue
        found[table.name] = {
            str(c["name"]): _precision(backend, c["type"])
            for c in inspector.get_columns(table.name)
            if c["name"] in wanted
        }
    return found


def _precision(backend: str, column_type: Any) -> str:
    """The precision a live column of ``column_type`` keeps a decimal at."""
    if backend == "sqlite" or isinstance(column_type, types.Float):
        return DECIMAL_DOUBLE
    scale = getattr(column_type, "scale", None)
    return DECIMAL_EXACT if scale is None else str(int(scale))


def _jdbc_reader(spark: Any, live_url: str, init_statement: str | None) -> Any:
    jdbc, props = jdbc_target(live_url)
    props.pop("batchsize", None)
    reader = spark.read.format("jdbc").option("url", jdbc).option("fetchsize", str(JDBC_FETCH_SIZE))
    for name, value in props.items():
        reader = reader.option(name, value)
    if init_statement is not None:
        reader = reader.option("sessionInitStatement", init_statement)
    return reader


@contextmanager
def live_snapshot(
    spark: Any,
    live_url: str,
    tables: Sequence[Table],
    cluster_name: str,
    *,
    only_log: Sequence[Table] = (),
) -> Iterator[LiveSnapshot]:
    """Open the live database's tables at its marks for Spark (see the module docstring).

    Args:
        spark: the Spark session (with the JDBC drivers on ``spark.jars``).
        live_url: the live database (SQLAlchemy URL: PostgreSQL, MariaDB or SQLite).
        tables: the tables to read.
        cluster_name: the log's name (its marks are read).
        only_log: the tables among ``tables`` whose rows of this log only are read.

    Yields:
        The marks and the tables' DataFrames; valid until the block ends.

    Raises:
        RebuildError: a MariaDB database's marks kept moving while it was read, or the backend
            is not supported.
    """
    engine = create_framework_engine(live_url)
    try:
        backend = backend_of(engine)
        if backend == "postgresql":
            with _postgresql(spark, engine, live_url, tables, cluster_name, only_log) as snapshot:
                yield snapshot
        elif backend == "mariadb":
            snapshot = _mariadb(spark, engine, live_url, tables, cluster_name, only_log)
            try:
                yield snapshot
            finally:
                snapshot.release()
        elif backend == "sqlite":
            yield _sqlite(engine, tables, cluster_name, only_log)
        else:
            raise RebuildError(f"the drift check reads PostgreSQL, MariaDB or SQLite, not {backend}")
    finally:
        engine.dispose()


@contextmanager
def _postgresql(
    spark: Any,
    engine: Engine,
    live_url: str,
    tables: Sequence[Table],
    cluster_name: str,
    only_log: Sequence[Table],
) -> Iterator[LiveSnapshot]:
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn, conn.begin():
        snapshot_id = str(conn.execute(text("SELECT pg_export_snapshot()")).scalar_one())
        marks = HighWaterMarks(cluster_name).read_all(conn)
        existing = _existing(conn, tables)
        precisions = _precisions(conn, "postgresql", existing)
        # Each executor's connection runs without autocommit (the fetch size asks for it), so this
        # begins its transaction, on the driver's snapshot.
        init = (
            "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; "
            f"SET TRANSACTION SNAPSHOT '{snapshot_id}'"  # an ID PostgreSQL made: no quote in it
        )
        reader = _jdbc_reader(spark, live_url, init)
        frames = {
            t.name: reader.option(
                "dbtable", live_query(engine, t, cluster_name, only_log=_among(t, only_log))
            ).load()
            for t in existing
        }
        log.info("live PostgreSQL snapshot %s at marks %s", snapshot_id, marks_text(marks))
        yield LiveSnapshot(marks, "postgresql", frames, _precisions=precisions)


def _mariadb(
    spark: Any,
    engine: Engine,
    live_url: str,
    tables: Sequence[Table],
    cluster_name: str,
    only_log: Sequence[Table],
) -> LiveSnapshot:
    from pyspark import StorageLevel

    reader = _jdbc_reader(spark, live_url, None)
    seen: list[str] = []
    for _ in range(MARIADB_ATTEMPTS):
        with engine.connect() as conn:
            before = HighWaterMarks(cluster_name).read_all(conn)
            existing = _existing(conn, tables)
            precisions = _precisions(conn, "mariadb", existing)
        frames: dict[str, Any] = {}
        for t in existing:
            query = live_query(engine, t, cluster_name, only_log=_among(t, only_log))
            frames[t.name] = reader.option("dbtable", query).load().persist(StorageLevel.MEMORY_AND_DISK)
            frames[t.name].count()  # read now, between the two mark readings
        with engine.connect() as conn:
            after = HighWaterMarks(cluster_name).read_all(conn)
        if after == before:
            return LiveSnapshot(before, "mariadb", frames, _precisions=precisions)
        for frame in frames.values():
            frame.unpersist()
        seen.append(f"{marks_text(before)} -> {marks_text(after)}")
        log.info("the live MariaDB database applied while it was read (%s); reading again", seen[-1])
    raise RebuildError(
        f"the live database kept applying the log while the drift check read it ({'; '.join(seen)}): "
        "on MariaDB the check needs the marks to stay still while the tables are read; run it when "
        "the instances are idle (or paused)"
    )


def _sqlite(
    engine: Engine, tables: Sequence[Table], cluster_name: str, only_log: Sequence[Table]
) -> LiveSnapshot:
    with engine.connect() as conn, conn.begin():
        marks = HighWaterMarks(cluster_name).read_all(conn)
        rows: dict[str, list[tuple[Any, ...]]] = {}
        existing = _existing(conn, tables)
        for t in existing:
            # A decimal-text column as SQLite keeps it (a float), not rounded to 10 decimals by
            # SQLAlchemy's Numeric.
            columns = [type_coerce(c, NullType()) if carries_decimal_text(c.type) else c for c in t.columns]
            query = select(*columns)
            if _among(t, only_log):
                query = query.where(t.c.cluster_name == cluster_name)
            rows[t.name] = [tuple(r) for r in conn.execute(query)]
        precisions = _precisions(conn, "sqlite", existing)
    return LiveSnapshot(marks, "sqlite", _rows=rows, _precisions=precisions)
