"""Create, upgrade and inspect the SQL framework's own tables (alembic).

The tables of :mod:`waltz.jdbc_style.schema` (high-water marks, idempotency keys, skipped
transactions) are made by an alembic environment shipped in the top-level ``migrations/``
directory (installed as ``waltz/jdbc_style/migrations``). Its
revisions carry the branch label ``waltz`` and, run through this module or ``waltz db upgrade``,
record themselves in their own version table, ``waltz_alembic_version``: an application's
``alembic_version`` is never read nor written. Source: docs/design/sql.md "The high-water-mark
table" (the database stores the high-water mark), "Migrations"; ``docs/sql.md``, "Migrations and
operator commands".

An application that keeps its own alembic environment chooses one of two ways:

1. **Run ours beside its own** (recommended). Call :func:`upgrade` with the connection, from the
   deployment script or from the application's ``env.py`` before its own ``context.configure``::

       from waltz.jdbc_style import migrations_api

       def run_migrations_online() -> None:
           with engine.connect() as connection:
               migrations_api.upgrade(connection)  # commits its own transaction
               context.configure(
                   connection=connection,
                   target_metadata=target_metadata,
                   include_object=migrations_api.exclude_framework_tables,
               )
               with context.begin_transaction():
                   context.run_migrations()

   The framework's revision then lives in ``waltz_alembic_version``, apart from the application's.

2. **Adopt our revisions as a branch** of the application's history: add
   ``str(migrations_api.script_location() / "versions")`` to its ``version_locations`` (with its
   own versions directory, separated as its ``path_separator`` says) and upgrade to ``heads``
   (or ``waltz@head``). The framework's revision is then recorded in the application's own
   version table, beside its own head: pass ``version_table="alembic_version"`` to
   :func:`current` and :func:`check_current`.

Either way, pass :func:`exclude_framework_tables` as ``include_object`` to the application's
``context.configure`` so that autogenerate neither drops nor re-creates the framework's tables
(which are not in the application's ``target_metadata``).

Operators use the same functions through ``waltz db`` (:mod:`waltz.cli.db`).
"""

from __future__ import annotations

import hashlib
import io
import logging
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import Connection, Engine, Table, inspect, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.schema import SchemaItem

from waltz.errors import SqlFrameworkError
from waltz.jdbc_style.binding import Bind, connection_for, describe, url_text
from waltz.jdbc_style.engine import (
    SQLITE_BEGIN,
    create_framework_engine,
    emits_sqlite_begin,
    parse_database_url,
    refuse_async_bind,
)
from waltz.jdbc_style.schema import metadata

__all__ = [
    "BRANCH_LABEL",
    "MIGRATION_LOCK_TIMEOUT",
    "VERSION_TABLE",
    "FrameworkRevisionNewerError",
    "FrameworkTablesMissingError",
    "MigrationLockTimeoutError",
    "OfflineDialectError",
    "alembic_config",
    "check_current",
    "current",
    "downgrade",
    "downgrade_environment",
    "exclude_framework_tables",
    "head",
    "migration_lock",
    "require_tables",
    "revisions",
    "script_location",
    "upgrade",
    "upgrade_sql",
]

logger = logging.getLogger(__name__)

#: The alembic version table of the framework's revisions (never an application's ``alembic_version``).
VERSION_TABLE = "waltz_alembic_version"
#: The branch label of the framework's revisions (``waltz@head``).
BRANCH_LABEL = "waltz"


_FRAMEWORK_TABLES = frozenset(metadata.tables) | {VERSION_TABLE}

#: Seconds :func:`migration_lock` waits for another process's migration by default.
MIGRATION_LOCK_TIMEOUT = 300.0
#: PostgreSQL's advisory lock key of the migrations (a fixed bigint: the first 8 bytes of the
#: SHA-256 of ``waltz_migrations``, signed); MySQL's and MariaDB's named lock.
_PG_LOCK_KEY = int.from_bytes(hashlib.sha256(b"waltz_migrations").digest()[:8], "big", signed=True)
_MYSQL_LOCK_NAME = "waltz_migrations"
#: Where a SQLite connection's busy timeout before the lock is kept (``Connection.info``).
_SQLITE_BUSY_BEFORE = "waltz_busy_timeout_before_migration_lock"


