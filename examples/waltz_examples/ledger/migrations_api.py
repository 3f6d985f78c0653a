"""The ledger's alembic migrations (``examples/waltz_examples/ledger/migrations``), run in code.

The ledger records its revision in ``ledger_alembic_version``, beside the framework's
``waltz_alembic_version``: the two histories never mix. Run them once before starting instances
(``prepare_database``); the framework's :func:`~waltz.jdbc_style.migrations_api.upgrade_environment`
runs them.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Connection, Engine

from waltz.jdbc_style.migrations_api import downgrade_environment, upgrade_environment

__all__ = ["LOCATION", "VERSION_TABLE", "downgrade", "upgrade"]

#: The ledger's alembic version table.
VERSION_TABLE = "ledger_alembic_version"


#: The ledger's alembic environment.
LOCATION = Path(__file__).parent / "migrations"


def upgrade(bind: Engine | Connection, revision: str = "heads") -> None:
    """Create or upgrade the ledger's tables (idempotent), to ``revision`` (default: the newest)."""
    upgrade_environment(LOCATION, bind, revision)


def downgrade(bind: Engine | Connection, revision: str) -> None:
    """Take the ledger's tables back to ``revision`` (``ledger_0001``; ``base`` drops them)."""
    downgrade_environment(LOCATION, bind, revision)
