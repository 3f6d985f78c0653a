"""Writing rebuilt views into a database: staging tables, then one swap with the marks.

Source: docs/design/spark.md "Swapping tables with the marks" (a database stores its high-water
marks, updated with the data they cover); ``docs/spark.md`` ("``waltz rebuild``").

Each table is written into a fresh ``<table>__rebuild`` (JDBC for PostgreSQL and MariaDB,
SQLAlchemy for SQLite). Only when every table is complete are they swapped in, together with the
framework's rows of this log: its ``waltz_high_water_marks`` rows set to the marks read up to and
its ``waltz_idempotency_keys`` rows replaced by the keys of the log. On PostgreSQL and SQLite that
is one transaction; on MariaDB, where DDL commits, the mark and key tables are staged too (their
rows of other logs copied over) and everything is renamed in one atomic ``RENAME TABLE``. A
table may start with seeded rows (a snapshot's, :class:`StagingSeed`), copied into its staging
table by the driver while Spark writes. On PostgreSQL a staging table's indexes are built once
its rows are in. On PostgreSQL and MariaDB up to :data:`WRITE_JOBS` tables are written at once,
each by its own Spark job. A failure before the swap leaves the old
tables; a rerun gives the same tables.
"""

from __future__ import annotations

import decimal
import logging
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Protocol

from sqlalchemy import Engine, Table, column, delete, insert, inspect, select, text, types
from sqlalchemy import table as table_clause
from sqlalchemy.engine import Connection, make_url

from waltz.jdbc_style import create_framework_engine
from waltz.jdbc_style.engine import MYSQL_SESSION_SQL_MODE, SQLITE_BEGIN
from waltz.jdbc_style.schema import high_water_marks, idempotency_keys
from waltz.spark.errors import RebuildError
from waltz.spark.views import AppViews

log = logging.getLogger(__name__)

__all__ = [
    "STAGING_SUFFIX",
    "WRITE_BATCH",
    "WRITE_JOBS",
    "StagingSeed",
    "backend_of",
    "check_target",
    "jdbc_target",
    "marks_text",
    "write_views",
]

Progress = Callable[[str], None]

#: Suffix of the staging tables a rebuild writes before swapping them in.
STAGING_SUFFIX = "__rebuild"
#: Suffix of the tables a MariaDB swap moves out of the way (dropped right after).
_OLD_SUFFIX = "__old"
#: Rows per INSERT batch (SQLite) and per JDBC batch.
WRITE_BATCH = 5000
#: Tables written at once on PostgreSQL and MariaDB (each by its own Spark job).
WRITE_JOBS = 3


def _quiet(_: str) -> None:
    return None


class StagingSeed(Protocol):
    """Rows a rebuild copies into a staging table as they are, before the view's own rows."""

    def copy_into(self, conn: Connection, table: Table, staging: str) -> int:
        """Copy the rows into ``staging`` (``table``'s columns) in ``conn``'s transaction; the count."""
        ...


def marks_text(marks: Mapping[int, int]) -> str:
    """``{0: 120, 1: 98}`` as ``"0:120,1:98"`` (the form of the ``up_to`` option and of reports)."""
    return ",".join(f"{p}:{m}" for p, m in sorted(marks.items()))


def backend_of(engine: Engine) -> str:
    """``postgresql``, ``mariadb`` (MySQL too) or ``sqlite``: the backend a rebuild writes."""
    name = engine.dialect.name
    return "mariadb" if name in ("mysql", "mariadb") else name


#: Query parameters of a PostgreSQL URL that the PostgreSQL JDBC driver takes under the same name
#: (TLS to the database): carried over as connection properties.
PG_JDBC_PARAMETERS = frozenset({"sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword"})


