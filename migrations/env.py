"""Alembic environment of the SQL framework's own tables (``waltz db upgrade``).

Not an application's environment: it only ever looks at the tables of
:data:`waltz.jdbc_style.schema.metadata` and records its revision in its own version table,
``waltz_alembic_version``, so that it never touches an application's ``alembic_version``.

The configuration is built in code by :func:`waltz.jdbc_style.migrations_api.alembic_config`
(there is no ``alembic.ini``). The database comes from, in this order:

- ``config.attributes["connection"]``: a SQLAlchemy ``Connection`` (used as is: if it is inside a
  transaction, the caller commits it) or an ``Engine`` (a connection is taken from it);
- the ``sqlalchemy.url`` main option (a ``NullPool`` engine is made and disposed of).

Offline mode (``waltz db upgrade --sql``) needs only the dialect, taken from the same sources.
"""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import Connection, Engine, engine_from_config, pool
from sqlalchemy.engine import URL

from waltz.jdbc_style.migrations_api import VERSION_TABLE
from waltz.jdbc_style.schema import metadata

config = context.config
target_metadata = metadata


def _include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Reflect only the framework's tables, so that autogenerate never sees an application's."""
    if type_ == "table":
        return name in metadata.tables
    return True


def _common_options() -> dict[str, Any]:
    return {
        "target_metadata": target_metadata,
        "version_table": VERSION_TABLE,
        "include_name": _include_name,
        "compare_type": True,
    }


def _offline_url() -> str | URL:
    given = config.attributes.get("connection")
    if isinstance(given, Connection):
        return given.engine.url
    if isinstance(given, Engine):
        return given.url
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError(
            "no database for the waltz migrations: set sqlalchemy.url, or pass a connection in "
            'config.attributes["connection"] (see waltz.jdbc_style.migrations_api.alembic_config)'
        )
    return url


def run_migrations_offline() -> None:
    """Write the DDL to the output buffer instead of running it (``--sql``)."""
    context.configure(
        url=_offline_url(),
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        **_common_options(),
    )
    with context.begin_transaction():
        context.run_migrations()


def _run_on(connection: Connection) -> None:
    context.configure(connection=connection, **_common_options())
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run the migrations on the given connection or engine, or on ``sqlalchemy.url``."""
    given = config.attributes.get("connection")
    if isinstance(given, Connection):
        _run_on(given)
        return
    if isinstance(given, Engine):
        with given.connect() as connection:
            _run_on(connection)
        return
    if given is not None:
        raise TypeError(
            f'config.attributes["connection"] must be a SQLAlchemy Connection or Engine, not {given!r}'
        )
    engine = engine_from_config(
        config.get_section(config.config_ini_section, {}),
        prefix="sqlalchemy.",
        poolclass=pool.NullPool,
    )
    try:
        with engine.connect() as connection:
            _run_on(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
