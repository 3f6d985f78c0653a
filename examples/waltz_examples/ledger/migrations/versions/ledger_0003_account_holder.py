"""The column ``name`` of the accounts becomes ``holder`` (release 4; schema version 3 is release 3's).

Release 3 renamed the attribute (``RenameAttribute(2, "name", "holder")``) and kept it on the
column ``name``; this renames the column, which release 3 cannot use any more: every instance
runs release 4 after it (``releases.py``).

Revision ID: ledger_0003
Revises: ledger_0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "ledger_0003"
down_revision = "ledger_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("ledger_accounts") as batch:
        batch.alter_column(
            "name", new_column_name="holder", existing_type=sa.String(64), existing_nullable=False
        )


def downgrade() -> None:
    with op.batch_alter_table("ledger_accounts") as batch:
        batch.alter_column(
            "holder", new_column_name="name", existing_type=sa.String(64), existing_nullable=False
        )