def jdbc_target(db_url: str) -> tuple[str, dict[str, str]]:
    """The JDBC URL and connection properties of a PostgreSQL or MariaDB SQLAlchemy URL.

    Host, port, database, user and password are carried over, and on PostgreSQL the TLS
    parameters the JDBC driver knows by the same name (:data:`PG_JDBC_PARAMETERS`, e.g.
    ``?sslmode=verify-full&sslrootcert=/etc/ssl/db-ca.pem``). Any other query parameter is refused
    rather than dropped: a rebuild must not connect differently from what the URL says. On
    PostgreSQL text parameters are sent untyped (``stringtype=unspecified``), so that a ``uuid``
    or ``numeric`` column takes the text the rebuild carries its values as. On MariaDB
    each connection adds ``STRICT_TRANS_TABLES`` and ``NO_AUTO_VALUE_ON_ZERO`` to the server's
    ``sql_mode``, as the framework's own connections do (docs/design/sql.md "Change-sets"), so the
    rebuild writes the values the live applies write.

    Raises:
        RebuildError: another backend, or a query parameter the JDBC target cannot carry.
    """
    url = make_url(db_url)
    backend = url.get_backend_name()
    known = PG_JDBC_PARAMETERS if backend == "postgresql" else frozenset()
    unknown = sorted(set(url.query) - known)
    if unknown:
        raise RebuildError(
            f"the database URL's query parameters {unknown} cannot be carried over to the JDBC writer "
            f"(it takes {sorted(known) or 'none'} for {backend}); give the database over TCP without them"
        )
    props: dict[str, str] = {name: str(url.query[name]) for name in sorted(known & set(url.query))}
    if url.username:
        props["user"] = url.username
    if url.password:
        props["password"] = str(url.password)
    if backend == "postgresql":
        address = f"{url.host or '127.0.0.1'}:{url.port or 5432}"
        # Text parameters go untyped, so PostgreSQL reads each as its column's type, as it reads the
        # live apply's values: a UUID's text into a uuid column, a decimal's into a numeric one.
        jdbc = f"jdbc:postgresql://{address}/{url.database}?reWriteBatchedInserts=true&stringtype=unspecified"
        props["driver"] = "org.postgresql.Driver"
    elif backend in ("mysql", "mariadb"):
        address = f"{url.host or '127.0.0.1'}:{url.port or 3306}"
        # The framework's own sql_mode: a value that does not fit is an error, a key of 0 stays 0.
        session = f"sessionVariables={MYSQL_SESSION_SQL_MODE}"
        jdbc = f"jdbc:mysql://{address}/{url.database}?rewriteBatchedStatements=true&{session}"
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
    # SQLite: the table's own DDL (what its migrations made, CHECK constraints included) under the
    # staging name; its indexes are created after the swap (SQLite index names are per database).
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
    _run_ddl(conn, created)
    indexes = conn.execute(
        text("SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = :name AND sql IS NOT NULL"),
        {"name": table.name},
    ).scalars()
    return [str(s) for s in indexes]


def _defer_pg_indexes(conn: Connection, staging: str) -> list[str]:
    """Drop a fresh PostgreSQL staging table's indexes (its primary key, unique and exclusion
    constraints among them) and return the statements that build them again, under the same
    names and with the indexes' comments, once its rows are in: one sort per index instead of
    one B-tree insert per row (docs/design/spark.md "Swapping tables with the marks")."""
    preparer = conn.dialect.identifier_preparer
    quoted = preparer.quote(staging)
    relation = {"t": quoted}
    constraints = conn.execute(
        text(
            "SELECT conname, pg_get_constraintdef(oid), conindid FROM pg_constraint "
            "WHERE conrelid = CAST(:t AS regclass) AND contype IN ('p', 'u', 'x') ORDER BY conname"
        ),
        relation,
    ).all()
    backing = {int(row[2]) for row in constraints}
    indexes = conn.execute(
        text(
            "SELECT c.relname, pg_get_indexdef(i.indexrelid), i.indexrelid, "
            "CASE WHEN obj_description(i.indexrelid, 'pg_class') IS NOT NULL THEN "
            "format('COMMENT ON INDEX %I IS %L', c.relname, obj_description(i.indexrelid, 'pg_class')) END "
            "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE i.indrelid = CAST(:t AS regclass) ORDER BY c.relname"
        ),
        relation,
    ).all()
    build: list[str] = []
    # (The LIKE copies the comments of indexes, not of the constraints they back.)
    comments = [str(row[3]) for row in indexes if row[3] is not None]
    for name, definition, _ in constraints:
        _run_ddl(conn, f"ALTER TABLE {quoted} DROP CONSTRAINT {preparer.quote(name)}")
        build.append(f"ALTER TABLE {quoted} ADD CONSTRAINT {preparer.quote(name)} {definition}")
    for name, definition, oid, _ in indexes:
        if int(oid) not in backing:
            _run_ddl(conn, f"DROP INDEX {preparer.quote(name)}")
            build.append(str(definition))
    return build + comments


