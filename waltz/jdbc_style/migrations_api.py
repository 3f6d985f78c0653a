"""Create, upgrade and inspect the SQL framework's own tables; record an operator's skip.

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

import datetime as dt
import io
import logging
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, Table, create_engine, inspect, select
from sqlalchemy.engine import URL
from sqlalchemy.exc import IntegrityError
from sqlalchemy.pool import NullPool
from sqlalchemy.schema import SchemaItem

from waltz.errors import SqlFrameworkError
from waltz.jdbc_style.schema import high_water_marks, metadata, skipped_transactions

__all__ = [
    "BRANCH_LABEL",
    "VERSION_TABLE",
    "Bind",
    "FrameworkTablesMissingError",
    "MarkRow",
    "SkipRefusedError",
    "SkipRow",
    "alembic_config",
    "check_current",
    "current",
    "downgrade",
    "exclude_framework_tables",
    "head",
    "list_marks",
    "list_skips",
    "request_skip",
    "script_location",
    "upgrade",
    "upgrade_sql",
]

logger = logging.getLogger(__name__)

#: The alembic version table of the framework's revisions (never an application's ``alembic_version``).
VERSION_TABLE = "waltz_alembic_version"
#: The branch label of the framework's revisions (``waltz@head``).
BRANCH_LABEL = "waltz"

Bind = str | URL | Engine | Connection
"""A database: a SQLAlchemy URL (as text or :class:`~sqlalchemy.engine.URL`), an engine, or a connection."""

_FRAMEWORK_TABLES = frozenset(metadata.tables) | {VERSION_TABLE}


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


class SkipRefusedError(SqlFrameworkError):
    """An operator's skip request was refused; nothing was recorded (the message says why)."""


@dataclass(frozen=True, slots=True)
class MarkRow:
    """One row of ``waltz_high_water_marks``.

    Attributes:
        cluster_name: the Waltz cluster (log) the mark belongs to.
        partition_id: the partition.
        high_water_mark: the highest transaction ID applied to this database (-1: none).
        updated_at: when it last moved (UTC), or None.
    """

    cluster_name: str
    partition_id: int
    high_water_mark: int
    updated_at: dt.datetime | None


