"""The rebuild job: an application's views computed from the log with Spark, written to a database,
and the drift check against a live database.

Source: seed 001, "Basic Idea" and "Limitations and Requirements" (databases derive from the log;
a database stores its high-water marks); DESIGN.md, "Spark"; ``docs/spark.md``.

:func:`compute_views` reads the committed log up to fixed marks and runs the application's
:class:`~waltz.spark.views.AppViews`. :func:`write_views` writes each table into a fresh staging
table (JDBC for PostgreSQL and MariaDB, SQLAlchemy for SQLite) and only when every table is
complete swaps them in and sets the framework's mark rows to the marks read up to (one
transaction on PostgreSQL and SQLite; MariaDB renames atomically, then writes the marks). A rerun
gives the same tables. :func:`verify` reads a live database in one snapshot with its marks,
rebuilds at those marks and reports missing, extra and different rows.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, Table, column, delete, insert, inspect, select, text
from sqlalchemy import table as table_clause
from sqlalchemy.engine import Connection, make_url

from waltz.jdbc_style import create_framework_engine
from waltz.jdbc_style.marks import HighWaterMarks
from waltz.jdbc_style.schema import high_water_marks
from waltz.spark.committed import CommittedPartition, plan_live, plan_offline
from waltz.spark.decoders import decode_changes
from waltz.spark.errors import CommittedReadError, RebuildError
from waltz.spark.views import AppViews

__all__ = [
    "DriftReport",
    "LogSource",
    "RebuildResult",
    "TableDrift",
    "compute_views",
    "rebuild",
    "verify",
    "write_views",
]

log = logging.getLogger(__name__)

Progress = Callable[[str], None]

#: Suffix of the staging tables a rebuild writes before swapping them in.
STAGING_SUFFIX = "__rebuild"
#: Rows per INSERT batch (SQLite) and per JDBC batch.
WRITE_BATCH = 5000
#: Examples kept per kind of drift and table.
DRIFT_EXAMPLES = 5


def _quiet(_: str) -> None:
    return None


@dataclass(frozen=True)
class LogSource:
    """Where the log is read: a live cluster, or storage directories on disk.

    Attributes:
        zookeeper: ZooKeeper connect string (live).
        cluster_root: the cluster root znode (live).
        storage_dirs: storage directories (offline).
        replicas: replicas per partition (offline majority mode).
        high_water_marks: partition -> a high-water mark the user vouches for (offline).
    """

    zookeeper: str | None = None
    cluster_root: str | None = None
    storage_dirs: Sequence[str] = ()
    replicas: int | None = None
    high_water_marks: Mapping[int, int] | None = None

    def plan(self) -> list[CommittedPartition]:
        """The committed high-water mark of every partition (see :mod:`waltz.spark.committed`).

        Raises:
            RebuildError: neither or both kinds of source given.
            CommittedReadError: a partition cannot be proven.
        """
        if self.zookeeper and self.cluster_root and not self.storage_dirs:
            return plan_live(self.zookeeper, self.cluster_root)
        if self.storage_dirs and not self.zookeeper:
            return plan_offline(
                list(self.storage_dirs), replicas=self.replicas, high_water_marks=self.high_water_marks
            )
        raise RebuildError(
            "read the log from a live cluster (zookeeper and cluster root) or from storage directories"
        )

    def options(self) -> dict[str, str]:
        """The ``waltz`` data source options of this source."""
        if self.zookeeper:
            return {"zookeeper": self.zookeeper, "cluster_root": self.cluster_root or ""}
        options = {"storage_dirs": ",".join(self.storage_dirs)}
        if self.replicas is not None:
            options["replicas"] = str(self.replicas)
        if self.high_water_marks:
            options["high_water_mark"] = _marks_text(self.high_water_marks)
        return options


def _marks_text(marks: Mapping[int, int]) -> str:
    return ",".join(f"{p}:{m}" for p, m in sorted(marks.items()))


@dataclass(frozen=True)
class RebuildResult:
    """What a rebuild wrote.

    Attributes:
        marks: partition -> the transaction ID read up to (-1: nothing), as written in the marks.
        rows: table name -> rows written.
        seconds: wall time.
    """

    marks: Mapping[int, int]
    rows: Mapping[str, int]
    seconds: float


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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
        out = [f"compared at high-water marks {_marks_text(self.marks) or '(none)'}"]
        for t in self.tables:
            status = "DRIFT" if t.drift else "same"
            out.append(f"{status}  {t.table}: {t.missing} missing, {t.extra} extra, {t.different} different")
            out.extend(f"    {example}" for example in t.examples)
        return out


# ---- computing ----


@dataclass(frozen=True)
class ComputedViews:
    """The views of the log at fixed marks.

    Attributes:
        marks: partition -> the transaction ID read up to (-1: nothing).
        tables: table name -> DataFrame.
        changes: the decoded row changes (cached while the views are used).
    """

    marks: dict[int, int]
    tables: Mapping[str, Any]
    changes: Any

    def release(self) -> None:
        """Drop the cached log."""
        self.changes.unpersist()


def compute_views(
    spark: Any,
    app: AppViews,
    source: LogSource,
    *,
    up_to: Mapping[int, int] | None = None,
    progress: Progress = _quiet,
) -> ComputedViews:
    """The application's views at fixed marks (DataFrames over the cached, decoded log) and those marks.

    Args:
        spark: the Spark session (``waltz`` data source registered).
        app: the application's views.
        source: where to read the log.
        up_to: partition -> mark to read up to (default: each partition's committed high-water mark).
        progress: called with a line per step.

    Returns:
        The marks (every partition of the log has one, -1: empty) and the tables; call
        :meth:`ComputedViews.release` when done.

    Raises:
        CommittedReadError: a requested mark is above what is proven committed.
        RebuildError: the application's views miss a table.
    """
    plans = source.plan()
    marks = {p.partition_id: p.high_water_mark for p in plans}
    for plan in plans:
        progress(f"partition {plan.partition_id}: committed up to {plan.high_water_mark} ({plan.proof})")
    if up_to is not None:
        for pid, mark in up_to.items():
            if mark > marks.get(pid, -1):
                raise CommittedReadError(
                    f"partition {pid}: the marks ask for {mark}, but only {marks.get(pid, -1)} is proven "
                    "committed"
                )
        marks = {pid: up_to.get(pid, -1) for pid in marks}
    reader = spark.read.format("waltz").options(**source.options())
    log_df = reader.option("up_to", _marks_text(marks)).load()
    if not marks or all(m < 0 for m in marks.values()):
        log_df = log_df.limit(0)
    changes = decode_changes(log_df, app.decoders).cache()
    decoded = changes.count()
    progress(f"read and decoded the log: {decoded} row changes")
    views = dict(app.build(changes, log_df))
    missing = [t.name for t in app.tables if t.name not in views]
    if missing:
        changes.unpersist()
        raise RebuildError(f"the application's views lack tables {missing}")
    return ComputedViews(marks, views, changes)


# ---- writing ----


def _backend(engine: Engine) -> str:
    name = engine.dialect.name
    return "mariadb" if name in ("mysql", "mariadb") else name


def jdbc_target(db_url: str) -> tuple[str, dict[str, str]]:
    """The JDBC URL and connection properties of a PostgreSQL or MariaDB SQLAlchemy URL.

    Raises:
        RebuildError: another backend.
    """
    url = make_url(db_url)
    backend = url.get_backend_name()
    props: dict[str, str] = {}
    if url.username:
        props["user"] = url.username
    if url.password:
        props["password"] = str(url.password)
    if backend == "postgresql":
        address = f"{url.host or '127.0.0.1'}:{url.port or 5432}"
        jdbc = f"jdbc:postgresql://{address}/{url.database}?reWriteBatchedInserts=true"
        props["driver"] = "org.postgresql.Driver"
    elif backend in ("mysql", "mariadb"):
        address = f"{url.host or '127.0.0.1'}:{url.port or 3306}"
        jdbc = f"jdbc:mysql://{address}/{url.database}?rewriteBatchedStatements=true"
        props["driver"] = "org.mariadb.jdbc.Driver"
    else:
        raise RebuildError(f"no JDBC writer for {backend} databases")
    props["batchsize"] = str(WRITE_BATCH)
    return jdbc, props


def _create_staging(conn: Connection, backend: str, table: Table, staging: str) -> list[str]:
    """Create ``staging`` like ``table``; returns statements to run after the swap (SQLite indexes)."""
    preparer = conn.dialect.identifier_preparer
    quoted, quoted_staging = preparer.quote(table.name), preparer.quote(staging)
    conn.execute(text(f"DROP TABLE IF EXISTS {quoted_staging}"))
    if backend == "postgresql":
        conn.execute(text(f"CREATE TABLE {quoted_staging} (LIKE {quoted} INCLUDING ALL)"))
        return []
    if backend == "mariadb":
        conn.execute(text(f"CREATE TABLE {quoted_staging} LIKE {quoted}"))
        return []
    sql = conn.execute(
        text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = :name"), {"name": table.name}
    ).scalar()
    if not sql:
        raise RebuildError(f"table {table.name} does not exist in the target database")
    created = re.sub(
        r"^\s*CREATE\s+TABLE\s+(\"[^\"]+\"|`[^`]+`|\[[^\]]+\]|\S+)",
        f"CREATE TABLE {quoted_staging}",
        sql,
        count=1,
        flags=re.IGNORECASE,
    )
    conn.execute(text(created))
    indexes = conn.execute(
        text("SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = :name AND sql IS NOT NULL"),
        {"name": table.name},
    ).scalars()
    return [str(s) for s in indexes]


def _pg_index_names(conn: Connection, table: str) -> dict[str, str]:
    """Index definition with names blanked -> index name, of a PostgreSQL table."""
    rows = conn.execute(
        text(
            "SELECT indexname, indexdef FROM pg_indexes "
            "WHERE tablename = :t AND schemaname = current_schema()"
        ),
        {"t": table},
    )
    out = {}
    for name, definition in rows:
        shape = re.sub(r"INDEX \S+ ON \S+", "INDEX ON", str(definition))
        out[shape] = str(name)
    return out


def _write_rows(spark_df: Any, engine: Engine, backend: str, db_url: str, table: Table, staging: str) -> int:
    count = 0
    if backend in ("postgresql", "mariadb"):
        jdbc, props = jdbc_target(db_url)
        spark_df.write.jdbc(jdbc, staging, mode="append", properties=props)
        with engine.connect() as conn:
            count = int(
                conn.execute(
                    text(f"SELECT COUNT(*) FROM {conn.dialect.identifier_preparer.quote(staging)}")
                ).scalar()
                or 0
            )
        return count
    target = table_clause(staging, *(column(c.name) for c in table.columns))
    names = [c.name for c in table.columns]
    batch: list[dict[str, Any]] = []
    with engine.begin() as conn:
        for row in spark_df.select(*names).toLocalIterator():
            batch.append(dict(zip(names, row, strict=True)))
            if len(batch) >= WRITE_BATCH:
                conn.execute(insert(target), batch)
                count += len(batch)
                batch = []
        if batch:
            conn.execute(insert(target), batch)
            count += len(batch)
    return count


def write_views(
    views: Mapping[str, Any],
    app: AppViews,
    db_url: str,
    marks: Mapping[int, int],
    *,
    cluster_name: str | None = None,
    progress: Progress = _quiet,
) -> dict[str, int]:
    """Write the views into fresh tables, swap them in when all are complete, and set the marks.

    Args:
        views: table name -> DataFrame (from :func:`compute_views`).
        app: the application (its ``prepare`` creates the tables first when missing).
        db_url: the target database (SQLAlchemy URL).
        marks: partition -> transaction ID the views include (the mark rows written).
        cluster_name: the log's name in the mark rows (default ``app.cluster_name``).
        progress: called with a line per step.

    Returns:
        Table name -> rows written.

    Raises:
        RebuildError: the target backend is not supported.
        sqlalchemy.exc.DBAPIError: the database refused (the old tables stay as they were).
    """
    name = cluster_name or app.cluster_name
    engine = create_framework_engine(db_url)
    try:
        backend = _backend(engine)
        if backend not in ("postgresql", "mariadb", "sqlite"):
            raise RebuildError(f"rebuild writes PostgreSQL, MariaDB or SQLite, not {backend}")
        app.prepare(engine)
        after_swap: list[str] = []
        pg_names: dict[str, dict[str, str]] = {}
        rows: dict[str, int] = {}
        for table in app.tables:
            staging = table.name + STAGING_SUFFIX
            with engine.begin() as conn:
                after_swap += _create_staging(conn, backend, table, staging)
                if backend == "postgresql":
                    pg_names[table.name] = _pg_index_names(conn, table.name)
            progress(f"writing {table.name} into {staging}")
            rows[table.name] = _write_rows(views[table.name], engine, backend, db_url, table, staging)
            progress(f"  {table.name}: {rows[table.name]} rows")
        _swap(engine, backend, app.tables, pg_names, after_swap, name, marks)
        progress(f"swapped in {len(app.tables)} tables; marks of {name!r} set to {_marks_text(marks)}")
        return rows
    finally:
        engine.dispose()


def _write_marks(conn: Connection, cluster_name: str, marks: Mapping[int, int]) -> None:
    conn.execute(delete(high_water_marks).where(high_water_marks.c.cluster_name == cluster_name))
    if marks:
        conn.execute(
            insert(high_water_marks),
            [
                {
                    "cluster_name": cluster_name,
                    "partition_id": pid,
                    "high_water_mark": mark,
                    "updated_at": None,
                }
                for pid, mark in sorted(marks.items())
            ],
        )


def _swap(
    engine: Engine,
    backend: str,
    tables: Sequence[Table],
    pg_names: Mapping[str, Mapping[str, str]],
    after_swap: Sequence[str],
    cluster_name: str,
    marks: Mapping[int, int],
) -> None:
    preparer = engine.dialect.identifier_preparer
    if backend == "mariadb":
        renames = ", ".join(
            f"{preparer.quote(t.name)} TO {preparer.quote(t.name + '__old')}, "
            f"{preparer.quote(t.name + STAGING_SUFFIX)} TO {preparer.quote(t.name)}"
            for t in tables
        )
        with engine.begin() as conn:
            for t in tables:
                conn.execute(text(f"DROP TABLE IF EXISTS {preparer.quote(t.name + '__old')}"))
            conn.execute(text(f"RENAME TABLE {renames}"))
            for t in tables:
                conn.execute(text(f"DROP TABLE {preparer.quote(t.name + '__old')}"))
        with engine.begin() as conn:
            _write_marks(conn, cluster_name, marks)
        return
    with engine.begin() as conn:
        for t in tables:
            conn.execute(text(f"DROP TABLE {preparer.quote(t.name)}"))
            conn.execute(
                text(
                    f"ALTER TABLE {preparer.quote(t.name + STAGING_SUFFIX)} "
                    f"RENAME TO {preparer.quote(t.name)}"
                )
            )
            if backend == "postgresql":
                for shape, staged in _pg_index_names(conn, t.name).items():
                    original = pg_names.get(t.name, {}).get(shape)
                    if original and original != staged:
                        conn.execute(
                            text(f"ALTER INDEX {preparer.quote(staged)} RENAME TO {preparer.quote(original)}")
                        )
        for statement in after_swap:
            conn.execute(text(statement))
        _write_marks(conn, cluster_name, marks)


def rebuild(
    spark: Any,
    app: AppViews,
    source: LogSource,
    db_url: str,
    *,
    cluster_name: str | None = None,
    up_to: Mapping[int, int] | None = None,
    progress: Progress = _quiet,
) -> RebuildResult:
    """Rebuild the application's tables in ``db_url`` from the committed log (see the module docstring).

    Raises:
        CommittedReadError, RebuildError: as :func:`compute_views` and :func:`write_views`.
    """
    started = time.monotonic()
    computed = compute_views(spark, app, source, up_to=up_to, progress=progress)
    try:
        rows = write_views(
            computed.tables, app, db_url, computed.marks, cluster_name=cluster_name, progress=progress
        )
    finally:
        computed.release()
    return RebuildResult(computed.marks, rows, time.monotonic() - started)


# ---- verifying ----


def read_live_snapshot(
    live_url: str, tables: Sequence[Table], cluster_name: str
) -> tuple[dict[int, int], dict[str, list[tuple[Any, ...]]]]:
    """Read a live database's marks and the rows of ``tables`` in one snapshot (one transaction).

    Returns:
        ``(marks, {table name: rows as tuples in column order})``.
    """
    engine = create_framework_engine(live_url)
    try:
        options: dict[str, Any] = {}
        if _backend(engine) in ("postgresql", "mariadb"):
            options["isolation_level"] = "REPEATABLE READ"
        with engine.connect().execution_options(**options) as conn, conn.begin():
            if _backend(engine) == "mariadb":
                conn.execute(text("SELECT 1"))
            marks = HighWaterMarks(cluster_name).read_all(conn)
            rows: dict[str, list[tuple[Any, ...]]] = {}
            existing = set(inspect(conn).get_table_names())
            for table in tables:
                if table.name not in existing:
                    rows[table.name] = []
                    continue
                rows[table.name] = [tuple(r) for r in conn.execute(select(*table.columns))]
        return marks, rows
    finally:
        engine.dispose()


def compare_table(spark: Any, table: Table, rebuilt: Any, live_rows: list[tuple[Any, ...]]) -> TableDrift:
    """Compare a rebuilt table with a live table's rows, by primary key.

    Returns:
        The counts of missing, extra and different rows with a few examples.
    """
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

    names = [c.name for c in table.columns]
    rebuilt = rebuilt.select(*names)
    live = spark.createDataFrame(live_rows, schema=rebuilt.schema)
    keys = [c.name for c in table.primary_key.columns] or names
    values = [n for n in names if n not in keys]
    r = rebuilt.select(*[F.col(n).alias(f"r_{n}") for n in names], F.lit(True).alias("r_present"))
    lv = live.select(*[F.col(n).alias(f"l_{n}") for n in names], F.lit(True).alias("l_present"))
    condition = [F.col(f"r_{k}").eqNullSafe(F.col(f"l_{k}")) for k in keys]
    joined = r.join(lv, condition, "full_outer")
    if values:
        same = [F.col(f"r_{v}").eqNullSafe(F.col(f"l_{v}")) for v in values]
        all_same = same[0]
        for expression in same[1:]:
            all_same = all_same & expression
    else:
        all_same = F.lit(True)
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

    The live database is read first, in one snapshot with its marks; the log is then read up to
    exactly those marks. With ``db_url``, the views are also written there (a rebuild at those marks).

    Returns:
        The differences per table (:attr:`DriftReport.drift` is True when any).

    Raises:
        CommittedReadError: the live database claims transactions the log does not prove committed.
    """
    name = cluster_name or app.cluster_name
    live_marks, live_rows = read_live_snapshot(live_url, app.tables, name)
    progress(f"live database read in one snapshot at marks {_marks_text(live_marks) or '(none)'}")
    computed = compute_views(spark, app, source, up_to=live_marks, progress=progress)
    try:
        if db_url is not None:
            write_views(computed.tables, app, db_url, computed.marks, cluster_name=name, progress=progress)
        tables = []
        for table in app.tables:
            drift = compare_table(spark, table, computed.tables[table.name], live_rows[table.name])
            progress(
                f"compared {table.name}: {drift.missing} missing, {drift.extra} extra, "
                f"{drift.different} different"
            )
            tables.append(drift)
    finally:
        computed.release()
    return DriftReport(live_marks, tables)
