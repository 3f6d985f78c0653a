"""Account gets currency (schema version 2): a new column, ``USD`` for the accounts already there.

Compatible with both releases: release 1 leaves the column out of its inserts and the server
default fills it, as the upcaster ``AddAttribute(1, "currency", "USD")`` fills it in release 1's
changes of the log (``releases.py``).

Revision ID: ledger_0002
Revises: ledger_0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "ledger_0002"
down_revision = "ledger_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "ledger_accounts", sa.Column("currency", sa.String(3), nullable=False, server_default="USD")
    )


def downgrade() -> None:
    with op.batch_alter_table("ledger_accounts") as batch:
        batch.drop_column("currency")