def _run_ddl(conn: Connection, statement: str) -> None:
    """Run a statement the database wrote (a table's or an index's definition, a comment) as it
    is: no bind parameters, so a ``:name`` or ``%`` in a predicate, a default or a comment stays
    text."""
    conn.exec_driver_sql(statement, execution_options={"no_parameters": True})


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


def _staged_rows(engine: Engine, staging: str) -> int:
    with engine.connect() as conn:
        quoted = conn.dialect.identifier_preparer.quote(staging)
        return int(conn.execute(text(f"SELECT COUNT(*) FROM {quoted}")).scalar() or 0)


def _write_rows(spark_df: Any, engine: Engine, backend: str, db_url: str, table: Table, staging: str) -> int:
    """Append the DataFrame's rows to ``staging``: the rows written (SQLite), -1 (the JDBC writer)."""
    names = [c.name for c in table.columns]
    if backend in ("postgresql", "mariadb"):
        jdbc, props = jdbc_target(db_url)
        spark_df.select(*names).write.jdbc(jdbc, staging, mode="append", properties=props)
        return -1
    count = 0
    target = table_clause(staging, *(column(name) for name in names))
    converters = [_sqlite_value(c.type) for c in table.columns]
    batch: list[dict[str, Any]] = []
    with engine.begin() as conn:
        for row in _driver_rows(spark_df.select(*names)).toLocalIterator():
            batch.append(
                {
                    name: value if convert is None or value is None else convert(value)
                    for name, value, convert in zip(names, row, converters, strict=True)
                }
            )
            if len(batch) >= WRITE_BATCH:
                conn.execute(insert(target), batch)
                count += len(batch)
                batch = []
        if batch:
            conn.execute(insert(target), batch)
            count += len(batch)
    return count


def _driver_rows(frame: Any) -> Any:
    """``frame`` with its ``timestamp`` columns as ``timestamp_ntz`` in UTC (the session's zone):
    handed to Python, a ``timestamp`` becomes the local time of the driver's zone, a
    ``timestamp_ntz`` the time it holds, whatever the machine's zone (docs/design/spark.md,
    "Swapping tables with the marks")."""
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention
    from pyspark.sql.types import TimestampType

    return frame.select(
        *[
            F.col(f.name).cast("timestamp_ntz").alias(f.name)
            if isinstance(f.dataType, TimestampType)
            else F.col(f.name)
            for f in frame.schema.fields
        ]
    )


def _sqlite_value(column_type: types.TypeEngine[Any]) -> Callable[[Any], Any] | None:
    """What turns a rebuilt value of a column of ``column_type`` into the value SQLite stores for
    the live apply's (SQLAlchemy's own conversion on SQLite), or None when it is stored as it is:
    a ``Numeric``'s decimal as a float (SQLite keeps a ``REAL``), a ``Uuid``'s text as its 32 hex
    digits."""
    if isinstance(column_type, types.Numeric) and not isinstance(column_type, types.Float):
        return lambda value: float(decimal.Decimal(str(value)))
    if isinstance(column_type, types.Uuid):
        return _uuid_hex
    return None


def _uuid_hex(value: Any) -> str:
    """A UUID's text as SQLAlchemy keeps it on SQLite: 32 hex digits (text that is no UUID loses
    its dashes, as SQLAlchemy's ``Uuid(as_uuid=False)`` writes it)."""
    try:
        return uuid.UUID(str(value)).hex
    except ValueError:
        return str(value).replace("-", "")