@dataclass(frozen=True, slots=True)
class SkipRow:
    """One row of ``waltz_skipped_transactions``: an operator's skip request.

    Attributes:
        cluster_name: the Waltz cluster (log).
        partition_id: the partition.
        transaction_id: the transaction to pass over.
        reason: why the operator asked for it.
        operator: who asked.
        requested_at: when the request was recorded (UTC).
        skipped_at: when an application instance passed over the transaction (UTC); None while
            the request is pending.
    """

    cluster_name: str
    partition_id: int
    transaction_id: int
    reason: str
    operator: str
    requested_at: dt.datetime
    skipped_at: dt.datetime | None

    @property
    def pending(self) -> bool:
        """Whether no application instance has passed over the transaction yet."""
        return self.skipped_at is None


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
    """
    config = Config()
    config.set_main_option("script_location", str(script_location()))
    if isinstance(url_or_connection, str | URL):
        # ConfigParser interpolates "%": escape it (URL-encoded passwords contain it).
        text = _url_text(url_or_connection, hide_password=False)
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


# ---- migrating -----------------------------------------------------------------------------------


def upgrade(bind: Bind, revision: str = "heads") -> None:
    """Create or upgrade the framework's tables (idempotent: nothing happens at the target).

    Args:
        bind: the database. With a URL or an engine the upgrade runs in its own connection and
            transaction. A connection is used as is: outside a transaction alembic begins and
            commits its own; inside one, the caller commits it. Safe to call from an
            application's own alembic ``env.py`` (see the module documentation).
        revision: the target revision (``heads``, ``waltz@head``, a revision ID, ``+1``).

    Raises:
        sqlalchemy.exc.DBAPIError: the database could not be reached or refused the DDL.
        alembic.util.exc.CommandError: ``revision`` is unknown.
    """
    with _ALEMBIC_RUN, _preserving_alembic_context():
        command.upgrade(alembic_config(bind), revision)
    logger.info("waltz framework tables upgraded to %s on %s", revision, _describe(bind))


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
    logger.info("alembic environment %s upgraded to %s on %s", location, revision, _describe(bind))


def upgrade_sql(url: str | URL, revision: str = "heads", from_revision: str | None = None) -> str:
    """The DDL that :func:`upgrade` would run, without touching a database (alembic offline mode).

    Args:
        url: a URL naming the dialect; nothing connects to it (``postgresql://`` is enough).
        revision: the target revision.
        from_revision: the revision the database is at (None: an empty database).

    Returns:
        The SQL script, statements separated by ``;``, including the version table's updates.

    Raises:
        sqlalchemy.exc.ArgumentError: the URL cannot be parsed or names an unknown dialect.
    """
    buffer = io.StringIO()
    config = alembic_config(url)
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
        sqlalchemy.exc.DBAPIError: the database could not be reached or refused the DDL.
        alembic.util.exc.CommandError: ``revision`` is unknown.
    """
    with _preserving_alembic_context():
        command.downgrade(alembic_config(bind), revision)
    logger.info("waltz framework tables downgraded to %s on %s", revision, _describe(bind))


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
        sqlalchemy.exc.DBAPIError: the database could not be reached.
    """
    with _connection(bind) as connection:
        heads = _heads(connection, version_table)
    if version_table != VERSION_TABLE:
        ours = {script.revision for script in _script().walk_revisions()}
        heads = [revision for revision in heads if revision in ours]
    if len(heads) > 1:
        raise SqlFrameworkError(
            f"{version_table} on {_describe(bind)} holds several waltz framework revisions "
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
        FrameworkTablesMissingError: the tables are missing or at another revision.
        sqlalchemy.exc.DBAPIError: the database could not be reached.
    """
    revision = current(bind, version_table=version_table)
    wanted = head()
    if revision != wanted:
        raise FrameworkTablesMissingError(_describe(bind), revision, wanted)


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


# ---- operator commands ---------------------------------------------------------------------------


def request_skip(
    bind: Bind,
    *,
    cluster_name: str,
    partition_id: int,
    transaction_id: int,
    reason: str,
    operator: str,
) -> None:
    """Record an operator's request to pass over a transaction whose apply keeps failing.

    Only the transaction an application is stuck on can be skipped: the one right after the
    partition's high-water mark. The request is a row in ``waltz_skipped_transactions``
    (``skipped_at`` NULL); an application instance whose apply of that transaction failed moves
    the mark past it at its next attempt, without applying it, and sets ``skipped_at``. The
    transaction stays in the log: other databases that follow the log are not affected.

    The partition's mark row is locked (``SELECT ... FOR UPDATE``) while the request is checked
    and recorded, so it cannot race with an apply.

    Args:
        bind: the application's database (see :func:`upgrade`; a connection inside a transaction
            is left for the caller to commit).
        cluster_name: the Waltz cluster (log) the application follows.
        partition_id: the partition.
        transaction_id: the stuck transaction: the partition's high-water mark + 1 (0 when the
            partition has no mark row yet).
        reason: why, for the audit trail (not blank).
        operator: who asks, for the audit trail (not blank).

    Raises:
        SkipRefusedError: a blank reason or operator; the transaction is already applied, or is
            not the next one to apply; a request for it already exists. Nothing is recorded.
        FrameworkTablesMissingError: the database has no framework tables (run :func:`upgrade`).
        sqlalchemy.exc.DBAPIError: the database could not be reached.
    """
    where = f"cluster {cluster_name!r} partition {partition_id}"
    if not reason.strip():
        raise SkipRefusedError(
            f"{where}: give a reason for skipping transaction {transaction_id} (it is kept for the audit)"
        )
    if not operator.strip():
        raise SkipRefusedError(f"{where}: give the operator's name (it is kept for the audit)")
    if not cluster_name:
        raise SkipRefusedError("give the cluster name (the log the application follows)")
    try:
        with _transaction(bind) as connection:
            _require_tables(connection, high_water_marks, skipped_transactions)
            mark = connection.execute(
                select(high_water_marks.c.high_water_mark)
                .where(
                    high_water_marks.c.cluster_name == cluster_name,
                    high_water_marks.c.partition_id == partition_id,
                )
                .with_for_update()
            ).scalar_one_or_none()
            _check_skippable(where, mark, transaction_id)
            existing = connection.execute(
                select(skipped_transactions).where(
                    skipped_transactions.c.cluster_name == cluster_name,
                    skipped_transactions.c.partition_id == partition_id,
                    skipped_transactions.c.transaction_id == transaction_id,
                )
            ).one_or_none()
            if existing is not None:
                raise SkipRefusedError(_already_requested(where, _skip_row(existing._mapping)))
            connection.execute(
                skipped_transactions.insert().values(
                    cluster_name=cluster_name,
                    partition_id=partition_id,
                    transaction_id=transaction_id,
                    reason=reason.strip(),
                    operator=operator.strip(),
                    requested_at=dt.datetime.now(dt.UTC),
                    skipped_at=None,
                )
            )
    except IntegrityError as exc:  # another operator recorded the same request concurrently
        raise SkipRefusedError(
            f"{where}: a skip of transaction {transaction_id} was recorded concurrently by someone "
            "else; see `waltz db skips`"
        ) from exc
    logger.warning(
        "%s: %s requested to skip transaction %d: %s", where, operator.strip(), transaction_id, reason.strip()
    )


def _check_skippable(where: str, mark: int | None, transaction_id: int) -> None:
    if mark is None:
        if transaction_id != 0:
            raise SkipRefusedError(
                f"{where} has no high-water mark row in this database: nothing was applied yet, so "
                f"only transaction 0 can be stuck, not {transaction_id}; check the cluster name and "
                "partition with `waltz db marks`"
            )
        return
    if transaction_id <= mark:
        raise SkipRefusedError(
            f"{where}: transaction {transaction_id} is already applied (high-water mark {mark}); "
            "there is nothing to skip"
        )
    if transaction_id > mark + 1:
        raise SkipRefusedError(
            f"{where}: only the next transaction to apply, {mark + 1} (the one an application is "
            f"stuck on), can be skipped, not {transaction_id}; transactions are applied in order, "
            f"so {transaction_id} has not been tried yet"
        )


def _already_requested(where: str, row: SkipRow) -> str:
    if row.skipped_at is None:
        state = "pending: it takes effect at an application's next attempt after a failed apply of it"
    else:
        state = f"skipped at {row.skipped_at.isoformat()}"
    return (
        f"{where}: a skip of transaction {row.transaction_id} was already requested by "
        f"{row.operator} at {row.requested_at.isoformat()} ({row.reason!r}); {state}"
    )


def list_marks(bind: Bind, cluster_name: str | None = None) -> list[MarkRow]:
    """The high-water marks recorded in the database.

    Args:
        bind: the database (see :func:`upgrade`).
        cluster_name: only this cluster's marks; None: every cluster's.

    Returns:
        The rows, ordered by cluster name and partition.

    Raises:
        FrameworkTablesMissingError: the database has no framework tables (run :func:`upgrade`).
        sqlalchemy.exc.DBAPIError: the database could not be reached.
    """
    table = high_water_marks
    query = select(table).order_by(table.c.cluster_name, table.c.partition_id)
    if cluster_name is not None:
        query = query.where(table.c.cluster_name == cluster_name)
    with _connection(bind) as connection:
        _require_tables(connection, table)
        rows = connection.execute(query).all()
    return [
        MarkRow(
            cluster_name=row.cluster_name,
            partition_id=row.partition_id,
            high_water_mark=row.high_water_mark,
            updated_at=_utc(row.updated_at),
        )
        for row in rows
    ]


def list_skips(bind: Bind, cluster_name: str | None = None) -> list[SkipRow]:
    """The operators' skip requests recorded in the database (pending and done).

    Args:
        bind: the database (see :func:`upgrade`).
        cluster_name: only this cluster's requests; None: every cluster's.

    Returns:
        The rows, ordered by cluster name, partition and transaction.

    Raises:
        FrameworkTablesMissingError: the database has no framework tables (run :func:`upgrade`).
        sqlalchemy.exc.DBAPIError: the database could not be reached.
    """
    table = skipped_transactions
    query = select(table).order_by(table.c.cluster_name, table.c.partition_id, table.c.transaction_id)
    if cluster_name is not None:
        query = query.where(table.c.cluster_name == cluster_name)
    with _connection(bind) as connection:
        _require_tables(connection, table)
        rows = connection.execute(query).all()
    return [_skip_row(row._mapping) for row in rows]


def _skip_row(row: Any) -> SkipRow:
    requested_at = _utc(row["requested_at"])
    assert requested_at is not None  # NOT NULL column
    return SkipRow(
        cluster_name=row["cluster_name"],
        partition_id=row["partition_id"],
        transaction_id=row["transaction_id"],
        reason=row["reason"],
        operator=row["operator"],
        requested_at=requested_at,
        skipped_at=_utc(row["skipped_at"]),
    )


# ---- helpers -------------------------------------------------------------------------------------


def _script() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def _heads(connection: Connection, version_table: str) -> Sequence[str]:
    context = MigrationContext.configure(connection, opts={"version_table": version_table})
    return context.get_current_heads()


def _require_tables(connection: Connection, *tables: Table) -> None:
    """Raise a clear error, rather than the database's "no such table", when tables are missing."""
    inspector = inspect(connection)
    missing = [table.name for table in tables if not inspector.has_table(table.name)]
    if missing:
        heads = _heads(connection, VERSION_TABLE)
        raise FrameworkTablesMissingError(
            _describe(connection), heads[0] if heads else None, head(), missing=missing
        )


def _utc(value: dt.datetime | None) -> dt.datetime | None:
    """Aware UTC; SQLite and MariaDB return naive datetimes, which we always write in UTC."""
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC)