class FrameworkTablesMissingError(SqlFrameworkError):
    """The database's framework tables are missing or not at the revision this waltz-py needs.

    Attributes:
        revision: the database's framework revision (None: the tables were never created).
        head: the revision this waltz-py needs.
        missing: the framework tables found missing, if they were looked for.
    """

    def __init__(self, url: str, revision: str | None, head: str, missing: Sequence[str] = ()) -> None:
        if missing:
            state = f"has no table {', '.join(missing)} (waltz framework revision {revision or 'none'})"
        elif revision is None:
            state = f"has no waltz framework tables (no revision in {VERSION_TABLE})"
        else:
            state = f"is at waltz framework revision {revision!r}, but this waltz-py needs {head!r}"
        password = " with the password filled in" if "***" in url else ""
        super().__init__(
            f"the database {url} {state}; run `waltz db upgrade --url '{url}'`{password} (or call "
            "waltz.jdbc_style.migrations_api.upgrade) and try again"
        )
        self.revision = revision
        self.head = head
        self.missing = tuple(missing)


class MigrationLockTimeoutError(SqlFrameworkError):
    """Another process held the database's migration lock longer than the wait allowed
    (docs/design/sql.md "Migrations"): its migration is still running, or it stopped holding
    the lock in a session the database has not ended.

    Attributes:
        timeout: the seconds waited.
    """

    def __init__(self, url: str, timeout: float) -> None:
        super().__init__(
            f"another process has held the migration lock of {url} for over {timeout:g} s: wait for "
            "its migration to end (or end its session) and try again"
        )
        self.timeout = timeout


class FrameworkRevisionNewerError(FrameworkTablesMissingError):
    """The database is at a framework revision this waltz-py does not ship: a newer waltz-py
    migrated it (docs/design/sql.md "Migrations").

    Whether this waltz-py can use those tables is unknown, so its callbacks refuse to start, and
    it cannot upgrade nor downgrade them (it has no script from that revision). A subclass of
    :class:`FrameworkTablesMissingError`, whose handlers still catch it; ``missing`` is empty.

    Attributes:
        revision: the database's framework revision (e.g. ``"waltz_0003"``).
        head: the newest revision this waltz-py ships.
    """

    def __init__(self, url: str, revision: str, head: str) -> None:
        SqlFrameworkError.__init__(
            self,
            f"the database {url} is at waltz framework revision {revision!r}, which this waltz-py "
            f"does not know (its newest is {head!r}): a newer waltz-py migrated it. Run this "
            "instance with that waltz-py or a newer one: this one cannot tell whether it works with "
            "those tables, and cannot upgrade or downgrade them",
        )
        self.revision = revision
        self.head = head
        self.missing = ()


class OfflineDialectError(SqlFrameworkError):
    """:func:`upgrade_sql` cannot tell which server's DDL to print (docs/design/sql.md
    "Migrations"): a ``mysql://`` URL names MariaDB and MySQL alike, whose byte-for-byte
    collations differ, and offline no server says which it is; or ``mysql_8`` was given with a
    URL that is not ``mysql://``.

    Attributes:
        dialect: the URL's dialect (``mysql``, ``mariadb``, ``postgresql``...).
    """

    def __init__(self, message: str, dialect: str) -> None:
        super().__init__(message)
        self.dialect = dialect


# ---- alembic configuration -----------------------------------------------------------------------


def script_location() -> Path:
    """The directory of the framework's alembic environment (``env.py``, ``versions/``).

    The environment lives in the repository's top-level ``migrations/`` directory, which a wheel
    installs as ``waltz/jdbc_style/migrations`` (setup.py).

    Returns:
        An absolute path: inside the installed ``waltz`` package, or, in a source checkout (an
        editable install), the repository's ``migrations/``.
    """
    here = Path(__file__).resolve().parent
    packaged = here / "migrations"
    return packaged if packaged.is_dir() else here.parents[1] / "migrations"


