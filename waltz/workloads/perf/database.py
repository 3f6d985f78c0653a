"""The database of a ``waltz perf smallbank`` or ``inventory`` run: checked before anything starts,
or a temporary one.

Part of :mod:`waltz.workloads.perf` (its module docstring describes the run).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from typing import Protocol

from sqlalchemy import inspect, select
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

from waltz.jdbc_style import create_framework_engine
from waltz.jdbc_style import migrations_api as framework_migrations
from waltz.jdbc_style.binding import url_text
from waltz.jdbc_style.schema import high_water_marks
from waltz.jdbc_style.schema import metadata as framework_metadata

__all__ = [
    "FRAMEWORK_TABLES",
    "PerfApplication",
    "UnusableDatabaseError",
    "check_database",
    "perf_database",
]

#: The SQL framework's tables, with its alembic version table: a database may hold them and the
#: application's (``PerfApplication.tables``), and nothing else.
FRAMEWORK_TABLES = frozenset(framework_metadata.tables) | {framework_migrations.VERSION_TABLE}


class PerfApplication(Protocol):
    """What the database checks need of an application a run drives (a SmallBank application,
    an inventory application).

    Attributes:
        name: its short name (its SQLite file's, and its default log name in the mark rows).
        tables: the tables its own migrations make, their version table included.
    """

    @property
    def name(self) -> str: ...

    @property
    def tables(self) -> frozenset[str]: ...


class UnusableDatabaseError(ValueError):
    """The ``--db`` database cannot be used: a bad URL, unreachable, or holding other tables."""


@contextlib.contextmanager
def perf_database(application: PerfApplication, db_url: str | None) -> Iterator[str]:
    """Yield ``db_url``, or without one the URL of a SQLite file named after the application in a
    temporary directory that is removed when the block ends."""
    if db_url is not None:
        yield db_url
        return
    directory = tempfile.mkdtemp(prefix="waltz-perf-")
    try:
        yield f"sqlite:///{directory}/{application.name}.db"
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def check_database(
    application: PerfApplication, db_url: str, *, new_log: bool, cluster_name: str | None = None
) -> None:
    """Check that the run may use the database, before anything starts.

    Args:
        application: the application the run drives.
        db_url: a SQLAlchemy URL (SQLite, PostgreSQL, MariaDB/MySQL).
        new_log: the log is new (a local cluster started for the run): the database must then hold
            no marks of ``cluster_name`` either (they would belong to another log).
        cluster_name: the log's name in the mark rows (None: the application's name).

    Raises:
        UnusableDatabaseError: a bad URL or a missing driver; the database cannot be reached; it
            holds tables that are not this application's; or (``new_log``) it holds another log's
            marks.
    """
    name = application.name
    cluster_name = cluster_name or name
    shown = url_text(db_url, hide_password=True)
    try:
        engine = create_framework_engine(db_url)
    except (ArgumentError, NoSuchModuleError, ImportError, ValueError) as exc:
        raise UnusableDatabaseError(
            f"--db {shown!r} is not a usable database URL ({type(exc).__name__}: {exc}); e.g. "
            "postgresql+psycopg://postgres@127.0.0.1/bench or mysql+pymysql://root@127.0.0.1/bench"
        ) from exc
    try:
        with engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
            foreign = sorted(tables - FRAMEWORK_TABLES - application.tables)
            if foreign:
                more = f" and {len(foreign) - 8} more" if len(foreign) > 8 else ""
                listed = ", ".join(foreign[:8]) + more
                raise UnusableDatabaseError(
                    f"the database {shown} holds tables that are not the {name}'s ({listed}): give "
                    f"--db an empty database, or one that holds only this {name}'s tables"
                )
            if new_log and high_water_marks.name in tables:
                marks = conn.execute(
                    select(high_water_marks.c.partition_id).where(
                        high_water_marks.c.cluster_name == cluster_name
                    )
                ).all()
                if marks:
                    raise UnusableDatabaseError(
                        f"the database {shown} holds the {name} of another log (marks of "
                        f"{cluster_name!r} for {len(marks)} partition(s)); a cluster started for the "
                        "run has a new log: give --db an empty database"
                    )
    except (SQLAlchemyError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnusableDatabaseError(
            f"cannot use the database {shown}: {type(exc).__name__}: {first}"
        ) from exc
    finally:
        engine.dispose()