def check_target(app: AppViews, db_url: str, *, create: bool = True) -> bool:
    """Make or upgrade the application's tables (its ``prepare``) and check that every one of them
    has the columns of the application's model, before a rebuild reads the log.

    With ``create=False`` (the rebuild's first pass, before the log is planned), a database that
    holds none of the application's tables is left alone: the rebuild makes them once the log is
    planned, so one that cannot read its log (a wrong cluster root, an empty snapshot location)
    makes no table. A database that holds some is prepared and checked at once, as always.

    Returns:
        Whether the database was prepared and checked (False: left alone, ``create=False``).

    Raises:
        RebuildError: a table of the application or the framework is missing after ``prepare``
            (dropped from a database whose migrations ran), naming it; or a table lacks columns
            of the model (a database not migrated to the model the rebuild runs, or one of a
            newer release), naming them and the columns the model does not map: nothing is read
            or written (docs/design/spark.md, "Swapping tables with the marks").
        sqlalchemy.exc.DBAPIError: the database refused.
    """
    engine = create_framework_engine(db_url)
    try:
        if not create and not {t.name for t in app.tables} & set(inspect(engine).get_table_names()):
            return False
        app.prepare(engine)
        inspector = inspect(engine)
        present_tables = set(inspector.get_table_names())
        absent = [
            t.name for t in (*app.tables, high_water_marks, idempotency_keys) if t.name not in present_tables
        ]
        if absent:
            raise RebuildError(
                f"the target database {engine.url.render_as_string(hide_password=True)} has no table "
                f"{', '.join(absent)} of the application {app.cluster_name!r}"
                + ("" if set(absent) <= {t.name for t in app.tables} else " or of the framework")
                + ": run the application's migrations on it (alembic upgrade, as its instances do), or "
                "rebuild into an empty database; nothing was read or written"
            )
        problems = []
        for table in app.tables:
            present = [column["name"] for column in inspector.get_columns(table.name)]
            missing = [c.name for c in table.columns if c.name not in present]
            if missing:
                mapped = {c.name for c in table.columns}
                others = [name for name in present if name not in mapped]
                problems.append(
                    f"table {table.name} lacks the columns {missing}"
                    + (f" and has {others}, which the model does not map" if others else "")
                )
        if problems:
            raise RebuildError(
                f"the target database is not at the application's model: {'; '.join(problems)}; migrate "
                "it first (alembic upgrade, as the application's instances do), or, if it is at a newer "
                "release than these models, rebuild with that release's code, or rebuild into an empty "
                "database; nothing was read or written"
            )
        return True
    finally:
        engine.dispose()