def alembic_config(url_or_connection: Bind | None = None) -> Config:
    """An alembic :class:`~alembic.config.Config` for the framework's environment (no ini file).

    The environment (``migrations/env.py``) records revisions in :data:`VERSION_TABLE` and only
    looks at the framework's tables.

    Args:
        url_or_connection: the database: a URL (set as ``sqlalchemy.url``), or an engine or
            connection (put in ``config.attributes["connection"]``, the alembic cookbook's way). A
            connection is used as is: if it is inside a transaction, the caller commits it.
            None: set one later.

    Returns:
        The configuration, for :mod:`alembic.command` functions.

    Raises:
        AsyncEngineError: an asyncio engine, connection or URL.
    """
    if url_or_connection is not None:
        refuse_async_bind(url_or_connection)
    config = Config()
    config.set_main_option("script_location", str(script_location()))
    if isinstance(url_or_connection, str | URL):
        # ConfigParser interpolates "%": escape it (URL-encoded passwords contain it).
        text = url_text(url_or_connection, hide_password=False)
        config.set_main_option("sqlalchemy.url", text.replace("%", "%%"))
    elif url_or_connection is not None:
        config.attributes["connection"] = url_or_connection
    return config


def head() -> str:
    """The newest framework revision this waltz-py ships (what :func:`upgrade` moves to).

    Returns:
        The revision ID, e.g. ``"waltz_0001"``.
    """
    revision = _script().get_current_head()
    if revision is None:  # pragma: no cover - the package always ships a revision
        raise SqlFrameworkError(f"no alembic revision under {script_location()}: the installation is broken")
    return revision


def revisions() -> frozenset[str]:
    """Every framework revision this waltz-py ships (:func:`head` and those before it).

    Returns:
        The revision IDs, e.g. ``{"waltz_0001", "waltz_0002"}``. A database at a revision not
        among them was migrated by a newer waltz-py (:class:`FrameworkRevisionNewerError`).
    """
    return frozenset(script.revision for script in _script().walk_revisions())


def _refuse_newer_revision(bind: Bind) -> None:
    """Raise :class:`FrameworkRevisionNewerError` when the database's framework revision is one
    this waltz-py does not ship (what makes alembic answer "Can't locate revision")."""
    revision = current(bind)
    if revision is not None and revision not in revisions():
        raise FrameworkRevisionNewerError(describe(bind), revision, head())


# ---- migrating -----------------------------------------------------------------------------------


@contextmanager
def migration_lock(
    bind: Engine | str | URL, *, timeout: float = MIGRATION_LOCK_TIMEOUT
) -> Iterator[Connection]:
    """Hold the database's migration lock: one process at a time creates or upgrades tables
    (docs/design/sql.md "Migrations"). Instances that start together on a new database, each
    preparing it (``upgrade``, then the application's ``create_all``), would otherwise race to
    create the same tables, and all but one fail.

    Yields a connection that holds the lock; run the preparation on it::

        with migrations_api.migration_lock(engine) as connection:
            migrations_api.upgrade(connection)
            Base.metadata.create_all(connection)

    The connection's open transaction is committed when the block ends (rolled back when it
    raises), then the lock is released. The lock is PostgreSQL's session advisory lock on a fixed
    key, MySQL's and MariaDB's ``GET_LOCK('waltz_migrations')``, and SQLite's write lock
    (``BEGIN IMMEDIATE``: the block is then one transaction, and other writers wait for it).
    :func:`upgrade` given a URL or an engine takes the lock itself.

    Args:
        bind: the database (a URL, or an engine; a pooled engine gets its connection back
            unlocked).
        timeout: seconds to wait for another process's lock (on SQLite, the connection's busy
            timeout while it waits).

    Raises:
        MigrationLockTimeoutError: another process held the lock for longer than ``timeout``.
        AsyncEngineError: an asyncio engine or URL.
        sqlalchemy.exc.DBAPIError: the database could not be reached.
    """
    refuse_async_bind(bind)
    if isinstance(bind, str | URL):
        engine = create_framework_engine(bind)
        try:
            with migration_lock(engine, timeout=timeout) as connection:
                yield connection
        finally:
            engine.dispose()
        return
    with bind.connect() as connection:
        dialect = connection.dialect.name
        try:
            _take_migration_lock(connection, dialect, timeout)
        except BaseException as error:
            if connection.in_transaction():
                connection.rollback()
            if dialect == "sqlite":
                _release_migration_lock(connection, dialect)  # its busy timeout as it was
            if isinstance(error, DBAPIError) and dialect == "sqlite" and "locked" in str(error.orig):
                raise MigrationLockTimeoutError(describe(bind), timeout) from error
            raise
        try:
            yield connection
            if connection.in_transaction():
                connection.commit()
        except BaseException:
            if connection.in_transaction():
                connection.rollback()
            raise
        finally:
            _release_migration_lock(connection, dialect)