def _url_text(url: str | URL, *, hide_password: bool) -> str:
    if isinstance(url, URL):
        return url.render_as_string(hide_password=hide_password)
    if not hide_password:
        return url
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "(unparsable URL)"


def _describe(bind: Bind) -> str:
    """The database's URL with the password hidden, for messages."""
    if isinstance(bind, str | URL):
        return _url_text(bind, hide_password=True)
    return bind.engine.url.render_as_string(hide_password=True)


@contextmanager
def _engine_for(url: str | URL) -> Iterator[Engine]:
    engine = create_engine(url, poolclass=NullPool)
    try:
        yield engine
    finally:
        engine.dispose()


@contextmanager
def _connection(bind: Bind) -> Iterator[Connection]:
    """A connection for reads: the given one, or a new one closed afterwards.

    A given connection that was outside a transaction is left outside one (the transaction the
    reads began is rolled back), so that a following :func:`upgrade` on it commits its own.
    """
    if isinstance(bind, Connection):
        began = not bind.in_transaction()
        try:
            yield bind
        finally:
            if began and bind.in_transaction():
                bind.rollback()
    elif isinstance(bind, Engine):
        with bind.connect() as connection:
            yield connection
    else:
        with _engine_for(bind) as engine, engine.connect() as connection:
            yield connection


@contextmanager
def _transaction(bind: Bind) -> Iterator[Connection]:
    """A connection in a transaction committed on success (a caller's transaction is left to it)."""
    if isinstance(bind, Connection):
        if bind.in_transaction():
            yield bind
        else:
            with bind.begin():
                yield bind
    elif isinstance(bind, Engine):
        with bind.begin() as connection:
            yield connection
    else:
        with _engine_for(bind) as engine, engine.begin() as connection:
            yield connection


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
