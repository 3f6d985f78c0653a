"""The ledger's alembic migrations (``examples/waltz_examples/ledger/migrations``), run in code.

The ledger records its revision in ``ledger_alembic_version``, beside the framework's
``waltz_alembic_version``: the two histories never mix. Run them once before starting instances
(``prepare_database``); the framework's :func:`~waltz.jdbc_style.migrations_api.upgrade_environment`
runs them.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Connection, Engine

from waltz.jdbc_style.migrations_api import upgrade_environment

__all__ = ["VERSION_TABLE", "upgrade"]

#: The ledger's alembic version table.
VERSION_TABLE = "ledger_alembic_version"


def upgrade(bind: Engine | Connection, revision: str = "heads") -> None:
    """Create or upgrade the ledger's tables (idempotent)."""
    upgrade_environment(Path(__file__).parent / "migrations", bind, revision)
