"""Cluster names and idempotency keys compared byte for byte on MariaDB and MySQL.

Revision ID: waltz_0002
Revises: waltz_0001

MariaDB's and MySQL's default collations ignore case (and accents), and their ``utf8mb4_bin``
ignores trailing spaces, so on those backends the first revision's tables took ``Req-1`` and
``req-1`` for one idempotency key (the second request was answered as the first one's retry and not
applied), and two cluster names so differing for one log. PostgreSQL and SQLite compared them byte
for byte already: this revision changes nothing there.

On MariaDB the columns take ``utf8mb4_nopad_bin``, on MySQL ``utf8mb4_0900_bin`` (MySQL 8.0.17 or
newer). Rows are kept: values equal under the old collation could not both be stored, so every row
is still unique under the new one. Written out in full, not imported from
``waltz.jdbc_style.schema``: a migration is a snapshot of its time.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

# revision identifiers, used by Alembic.
revision: str = "waltz_0002"
down_revision: str | Sequence[str] | None = "waltz_0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_NAME_LENGTH = 190

#: (table, column) of every cluster name and idempotency key.
_COLUMNS = (
    ("waltz_high_water_marks", "cluster_name"),
    ("waltz_idempotency_keys", "cluster_name"),
    ("waltz_idempotency_keys", "idempotency_key"),
    ("waltz_skipped_transactions", "cluster_name"),
)


def _exact_collation() -> str | None:
    dialect = op.get_context().dialect
    if dialect.name not in ("mysql", "mariadb"):
        return None
    return "utf8mb4_nopad_bin" if getattr(dialect, "is_mariadb", False) else "utf8mb4_0900_bin"


def _retype(type_: sa.types.TypeEngine[str]) -> None:
    for table, column in _COLUMNS:
        op.alter_column(
            table, column, existing_type=sa.String(_NAME_LENGTH), type_=type_, existing_nullable=False
        )


def upgrade() -> None:
    """Give the cluster names and idempotency keys a byte-for-byte collation on MariaDB/MySQL."""
    collation = _exact_collation()
    if collation is not None:
        _retype(mysql.VARCHAR(_NAME_LENGTH, collation=collation))


def downgrade() -> None:
    """Back to the table's default collation on MariaDB/MySQL. Fails (a duplicate primary key) if
    rows were written since that the default collation takes for equal: keys that differ only in
    case or in trailing spaces."""
    if _exact_collation() is not None:
        _retype(sa.String(_NAME_LENGTH))