def write_views(
    views: Mapping[str, Any],
    app: AppViews,
    db_url: str,
    marks: Mapping[int, int],
    *,
    idempotency_keys_df: Any = None,
    cluster_name: str | None = None,
    seeds: Mapping[str, StagingSeed] | None = None,
    progress: Progress = _quiet,
) -> dict[str, int]:
    """Write the views into fresh tables, swap them in when all are complete, and set the marks.

    On PostgreSQL and MariaDB up to :data:`WRITE_JOBS` tables are written at once (Spark jobs from
    driver threads), a seed's copy beside its table's own rows; on SQLite one after the other
    (docs/design/spark.md "Swapping tables with the marks").

    Args:
        views: table name -> DataFrame (from :func:`waltz.spark.rebuild.compute_views`).
        app: the application (its ``prepare`` creates the tables first when missing).
        db_url: the target database (SQLAlchemy URL).
        marks: partition -> transaction ID the views include (the mark rows written).
        idempotency_keys_df: the log's idempotency keys (:func:`waltz.spark.views.idempotency_key_rows`)
            to replace this log's ``waltz_idempotency_keys`` rows with; None leaves them.
        cluster_name: the log's name in the mark rows (default ``app.cluster_name``).
        seeds: table name -> rows copied into its staging table before the view's own rows
            (a snapshot's, :class:`waltz.spark.snapshot.SnapshotSeed`; docs/design/spark.md
            "Snapshots"); the view's DataFrame then holds only the rows that follow them.
        progress: called with a line per step.

    Returns:
        Table name -> rows written (``waltz_idempotency_keys`` included when given), seeded
        rows included.

    Raises:
        RebuildError: the target backend is not supported, or the live database's marks are past
            ``marks`` (nothing swapped: docs/design/spark.md "Swapping tables with the marks").
        sqlalchemy.exc.DBAPIError: the database refused (the old tables stay as they were).

    A failure, the swap's refusal among them, drops every staging table it made.
    """
    name = cluster_name or app.cluster_name
    engine = create_framework_engine(db_url)
    try:
        backend = backend_of(engine)
        if backend not in ("postgresql", "mariadb", "sqlite"):
            raise RebuildError(f"rebuild writes PostgreSQL, MariaDB or SQLite, not {backend}")
        app.prepare(engine)
        staged: list[tuple[Table, Any]] = [(table, views[table.name]) for table in app.tables]
        if idempotency_keys_df is not None:
            staged.append((idempotency_keys, idempotency_keys_df))
        after_swap: list[str] = []
        pg_names: dict[str, dict[str, str]] = {}
        rows: dict[str, int] = {}
        created: list[str] = []
        deferred: dict[str, list[str]] = {}

        def create(table: Table) -> str:
            staging = table.name + STAGING_SUFFIX
            with engine.begin() as conn:
                created.append(staging)
                index_statements = _create_staging(conn, backend, table, staging)
                if backend == "postgresql":
                    deferred[table.name] = _defer_pg_indexes(conn, staging)  # built once the rows are in
                if table is not idempotency_keys:  # its rows are copied over, the table stays
                    after_swap.extend(index_statements)
                    if backend == "postgresql":
                        pg_names[table.name] = _pg_index_names(conn, table.name)
            return staging

        def build_indexes(table: Table, staging: str) -> None:
            statements = deferred.get(table.name, [])
            if not statements:
                return
            with engine.begin() as conn:
                for statement in statements:
                    _run_ddl(conn, statement)
            progress(f"  {table.name}: built the indexes of {staging} ({len(statements)})")

        def copy(seed: StagingSeed, table: Table, staging: str) -> int:
            with engine.begin() as conn:
                return seed.copy_into(conn, table, staging)

        chosen = seeds or {}
        concurrent = backend != "sqlite"  # SQLite has one writer: there, everything runs in turn

        def write(table: Table, frame: Any, seeding: Future[int] | None) -> int:
            staging = table.name + STAGING_SUFFIX
            seeded = 0
            if seeding is None and table.name in chosen:
                seeded = copy(chosen[table.name], table, staging)
                progress(f"copied {seeded} rows of {table.name} into {staging}")
            progress(f"writing {table.name} into {staging}")
            # On a database server, Spark appends while the seed's copy runs (rows in no order).
            written = _write_rows(frame, engine, backend, db_url, table, staging)
            if seeding is not None:
                seeded = seeding.result()
                progress(f"copied {seeded} rows of {table.name} into {staging}")
            # A duplicate key is refused here (the unique index's build), before any swap.
            build_indexes(table, staging)
            # The JDBC backends count the staging table's rows, the seeded ones among them.
            count = _staged_rows(engine, staging) if concurrent else seeded + written
            progress(f"  {table.name}: {count} rows")
            return count

        copies: dict[str, Future[int]] = {}
        writes: dict[str, Future[int]] = {}
        with (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="waltz-rebuild-seed") as pool,
            ThreadPoolExecutor(
                max_workers=WRITE_JOBS if concurrent else 1, thread_name_prefix="waltz-rebuild-write"
            ) as writers,
        ):
            try:
                for table, _ in staged:
                    create(table)
                    if concurrent and table.name in chosen:
                        # The seeded tables' copies run while Spark writes the other tables.
                        staging = table.name + STAGING_SUFFIX
                        copies[table.name] = pool.submit(copy, chosen[table.name], table, staging)
                if concurrent:
                    # Each table's write is its own Spark job; several at once keep the executors
                    # busy through one job's driver-side steps (planning, connections, the count).
                    for table, frame in staged:
                        writes[table.name] = writers.submit(write, table, frame, copies.get(table.name))
                    for table, _ in staged:
                        rows[table.name] = writes[table.name].result()
                else:
                    for table, frame in staged:
                        rows[table.name] = write(table, frame, None)
            except BaseException:
                for future in (*copies.values(), *writes.values()):
                    future.cancel()
                wait([*copies.values(), *writes.values()])
                _drop_staging(engine, created)  # a failed rebuild leaves the database as it was
                raise
        swap = _Swap(engine, backend, name, marks, with_keys=idempotency_keys_df is not None)
        try:
            if backend == "mariadb":
                swap.mariadb(app.tables)
            else:
                swap.in_one_transaction(app.tables, pg_names, after_swap)
        except BaseException:
            # A refused or failed swap moved nothing: the staged copies go (on MariaDB also the
            # marks' staging copy, made for the rename; a staging name the rename moved is gone).
            _drop_staging(engine, [*created, high_water_marks.name + STAGING_SUFFIX])
            raise
        progress(f"swapped in {len(staged)} tables; marks of {name!r} set to {marks_text(marks)}")
        return rows
    finally:
        engine.dispose()


