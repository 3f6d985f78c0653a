"""Drift between a live database and the log: ``waltz rebuild --verify-against``.

Source: docs/design/spark.md "Drift check" (a database is derived from the log, so it can be checked
against it); ``docs/spark.md`` ("``waltz rebuild``"). :func:`verify` reads the live database's marks
and tables in one snapshot, computes the views of the log at exactly those marks, and reports per
table the rows the live database lacks, the ones it has and the log does not, and the ones that
differ.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Column, MetaData, PrimaryKeyConstraint, Table, inspect, select, text
from sqlalchemy.engine import Connection

from waltz.jdbc_style import create_framework_engine
from waltz.jdbc_style.marks import HighWaterMarks
from waltz.jdbc_style.schema import idempotency_keys
from waltz.spark.live_tables import DECIMAL_EXACT, live_snapshot
from waltz.spark.rebuild import LogSource, compute_views
from waltz.spark.target import backend_of, marks_text, write_views
from waltz.spark.views import AppViews, carries_decimal_text, compared_decimal

__all__ = [
    "DRIFT_EXAMPLES",
    "IDEMPOTENCY_KEYS_COMPARED",
    "DriftReport",
    "TableDrift",
    "compare_table",
    "read_live_snapshot",
    "verify",
]

Progress = Callable[[str], None]

#: Examples kept per kind of drift and table.
DRIFT_EXAMPLES = 5

#: The columns of ``waltz_idempotency_keys`` a verification compares (``applied_at`` is a time of
#: the live apply, which the log does not know).
IDEMPOTENCY_KEYS_COMPARED = Table(
    idempotency_keys.name,
    MetaData(),
    *(Column(c.name, c.type) for c in idempotency_keys.columns if c.name != "applied_at"),
    PrimaryKeyConstraint("cluster_name", "idempotency_key"),
)


def _quiet(_: str) -> None:
    return None


@dataclass(frozen=True, slots=True)
class TableDrift:
    """Differences of one table between the log's view and a live database.

    Attributes:
        table: the table.
        missing: rows the log has and the live database lacks (count).
        extra: rows the live database has and the log does not.
        different: rows with the same key and other values.
        examples: up to :data:`DRIFT_EXAMPLES` descriptions per kind.
    """

    table: str
    missing: int
    extra: int
    different: int
    examples: Sequence[str] = ()

    @property
    def drift(self) -> bool:
        """True when the table differs."""
        return bool(self.missing or self.extra or self.different)


@dataclass(frozen=True, slots=True)
class DriftReport:
    """The result of :func:`verify`.

    Attributes:
        marks: the live database's marks the comparison was made at.
        tables: one entry per table.
    """

    marks: Mapping[int, int]
    tables: Sequence[TableDrift] = field(default_factory=list)

    @property
    def drift(self) -> bool:
        """True when any table differs."""
        return any(t.drift for t in self.tables)

    def lines(self) -> list[str]:
        """A human-readable report, one line per table and example."""
        out = [f"compared at high-water marks {marks_text(self.marks) or '(none)'}"]
        for t in self.tables:
            status = "DRIFT" if t.drift else "same"
            out.append(f"{status}  {t.table}: {t.missing} missing, {t.extra} extra, {t.different} different")
            out.extend(f"    {example}" for example in t.examples)
        return out


def read_live_snapshot(
    live_url: str, tables: Sequence[Table], cluster_name: str
) -> tuple[dict[int, int], dict[str, list[tuple[Any, ...]]]]:
    """Read a live database's marks and the rows of ``tables`` in one snapshot (one transaction).

    PostgreSQL and MariaDB: one ``REPEATABLE READ`` transaction (MariaDB's started ``WITH
    CONSISTENT SNAPSHOT``, so the marks and every table are read at one point); SQLite: one
    deferred transaction (a WAL snapshot from its first read). The rows of
    :data:`IDEMPOTENCY_KEYS_COMPARED` are this log's only.

    Returns:
        ``(marks, {table name: rows as tuples in column order})``; a table missing from the live
        database has no rows.
    """
    engine = create_framework_engine(live_url)
    try:
        backend = backend_of(engine)
        options: dict[str, Any] = {}
        if backend in ("postgresql", "mariadb"):
            options["isolation_level"] = "REPEATABLE READ"
        with engine.connect().execution_options(**options) as conn, conn.begin():
            if backend == "mariadb":
                conn.execute(text("START TRANSACTION WITH CONSISTENT SNAPSHOT"))
            marks = HighWaterMarks(cluster_name).read_all(conn)
            existing = set(inspect(conn).get_table_names())
            rows = {t.name: _live_rows(conn, t, cluster_name) if t.name in existing else [] for t in tables}
        return marks, rows
    finally:
        engine.dispose()


def _live_rows(conn: Connection, table: Table, cluster_name: str) -> list[tuple[Any, ...]]:
    query = select(*table.columns)
    if table is IDEMPOTENCY_KEYS_COMPARED:
        query = query.where(table.c.cluster_name == cluster_name)
    return [tuple(r) for r in conn.execute(query)]


def compare_table(
    spark: Any,
    table: Table,
    rebuilt: Any,
    live_rows: Any,
    decimal_precision: Mapping[str, str] | None = None,
) -> TableDrift:
    """Compare a rebuilt table with a live table, by primary key, in Spark.

    A full outer join on the key tags each row missing, extra or different; only the tagged rows
    are kept (on the executors), counted per kind, and at most :data:`DRIFT_EXAMPLES` of each kind
    reach the driver. A column the rebuild carries as decimal text
    (:func:`waltz.spark.views.carries_decimal_text`) is compared as a number at the live column's
    own precision (:func:`waltz.spark.views.compared_decimal`; docs/design/spark.md, "Drift
    check"): a difference the live column keeps is drift, a rounding the live column made of
    the log's value (MariaDB's ``NUMERIC`` keeps no decimals) is not.

    Args:
        spark: the Spark session.
        table: the table (its columns and primary key).
        rebuilt: the log's view of the table (a DataFrame with at least its columns).
        live_rows: the live table: a DataFrame with its columns (cast to the rebuilt types), or
            its rows in column order.
        decimal_precision: column name -> the precision the live database keeps a decimal-text
            column at (:meth:`waltz.spark.live_tables.LiveSnapshot.decimal_precision`); a
            column not named is compared exactly.

    Returns:
        The counts of missing, extra and different rows with a few examples.
    """
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

    names = [c.name for c in table.columns]
    rebuilt = rebuilt.select(*names)
    if isinstance(live_rows, DataFrame):
        live = live_rows.select(
            *[F.col(f.name).cast(f.dataType).alias(f.name) for f in rebuilt.schema.fields]
        )
    else:
        live = spark.createDataFrame(live_rows, schema=rebuilt.schema)
    decimals = [c.name for c in table.columns if carries_decimal_text(c.type)]
    if decimals:
        precision = decimal_precision or {}
        compared = F.udf(compared_decimal, "STRING", useArrow=False)

        def at_precision(frame: Any) -> Any:
            return frame.select(
                *[
                    compared(F.col(n).cast("string"), F.lit(precision.get(n, DECIMAL_EXACT))).alias(n)
                    if n in decimals
                    else F.col(n)
                    for n in names
                ]
            )

        rebuilt, live = at_precision(rebuilt), at_precision(live)
    keys = [c.name for c in table.primary_key.columns] or names
    values = [n for n in names if n not in keys]
    r = rebuilt.select(*[F.col(n).alias(f"r_{n}") for n in names], F.lit(True).alias("r_present"))
    lv = live.select(*[F.col(n).alias(f"l_{n}") for n in names], F.lit(True).alias("l_present"))
    condition = [F.col(f"r_{k}").eqNullSafe(F.col(f"l_{k}")) for k in keys]
    joined = r.join(lv, condition, "full_outer")
    all_same = F.lit(True)
    for v in values:
        all_same = all_same & F.col(f"r_{v}").eqNullSafe(F.col(f"l_{v}"))
    kind = (
        F.when(F.col("l_present").isNull(), "missing")
        .when(F.col("r_present").isNull(), "extra")
        .when(~all_same, "different")
        .otherwise("same")
    )
    tagged = joined.withColumn("kind", kind).where(F.col("kind") != "same").cache()
    try:
        counts = {row["kind"]: int(row["count"]) for row in tagged.groupBy("kind").count().collect()}
        examples: list[str] = []
        for kind_name in ("missing", "extra", "different"):
            if not counts.get(kind_name):
                continue
            for row in tagged.where(F.col("kind") == kind_name).limit(DRIFT_EXAMPLES).collect():
                if kind_name == "missing":
                    examples.append(f"missing: { ({n: row[f'r_{n}'] for n in names}) }")
                elif kind_name == "extra":
                    examples.append(f"extra: { ({n: row[f'l_{n}'] for n in names}) }")
                else:
                    key = {k: row[f"r_{k}"] for k in keys}
                    diffs = {
                        v: (row[f"l_{v}"], row[f"r_{v}"]) for v in values if row[f"l_{v}"] != row[f"r_{v}"]
                    }
                    examples.append(f"different: {key}: live vs log {diffs}")
        return TableDrift(
            table.name, counts.get("missing", 0), counts.get("extra", 0), counts.get("different", 0), examples
        )
    finally:
        tagged.unpersist()


def verify(
    spark: Any,
    app: AppViews,
    source: LogSource,
    live_url: str,
    *,
    db_url: str | None = None,
    cluster_name: str | None = None,
    progress: Progress = _quiet,
) -> DriftReport:
    """Compare the log's views with a live database at the live database's own marks.

    The live database's marks are read first, with its tables at exactly those marks (read over
    JDBC by the executors on PostgreSQL and MariaDB, see :mod:`waltz.spark.live_tables`); the log
    is then read up to exactly those marks, and each table compared in Spark
    (:func:`compare_table`): only the counts and a few examples reach the driver.

    The application's tables are compared, and this log's idempotency keys
    (``waltz_idempotency_keys`` without ``applied_at``). With ``db_url``, the views are also
    written there (a rebuild at those marks).

    Args:
        spark: the Spark session (``waltz`` data source registered).
        app: the application's views.
        source: where to read the log.
        live_url: the live database (SQLAlchemy URL).
        db_url: also write the views there, or None.
        cluster_name: the log's name in the mark rows (default ``app.cluster_name``).
        progress: called with a line per step.

    Returns:
        The differences per table (:attr:`DriftReport.drift` is True when any).

    Raises:
        CommittedReadError: the live database claims transactions the log does not prove committed.
        RebuildError: the application's views miss a table, ``db_url`` is not supported, or a
            MariaDB live database kept applying while it was read.
    """
    name = cluster_name or app.cluster_name
    compared = [*app.tables, IDEMPOTENCY_KEYS_COMPARED]
    with live_snapshot(spark, live_url, compared, name, only_log=[IDEMPOTENCY_KEYS_COMPARED]) as live:
        live_marks = live.marks
        how = {
            "postgresql": "over JDBC in one exported snapshot",
            "mariadb": "over JDBC between equal mark readings",
            "sqlite": "in one snapshot",
        }[live.backend]
        progress(f"live database read {how} at marks {marks_text(live_marks) or '(none)'}")
        computed = compute_views(spark, app, source, up_to=live_marks, cluster_name=name, progress=progress)
        try:
            if db_url is not None:
                write_views(
                    computed.tables,
                    app,
                    db_url,
                    computed.marks,
                    idempotency_keys_df=computed.idempotency_keys,
                    cluster_name=name,
                    progress=progress,
                )
            rebuilt = {**computed.tables, IDEMPOTENCY_KEYS_COMPARED.name: computed.idempotency_keys}
            tables = []
            for table in compared:
                frame = rebuilt[table.name].select(*[c.name for c in table.columns])
                drift = compare_table(
                    spark, table, frame, live.frame(spark, table, frame.schema), live.decimal_precision(table)
                )
                progress(
                    f"compared {table.name}: {drift.missing} missing, {drift.extra} extra, "
                    f"{drift.different} different"
                )
                tables.append(drift)
        finally:
            computed.release()
    return DriftReport(live_marks, tables)
