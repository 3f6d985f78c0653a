"""``ledger_applied_transactions`` records the member of a batch (release 4).

A batched log transaction holds several change-sets, its members, and ``LedgerCallbacks`` records
one row for each (docs/design/sql.md, "Batched change-sets"): the new column ``member`` (0 for a
transaction of one change-set, every row already there among them) joins the primary key. An
instance of an earlier release leaves the column out of its inserts and the server default fills
it; it never batches.

The downgrade deletes the rows of members after the first: the old primary key has room for one
row per transaction.

Revision ID: ledger_0004
Revises: ledger_0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "ledger_0004"
down_revision = "ledger_0003"
branch_labels = None
depends_on = None

_TABLE = "ledger_applied_transactions"
_PRIMARY_KEY = "pk_ledger_applied_transactions"


def upgrade() -> None:
    with op.batch_alter_table(_TABLE) as batch:
        batch.add_column(sa.Column("member", sa.Integer, nullable=False, server_default="0"))
        batch.drop_constraint(_PRIMARY_KEY, type_="primary")
        batch.create_primary_key(_PRIMARY_KEY, ["partition_id", "transaction_id", "member"])


def downgrade() -> None:
    op.execute(sa.text(f"DELETE FROM {_TABLE} WHERE member <> 0"))
    with op.batch_alter_table(_TABLE) as batch:
        batch.drop_constraint(_PRIMARY_KEY, type_="primary")
        batch.create_primary_key(_PRIMARY_KEY, ["partition_id", "transaction_id"])
        batch.drop_column("member")