def _take_migration_lock(connection: Connection, dialect: str, timeout: float) -> None:
    """Take the lock of :func:`migration_lock` on ``connection``.

    Raises:
        MigrationLockTimeoutError: not within ``timeout`` seconds.
    """
    url = describe(connection)
    if dialect == "postgresql":
        connection.execute(
            text("SELECT set_config('lock_timeout', :ms, false)"), {"ms": f"{int(timeout * 1000)}ms"}
        )
        try:
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": _PG_LOCK_KEY})
        except OperationalError as error:
            connection.rollback()
            if getattr(error.orig, "sqlstate", None) == "55P03":  # lock_not_available
                raise MigrationLockTimeoutError(url, timeout) from error
            raise
        finally:
            if connection.in_transaction():
                connection.commit()
            connection.execute(text("RESET lock_timeout"))
            connection.commit()
    elif dialect in ("mysql", "mariadb"):
        got = connection.execute(
            text("SELECT GET_LOCK(:name, :seconds)"), {"name": _MYSQL_LOCK_NAME, "seconds": timeout}
        ).scalar()
        connection.commit()
        if got != 1:
            raise MigrationLockTimeoutError(url, timeout)
    elif dialect == "sqlite":
        # The wait is SQLite's busy timeout, set on the driver's connection (a statement through
        # SQLAlchemy would begin a transaction first); _release_migration_lock restores it.
        driver = connection.connection.dbapi_connection
        assert driver is not None
        connection.info[_SQLITE_BUSY_BEFORE] = driver.execute("PRAGMA busy_timeout").fetchone()[0]
        driver.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
        if emits_sqlite_begin(connection.engine):
            connection.execution_options(**{SQLITE_BEGIN: "IMMEDIATE"})
            connection.begin()
        else:  # pysqlite's own transaction handling: it emits no BEGIN of its own before DDL
            connection.exec_driver_sql("BEGIN IMMEDIATE")
    # Other databases: no lock; concurrent preparations may race as before.


def _release_migration_lock(connection: Connection, dialect: str) -> None:
    """Release the lock of :func:`migration_lock` (SQLite's ended with the transaction); a
    connection whose release failed is invalidated, so that its session (and lock) ends."""
    try:
        if dialect == "postgresql":
            connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": _PG_LOCK_KEY})
            connection.commit()
        elif dialect in ("mysql", "mariadb"):
            connection.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": _MYSQL_LOCK_NAME})
            connection.commit()
        elif dialect == "sqlite" and _SQLITE_BUSY_BEFORE in connection.info:
            driver = connection.connection.dbapi_connection
            assert driver is not None
            driver.execute(f"PRAGMA busy_timeout = {int(connection.info.pop(_SQLITE_BUSY_BEFORE))}")
    except DBAPIError:
        connection.invalidate()
        raise


