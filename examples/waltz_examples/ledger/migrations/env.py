"""Alembic environment of the ledger example's tables (its own version table, ``ledger_alembic_version``).

Configured in code by :func:`waltz_examples.ledger.migrations_api.upgrade`: the connection or engine is
passed in ``config.attributes["connection"]``.
"""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import Connection, Engine

from waltz_examples.ledger.migrations_api import VERSION_TABLE
from waltz_examples.ledger.models import Base

config = context.config


def _include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    return name in Base.metadata.tables if type_ == "table" else True


def _run_on(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        include_name=_include_name,
    )
    with context.begin_transaction():
        context.run_migrations()


given = config.attributes.get("connection")
if isinstance(given, Connection):
    _run_on(given)
elif isinstance(given, Engine):
    with given.connect() as connection:
        _run_on(connection)
else:
    raise RuntimeError('pass a Connection or Engine in config.attributes["connection"]')
