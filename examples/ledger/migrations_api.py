"""The ledger's alembic migrations (``examples/ledger/migrations``), run in code.

The ledger records its revision in ``ledger_alembic_version``, beside the framework's
``waltz_alembic_version``: the two histories never mix.
"""

from __future__ import annotations

import threading
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine

__all__ = ["VERSION_TABLE", "upgrade"]

#: The ledger's alembic version table.
VERSION_TABLE = "ledger_alembic_version"

_lock = threading.Lock()  # alembic's context is module-global: one migration at a time per process


def upgrade(bind: Engine | Connection, revision: str = "heads") -> None:
    """Create or upgrade the ledger's tables (idempotent).

    Several instances may run it at once on a fresh database; the loser of the race for the
    version table fails with a database error and is simply run again (here, once).
    """
    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    config.attributes["connection"] = bind
    with _lock:
        try:
            command.upgrade(config, revision)
        except Exception:  # another instance created the tables at the same moment: the retry sees them
            command.upgrade(config, revision)