def upgrade(bind: Bind, revision: str = "heads") -> None:
    """Create or upgrade the framework's tables (idempotent: nothing happens at the target).

    Args:
        bind: the database. With a URL or an engine the upgrade runs in its own connection,
            under the database's migration lock (:func:`migration_lock`: processes that upgrade
            at once take turns). A connection is used as is, without the lock: outside a
            transaction alembic begins and commits its own; inside one, the caller commits it.
            Safe to call from an application's own alembic ``env.py`` (see the module
            documentation).
        revision: the target revision (``heads``, ``waltz@head``, a revision ID, ``+1``).

    Raises:
        AsyncEngineError: an asyncio engine, connection or URL (the message names the synchronous
            URL to give instead).
        MigrationLockTimeoutError: another process held the migration lock for over
            :data:`MIGRATION_LOCK_TIMEOUT` seconds.
        FrameworkRevisionNewerError: a newer waltz-py migrated the database.
        sqlalchemy.exc.DBAPIError: the database could not be reached or refused the DDL.
        alembic.util.exc.CommandError: ``revision`` is unknown.
    """
    if not isinstance(bind, Connection):
        with migration_lock(bind) as connection:
            upgrade(connection, revision)
        return
    try:
        with _ALEMBIC_RUN, _preserving_alembic_context():
            command.upgrade(alembic_config(bind), revision)
    except CommandError:
        _refuse_newer_revision(bind)  # alembic's "Can't locate revision" of the database's
        raise
    logger.info("waltz framework tables upgraded to %s on %s", revision, describe(bind))


def upgrade_environment(location: Path, bind: Engine | Connection, revision: str = "heads") -> None:
    """Upgrade with another alembic environment that, like ours, takes its database from
    ``config.attributes["connection"]`` (e.g. an application's migrations shipped in its package,
    as ``waltz_examples.ledger`` does), with the same care as :func:`upgrade`: one alembic run at a time
    in this process, and an enclosing run's ``alembic.context`` restored afterwards.

    Args:
        location: the environment's directory (``env.py``, ``versions/``).
        bind: the database (an engine, or a connection used as is).
        revision: the target revision.

    Raises:
        sqlalchemy.exc.DBAPIError: the database could not be reached or refused the DDL.
        alembic.util.exc.CommandError: ``revision`` is unknown.
    """
    config = Config()
    config.set_main_option("script_location", str(location))
    config.attributes["connection"] = bind
    with _ALEMBIC_RUN, _preserving_alembic_context():
        command.upgrade(config, revision)
    logger.info("alembic environment %s upgraded to %s on %s", location, revision, describe(bind))


def downgrade_environment(location: Path, bind: Engine | Connection, revision: str) -> None:
    """Downgrade with another alembic environment, as :func:`upgrade_environment` upgrades.

    Args:
        location: the environment's directory (``env.py``, ``versions/``).
        bind: the database (an engine, or a connection used as is).
        revision: the target revision (``base``, a revision ID, ``-1``).

    Raises:
        sqlalchemy.exc.DBAPIError: the database could not be reached or refused the DDL.
        alembic.util.exc.CommandError: ``revision`` is unknown.
    """
    config = Config()
    config.set_main_option("script_location", str(location))
    config.attributes["connection"] = bind
    with _ALEMBIC_RUN, _preserving_alembic_context():
        command.downgrade(config, revision)
    logger.info("alembic environment %s downgraded to %s on %s", location, revision, describe(bind))