def _drop_staging(engine: Engine, names: Sequence[str]) -> None:
    """Drop the staging tables of a rebuild that failed; a failure to drop is logged, not raised."""
    try:
        with engine.begin() as conn:
            for name in names:
                conn.execute(text(f"DROP TABLE IF EXISTS {conn.dialect.identifier_preparer.quote(name)}"))
    except Exception:
        log.exception("could not drop the staging tables %s of a failed rebuild", ", ".join(names))


class _Swap:
    """Puts the staged tables in place with the log's marks and keys (see the module docstring)."""

    def __init__(
        self, engine: Engine, backend: str, cluster_name: str, marks: Mapping[int, int], *, with_keys: bool
    ) -> None:
        self.engine = engine
        self.backend = backend
        self.cluster_name = cluster_name
        self.marks = marks
        self.with_keys = with_keys
        self.quote = engine.dialect.identifier_preparer.quote

    def _mark_rows(self) -> list[dict[str, Any]]:
        return [
            {
                "cluster_name": self.cluster_name,
                "partition_id": pid,
                "high_water_mark": mark,
                "updated_at": None,
            }
            for pid, mark in sorted(self.marks.items())
        ]

    def in_one_transaction(
        self, tables: Sequence[Table], pg_names: Mapping[str, Mapping[str, str]], after_swap: Sequence[str]
    ) -> None:
        """PostgreSQL and SQLite: DDL is transactional, so tables, marks and keys move at once,
        after the marks were found not to go backwards (their rows locked until the commit)."""
        with self.engine.connect() as conn:
            conn.execution_options(**{SQLITE_BEGIN: "IMMEDIATE"})  # SQLite: the writers wait for the swap
            with conn.begin():
                self._check_forward(conn, lock=True)
                self._swap_in_transaction(conn, tables, pg_names, after_swap)

    def _swap_in_transaction(
        self,
        conn: Connection,
        tables: Sequence[Table],
        pg_names: Mapping[str, Mapping[str, str]],
        after_swap: Sequence[str],
    ) -> None:
        quote = self.quote
        for t in tables:
            conn.execute(text(f"DROP TABLE {quote(t.name)}"))
            conn.execute(text(f"ALTER TABLE {quote(t.name + STAGING_SUFFIX)} RENAME TO {quote(t.name)}"))
            if self.backend == "postgresql":
                for shape, staged in _pg_index_names(conn, t.name).items():
                    original = pg_names.get(t.name, {}).get(shape)
                    if original and original != staged:
                        conn.execute(text(f"ALTER INDEX {quote(staged)} RENAME TO {quote(original)}"))
        for statement in after_swap:
            _run_ddl(conn, statement)
        conn.execute(delete(high_water_marks).where(high_water_marks.c.cluster_name == self.cluster_name))
        if self.marks:
            conn.execute(insert(high_water_marks), self._mark_rows())
        if self.with_keys:
            keys_staging = quote(idempotency_keys.name + STAGING_SUFFIX)
            names = ", ".join(quote(c.name) for c in idempotency_keys.columns)
            conn.execute(delete(idempotency_keys).where(idempotency_keys.c.cluster_name == self.cluster_name))
            target = quote(idempotency_keys.name)
            conn.execute(text(f"INSERT INTO {target} ({names}) SELECT {names} FROM {keys_staging}"))
            conn.execute(text(f"DROP TABLE {keys_staging}"))

    def mariadb(self, tables: Sequence[Table]) -> None:
        """MariaDB: DDL commits, so the marks and keys of other logs are copied into staged framework
        tables and every table is renamed in one atomic ``RENAME TABLE``."""
        quote = self.quote
        framework: list[Table] = [high_water_marks]
        with self.engine.begin() as conn:
            marks_staging = high_water_marks.name + STAGING_SUFFIX
            conn.execute(text(f"DROP TABLE IF EXISTS {quote(marks_staging)}"))
            conn.execute(text(f"CREATE TABLE {quote(marks_staging)} LIKE {quote(high_water_marks.name)}"))
            self._copy_other_logs(conn, high_water_marks)
            if self.marks:
                conn.execute(insert(_renamed(high_water_marks, marks_staging)), self._mark_rows())
            if self.with_keys:
                self._copy_other_logs(conn, idempotency_keys)
                framework.append(idempotency_keys)
        moved = [*tables, *framework]
        renames = ", ".join(
            f"{quote(t.name)} TO {quote(t.name + _OLD_SUFFIX)}, "
            f"{quote(t.name + STAGING_SUFFIX)} TO {quote(t.name)}"
            for t in moved
        )
        with self.engine.begin() as conn:
            for t in moved:
                conn.execute(text(f"DROP TABLE IF EXISTS {quote(t.name + _OLD_SUFFIX)}"))
            # DDL commits on MariaDB: the marks are compared right before the atomic rename, and an
            # instance that applies in between is caught by its next apply's mark check only.
            self._check_forward(conn, lock=False)
            conn.execute(text(f"RENAME TABLE {renames}"))
            for t in moved:
                conn.execute(text(f"DROP TABLE {quote(t.name + _OLD_SUFFIX)}"))

    def _check_forward(self, conn: Connection, *, lock: bool) -> None:
        """Refuse a swap that would move a partition's mark backwards (instances that applied past
        the rebuild's marks meanwhile would then skip what the rebuilt tables lack).

        Args:
            lock: lock the log's mark rows until the swap commits (applies wait for it).

        Raises:
            RebuildError: naming each partition whose live mark is past the rebuilt one.
        """
        stmt = select(high_water_marks.c.partition_id, high_water_marks.c.high_water_mark).where(
            high_water_marks.c.cluster_name == self.cluster_name
        )
        if lock and self.backend != "sqlite":
            stmt = stmt.with_for_update()
        ahead = {
            int(pid): int(mark)
            for pid, mark in conn.execute(stmt)
            if int(pid) in self.marks and int(mark) > self.marks[int(pid)]
        }
        if ahead:
            detail = ", ".join(
                f"partition {p}: {m} live, {self.marks[p]} rebuilt" for p, m in sorted(ahead.items())
            )
            raise RebuildError(
                f"the live database of log {self.cluster_name!r} has applied past the rebuild ({detail}); "
                "swapping would move its marks backwards, so nothing was swapped: rebuild again up to "
                "the live marks or beyond (or stop the instances first)"
            )

    def _copy_other_logs(self, conn: Connection, table: Table) -> None:
        """Copy the rows of other logs (other cluster names) into the table's staging copy."""
        staging = _renamed(table, table.name + STAGING_SUFFIX)
        others = select(*table.columns).where(table.c.cluster_name != self.cluster_name)
        conn.execute(insert(staging).from_select([c.name for c in table.columns], others))


def _renamed(table: Table, name: str) -> Any:
    """A lightweight table clause with ``table``'s columns under another name (a staging copy)."""
    return table_clause(name, *(column(c.name) for c in table.columns))
