"""The ledger's tables: accounts, savings, checking, transfers out and in, applied transactions.

Revision ID: ledger_0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "ledger_0001"
down_revision = None
branch_labels = ("ledger",)
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ledger_accounts",
        sa.Column("custid", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("status", sa.String(8), nullable=False),
    )
    for table in ("ledger_savings", "ledger_checking"):
        op.create_table(
            table,
            sa.Column("custid", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column("balance", sa.BigInteger, nullable=False),
        )
    op.create_table(
        "ledger_transfers_out",
        sa.Column("from_custid", sa.BigInteger, nullable=False),
        sa.Column("transfer_id", sa.String(32), nullable=False),
        sa.Column("to_custid", sa.BigInteger, nullable=False),
        sa.Column("amount", sa.BigInteger, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("status", sa.String(8), nullable=False),
        sa.PrimaryKeyConstraint("from_custid", "transfer_id"),
    )
    op.create_index("ix_ledger_transfers_out_status", "ledger_transfers_out", ["status"])
    op.create_table(
        "ledger_transfers_in",
        sa.Column("to_custid", sa.BigInteger, nullable=False),
        sa.Column("transfer_id", sa.String(32), nullable=False),
        sa.Column("from_custid", sa.BigInteger, nullable=False),
        sa.Column("amount", sa.BigInteger, nullable=False),
        sa.Column("status", sa.String(8), nullable=False),
        sa.PrimaryKeyConstraint("to_custid", "transfer_id"),
    )
    op.create_table(
        "ledger_applied_transactions",
        sa.Column("partition_id", sa.Integer, nullable=False),
        sa.Column("transaction_id", sa.BigInteger, nullable=False),
        sa.Column("op", sa.String(24), nullable=False),
        sa.Column("delta", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("partition_id", "transaction_id", name="pk_ledger_applied_transactions"),
    )


def downgrade() -> None:
    for table in (
        "ledger_applied_transactions",
        "ledger_transfers_in",
        "ledger_transfers_out",
        "ledger_checking",
        "ledger_savings",
        "ledger_accounts",
    ):
        op.drop_table(table)