def upgrade_sql(
    url: str | URL, revision: str = "heads", from_revision: str | None = None, *, mysql_8: bool = False
) -> str:
    """The DDL that :func:`upgrade` would run, without touching a database (alembic offline mode).

    Offline the dialect alone chooses the DDL. MariaDB and MySQL take different byte-for-byte
    collations (``utf8mb4_nopad_bin``, ``utf8mb4_0900_bin``), and each refuses the other's, part
    way through a script their non-transactional DDL does not undo: give MariaDB as
    ``mariadb://``, and MySQL 8 as ``mysql://`` with ``mysql_8=True``; ``mysql://`` alone is
    refused. Source: docs/design/sql.md "Migrations".

    Args:
        url: a URL naming the dialect; nothing connects to it (``postgresql://`` is enough).
        revision: the target revision.
        from_revision: the revision the database is at (None: an empty database).
        mysql_8: a ``mysql://`` URL is MySQL 8.0.17 or newer (not MariaDB).

    Returns:
        The SQL script, statements separated by ``;``, including the version table's updates.

    Raises:
        OfflineDialectError: a ``mysql://`` URL without ``mysql_8``, or ``mysql_8`` with
            another dialect.
        AsyncEngineError: an asyncio driver's URL.
        sqlalchemy.exc.ArgumentError: the URL cannot be parsed or names an unknown dialect.
    """
    config = alembic_config(url)  # refuses an asyncio URL first
    dialect = parse_database_url(url).get_backend_name()
    if dialect == "mysql" and not mysql_8:
        raise OfflineDialectError(
            f"the DDL for {url_text(url, hide_password=True)} would be MySQL 8's: its byte-for-byte "
            "columns take the collation utf8mb4_0900_bin (MySQL 8.0.17 or newer), which MariaDB "
            "refuses part way through, leaving the tables half migrated; offline nothing tells "
            "MariaDB from MySQL. For MariaDB give a mariadb:// URL (mariadb+pymysql://...); for "
            "MySQL 8 say so (mysql_8=True, `waltz db upgrade --sql --mysql-8`)",
            dialect,
        )
    if mysql_8 and dialect != "mysql":
        raise OfflineDialectError(
            f"mysql_8 (`waltz db upgrade --sql --mysql-8`) says a mysql:// URL is MySQL 8, but "
            f"{url_text(url, hide_password=True)} names the dialect {dialect}: leave it out",
            dialect,
        )
    buffer = io.StringIO()
    config.output_buffer = buffer
    target = revision if from_revision is None else f"{from_revision}:{revision}"
    with _preserving_alembic_context():
        command.upgrade(config, target, sql=True)
    return buffer.getvalue()


def downgrade(bind: Bind, revision: str) -> None:
    """Downgrade the framework's tables to ``revision``.

    ``base`` drops the tables: the high-water marks are lost, and an application would then apply
    the whole log again on top of its existing data. Only for a database being discarded.

    Args:
        bind: the database (see :func:`upgrade`).
        revision: the target revision (``base``, a revision ID, ``-1``).

    Raises:
        FrameworkRevisionNewerError: a newer waltz-py migrated the database.
        sqlalchemy.exc.DBAPIError: the database could not be reached or refused the DDL.
        alembic.util.exc.CommandError: ``revision`` is unknown.
    """
    try:
        with _preserving_alembic_context():
            command.downgrade(alembic_config(bind), revision)
    except CommandError:
        _refuse_newer_revision(bind)
        raise
    logger.info("waltz framework tables downgraded to %s on %s", revision, describe(bind))


def current(bind: Bind, *, version_table: str = VERSION_TABLE) -> str | None:
    """The database's framework revision.

    Args:
        bind: the database (see :func:`upgrade`).
        version_table: where the revision is recorded; the application's own version table (for
            instance ``alembic_version``) when it adopted our revisions as a branch, in which case
            only the framework's revisions are considered.

    Returns:
        The revision ID, or None when the tables were never created (or were dropped).

    Raises:
        SqlFrameworkError: the version table holds several framework revisions.
        AsyncEngineError: an asyncio engine, connection or URL (the message names the synchronous
            URL to give instead).
        sqlalchemy.exc.DBAPIError: the database could not be reached.
    """
    refuse_async_bind(bind)
    with connection_for(bind) as connection:
        heads = _heads(connection, version_table)
    if version_table != VERSION_TABLE:
        ours = {script.revision for script in _script().walk_revisions()}
        heads = [revision for revision in heads if revision in ours]
    if len(heads) > 1:
        raise SqlFrameworkError(
            f"{version_table} on {describe(bind)} holds several waltz framework revisions "
            f"{sorted(heads)}; repair it by hand (one revision per branch) or ask the waltz-py maintainers"
        )
    return heads[0] if heads else None


def check_current(bind: Bind, *, version_table: str = VERSION_TABLE) -> None:
    """Check that the database's framework tables are at :func:`head`.

    Applications call it at start-up so that a missing migration fails at once with a message
    saying what to run, rather than at the first apply.

    Args:
        bind: the database (see :func:`upgrade`).
        version_table: see :func:`current`.

    Raises:
        FrameworkTablesMissingError: the tables are missing or at an older revision (the message
            says to run ``waltz db upgrade``).
        FrameworkRevisionNewerError: (a subclass of the above) at a revision this waltz-py does
            not ship: a newer waltz-py migrated the database, and this one refuses it.
        sqlalchemy.exc.DBAPIError: the database could not be reached.
    """
    revision = current(bind, version_table=version_table)
    wanted = head()
    if revision is not None and revision != wanted and revision not in revisions():
        raise FrameworkRevisionNewerError(describe(bind), revision, wanted)
    if revision != wanted:
        raise FrameworkTablesMissingError(describe(bind), revision, wanted)


def exclude_framework_tables(
    object: SchemaItem,
    name: str | None,
    type_: str,
    reflected: bool,
    compare_to: SchemaItem | None,
) -> bool:
    """An alembic ``include_object`` hook that leaves the framework's tables out of autogenerate.

    Give it to an application's ``context.configure(include_object=...)``. Combine it with the
    application's own hook by calling both.

    Args:
        object: the table, column, index or constraint alembic compares.
        name: its name.
        type_: ``"table"``, ``"column"``, ``"index"``, ``"unique_constraint"``, ...
        reflected: whether it was reflected from the database.
        compare_to: its counterpart in the metadata or database, if any.

    Returns:
        False for the framework's tables (and ``waltz_alembic_version``) and everything in them;
        True otherwise.
    """
    if type_ == "table":
        return name not in _FRAMEWORK_TABLES
    table = getattr(object, "table", None)
    return not (isinstance(table, Table) and table.name in _FRAMEWORK_TABLES)


# ---- helpers -------------------------------------------------------------------------------------


def _script() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def _heads(connection: Connection, version_table: str) -> Sequence[str]:
    context = MigrationContext.configure(connection, opts={"version_table": version_table})
    return context.get_current_heads()


def require_tables(connection: Connection, *tables: Table) -> None:
    """Raise a clear error, rather than the database's "no such table", when tables are missing."""
    inspector = inspect(connection)
    missing = [table.name for table in tables if not inspector.has_table(table.name)]
    if missing:
        heads = _heads(connection, VERSION_TABLE)
        raise FrameworkTablesMissingError(
            describe(connection), heads[0] if heads else None, head(), missing=missing
        )


#: Alembic's ``context`` and ``op`` are module globals: one run at a time per process (re-entrant,
#: for a run started from inside another's ``env.py``).
_ALEMBIC_RUN = threading.RLock()


@contextmanager
def _preserving_alembic_context() -> Iterator[None]:
    """Keep an enclosing alembic run working when ours runs inside it.

    Alembic installs its ``alembic.context`` and ``alembic.op`` proxies for the duration of a
    command and deletes them afterwards, without restoring an enclosing command's. When
    :func:`upgrade` is called from an application's ``env.py``, the application's proxies are
    put back once ours is done.
    """
    modules = [sys.modules[name] for name in ("alembic.context", "alembic.op") if name in sys.modules]
    saved = [
        (vars(module), dict(vars(module))) for module in modules if vars(module).get("_proxy") is not None
    ]
    try:
        yield
    finally:
        for namespace, before in saved:
            namespace.update(before)
